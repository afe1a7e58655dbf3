// Sliding-window layers in the paged pool (kv/paged_pool.h's window, kv/paged_pools.h's
// groups): a windowed pool gives back the blocks that no later query sees, keeps them findable
// in its prefix cache until they are evicted, refuses to rewind into them, and a model's
// full-attention and windowed layers keep their blocks in pools of their own. The expected
// counts come from the window's definition (a query at position p sees (p - window, p]),
// written out here, not from the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/paged_pools.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;
using SeqId = PagedPool::SeqId;
using Tokens = std::vector<int32_t>;

constexpr int64_t kBlock = 4;

KVCacheParams layer(int64_t window) {
  KVCacheParams c;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.dtype = DType::f16;
  c.window = window;
  return c;
}

PagedPoolParams windowed(int64_t window, int64_t n_blocks) {
  PagedPoolParams p;
  p.layers = {layer(window)};
  p.window = window;
  p.block_size = kBlock;
  p.n_blocks = n_blocks;
  return p;
}

Tokens tokens(int64_t n, int32_t first = 100) {
  Tokens t;
  for (int64_t i = 0; i < n; ++i) t.push_back(first + int32_t(i) * 7 % 50);
  return t;
}

// Rows a query at position `length` and later no longer sees, in whole blocks.
int64_t unseen_block_rows(int64_t length, int64_t window) {
  const int64_t first_seen = std::max<int64_t>(0, length - window + 1);
  return first_seen / kBlock * kBlock;
}

// Writes rows one at a time up to `n`, giving back what falls out of the window after each.
void decode_to(PagedPool& pool, SeqId s, const Tokens& t, int64_t n, bool cache) {
  while (pool.length(s) < n) {
    ASSERT_TRUE(pool.reserve(s, 1));
    pool.commit(s, 1);
    pool.release_behind(s, t, cache);
  }
}

TEST(PagedWindowPool, GivesBackTheBlocksNoLaterQuerySees) {
  constexpr int64_t kWindow = 6;
  PagedPool pool(windowed(kWindow, 16));
  const SeqId s = pool.create();
  const Tokens t = tokens(40);
  for (int64_t len = 1; len <= 40; ++len) {
    decode_to(pool, s, t, len, false);
    const int64_t released = unseen_block_rows(len, kWindow);
    ASSERT_EQ(pool.released_rows(s), released) << "length " << len;
    const std::vector<int32_t>& table = pool.block_table(s);
    for (int64_t b = 0; b < int64_t(table.size()); ++b)
      EXPECT_EQ(table[size_t(b)] < 0, b * kBlock < released) << "length " << len << ", block " << b;
    const int64_t held = (len + kBlock - 1) / kBlock - released / kBlock;
    EXPECT_EQ(pool.stats().n_in_use, held) << "length " << len;
    EXPECT_EQ(pool.stats().n_free, 16 - held) << "length " << len << ": given back blocks are free without caching";
  }
  // 40 rows in a pool of 16 blocks (64 rows) whose window needs at most 3.
  EXPECT_LE(pool.stats().n_in_use, 3);
  pool.free(s);
  EXPECT_EQ(pool.stats().n_free, 16);
}

TEST(PagedWindowPool, ALongSequenceFitsAPoolSmallerThanIt) {
  // 8 blocks hold 32 rows; the window's rows and the one being written take at most 3 blocks.
  PagedPool pool(windowed(6, 8));
  const SeqId s = pool.create();
  decode_to(pool, s, tokens(200), 200, false);
  EXPECT_EQ(pool.length(s), 200);
}

TEST(PagedWindowPool, RewindsOnlyAsFarAsTheWindowStillHoldsRows) {
  constexpr int64_t kWindow = 6;
  PagedPool pool(windowed(kWindow, 16));
  const SeqId s = pool.create();
  decode_to(pool, s, tokens(20), 20, false);
  ASSERT_EQ(pool.released_rows(s), 12);  // the query at 20 sees 15..20
  // A query at 17 sees 12..17: every row it needs is held.
  pool.truncate(s, 17);
  EXPECT_EQ(pool.length(s), 17);
  // A query at 16 would see row 11, given back.
  const std::string e = error_of<InvalidInput>([&] { pool.truncate(s, 16); });
  EXPECT_NE(e.find("given back"), std::string::npos) << e;
  EXPECT_EQ(pool.length(s), 17);
}

