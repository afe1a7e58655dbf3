// Pipelined decode and CUDA graph replay (docs/design.md, "Pipelined decode" and "Graph
// capture and replay") change how steps are issued, never what they compute: every combination
// of KV write path, graph replay and pipelining must give the same tokens, across the 256-row
// cache growth. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cuda_available.h"
#include "serve/generate.h"
#include "kv/dense_cache.h"
#include "model/model.h"
#include "support/families.h"
#include "support/test_util.h"

namespace osprey {
namespace {

std::filesystem::path fixture(const std::string& family) { return testing::source_dir() / "tests/fixtures/models" / family; }

struct Mode {
  bool inplace, graphs, pipelined;
  std::string str() const {
    return std::string(inplace ? "in-place" : "copying") + (graphs ? " graphs" : " eager") +
           (pipelined ? " pipelined" : " sync");
  }
};

std::vector<Mode> all_modes() {
  std::vector<Mode> m;
  for (int i = 0; i < 8; ++i) m.push_back({(i & 1) == 0, (i & 2) == 0, (i & 4) == 0});
  return m;
}

class DecodeModes : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
    LoadOptions lo;
    lo.device = Device::cuda(0);
    model_ = load_model(fixture(GetParam()), lo);
  }

  GenerateResult run(const Mode& m, const SamplerParams& sp, int n, SequenceCache* cache_in = nullptr,
                     std::vector<int32_t> stops = {}, std::vector<int32_t> prompt = {5, 99, 23, 311, 8, 140, 77, 3},
                     int64_t step = 256) {
    KVCacheParams co;
    co.inplace = m.inplace;
    co.step = step;
    SequenceCache local = model_->make_cache(co);
    SequenceCache& cache = cache_in ? *cache_in : local;
    GenerateParams gp;
    gp.max_tokens = n;
    gp.sampler = sp;
    gp.graphs = m.graphs;
    gp.pipelined = m.pipelined;
    gp.stop_ids = std::move(stops);
    return generate(*model_, cache, prompt, gp);
  }

  std::unique_ptr<Model> model_;
};

}  // namespace

// Whether every layer's cache is the dense one (a family without sliding-window layers, or a
// build whose windowed layers keep every row), whose write counts the test knows exactly.
bool all_dense(SequenceCache& cache) {
  for (size_t i = 0; i < cache.n_layers(); ++i)
    if (!dynamic_cast<DenseKVCache*>(&cache.layer(i))) return false;
  return true;
}

TEST_P(DecodeModes, GreedyOutputIsIdenticalInEveryModeFor300Tokens) {
  // 8 prompt rows and 299 decode steps with a growth step of 64 rows: the dense layers grow at
  // rows 64, 128, 192 and 256; a sliding-window layer's cache (window 16 in the gemma3 and
  // cohere2 fixtures) wraps many times.
  constexpr int64_t kStep = 64;
  const uint64_t layers = uint64_t(model_->info().n_layers);
  const bool dense = [&] {
    SequenceCache c = model_->make_cache({});
    return all_dense(c);
  }();
  std::vector<int32_t> first;
  for (const Mode& m : all_modes()) {
    GenerateResult r = run(m, SamplerParams{}, 300, nullptr, {}, {5, 99, 23, 311, 8, 140, 77, 3}, kStep);
    ASSERT_EQ(r.tokens.size(), 300u) << m.str();
    if (first.empty()) first = r.tokens;
    EXPECT_EQ(r.tokens, first) << m.str();
    EXPECT_TRUE(r.stats.device_sampling);
    EXPECT_EQ(r.stats.pipelined, m.pipelined) << m.str();
    // The prefill and 299 single-row writes per layer, each counted once.
    EXPECT_EQ(r.stats.kv.n_inplace_writes + r.stats.kv.n_copying_writes, layers * 300) << m.str();
    if (!m.inplace) {
      EXPECT_EQ(r.stats.kv.n_inplace_writes, 0u) << m.str();
    }
    if (m.inplace && dense) {
      // A copying write at the prefill and at each of the 4 growths, every other step in place.
      EXPECT_EQ(r.stats.kv.n_copying_writes, layers * 5) << m.str();
    } else if (m.inplace) {
      EXPECT_LE(r.stats.kv.n_copying_writes, layers * 5) << m.str();
    }
    if (m.inplace && m.graphs) {
      if (dense) {
        EXPECT_EQ(r.stats.n_graph_captures, 5u) << m.str();  // one per buffer generation
      }
      EXPECT_GE(r.stats.n_graph_captures, 1u) << m.str();
      EXPECT_LE(r.stats.n_graph_captures, 5u) << m.str();
      EXPECT_GE(r.stats.n_graph_replays, 280u) << m.str();
    } else {
      EXPECT_EQ(r.stats.n_graph_captures, 0u) << m.str();
      EXPECT_EQ(r.stats.n_graph_replays, 0u) << m.str();
    }
  }
}

