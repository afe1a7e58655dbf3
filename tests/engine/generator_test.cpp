// The generation loop: stop conditions, and the two KV write paths giving byte-identical
// greedy output with the in-place arm writing every decode step in place except growths.
#include <gtest/gtest.h>

#include "serve/generate.h"
#include "model/model.h"
#include "support/test_util.h"

namespace osprey {
namespace {

struct GreedyRun {
  std::vector<int32_t> tokens;
  KVCounters kv;
};

GreedyRun greedy(Model& model, const std::vector<int32_t>& prompt, int n, bool inplace) {
  KVCacheParams co;
  co.inplace = inplace;
  SequenceCache cache = model.make_cache(co);
  GenerateParams gp;
  gp.max_tokens = n;
  GenerateResult r = generate(model, cache, prompt, gp);
  return {r.tokens, r.stats.kv};
}

}  // namespace

TEST(Generator, StopsAtAStopIdWithoutEmittingIt) {
  testing::TempDir d;
  testing::write_tiny_llama(d.path(), testing::tiny_llama_config());
  auto model = load_model(d.path());
  GreedyRun free_run = greedy(*model, {1, 2, 3}, 20, true);
  ASSERT_EQ(free_run.tokens.size(), 20u);
  SequenceCache cache = model->make_cache({});
  GenerateParams gp;
  gp.max_tokens = 20;
  gp.stop_ids = {free_run.tokens[5]};
  GenerateResult r = generate(*model, cache, std::vector<int32_t>{1, 2, 3}, gp);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[5]);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(free_run.tokens.begin(), first));
  EXPECT_EQ(r.stats.stop_reason, "stop");
}

TEST(Generator, KVWritePathsGiveIdenticalGreedyOutputAcrossGrowth) {
  testing::TempDir d;
  auto cfg = testing::tiny_llama_config();
  testing::write_tiny_llama(d.path(), cfg, 11);
  auto model = load_model(d.path());
  const std::vector<int32_t> prompt = {1, 9, 4, 33, 12, 5, 7};
  constexpr int kN = 300;
  GreedyRun in_place = greedy(*model, prompt, kN, true);
  GreedyRun copying = greedy(*model, prompt, kN, false);
  ASSERT_EQ(in_place.tokens.size(), size_t(kN));
  EXPECT_EQ(in_place.tokens, copying.tokens);

  // Decode steps write rows P .. P + kN - 2; the ones at a multiple of 256 need growth.
  const int64_t P = int64_t(prompt.size()), layers = cfg["num_hidden_layers"];
  int64_t growths = 0;
  for (int64_t row = P; row < P + kN - 1; ++row) growths += row % 256 == 0;
  ASSERT_EQ(growths, 1);
  EXPECT_EQ(in_place.kv.n_copying_writes, uint64_t(layers * (1 + growths)));
  EXPECT_EQ(in_place.kv.n_inplace_writes, uint64_t(layers * (kN - 1 - growths)));
  EXPECT_EQ(copying.kv.n_inplace_writes, 0u);
  EXPECT_EQ(copying.kv.n_copying_writes, uint64_t(layers * kN));
}

}  // namespace osprey