TEST(PagedWindowPool, GivenBackBlocksStayFindableInThePrefixCache) {
  PagedPool pool(windowed(6, 16));
  const Tokens t = tokens(40);
  const SeqId s = pool.create();
  ASSERT_EQ(pool.match_prefix(s, t, 0), 0);
  std::vector<int32_t> held;  // the block that held each block's rows
  while (pool.length(s) < 40) {
    ASSERT_TRUE(pool.reserve(s, 1));
    pool.commit(s, 1);
    const std::vector<int32_t>& table = pool.block_table(s);
    if (held.size() < table.size()) held.push_back(table.back());
    pool.release_behind(s, t, true);
  }
  EXPECT_GT(pool.released_rows(s), 0);
  EXPECT_GT(pool.stats().n_cached, 0) << "the given back blocks are the prefix cache's";
  pool.cache_prefix(s, t);
  pool.free(s);

  // A prompt with the same 40 tokens finds every block, and holds those of its window: a query
  // at 40 sees rows (34, 40), blocks 8 and 9, each the one that held its rows.
  const SeqId again = pool.create();
  EXPECT_EQ(pool.match_prefix(again, t, 40), 40);
  std::vector<int32_t> window_only(8, -1);
  window_only.insert(window_only.end(), held.begin() + 8, held.end());
  EXPECT_EQ(pool.block_table(again), window_only);
  EXPECT_EQ(pool.released_rows(again), 32);
  pool.free(again);

  // Other prompts take every block: the cached ones are evicted, and a match finds a prefix of
  // the chain only, whose blocks are still the ones that held it.
  const SeqId other = pool.create();
  ASSERT_TRUE(pool.reserve(other, 15 * kBlock));
  const SeqId third = pool.create();
  const int64_t found = pool.match_prefix(third, t, 40);
  EXPECT_LT(found, 40);
  const std::vector<int32_t>& table = pool.block_table(third);
  for (size_t b = 0; b < table.size(); ++b)
    if (table[b] >= 0) EXPECT_EQ(table[b], held[b]) << "block " << b;
}

TEST(PagedWindowPool, AnEvictedHeadLeavesALinkAndTheWindowsBehindItStayUsable) {
  // 40 rows (10 blocks) cached in a pool of 16 with a window of 6; then another sequence takes
  // the 6 free blocks and 4 more: the least recently given back, blocks 0 to 3, lose their rows
  // but stay in the chain as links. A prefix of k blocks is usable where the blocks of a query
  // at 4k's window, rows (4k - 6, 4k), hold their rows: from rows 4k - 5 on, block (4k - 5) / 4.
  PagedPool pool(windowed(6, 16));
  const Tokens t = tokens(40);
  const SeqId s = pool.create();
  std::vector<int32_t> held;
  while (pool.length(s) < 40) {
    ASSERT_TRUE(pool.reserve(s, 1));
    pool.commit(s, 1);
    const std::vector<int32_t>& table = pool.block_table(s);
    if (held.size() < table.size()) held.push_back(table.back());
    pool.release_behind(s, t, true);
  }
  pool.cache_prefix(s, t);
  pool.free(s);
  const SeqId other = pool.create();
  ASSERT_TRUE(pool.reserve(other, 10 * kBlock));
  EXPECT_EQ(pool.stats().n_evicted, 4u);
  EXPECT_EQ(pool.stats().n_cached, 6);

  // k = 0 .. 10: k = 1, 2 need blocks 0 (rows 0 .. 3, from row max(0, 4k - 5)); k = 3 needs
  // block 1; k = 4 block 2; k = 5 block 3 (row 15); k = 6 .. 10 blocks 4 .. 8, all held.
  const std::vector<bool> want{true, false, false, false, false, false, true, true, true, true, true};
  EXPECT_EQ(pool.usable_prefixes(t, 40), want);
  const SeqId again = pool.create();
  EXPECT_EQ(pool.match_prefix(again, t, 40), 40);
  std::vector<int32_t> window_only(8, -1);
  window_only.insert(window_only.end(), held.begin() + 8, held.end());
  EXPECT_EQ(pool.block_table(again), window_only);
  pool.free(again);

  // A prompt leaving the chain after 26 tokens: 6 blocks, whose window (rows 19 to 23) is in
  // block 4, held.
  Tokens branch(t.begin(), t.begin() + 26);
  branch.push_back(7);
  const SeqId b = pool.create();
  EXPECT_EQ(pool.match_prefix(b, branch, 27), 24);
  EXPECT_EQ(pool.block_table(b), (std::vector<int32_t>{-1, -1, -1, -1, held[4], held[5]}));
  pool.free(b);
  // One leaving it after 18: 4 blocks would need block 2, 3 blocks block 1: nothing usable.
  Tokens early(t.begin(), t.begin() + 18);
  early.push_back(7);
  const SeqId e = pool.create();
  EXPECT_EQ(pool.match_prefix(e, early, 19), 0);
  EXPECT_TRUE(pool.block_table(e).empty());
  pool.free(e);

  // The chain is whole, links and blocks.
  pool.free(other);
  EXPECT_EQ(pool.find_chain(t, 10).size(), 10u);
  EXPECT_EQ(pool.stats().n_in_use, 0);
}

