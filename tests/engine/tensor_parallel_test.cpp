// Tensor parallelism on the CPU (docs/design.md, "Tensor parallelism"): the communicator's
// collectives against sums and layouts computed here, and N ranks of a model (threads of this
// process) against the unsharded model on the fixtures and on random checkpoints written
// here: the same logits within float tolerance and the same greedy tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "backend/communicator.h"
#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/error.h"
#include "engine/sharded_model.h"
#include "formats/safetensors.h"
#include "model/blocks.h"
#include "model/model.h"
#include "serve/generate.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;

using testing::TempDir;
using testing::tokens_of;

std::filesystem::path fixture(const std::string& name) {
  return testing::source_dir() / "tests/fixtures/models" / name;
}

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void on_ranks(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(Communicator, ShardRangesCoverInOrder) {
  for (int64_t n : {1, 7, 64, 67}) {
    for (int size : {1, 2, 3, 4, 8}) {
      int64_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < size; ++r) {
        const ShardRange s = shard_range(n, {r, size});
        EXPECT_EQ(s.begin, next) << n << " over " << size << ", rank " << r;
        next = s.end;
        lo = std::min(lo, s.count());
        hi = std::max(hi, s.count());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1) << n << " over " << size;
    }
  }
}

TEST(Communicator, CpuAllReduceSumsEveryRanksValues) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = make_cpu_communicators(n);
    const int64_t len = 1001;  // not a multiple of the ranks: uneven slices of the sum
    std::vector<Array> xs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      xs[size_t(r)] = Array::empty({len}, DType::f32);
      for (int64_t i = 0; i < len; ++i) xs[size_t(r)].data<float>()[i] = std::sin(0.37f * float(i) + float(r)) * float(r + 1);
    }
    std::vector<double> expected(size_t(len), 0.0);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < len; ++i) expected[size_t(i)] += double(xs[size_t(r)].data<float>()[i]);
    // Twice in a row: the shared buffers are reused.
    std::vector<std::vector<float>> second(static_cast<size_t>(n));
    on_ranks(n, [&](int r) {
      Array x = xs[size_t(r)];
      Array y = ops::cast(x, DType::f32);  // a copy
      comms[size_t(r)]->all_reduce_sum_(x);
      comms[size_t(r)]->all_reduce_sum_(y);
      second[size_t(r)].assign(y.data<float>(), y.data<float>() + len);
    });
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_NEAR(xs[size_t(r)].data<float>()[i], expected[size_t(i)], 1e-5) << "rank " << r << " element " << i;
        // Every rank holds the same bits.
        ASSERT_EQ(xs[size_t(r)].data<float>()[i], xs[0].data<float>()[i]);
        ASSERT_EQ(second[size_t(r)][size_t(i)], xs[0].data<float>()[i]);
      }
  }
}

TEST(Communicator, CpuAllGatherPlacesColumnsInRankOrder) {
  const int n = 3;
  const int64_t rows = 2, total = 10;  // widths 4, 3, 3
  auto comms = make_cpu_communicators(n);
  std::vector<Array> out(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    const ShardRange cols = shard_range(total, {r, n});
    Array x = Array::empty({rows, cols.count()}, DType::f32);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols.count(); ++j) x.data<float>()[i * cols.count() + j] = float(100 * i + cols.begin + j);
    out[size_t(r)] = comms[size_t(r)]->all_gather_cols(x, total);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(out[size_t(r)].shape(), (Shape{rows, total}));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < total; ++j)
        EXPECT_EQ(out[size_t(r)].data<float>()[i * total + j], float(100 * i + j)) << "rank " << r;
  }
}

TEST(Communicator, BadInput) {
  EXPECT_THROW(make_cpu_communicators(0), InvalidInput);
  auto comms = make_cpu_communicators(1);
  Array ints = Array::zeros({4}, DType::i32);
  EXPECT_THROW(comms[0]->all_reduce_sum_(ints), InvalidInput);
  if (!nccl_available()) {
    EXPECT_THROW(make_nccl_communicators({0, 1}), Unsupported);
  }
}

