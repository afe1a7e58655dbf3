// The benchmark's memory: filling the cache to depth, then timing, must not leave freed
// blocks reserved in the allocator's pool. The bound comes from the model's shape, not from
// the code under test.
#include <gtest/gtest.h>

#include "core/buffer.h"
#include "serve/bench.h"
#include "serve/generate.h"
#include "model/model.h"
#include "support/test_util.h"

namespace osprey {
namespace {

// A tiny Llama whose dense caches dominate its memory: 8 layers of 4 KV heads of 16 dims,
// 128 bytes per cached row and buffer.
constexpr int64_t kLayers = 8, kKvHeads = 4, kHeadDim = 16, kChunk = 64;

nlohmann::json shape() {
  auto c = testing::tiny_llama_config();
  c["hidden_size"] = 64;
  c["intermediate_size"] = 96;
  c["num_hidden_layers"] = kLayers;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = kKvHeads;
  c["max_position_embeddings"] = 4096;
  return c;
}

// Bytes of every layer's keys and values for a capacity of `rows` (f16 or bf16).
size_t kv_bytes(int64_t rows) { return size_t(kLayers * 2 * kKvHeads * kHeadDim * rows * 2); }

// What may be live besides the caches, from the shape alone: the copying write of a chunk
// holds one layer's old keys and values beside the new ones, and a forward pass of kChunk
// tokens holds a few dozen activations of at most [kChunk, 2 * intermediate] f32 (about
// 50 KiB each), so 1 MiB covers them with room to spare.
size_t transient_bytes(int64_t rows) { return kv_bytes(rows) / kLayers + (size_t(1) << 20); }

int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }

}  // namespace

TEST(Bench, DepthFillAndDecodeKeepReservedMemoryAtTheCachePlusOneChunk) {
  // Before the pool returned what growth left behind, the fill to 2048 kept every capacity
  // it grew through (256, 512, ... rows) reserved: about 5x this bound.
  testing::TempDir d;
  testing::write_tiny_llama(d.path(), shape());
  auto model = load_model(d.path());
  ASSERT_TRUE(model->info().device.is_cpu());

  Allocator& alloc = allocator_for(model->info().device);
  alloc.trim();
  const size_t resident = alloc.stats().live_bytes;  // the weights and whatever else is held

  BenchParams params;
  params.warmup = 1;
  params.repetitions = 2;  // a run after a run: the last run's cache must not stay reserved
  params.depth_chunk = kChunk;
  for (BenchTest test : {BenchTest{BenchTest::Kind::generation, 4, 2048}, BenchTest{BenchTest::Kind::prompt, 40, 2048}}) {
    SCOPED_TRACE(test.name());
    const BenchResult r = run_bench(*model, test, params);
    const int64_t rows = round_up(test.depth + test.n_tokens, params.cache.step);
    const double bound = double(resident + kv_bytes(rows)) * 1.05 + double(transient_bytes(rows));
    EXPECT_LE(double(r.memory.test.reserved_bytes), bound)
        << "peak allocated " << r.memory.test.alloc_bytes << ", KV " << kv_bytes(rows) << ", resident " << resident;
    EXPECT_GE(r.memory.test.alloc_bytes, resident + kv_bytes(rows));  // the caches were really there
  }
}

TEST(Bench, LongPromptPrefillKeepsReservedMemoryAtTheCachePlusOneChunk) {
  // generate() reserves the prompt's rows, so its chunks do not grow the cache through every
  // capacity on the way.
  testing::TempDir d;
  testing::write_tiny_llama(d.path(), shape());
  auto model = load_model(d.path());
  Allocator& alloc = allocator_for(model->info().device);
  alloc.trim();
  const size_t resident = alloc.stats().live_bytes;
  alloc.reset_peak();

  std::vector<int32_t> prompt(2000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + i % 60);
  GenerateParams gp;
  gp.max_tokens = 8;
  gp.prefill_chunk = kChunk;
  SequenceCache cache = model->make_cache({});
  generate(*model, cache, prompt, gp);
  const int64_t rows = round_up(int64_t(prompt.size()) + gp.max_tokens, 256);
  const double bound = double(resident + kv_bytes(rows)) * 1.05 + double(transient_bytes(rows));
  EXPECT_LE(double(alloc.stats().peak_reserved_bytes), bound) << "peak allocated " << alloc.stats().peak_bytes;
}

}  // namespace osprey