TEST(PagedWindowPool, AForkSharesTheHeldBlocksAndTheGapsBeforeThem) {
  PagedPool pool(windowed(6, 16));
  const SeqId s = pool.create();
  decode_to(pool, s, tokens(22), 22, false);
  const SeqId child = pool.fork(s);
  EXPECT_EQ(pool.block_table(child), pool.block_table(s));
  EXPECT_EQ(pool.released_rows(child), pool.released_rows(s));
  decode_to(pool, child, tokens(30), 30, false);
  decode_to(pool, s, tokens(30), 30, false);
  pool.free(s);
  pool.free(child);
  EXPECT_EQ(pool.stats().n_in_use, 0);
  EXPECT_EQ(pool.stats().n_free, 16);
}

PagedPoolsParams mixed(std::vector<int64_t> n_blocks) {
  PagedPoolsParams p;
  p.layers = {layer(0), layer(6), layer(6), layer(0), layer(6)};
  p.block_size = kBlock;
  p.n_blocks = std::move(n_blocks);
  return p;
}

TEST(PagedPools, FullAttentionAndWindowedLayersKeepBlocksOfTheirOwn) {
  PagedPools pools(mixed({40, 8}));
  ASSERT_EQ(pools.n_groups(), 2u);
  EXPECT_EQ(pools.window(0), 0);
  EXPECT_EQ(pools.window(1), 6);
  EXPECT_EQ(std::vector<size_t>({pools.group_of(0), pools.group_of(1), pools.group_of(2), pools.group_of(3),
                                 pools.group_of(4)}),
            std::vector<size_t>({0, 1, 1, 0, 1}));
  EXPECT_EQ(pools.keys(3).dim(0), 40);  // the full-attention group's blocks
  EXPECT_EQ(pools.keys(4).dim(0), 8);
  EXPECT_EQ(pools.block_bytes(0), 2 * 2 * kBlock * 4 * 2);  // two layers' keys and values in f16
  EXPECT_EQ(pools.block_bytes(1), 3 * 2 * kBlock * 4 * 2);

  const SeqId s = pools.create();
  const Tokens t = tokens(100);
  for (int64_t len = 1; len <= 100; ++len) {
    ASSERT_TRUE(pools.reserve(s, 1)) << "length " << len;
    pools.commit(s, 1);
    pools.release_behind(s, std::span<const int32_t>(t).first(size_t(len)), false, "");
  }
  EXPECT_EQ(pools.stats(0).n_in_use, 25);  // every row
  EXPECT_LE(pools.stats(1).n_in_use, 3);   // the window's
  EXPECT_EQ(pools.bytes_in_use(), 25 * pools.block_bytes(0) + pools.stats(1).n_in_use * pools.block_bytes(1));
  pools.free(s);
  EXPECT_EQ(pools.bytes_in_use(), 0);
}

TEST(PagedPools, AReservationThatOneGroupCannotTakeChangesNoGroup) {
  PagedPools pools(mixed({2, 40}));
  const SeqId s = pools.create();
  EXPECT_FALSE(pools.reserve(s, 3 * kBlock));  // the full-attention group has 2 blocks
  EXPECT_EQ(pools.stats(0).n_in_use, 0);
  EXPECT_EQ(pools.stats(1).n_in_use, 0);
  EXPECT_TRUE(pools.reserve(s, 2 * kBlock));
}