// The NCCL communicator on the one GPU a single-GPU machine has: a group of one rank, whose
// all-reduce leaves x as it is and whose gather returns its own columns, run on the rank's
// stream. Several ranks need as many GPUs. Skips without CUDA or NCCL.
TEST(Communicator, NcclOneRankOnOneGpu) {
  if (!cuda_available() || !nccl_available()) GTEST_SKIP() << "needs a CUDA device and NCCL";
  auto comms = make_nccl_communicators({0});
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(comms[0]->rank(), 0);
  EXPECT_EQ(comms[0]->size(), 1);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Array host = Array::empty({3, 37}, DType::f32);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = dist(rng);
  Array x = ops::to_device(host, Device::cuda(0));
  comms[0]->all_reduce_sum_(x);
  Array gathered = comms[0]->all_gather_cols(x, 37);
  comms[0]->barrier();
  const Array back = ops::to_device(x, Device::cpu()), g = ops::to_device(gathered, Device::cpu());
  ASSERT_EQ(g.shape(), host.shape());
  for (int64_t i = 0; i < host.numel(); ++i) {
    EXPECT_EQ(back.data<float>()[i], host.data<float>()[i]) << i;
    EXPECT_EQ(g.data<float>()[i], host.data<float>()[i]) << i;
  }
  if (cuda_device_count() == 1) {
    EXPECT_THROW(make_nccl_communicators({0, 1}), InvalidInput);  // cuda:1 is named
  }
}

TEST(TensorParallel, HeadsSplitWholeAndKvHeadsReplicate) {
  // 32 query heads over 8 K/V heads (4 per K/V head).
  HeadShard a = shard_heads(32, 8, {3, 4});  // 8 query heads, 2 K/V heads each
  EXPECT_EQ(a.q_head0, 24);
  EXPECT_EQ(a.n_heads, 8);
  EXPECT_EQ(a.kv_head0, 6);
  EXPECT_EQ(a.n_kv_heads, 2);
  for (int r = 0; r < 16; ++r) {  // 2 query heads each: one K/V head, shared by 2 ranks
    HeadShard b = shard_heads(32, 8, {r, 16});
    EXPECT_EQ(b.n_heads, 2);
    EXPECT_EQ(b.n_kv_heads, 1);
    // Each of the rank's query heads reads K/V head q / 4: the one the rank holds.
    for (int64_t q = b.q_head0; q < b.q_head0 + b.n_heads; ++q) EXPECT_EQ(q / 4, b.kv_head0) << "rank " << r;
  }
  EXPECT_NE(error_of([] { shard_heads(4, 2, {0, 3}); }).find("3 does not divide the 4 attention heads"),
            std::string::npos);
  // 12 query heads over 6 K/V heads on 4 ranks: 3 query heads a rank, which straddle K/V heads.
  EXPECT_NE(error_of([] { shard_heads(12, 6, {0, 4}); }).find("6 key/value heads"), std::string::npos);
}

namespace {

// A random Llama checkpoint in float32 with q/k/v, o and MLP biases: vocab 67 (not a multiple
// of 2, 4 or 8), 8 query heads over 2 K/V heads (replicated on 4 and 8 ranks).
void write_biased_llama(const std::filesystem::path& dir, uint32_t seed) {
  const int64_t v = 67, h = 32, f = 40, n_heads = 8, n_kv = 2, hd = 4, n_layers = 2;
  nlohmann::json cfg = testing::tiny_llama_config();
  cfg["vocab_size"] = v;
  cfg["hidden_size"] = h;
  cfg["intermediate_size"] = f;
  cfg["num_attention_heads"] = n_heads;
  cfg["num_key_value_heads"] = n_kv;
  cfg["num_hidden_layers"] = n_layers;
  cfg["attention_bias"] = true;
  cfg["mlp_bias"] = true;
  std::filesystem::create_directories(dir);
  testing::write_file(dir / "config.json", cfg.dump(2));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<std::pair<std::string, Array>> tensors;
  auto add = [&](const std::string& name, Shape shape, float offset = 0.0f) {
    Array a = Array::empty(shape, DType::f32);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = offset + dist(rng);
    tensors.emplace_back(name, a);
  };
  add("model.embed_tokens.weight", {v, h});
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, 1.0f);
    add(p + "post_attention_layernorm.weight", {h}, 1.0f);
    for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
      const int64_t out = std::string(m) == "q_proj" ? n_heads * hd : n_kv * hd;
      add(p + "self_attn." + m + ".weight", {out, h});
      add(p + "self_attn." + m + ".bias", {out});
    }
    add(p + "self_attn.o_proj.weight", {h, n_heads * hd});
    add(p + "self_attn.o_proj.bias", {h});
    add(p + "mlp.gate_proj.weight", {f, h});
    add(p + "mlp.gate_proj.bias", {f});
    add(p + "mlp.up_proj.weight", {f, h});
    add(p + "mlp.up_proj.bias", {f});
    add(p + "mlp.down_proj.weight", {h, f});
    add(p + "mlp.down_proj.bias", {h});
  }
  add("model.norm.weight", {h}, 1.0f);
  add("lm_head.weight", {v, h});
  write_safetensors(dir / "model.safetensors", tensors);
}

