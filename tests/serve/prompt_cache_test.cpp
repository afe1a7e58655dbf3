#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/dense_cache.h"
#include "kv/rotating_cache.h"
#include "serve/prompt_cache.h"
#include "support/kv_params.h"

namespace osprey {
namespace {

// A one-layer cache state holding `n` rows (row r's values all r + salt).
std::vector<KVState> state_of(int64_t n, float salt = 0) {
  KVCacheParams p = testing::kv_params(1, 4);
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

TEST(PromptCache, AnUnusableMatchCountsNeitherAsAHitNorAsRestoredTokens) {
  PromptCache pc(1 << 20);
  pc.store({1, 2, 3, 4}, state_of(4));
  ASSERT_TRUE(pc.lookup(std::vector<int32_t>{1, 2, 3, 9}, 3).entry);
  ASSERT_TRUE(pc.lookup(std::vector<int32_t>{1, 2, 7}, 2).entry);
  pc.unusable(2);
  PromptCacheStats s = pc.stats();
  EXPECT_EQ(s.n_hits, 1u);
  EXPECT_EQ(s.n_restored_tokens, 3u);
  EXPECT_EQ(s.n_unusable, 1u);
  EXPECT_EQ(s.n_misses, 0u);
  // More than the lookups restored: no lookup returned that match.
  EXPECT_THROW(pc.unusable(4), InvalidInput);
  pc.unusable(3);
  EXPECT_THROW(pc.unusable(0), InvalidInput);
  EXPECT_EQ(pc.stats().n_unusable, 2u);
}

TEST(PromptCache, ChecksumsOfAWrappedRingHashItsRowsOnly) {
  // Ten positions through a ring of four rows: the snapshot's offset (10) exceeds its rows.
  KVCacheParams p = testing::kv_params(1, 4);
  p.window = 4;
  RotatingKVCache c(p);
  Array k = Array::empty({10, 1, 4}, DType::f32);
  for (int64_t i = 0; i < 40; ++i) k.data<float>()[i] = float(i);
  c.update_and_fetch(k, k);
  std::vector<KVState> st = {c.snapshot()};
  ASSERT_EQ(st[0].offset, 10);
  ASSERT_EQ(st[0].keys.dim(1), 4);
  PromptCache pc(1 << 20, /*keep_checksums=*/true);
  pc.store(std::vector<int32_t>(10, 1), st);
  auto sums = pc.checksums();
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums[0].at_store, sums[0].now);
  // The last row of the ring (position 7) is part of it.
  uint16_t* v = static_cast<uint16_t*>(st[0].values.raw());
  v[3 * 4 + 1] ^= 0x0100;
  EXPECT_NE(pc.checksums()[0].at_store, pc.checksums()[0].now);
}

TEST(PromptCache, ASnapshotWhoseLengthDisagreesIsRejected) {
  PromptCache pc(1 << 20);
  EXPECT_THROW(pc.store({1, 2}, state_of(3)), InvalidInput);
}

}  // namespace osprey