TEST(PagedPools, APrefixIsOnlyWhatEveryGroupStillHolds) {
  // The windowed group holds the 10 blocks of 40 rows (given back ones cached) without evicting.
  PagedPools pools(mixed({40, 12}));
  const Tokens t = tokens(40);
  const SeqId s = pools.create();
  for (int64_t len = 1; len <= 40; ++len) {
    ASSERT_TRUE(pools.reserve(s, 1));
    pools.commit(s, 1);
    pools.release_behind(s, std::span<const int32_t>(t).first(size_t(len)), true, "");
  }
  pools.cache_prefix(s, t);
  // The windowed group's given back blocks are found in its prefix cache: a file of the run can
  // be written from them.
  EXPECT_EQ(pools.run_blocks(s, 1, t, 0, 10, "").size(), 10u);
  pools.free(s);
  const SeqId again = pools.create();
  EXPECT_EQ(pools.match_prefix(again, t, 40), 40);
  pools.free(again);

  // Another sequence takes every windowed block: the windowed chain is evicted, so no prefix is
  // held by both groups, and the full-attention group's match is cut back to it.
  const SeqId other = pools.create();
  ASSERT_TRUE(pools.reserve(other, 12 * kBlock));
  const SeqId third = pools.create();
  EXPECT_EQ(pools.match_prefix(third, t, 40), 0);
  EXPECT_EQ(pools.length(third), 0);
  EXPECT_TRUE(pools.block_table(third, 0).empty());
  EXPECT_TRUE(pools.run_blocks(third, 1, t, 0, 10, "").empty());
}

TEST(PagedPools, ALayerWithoutAWindowMakesOneGroup) {
  PagedPoolsParams p;
  p.layers = {layer(0), layer(0)};
  p.block_size = kBlock;
  p.n_blocks = {8};
  PagedPools pools(p);
  EXPECT_EQ(pools.n_groups(), 1u);
  p.n_blocks = {8, 8};
  const std::string e = error_of<InvalidInput>([&] { PagedPools bad(p); });
  EXPECT_NE(e.find("2 block counts for 1 groups"), std::string::npos) << e;
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// The KV bytes one 32k-token sequence of the Gemma 3 4B shape holds (google/gemma-3-4b-it's
// text config: 34 layers, every sixth full attention and the others a window of 1,024 rows, 4
// K/V heads of 256, bfloat16), its prompt written in chunks of 512 as the server's scheduler
// does, against one pool keeping every row of every layer. Run by hand for the record:
//   build/osprey_tests --gtest_also_run_disabled_tests --gtest_filter='*Gemma3FourB*'
TEST(PagedPools, DISABLED_Gemma3FourBBytesOfA32kSequence) {
  constexpr int64_t kLayers = 34, kWindow = 1024, kRows = 32768, kChunk = 512, kBlockRows = 16;
  PagedPoolsParams p;
  for (int64_t l = 0; l < kLayers; ++l) {
    KVCacheParams c;
    c.n_kv_heads = 4;
    c.head_dim = 256;
    c.dtype = DType::bf16;
    c.window = (l + 1) % 6 == 0 ? 0 : kWindow;
    p.layers.push_back(c);
  }
  p.block_size = kBlockRows;
  p.n_blocks = {kRows / kBlockRows, (kWindow + kChunk) / kBlockRows + 2};
  PagedPools pools(p);
  const SeqId s = pools.create();
  std::vector<int32_t> t;
  int64_t peak = 0;
  while (pools.length(s) < kRows) {
    ASSERT_TRUE(pools.reserve(s, kChunk));
    pools.commit(s, kChunk);
    t.resize(size_t(pools.length(s)), 1);
    pools.release_behind(s, t, false, "");
    peak = std::max(peak, pools.bytes_in_use());
  }
  PagedPoolParams every;
  every.layers = p.layers;
  every.block_size = kBlockRows;
  const int64_t all_rows = kRows / kBlockRows * paged_block_bytes(every);
  std::printf("Gemma 3 4B, %lld tokens: %.1f MiB held (peak %.1f MiB) against %.1f MiB for every row of every "
              "layer: %.1f%%\n",
              (long long)kRows, double(pools.bytes_in_use()) / 1048576.0, double(peak) / 1048576.0,
              double(all_rows) / 1048576.0, 100.0 * double(pools.bytes_in_use()) / double(all_rows));
  EXPECT_LT(pools.bytes_in_use(), all_rows);
}

}  // namespace
}  // namespace osprey