// The logits of a prefill of 6 tokens (every row) and of 5 decode steps after it.
std::vector<Array> prefill_and_decode(Model& model) {
  const std::vector<int32_t> prompt = {1, 5, 17, 3, 42, 9};
  const std::vector<int32_t> steps = {60, 2, 33, 21, 7};
  SequenceCache cache = model.make_cache({});
  std::vector<Array> out;
  out.push_back(model.forward(tokens_of(prompt), cache, true));
  for (int32_t t : steps) out.push_back(model.forward(tokens_of({t}), cache, false));
  EXPECT_EQ(cache.offset(), int64_t(prompt.size() + steps.size()));
  return out;
}

// NOTE on the tolerance: a rank sums its share of the o and down projections' products and
// the all-reduce adds the shares, so the float sums run in another order than the unsharded
// model's: each differs by a few float32 ulps. The K/V rows are then stored as float16 (or
// bfloat16), and a value that lands on a rounding boundary may round to the neighbouring
// f16 value (2^-11 relative) on one side only. On these checkpoints the largest difference
// seen is under 5e-5 of the row's range; 5e-4 leaves room for that rounding and still fails
// any slicing mistake (a bias added on every rank moves logits by 8-15% of the range, a
// wrong head or column by more).
constexpr double kTolerance = 5e-4;

void expect_sharded_equals_whole(const std::filesystem::path& dir, int tp) {
  SCOPED_TRACE(dir.filename().string() + " on " + std::to_string(tp) + " ranks");
  auto whole = load_model(dir);
  auto sharded = load_sharded_model(dir, tp);
  ASSERT_EQ(sharded->info().vocab_size, whole->info().vocab_size);
  const int64_t vocab = whole->info().vocab_size;
  const std::vector<Array> a = prefill_and_decode(*whole), b = prefill_and_decode(*sharded);
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].shape(), b[s].shape()) << "step " << s;
    for (int64_t row = 0; row < a[s].dim(0); ++row)
      EXPECT_LT(testing::relative_row_error(b[s].data<float>() + row * vocab, a[s].data<float>() + row * vocab, vocab),
                kTolerance)
          << "step " << s << " row " << row;
  }
  // Greedy generation gives the same tokens.
  GenerateParams gp;
  gp.max_tokens = 24;
  const std::vector<int32_t> prompt = {1, 5, 17, 3, 42};
  SequenceCache ca = whole->make_cache({}), cb = sharded->make_cache({});
  const GenerateResult ga = generate(*whole, ca, prompt, gp), gb = generate(*sharded, cb, prompt, gp);
  EXPECT_EQ(ga.tokens, gb.tokens);
  EXPECT_EQ(ga.tokens.size(), 24u);
}

}  // namespace

TEST(TensorParallel, LlamaBf16MatchesUnsharded) {
  expect_sharded_equals_whole(fixture("llama"), 2);
  expect_sharded_equals_whole(fixture("llama"), 4);  // 2 K/V heads on 4 ranks: replicated
}

