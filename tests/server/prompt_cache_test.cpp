#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/dense_cache.h"
#include "server/prompt_cache.h"

namespace osprey {
namespace {

// A one-layer cache state holding `n` rows (row r's values all r + salt).
std::vector<KVState> state_of(int64_t n, float salt = 0) {
  KVCacheParams p;
  p.n_kv_heads = 1;
  p.head_dim = 4;
  p.step = 16;
  DenseKVCache c(p);
  Array k = Array::empty({n, 1, 4}, DType::f32);
  for (int64_t i = 0; i < n * 4; ++i) k.data<float>()[i] = float(i / 4) + salt;
  c.update_and_fetch(k, k);
  return {c.snapshot()};
}

}  // namespace

TEST(PromptCache, LookupFindsTheLongestCommonPrefixTokenByToken) {
  PromptCache pc(1 << 20);
  pc.store({1, 2, 3, 4}, state_of(4));
  pc.store({1, 2, 9}, state_of(3));
  auto m = pc.lookup(std::vector<int32_t>{1, 2, 3, 7}, 100);
  ASSERT_TRUE(m.entry);
  EXPECT_EQ(m.n_common, 3u);
  EXPECT_EQ(m.entry->tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  m = pc.lookup(std::vector<int32_t>{1, 2, 9, 9}, 100);
  ASSERT_TRUE(m.entry);
  EXPECT_EQ(m.entry->tokens, (std::vector<int32_t>{1, 2, 9}));
  EXPECT_FALSE(pc.lookup(std::vector<int32_t>{5, 1, 2}, 100).entry);
  // max_use 0 (a one-token prompt) can reuse nothing.
  EXPECT_FALSE(pc.lookup(std::vector<int32_t>{1}, 0).entry);
  const PromptCacheStats s = pc.stats();
  EXPECT_EQ(s.n_hits, 2u);
  EXPECT_EQ(s.n_misses, 2u);
  EXPECT_EQ(s.n_restored_tokens, 6u);
}

TEST(PromptCache, AnExtendingEntryReplacesItsPrefixAndACoveredOneIsNotStored) {
  PromptCache pc(1 << 20);
  pc.store({1, 2}, state_of(2));
  pc.store({1, 2, 3}, state_of(3));
  EXPECT_EQ(pc.stats().n_entries, 1u);
  pc.store({1, 2}, state_of(2));
  EXPECT_EQ(pc.stats().n_entries, 1u);
  EXPECT_EQ(pc.stats().n_stored, 2u);
  EXPECT_EQ(pc.lookup(std::vector<int32_t>{1, 2, 3, 4}, 10).entry->tokens.size(), 3u);
}

TEST(PromptCache, EvictsTheLeastRecentlyUsedPastTheBudget) {
  const uint64_t one = snapshot_bytes(state_of(3));
  ASSERT_GT(one, 0u);
  PromptCache pc(2 * one + one / 2);
  pc.store({1, 1, 1}, state_of(3));
  pc.store({2, 2, 2}, state_of(3));
  ASSERT_TRUE(pc.lookup(std::vector<int32_t>{1, 1, 1, 5}, 10).entry);  // 1 is now the most recent
  pc.store({3, 3, 3}, state_of(3));                                    // evicts 2
  EXPECT_EQ(pc.stats().n_evictions, 1u);
  EXPECT_EQ(pc.stats().bytes, 2 * one);
  EXPECT_TRUE(pc.lookup(std::vector<int32_t>{1, 1, 1}, 10).entry);
  EXPECT_TRUE(pc.lookup(std::vector<int32_t>{3, 3, 3}, 10).entry);
  EXPECT_FALSE(pc.lookup(std::vector<int32_t>{2, 2, 2}, 10).entry);
}

TEST(PromptCache, AnEntryLargerThanTheBudgetIsNotKept) {
  PromptCache pc(snapshot_bytes(state_of(3)) - 1);
  pc.store({1, 2, 3}, state_of(3));
  EXPECT_EQ(pc.stats().n_entries, 0u);
  EXPECT_EQ(pc.stats().bytes, 0u);
}

TEST(PromptCache, ZeroBudgetDisablesIt) {
  PromptCache pc(0);
  EXPECT_FALSE(pc.enabled());
  pc.store({1, 2, 3}, state_of(3));
  EXPECT_FALSE(pc.lookup(std::vector<int32_t>{1, 2, 3}, 3).entry);
  EXPECT_EQ(pc.stats().n_entries, 0u);
}

TEST(PromptCache, ChecksumsSeeAChangedRow) {
  PromptCache pc(1 << 20, /*keep_checksums=*/true);
  std::vector<KVState> st = state_of(3);
  pc.store({1, 2, 3}, st);
  auto c = pc.checksums();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].at_store, c[0].now);
  // Poison one live value row behind the cache's back: the checksum must see it.
  uint16_t* v = static_cast<uint16_t*>(st[0].values.raw());
  v[1 * 4 + 2] ^= 0x0100;
  c = pc.checksums();
  EXPECT_NE(c[0].at_store, c[0].now);
}

TEST(PromptCache, ASnapshotWhoseLengthDisagreesIsRejected) {
  PromptCache pc(1 << 20);
  EXPECT_THROW(pc.store({1, 2}, state_of(3)), InvalidInput);
}

}  // namespace osprey
