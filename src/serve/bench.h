#pragma once
// Throughput measurement after llama-bench (docs/benchmarks.md).
//
// A test runs on a fresh cache that is first filled to `depth` with random tokens (not
// timed), then times one phase:
// - prompt processing (pp): one forward pass over n_tokens random tokens, last logits only;
// - token generation (tg): n_tokens single-token forward passes, each fed the greedy argmax
//   of the previous step's logits (the first is fed a random token).
// Tokenization and sampling are not part of either: the timed work is Model::forward plus
// an argmax over the vocabulary per tg step. Forward passes are synchronous on the CPU, so
// a phase ends when its last forward returns (a device backend must synchronise there).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "serve/generate.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace osprey {

struct BenchTest {
  enum class Kind { prompt, generation };
  Kind kind = Kind::prompt;
  int64_t n_tokens = 0;  // prompt tokens (pp) or generated tokens (tg)
  int64_t depth = 0;     // rows already in the cache when the timed phase starts
  // llama-bench's names: "pp512", "tg128", "tg128 @ d2048".
  std::string name() const;
};

// Tests in the order they run: for each depth, a pp test per prompt size, then a tg test
// per generation length. Sizes of 0 are skipped. Throws InvalidInput for a negative size
// or depth.
std::vector<BenchTest> make_bench_tests(std::span<const int64_t> n_prompt, std::span<const int64_t> n_gen,
                                        std::span<const int64_t> depths);

struct BenchParams {
  int repetitions = 5;        // measured runs per test
  int warmup = 1;             // unmeasured runs per test, before the measured ones
  uint64_t seed = 1234;       // random tokens: the same for a given (seed, test, run index)
  KVCacheParams cache;         // per-run caches are made with these
  GenerateParams decode;       // tg tests: the decode switches (pipelined, graphs); the rest is set per test
  int64_t depth_chunk = 512;  // tokens per forward pass while filling the cache to depth
};

struct SampleStats {
  double mean = 0;
  double stddev = 0;  // sample standard deviation (n - 1); 0 for one sample
  double median = 0;
  double min = 0;
  double max = 0;
};
SampleStats summarize(std::span<const double> samples);

struct MemoryPeaks {
  size_t alloc_bytes = 0;     // CPU allocator: peak bytes handed out
  size_t reserved_bytes = 0;  // CPU allocator: peak bytes held, including its cache of freed blocks
  size_t rss_bytes = 0;       // the process's resident-set high-water mark (VmHWM)
};

struct BenchMemory {
  MemoryPeaks test;    // over the whole test: warmup, depth fills and measured runs
  MemoryPeaks timed;   // over the timed phases only (the marks are reset after each depth fill)
  bool rss_per_test = false;  // false: the RSS mark could not be reset, so it covers the process so far
};

struct BenchResult {
  BenchTest test;
  std::vector<double> seconds;  // timed phase of each measured run
  std::vector<double> tps;      // n_tokens / seconds, per measured run
  SampleStats stats;            // over tps
  KVCounters kv;                // cache writes during the timed phase of one run (all runs write alike)
  int64_t n_drafted = 0, n_accepted = 0;  // tg tests, speculative decoding: over the measured runs
  BenchMemory memory;
};

// Runs `test` (params.warmup + params.repetitions runs, each on a fresh cache). Before the
// test, returns the allocator's cached blocks to the system and resets the allocator's and
// the process's peak marks; after each depth fill it resets them again (without returning
// cached blocks), so the timed peaks are those of the timed phases. Throws InvalidInput when depth + n_tokens passes the model's
// context or repetitions < 1.
BenchResult run_bench(Model& model, const BenchTest& test, const BenchParams& params);

// The process's resident-set high-water mark in bytes (VmHWM of /proc/self/status; 0 when
// unreadable).
size_t peak_rss_bytes();
// Resets that mark to the current RSS (Linux /proc/self/clear_refs); false when it cannot.
bool reset_peak_rss();

}  // namespace osprey
