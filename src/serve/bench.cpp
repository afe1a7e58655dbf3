#include "serve/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/ops.h"
#include "core/buffer.h"
#include "core/error.h"
#include "serve/generate.h"

namespace osprey {
namespace {

using Clock = std::chrono::steady_clock;

// Random token ids in [0, vocab), a function of (seed, test, run index, stream).
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

struct RunResult {
  double seconds = 0;
  KVCounters kv;
  int64_t n_drafted = 0, n_accepted = 0;
};

// Peaks of the allocator of the model's device (on CUDA: the device high-water mark).
MemoryPeaks read_peaks(Device device) {
  const AllocatorStats st = allocator_for(device).stats();
  return {st.peak_bytes, st.peak_reserved_bytes, peak_rss_bytes()};
}

void reset_peaks(Device device) {
  allocator_for(device).reset_peak();
  reset_peak_rss();
}

void raise_to(MemoryPeaks& m, const MemoryPeaks& p) {
  m.alloc_bytes = std::max(m.alloc_bytes, p.alloc_bytes);
  m.reserved_bytes = std::max(m.reserved_bytes, p.reserved_bytes);
  m.rss_bytes = std::max(m.rss_bytes, p.rss_bytes);
}

// Raises `memory`'s peaks: the whole-test ones by the fill and the timed phase, the timed
// ones by the timed phase alone.
RunResult run_once(Model& model, const BenchTest& test, const BenchParams& params, uint64_t run_seed,
                   BenchMemory& memory) {
  const int64_t vocab = model.info().vocab_size;
  SequenceCache cache = model.make_cache(params.cache);
  // The run writes depth + n_tokens positions: the cache takes that size at its first write
  // rather than growing through every size class on the way.
  cache.reserve(test.depth + test.n_tokens);

  // Depth fill (not timed), in chunks so a deep fill never materialises one huge batch.
  const std::vector<int32_t> fill = random_tokens(test.depth, vocab, mix(run_seed, 1));
  const int64_t chunk = std::max<int64_t>(1, params.depth_chunk);
  for (int64_t b = 0; b < test.depth; b += chunk) {
    const int64_t e = std::min(test.depth, b + chunk);
    model.forward(host_i32(std::span<const int32_t>(fill).subspan(size_t(b), size_t(e - b))), cache, false);
  }

  raise_to(memory.test, read_peaks(model.info().device));
  reset_peaks(model.info().device);

  RunResult r;
  const std::vector<int32_t> input =
      random_tokens(test.kind == BenchTest::Kind::prompt ? test.n_tokens : 1, vocab, mix(run_seed, 2));
  const KVCounters before = cache.counters();
  if (test.kind == BenchTest::Kind::prompt) {
    Array tokens = host_i32(input);
    const auto t0 = Clock::now();
    model.forward(tokens, cache, false);
    ops::synchronize(model.info().device);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  } else {
    // The generator's own loop (greedy, stops ignored): n_tokens forward passes of one token,
    // pipelined and graph-replayed on CUDA as generation is.
    GenerateParams gp = params.decode;
    gp.max_tokens = int(test.n_tokens);
    const auto t0 = Clock::now();
    GenerateResult g = generate(model, cache, input, gp);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.n_drafted = g.stats.n_drafted;
    r.n_accepted = g.stats.n_accepted;
    if (g.stats.n_generated != test.n_tokens)
      throw Error("bench: generated " + std::to_string(g.stats.n_generated) + " of " + std::to_string(test.n_tokens) +
                  " tokens");
  }
  r.kv = cache.counters().since(before);
  const MemoryPeaks timed = read_peaks(model.info().device);
  raise_to(memory.test, timed);
  raise_to(memory.timed, timed);
  return r;
}

}  // namespace

std::string BenchTest::name() const {
  std::string s = (kind == Kind::prompt ? "pp" : "tg") + std::to_string(n_tokens);
  if (depth > 0) s += " @ d" + std::to_string(depth);
  return s;
}

std::vector<BenchTest> make_bench_tests(std::span<const int64_t> n_prompt, std::span<const int64_t> n_gen,
                                        std::span<const int64_t> depths) {
  auto check = [](std::span<const int64_t> values, const char* flag) {
    for (int64_t v : values)
      if (v < 0) throw InvalidInput(std::string("bench: ") + flag + " " + std::to_string(v) + " is negative");
  };
  check(n_prompt, "-p");
  check(n_gen, "-n");
  check(depths, "-d");
  std::vector<BenchTest> tests;
  const std::vector<int64_t> default_depth{0};
  for (int64_t d : depths.empty() ? std::span<const int64_t>(default_depth) : depths) {
    for (int64_t p : n_prompt)
      if (p > 0) tests.push_back({BenchTest::Kind::prompt, p, d});
    for (int64_t n : n_gen)
      if (n > 0) tests.push_back({BenchTest::Kind::generation, n, d});
  }
  return tests;
}

SampleStats summarize(std::span<const double> samples) {
  SampleStats s;
  if (samples.empty()) return s;
  const double n = double(samples.size());
  double sum = 0;
  for (double x : samples) sum += x;
  s.mean = sum / n;
  if (samples.size() > 1) {
    double ss = 0;
    for (double x : samples) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / (n - 1));
  }
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size() / 2;
  s.median = sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
  s.min = sorted.front();
  s.max = sorted.back();
  return s;
}

BenchResult run_bench(Model& model, const BenchTest& test, const BenchParams& params) {
  if (params.repetitions < 1) throw InvalidInput("bench: repetitions must be >= 1");
  if (params.warmup < 0) throw InvalidInput("bench: warmup runs must be >= 0");
  if (test.n_tokens < 1) throw InvalidInput("bench: test " + test.name() + " has no tokens");
  if (model.info().vocab_size < 1) throw InvalidInput("bench: the model has no vocabulary");
  const int64_t ctx = model.info().max_position_embeddings;
  if (ctx > 0 && test.depth + test.n_tokens > ctx)
    throw InvalidInput("bench: " + test.name() + " needs " + std::to_string(test.depth + test.n_tokens) +
                       " positions, past the model's context of " + std::to_string(ctx));

  BenchResult result;
  result.test = test;
  Allocator& alloc = allocator_for(model.info().device);
  alloc.trim();
  alloc.reset_peak();
  result.memory.rss_per_test = reset_peak_rss();

  // Run i's tokens depend on (seed, test, i) only, so two processes measuring the same
  // test (the two KV arms, say) feed the same tokens.
  uint64_t test_seed = mix(params.seed, uint64_t(test.kind == BenchTest::Kind::prompt ? 1 : 2));
  test_seed = mix(mix(test_seed, uint64_t(test.n_tokens)), uint64_t(test.depth));
  for (int i = 0; i < params.warmup + params.repetitions; ++i) {
    RunResult r = run_once(model, test, params, mix(test_seed, uint64_t(i)), result.memory);
    if (i < params.warmup) continue;
    if (i == params.warmup) result.kv = r.kv;
    result.n_drafted += r.n_drafted;
    result.n_accepted += r.n_accepted;
    result.seconds.push_back(r.seconds);
    result.tps.push_back(r.seconds > 0 ? double(test.n_tokens) / r.seconds : 0);
  }
  result.stats = summarize(result.tps);
  return result;
}

size_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    size_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return bool(out);
}

}  // namespace osprey