TEST_P(DecodeModes, SampledOutputIsIdenticalInEveryMode) {
  SamplerParams sp{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7, .logit_bias = {}};
  std::vector<int32_t> first;
  for (const Mode& m : all_modes()) {
    GenerateResult r = run(m, sp, 280);
    ASSERT_EQ(r.tokens.size(), 280u) << m.str();
    if (first.empty()) first = r.tokens;
    EXPECT_EQ(r.tokens, first) << m.str();
  }
  // The draw depends on the seed.
  sp.seed = 8;
  EXPECT_NE(run(all_modes()[0], sp, 280).tokens, first);
}

TEST_P(DecodeModes, AStopWhilePipelinedRewindsTheCacheByOne) {
  const Mode sync{true, true, false}, piped{true, true, true};
  const std::vector<int32_t> full = run(sync, SamplerParams{}, 60).tokens;
  ASSERT_EQ(full.size(), 60u);
  // A stop id whose first occurrence is at k >= 10.
  size_t k = 10;
  while (k < full.size() && std::find(full.begin(), full.begin() + long(k), full[k]) != full.begin() + long(k)) ++k;
  ASSERT_LT(k, full.size()) << "no token first seen after step 10";
  std::vector<int32_t> cont[2];
  for (int p = 0; p < 2; ++p) {
    const Mode& m = p ? piped : sync;
    KVCacheParams co;
    SequenceCache cache = model_->make_cache(co);
    GenerateResult r = run(m, SamplerParams{}, 60, &cache, {full[k]});
    EXPECT_EQ(r.stats.stop_reason, "stop") << m.str();
    EXPECT_EQ(r.tokens, std::vector<int32_t>(full.begin(), full.begin() + long(k))) << m.str();
    EXPECT_EQ(cache.offset(), 8 + int64_t(k)) << m.str();
    // Continuing on the same cache: the rewound row is written again, in place.
    GenerateResult c = run(m, SamplerParams{}, 40, &cache, {}, {full[k]});
    cont[p] = c.tokens;
    EXPECT_GT(c.stats.kv.n_inplace_writes, 0u) << m.str();
  }
  EXPECT_EQ(cont[0], cont[1]);
  // And both equal the uninterrupted run (which fed full[k] at the same position).
  EXPECT_EQ(std::vector<int32_t>(cont[0].begin(), cont[0].begin() + 20),
            std::vector<int32_t>(full.begin() + long(k) + 1, full.begin() + long(k) + 21));
}

TEST_P(DecodeModes, ARestoredSnapshotIsNotOverwrittenByAReplayedGraph) {
  const Mode m{true, true, true};
  KVCacheParams co;
  SequenceCache cache = model_->make_cache(co);
  run(m, SamplerParams{}, 20, &cache);
  const std::vector<KVState> snap = cache.snapshot();
  const std::vector<int32_t> a = run(m, SamplerParams{}, 50, &cache, {}, {42}).tokens;
  cache.restore(snap);
  const std::vector<int32_t> b = run(m, SamplerParams{}, 50, &cache, {}, {42}).tokens;
  EXPECT_EQ(a, b);
  cache.restore(snap);
  const std::vector<int32_t> c = run(Mode{false, false, false}, SamplerParams{}, 50, &cache, {}, {42}).tokens;
  EXPECT_EQ(a, c);
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeModes, ::testing::ValuesIn(testing::kFamilies),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');  // gemma3-mm
                           return name;
                         });

TEST(DecodeModesCli, EnvironmentSwitchesReachTheGenerator) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
  const std::string args = "generate -m " + fixture("llama").string() + " --device cuda --token-ids 5,99,23 -n 300 --ignore-eos --json";
  auto base = testing::run_osprey(args);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto jb = nlohmann::json::parse(base.out);
  EXPECT_TRUE(jb["timings"]["pipelined"].get<bool>());
  EXPECT_GT(jb["timings"]["graph_replays"].get<int>(), 0);
  for (const char* env : {"OSPREY_FORCE_SYNC=1", "OSPREY_CUDA_GRAPHS=0", "OSPREY_KV_INPLACE_WRITE=0"}) {
    auto r = testing::run_osprey(args, env);
    ASSERT_EQ(r.exit_code, 0) << env << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"], jb["tokens"]) << env;
    if (std::string(env) == "OSPREY_FORCE_SYNC=1") EXPECT_FALSE(j["timings"]["pipelined"].get<bool>());
    else EXPECT_EQ(j["timings"]["graph_replays"].get<int>(), 0) << env;
  }
}

}  // namespace osprey