TEST(TensorParallel, Qwen2TiedHeadAndQkvBiasesMatchUnsharded) {
  expect_sharded_equals_whole(fixture("qwen2"), 2);
  expect_sharded_equals_whole(fixture("qwen2"), 4);
}

TEST(TensorParallel, Qwen3HeadNormsMatchUnsharded) {
  expect_sharded_equals_whole(fixture("qwen3"), 2);
}

TEST(TensorParallel, MistralSlidingWindowMatchesUnsharded) {
  expect_sharded_equals_whole(fixture("mistral"), 2);
}

TEST(TensorParallel, Gemma3SandwichNormsAndSlidingLayersMatchUnsharded) {
  expect_sharded_equals_whole(fixture("gemma3"), 2);
}

TEST(TensorParallel, Cohere2ParallelBlockMatchesUnsharded) {
  expect_sharded_equals_whole(fixture("cohere2"), 2);
}

TEST(TensorParallel, Qwen2QuantizedMatchesUnsharded) {
  // 4- and 6-bit groups of 32 (o_proj's 64 inputs split into whole groups on 2 ranks), a
  // dense down_proj and o_proj, and a quantized embedding that is also the head.
  expect_sharded_equals_whole(fixture("qwen2-q4"), 2);
}

TEST(TensorParallel, Float32WithBiasesMatchesUnsharded) {
  TempDir d;
  write_biased_llama(d.path(), 7);
  for (int tp : {2, 4, 8}) expect_sharded_equals_whole(d.path(), tp);
}

TEST(TensorParallel, SnapshotRestoreAndTrimMoveEveryRank) {
  auto model = load_sharded_model(fixture("llama"), 2);
  SequenceCache cache = model->make_cache({});
  EXPECT_EQ(cache.n_layers(), 2u * size_t(model->info().n_layers));
  model->forward(tokens_of({1, 5, 17, 3}), cache, false);
  const auto snap = cache.snapshot();
  Array first = model->forward(tokens_of({42}), cache, false);
  cache.restore(snap);
  Array again = model->forward(tokens_of({42}), cache, false);
  cache.trim(1);
  Array trimmed = model->forward(tokens_of({42}), cache, false);
  const int64_t vocab = model->info().vocab_size;
  for (int64_t j = 0; j < vocab; ++j) {
    ASSERT_EQ(first.data<float>()[j], again.data<float>()[j]) << j;
    ASSERT_EQ(first.data<float>()[j], trimmed.data<float>()[j]) << j;
  }
}

TEST(TensorParallel, BadInputIsNamed) {
  EXPECT_NE(error_of([] { load_sharded_model(fixture("llama"), 3); }).find("3 does not divide the 4 attention heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_sharded_model(fixture("llama"), 0); }).find("at least 1"), std::string::npos);
  // llama-q4's o_proj has 64 inputs in one group of 64: no whole groups for 2 ranks.
  const std::string q = error_of([] { load_sharded_model(fixture("llama-q4"), 2); });
  EXPECT_NE(q.find("o_proj.weight is quantized in groups of 64"), std::string::npos) << q;
  EXPECT_NE(q.find("[0, 32)"), std::string::npos) << q;
  EXPECT_THROW(load_sharded_model(fixture("llama"), 3), InvalidInput);
}

TEST(TensorParallel, CliFlag) {
  const std::string m = "-m " + fixture("llama").string() + " --device cpu --token-ids 1,5,17 -n 6 --json";
  auto one = testing::run_osprey("generate " + m);
  auto two = testing::run_osprey("generate " + m + " -tp 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)["tokens"], nlohmann::json::parse(two.out)["tokens"]);
  auto zero = testing::run_osprey("generate " + m + " -tp 0");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--tensor-parallel"), std::string::npos) << zero.err;
  auto three = testing::run_osprey("generate " + m + " --tensor-parallel 3");
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_NE(three.err.find("does not divide the 4 attention heads"), std::string::npos) << three.err;
  auto bench = testing::run_osprey("bench -m " + fixture("llama").string() + " --device cpu -p 8 -n 4 -r 1 -tp 2 -o json");
  EXPECT_EQ(bench.exit_code, 0) << bench.err;
}

}  // namespace osprey
