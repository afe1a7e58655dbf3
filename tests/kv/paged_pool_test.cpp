#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/paged_pool.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;

using SeqId = PagedPool::SeqId;
using Tokens = std::vector<int32_t>;

constexpr int64_t kLayers = 2, kHeads = 2, kDim = 4, kBlock = 4;

PagedPoolParams pool_params(int64_t n_blocks = 32, int64_t block_size = kBlock) {
  PagedPoolParams p;
  for (int64_t l = 0; l < kLayers; ++l) {
    KVCacheParams c;
    c.n_kv_heads = kHeads;
    c.head_dim = kDim;
    c.dtype = DType::f16;
    p.layers.push_back(c);
  }
  p.block_size = block_size;
  p.n_blocks = n_blocks;
  return p;
}

// The pool without the copy-on-write rule: every block counts as writable in place.
class AlwaysInPlacePool final : public PagedPool {
 public:
  using PagedPool::PagedPool;

 protected:
  bool writable_in_place(SeqId, int32_t) const override { return true; }
};

// Every chain key collides.
class CollidingPool final : public PagedPool {
 public:
  using PagedPool::PagedPool;

 protected:
  uint64_t chain_key(uint64_t, std::span<const int32_t>) const override { return 42; }
};

// The test's own hash of a token prefix (independent of the pool's chain keys): row r of a
// sequence stores what "attention over tokens[0 .. r]" would, so rows of one prefix are equal
// whoever wrote them and rows of different prefixes differ.
std::vector<uint64_t> prefix_hashes(const Tokens& tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t x = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    x = (x ^ uint64_t(uint32_t(tokens[i]) + 1)) * 1099511628211ull;
    h[i] = x;
  }
  return h;
}

// The 16-bit pattern one stored element holds (compared as bits, never as a number).
uint16_t cell(uint64_t prefix, int64_t layer, int kv, int64_t head, int64_t elem) {
  uint64_t x = prefix ^ (uint64_t(layer) << 48) ^ (uint64_t(kv) << 40) ^ (uint64_t(head) << 32) ^ uint64_t(elem);
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return uint16_t(x ^ (x >> 33));
}

uint16_t* element(const Array& a, int64_t slot, int64_t head, int64_t elem) {
  const int64_t bs = a.dim(2), block = slot / bs, row = slot % bs;
  const Shape& s = a.strides();
  return a.data<uint16_t>() + block * s[0] + head * s[1] + row * s[2] + elem * s[3];
}

// Appends `more` to a sequence the way the engine writes a step: reserve, write every layer's
// keys and values through slots(), commit. The model's tokens grow only when reserve succeeds.
bool append(PagedPool& pool, SeqId seq, Tokens& model, const Tokens& more) {
  const int64_t row0 = int64_t(model.size()), n = int64_t(more.size());
  if (!pool.reserve(seq, n)) return false;
  Tokens all = model;
  all.insert(all.end(), more.begin(), more.end());
  const std::vector<uint64_t> h = prefix_hashes(all);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  pool.slots(seq, row0, n, slots.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t l = 0; l < kLayers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t hd = 0; hd < kHeads; ++hd)
          for (int64_t d = 0; d < kDim; ++d)
            *element(kv ? pool.values(size_t(l)) : pool.keys(size_t(l)), slots[size_t(i)], hd, d) =
                cell(h[size_t(row0 + i)], l, kv, hd, d);
  pool.commit(seq, n);
  model = std::move(all);
  return true;
}

// Reads every row of the sequence through its block table; "" when each holds exactly what
// the model says, else the first wrong row.
std::string content_mismatch(const PagedPool& pool, SeqId seq, const Tokens& model) {
  const std::vector<uint64_t> h = prefix_hashes(model);
  const std::vector<int32_t>& table = pool.block_table(seq);
  const int64_t bs = pool.block_size();
  for (int64_t r = 0; r < int64_t(model.size()); ++r) {
    const int64_t slot = int64_t(table[size_t(r / bs)]) * bs + r % bs;
    for (int64_t l = 0; l < kLayers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t hd = 0; hd < kHeads; ++hd)
          for (int64_t d = 0; d < kDim; ++d)
            if (*element(kv ? pool.values(size_t(l)) : pool.keys(size_t(l)), slot, hd, d) !=
                cell(h[size_t(r)], l, kv, hd, d))
              return "sequence " + std::to_string(seq) + " row " + std::to_string(r) + " (block " +
                     std::to_string(table[size_t(r / bs)]) + ") layer " + std::to_string(l) + " holds another row";
  }
  return "";
}

Tokens iota_tokens(int n, int first) {
  Tokens t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

int64_t blocks_for(int64_t rows) { return (rows + kBlock - 1) / kBlock; }

// ---------------------------------------------------------------------------------------------
// Accounting and content under 10,000 random operations against a reference model.

struct Model {
  std::map<SeqId, Tokens> live;
};

// Checks the pool against the model; returns "" or what is wrong.
std::string check(const PagedPool& pool, const Model& model) {
  std::set<int32_t> held;
  for (const auto& [seq, tokens] : model.live) {
    if (pool.length(seq) != int64_t(tokens.size()))
      return "sequence " + std::to_string(seq) + " length " + std::to_string(pool.length(seq)) + ", model " +
             std::to_string(tokens.size());
    const std::vector<int32_t>& table = pool.block_table(seq);
    if (int64_t(table.size()) != blocks_for(int64_t(tokens.size())))
      return "sequence " + std::to_string(seq) + " holds " + std::to_string(table.size()) + " blocks";
    std::set<int32_t> own(table.begin(), table.end());
    if (own.size() != table.size()) return "sequence " + std::to_string(seq) + " holds a block twice";
    for (int32_t b : table) {
      if (b < 0 || b >= pool.n_blocks()) return "block id " + std::to_string(b) + " out of range";
      held.insert(b);
    }
    const std::string bad = content_mismatch(pool, seq, tokens);
    if (!bad.empty()) return bad;
  }
  const PagedPoolStats st = pool.stats();
  if (st.n_in_use != int64_t(held.size()))
    return "n_in_use " + std::to_string(st.n_in_use) + ", tables hold " + std::to_string(held.size());
  if (st.n_free + st.n_cached + st.n_in_use != pool.n_blocks() || st.n_blocks != pool.n_blocks())
    return "counts " + std::to_string(st.n_free) + " + " + std::to_string(st.n_cached) + " + " +
           std::to_string(st.n_in_use) + " != " + std::to_string(pool.n_blocks());
  if (pool.n_available() != st.n_free + st.n_cached) return "n_available is not free + cached";
  return "";
}

// The random walk's state and its operations, each mirrored in the model. A failed assertion
// ends the operation; the walk checks for it after each.
struct PoolWalk {
  static constexpr int kMaxLive = 8;

  PagedPool pool{pool_params()};
  Model model;
  std::mt19937 rng{20240611};
  std::vector<Tokens> prompts;  // token lists recently put in the prefix cache
  int n_failed_reserves = 0, n_exact_reuses = 0;

  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  Tokens random_tokens(int64_t n) {
    Tokens t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(uniform(0, 2));  // a tiny vocabulary: prefixes repeat often
    return t;
  }
  SeqId random_live() {
    auto it = model.live.begin();
    std::advance(it, uniform(0, int64_t(model.live.size()) - 1));
    return it->first;
  }
  void drop(SeqId s) {
    pool.free(s);
    model.live.erase(s);
  }

  // A new request whose prompt shares a random prefix with a live or cached one.
  void match_prefix(int op) {
    Tokens prompt;
    if (!prompts.empty() && uniform(0, 1)) {
      prompt = prompts[size_t(uniform(0, int64_t(prompts.size()) - 1))];
    } else if (!model.live.empty()) {
      prompt = model.live[random_live()];
    }
    prompt.resize(size_t(uniform(0, int64_t(prompt.size()))));
    const Tokens tail = random_tokens(uniform(0, 6));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const int64_t cap = uniform(0, int64_t(prompt.size()));
    const SeqId s = pool.create();
    const int64_t m = pool.match_prefix(s, prompt, cap);
    ASSERT_TRUE(m >= 0 && m % kBlock == 0 && m <= cap) << "op " << op << " matched " << m << " of cap " << cap;
    model.live[s] = Tokens(prompt.begin(), prompt.begin() + m);
  }

  void append_rows(int op) {
    const SeqId s = random_live();
    Tokens& tokens = model.live[s];
    const int64_t n = uniform(1, 9), len = int64_t(tokens.size());
    const std::vector<int32_t> table_before = pool.block_table(s);
    const int64_t available = pool.n_available();
    if (!append(pool, s, tokens, random_tokens(n))) {
      ++n_failed_reserves;
      // A refusal is honest (at most one copy more than the new blocks) and changes nothing.
      ASSERT_LT(available, blocks_for(len + n) - blocks_for(len) + 1) << "op " << op;
      ASSERT_EQ(pool.block_table(s), table_before) << "op " << op;
      ASSERT_EQ(pool.n_available(), available) << "op " << op;
    }
  }

  void truncate() {
    const SeqId s = random_live();
    Tokens& tokens = model.live[s];
    const int64_t to = uniform(0, int64_t(tokens.size()));
    pool.truncate(s, to);
    tokens.resize(size_t(to));
  }

  void cache_prefix(int op) {
    const SeqId s = random_live();
    const Tokens tokens = model.live[s];
    pool.cache_prefix(s, tokens);
    prompts.push_back(tokens);
    if (prompts.size() > 8) prompts.erase(prompts.begin());
    if (int(model.live.size()) < kMaxLive && uniform(0, 1)) {
      // Nothing was evicted since: every full block within the cap is found again.
      const int64_t cap = uniform(0, int64_t(tokens.size()));
      const SeqId t = pool.create();
      const int64_t m = pool.match_prefix(t, tokens, cap);
      ASSERT_EQ(m, cap / kBlock * kBlock) << "op " << op;
      model.live[t] = Tokens(tokens.begin(), tokens.begin() + m);
      ++n_exact_reuses;
    }
  }

  // Pressure: a new sequence takes every block the pool can give, evicting the cache.
  void fill(int op) {
    if (int(model.live.size()) >= kMaxLive) drop(random_live());
    const SeqId s = pool.create();
    Tokens& tokens = model.live[s];
    const int64_t rows = pool.n_available() * kBlock;
    if (rows > 0) {
      ASSERT_TRUE(append(pool, s, tokens, random_tokens(rows))) << "op " << op;
    }
    ASSERT_EQ(pool.n_available(), 0) << "op " << op;
    ASSERT_EQ(pool.stats().n_cached, 0) << "op " << op;
    if (uniform(0, 1)) drop(s);
  }

  // One random operation; returns its name. One that the state does not allow (no room for
  // another sequence, none live) gives way to the next kind.
  std::string step(int op) {
    const int kind = int(uniform(0, 19));
    const bool room = int(model.live.size()) < kMaxLive, any = !model.live.empty();
    if (kind < 2 && room) {
      model.live[pool.create()] = {};
      return "create";
    }
    if (kind < 5 && room) {
      match_prefix(op);
      return "match_prefix";
    }
    if (kind < 11 && any) {
      append_rows(op);
      return "append";
    }
    if (kind < 13 && any && room) {
      const SeqId s = random_live();
      const Tokens copy = model.live[s];
      model.live[pool.fork(s)] = copy;
      return "fork";
    }
    if (kind < 15 && any) {
      drop(random_live());
      return "free";
    }
    if (kind < 16 && any) {
      truncate();
      return "truncate";
    }
    if (kind < 18 && any) {
      cache_prefix(op);
      return "cache_prefix";
    }
    if (kind < 19) {
      fill(op);
      return "fill";
    }
    pool.clear_prefix_cache();
    EXPECT_EQ(pool.stats().n_cached, 0) << "op " << op;
    return "clear_prefix_cache";
  }
};

TEST(PagedPoolAccounting, RandomOperationsKeepCountsAndContent) {
  PoolWalk w;
  for (int op = 0; op < 10000; ++op) {
    const std::string what = w.step(op);
    ASSERT_FALSE(HasFailure()) << "after op " << op << " (" << what << ")";
    const std::string bad = check(w.pool, w.model);
    ASSERT_EQ(bad, "") << "after op " << op << " (" << what << ")";
  }

  // The random walk went through every path.
  const PagedPoolStats st = w.pool.stats();
  EXPECT_GT(st.n_cow, 100u);
  EXPECT_GT(st.n_evicted, 100u);
  EXPECT_GT(st.n_prefix_hits, 100u);
  EXPECT_GT(w.n_failed_reserves, 10);
  EXPECT_GT(w.n_exact_reuses, 10);

  for (const auto& [seq, tokens] : w.model.live) w.pool.free(seq);
  w.pool.clear_prefix_cache();
  EXPECT_EQ(w.pool.stats().n_free, w.pool.n_blocks());
  EXPECT_EQ(w.pool.stats().n_in_use, 0);
  EXPECT_EQ(w.pool.stats().n_cached, 0);
}

// ---------------------------------------------------------------------------------------------
// The copy-on-write rule's seam: without it, the content check above fails.

// Fork, then both write the next row. Returns the first wrong row of either sequence.
template <class Pool>
std::string fork_then_write() {
  Pool pool(pool_params());
  Tokens a, b;
  const SeqId sa = pool.create();
  EXPECT_TRUE(append(pool, sa, a, {10, 11, 12, 13, 14, 15}));
  const SeqId sb = pool.fork(sa);
  b = a;
  EXPECT_TRUE(append(pool, sa, a, {7}));
  EXPECT_TRUE(append(pool, sb, b, {8}));
  return content_mismatch(pool, sa, a) + content_mismatch(pool, sb, b);
}

// A cached block is rewritten by its sequence after a truncate, then matched by another.
template <class Pool>
std::string cache_then_write() {
  Pool pool(pool_params());
  Tokens a, b;
  const Tokens prompt{1, 2, 3, 4, 5, 6, 7, 8};
  const SeqId sa = pool.create();
  EXPECT_TRUE(append(pool, sa, a, prompt));
  pool.cache_prefix(sa, prompt);
  pool.truncate(sa, 6);
  a.resize(6);
  EXPECT_TRUE(append(pool, sa, a, {9}));
  const SeqId sb = pool.create();
  EXPECT_EQ(pool.match_prefix(sb, prompt, 8), 8);
  b = prompt;
  return content_mismatch(pool, sa, a) + content_mismatch(pool, sb, b);
}

TEST(PagedPoolCopyOnWrite, SharedBlocksKeepTheirRows) {
  EXPECT_EQ(fork_then_write<PagedPool>(), "");
  EXPECT_EQ(cache_then_write<PagedPool>(), "");
}

TEST(PagedPoolCopyOnWrite, WithoutTheRuleAnotherSequenceReadsAWrongRow) {
  EXPECT_NE(fork_then_write<AlwaysInPlacePool>(), "");
  EXPECT_NE(cache_then_write<AlwaysInPlacePool>(), "");
}

// ---------------------------------------------------------------------------------------------
// The prefix cache.

// A new sequence of `pool` holding `prompt`, put in the prefix cache; `written` is false where
// the pool had no room for the prompt.
struct CachedPrompt {
  SeqId seq;
  Tokens tokens;
  bool written;
};

CachedPrompt cache_prompt(PagedPool& pool, const Tokens& prompt) {
  CachedPrompt c{pool.create(), {}, false};
  c.written = append(pool, c.seq, c.tokens, prompt);
  pool.cache_prefix(c.seq, c.tokens);
  return c;
}

TEST(PagedPoolPrefix, ExactReuse) {
  PagedPool pool(pool_params());
  const Tokens prompt = iota_tokens(13, 100);
  auto [sa, a, written] = cache_prompt(pool, prompt);
  ASSERT_TRUE(written);
  const SeqId sb = pool.create();
  EXPECT_EQ(pool.match_prefix(sb, prompt, 100), 12);
  EXPECT_EQ(pool.length(sb), 12);
  const std::vector<int32_t> shared(pool.block_table(sa).begin(), pool.block_table(sa).begin() + 3);
  EXPECT_EQ(pool.block_table(sb), shared);
  const PagedPoolStats st = pool.stats();
  EXPECT_EQ(st.n_prefix_queries, 3u);
  EXPECT_EQ(st.n_prefix_hits, 3u);
  EXPECT_EQ(st.n_in_use, 4);
  EXPECT_EQ(st.n_cached, 0);  // held by sequences too
  Tokens b(prompt.begin(), prompt.begin() + 12);
  EXPECT_EQ(content_mismatch(pool, sb, b), "");
  // The matched sequence writes on after the shared blocks without a copy.
  ASSERT_TRUE(append(pool, sb, b, {5}));
  EXPECT_EQ(pool.stats().n_cow, 0u);
  EXPECT_EQ(content_mismatch(pool, sa, a), "");
  EXPECT_EQ(content_mismatch(pool, sb, b), "");
  // Freed, the cached blocks stay cached, and match again.
  pool.free(sa);
  pool.free(sb);
  EXPECT_EQ(pool.stats().n_cached, 3);
  const SeqId sc = pool.create();
  EXPECT_EQ(pool.match_prefix(sc, prompt, 100), 12);
  EXPECT_EQ(pool.block_table(sc), shared);
}

// cache_prefix says which blocks it added (a persistent cache writes those): the whole chain
// first, then only the tail a longer sequence adds after a matched prefix.
TEST(PagedPoolPrefix, CachePrefixReturnsTheRunItAdded) {
  PagedPool pool(pool_params());
  Tokens a;
  const Tokens prompt = iota_tokens(13, 100);
  const SeqId sa = pool.create();
  ASSERT_TRUE(append(pool, sa, a, prompt));
  PagedPool::CachedRun run = pool.cache_prefix(sa, a);
  EXPECT_EQ(run.first, 0);
  EXPECT_EQ(run.end, 3);
  run = pool.cache_prefix(sa, a);  // again: nothing new
  EXPECT_EQ(run.first, run.end);
  const SeqId sb = pool.create();
  Tokens b(prompt.begin(), prompt.begin() + pool.match_prefix(sb, prompt, 100));
  ASSERT_TRUE(append(pool, sb, b, iota_tokens(9, 500)));  // 12 + 9 rows: blocks 3 and 4 are new and full
  run = pool.cache_prefix(sb, b);
  EXPECT_EQ(run.first, 3);
  EXPECT_EQ(run.end, 5);
}

// forget_prefix takes a chain out from its tail while nothing else holds or continues a block.
TEST(PagedPoolPrefix, ForgetPrefixTakesOutTheUnsharedTail) {
  PagedPool pool(pool_params());
  auto [sa, a, written] = cache_prompt(pool, iota_tokens(16, 100));
  ASSERT_TRUE(written);
  // c shares a's first two blocks and goes on differently.
  const SeqId sc = pool.create();
  Tokens c(a.begin(), a.begin() + pool.match_prefix(sc, a, 8));
  ASSERT_TRUE(append(pool, sc, c, iota_tokens(8, 900)));
  pool.cache_prefix(sc, c);
  pool.free(sa);
  pool.free(sc);
  EXPECT_EQ(pool.stats().n_cached, 6);
  // a's blocks 2 and 3 go; block 1 stays (c continues it), and so does block 0.
  EXPECT_EQ(pool.forget_prefix(a), 8);
  EXPECT_EQ(pool.stats().n_cached, 4);
  const SeqId sd = pool.create();
  EXPECT_EQ(pool.match_prefix(sd, a, 100), 8);
  // sd holds blocks 0 and 1: only c's own tail goes, then the rest once sd lets go.
  EXPECT_EQ(pool.forget_prefix(c), 8);
  pool.free(sd);
  EXPECT_EQ(pool.forget_prefix(c), 8);
  EXPECT_EQ(pool.stats().n_cached, 0);
  EXPECT_EQ(pool.forget_prefix(Tokens{1, 2, 3, 4}), 0);
}

TEST(PagedPoolPrefix, PartialReuseStopsAtTheFirstDifferentBlock) {
  PagedPool pool(pool_params());
  const Tokens prompt = iota_tokens(12, 100);
  auto [sa, a, written] = cache_prompt(pool, prompt);
  ASSERT_TRUE(written);

  Tokens other = prompt;
  other[5] = 7;  // differs in block 1
  EXPECT_EQ(pool.match_prefix(pool.create(), other, 100), 4);
  other = prompt;
  other[11] = 7;  // differs in block 2
  EXPECT_EQ(pool.match_prefix(pool.create(), other, 100), 8);
  other = prompt;
  other[0] = 7;  // a later block equal does not count after a different first one
  EXPECT_EQ(pool.match_prefix(pool.create(), other, 100), 0);
  EXPECT_EQ(pool.match_prefix(pool.create(), Tokens(prompt.begin(), prompt.begin() + 7), 100), 4);
  const PagedPoolStats st = pool.stats();
  EXPECT_EQ(st.n_prefix_queries, 3u + 3u + 3u + 1u);
  EXPECT_EQ(st.n_prefix_hits, 1u + 2u + 0u + 1u);
}

TEST(PagedPoolPrefix, MaxTokensCapsTheMatch) {
  PagedPool pool(pool_params());
  const Tokens prompt = iota_tokens(12, 100);
  auto [sa, a, written] = cache_prompt(pool, prompt);
  ASSERT_TRUE(written);
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 11), 8);  // the last token is computed
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 12), 12);
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 3), 0);
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 0), 0);
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 4), 4);
  EXPECT_EQ(pool.stats().n_prefix_queries, 2u + 3u + 0u + 0u + 1u);
}

TEST(PagedPoolPrefix, ForcedHashCollisionNeverMatches) {
  CollidingPool pool(pool_params());
  // Block 1 repeats block 0's tokens: its key and tokens both agree with the cached block 0,
  // only its parent tells them apart.
  const Tokens prompt{1, 2, 3, 4, 1, 2, 3, 4};
  auto [sa, a, written] = cache_prompt(pool, prompt);
  ASSERT_TRUE(written);
  EXPECT_EQ(pool.stats().n_in_use, 2);

  const SeqId sb = pool.create();
  EXPECT_EQ(pool.match_prefix(sb, prompt, 8), 4);
  EXPECT_EQ(pool.block_table(sb), std::vector<int32_t>{pool.block_table(sa)[0]});
  // Same key, other tokens: no match.
  EXPECT_EQ(pool.match_prefix(pool.create(), Tokens{5, 6, 7, 8, 1, 2, 3, 4}, 8), 0);
  EXPECT_EQ(pool.match_prefix(pool.create(), Tokens{1, 2, 3, 5}, 8), 0);
  Tokens b(prompt.begin(), prompt.begin() + 4);
  EXPECT_EQ(content_mismatch(pool, sb, b), "");
}

TEST(PagedPoolPrefix, EvictsTheLeastRecentlyUsedBlock) {
  PagedPool pool(pool_params(4));
  const Tokens ta{1, 1, 1, 1}, tb{2, 2, 2, 2}, tc{3, 3, 3, 3};
  std::vector<int32_t> block;
  for (const Tokens& t : {ta, tb, tc}) {
    Tokens m;
    const SeqId s = pool.create();
    ASSERT_TRUE(append(pool, s, m, t));
    pool.cache_prefix(s, t);
    block.push_back(pool.block_table(s)[0]);
    pool.free(s);
  }
  // a is used again: b is now the least recently used.
  const SeqId s = pool.create();
  ASSERT_EQ(pool.match_prefix(s, ta, 4), 4);
  pool.free(s);
  EXPECT_EQ(pool.stats().n_cached, 3);
  EXPECT_EQ(pool.stats().n_free, 1);

  Tokens m;
  const SeqId big = pool.create();
  ASSERT_TRUE(append(pool, big, m, iota_tokens(8, 50)));  // the free block, then b's
  EXPECT_EQ(pool.stats().n_evicted, 1u);
  EXPECT_EQ(pool.block_table(big)[1], block[1]);
  EXPECT_EQ(pool.match_prefix(pool.create(), tb, 4), 0);
  EXPECT_EQ(pool.match_prefix(pool.create(), tc, 4), 4);  // c is now the most recent
  EXPECT_EQ(pool.match_prefix(pool.create(), ta, 4), 4);
  // Everything is held: a further block cannot be had, and a failed reserve changes nothing.
  const PagedPoolStats before = pool.stats();
  EXPECT_FALSE(pool.reserve(big, 1));
  EXPECT_EQ(pool.stats().n_evicted, before.n_evicted);
  EXPECT_EQ(pool.block_table(big).size(), 2u);
  EXPECT_EQ(pool.n_available(), 0);
}

TEST(PagedPoolPrefix, EvictingAParentLeavesNoMatchableChild) {
  PagedPool pool(pool_params(3));
  const Tokens head{1, 2, 3, 4}, tail{5, 6, 7, 8};
  Tokens full = head;
  full.insert(full.end(), tail.begin(), tail.end());
  Tokens ma;
  const SeqId a = pool.create();
  ASSERT_TRUE(append(pool, a, ma, head));
  pool.cache_prefix(a, head);
  const int32_t p = pool.block_table(a)[0];
  pool.free(a);
  Tokens ms;
  const SeqId s = pool.create();
  ASSERT_TRUE(append(pool, s, ms, full));
  pool.cache_prefix(s, full);
  ASSERT_EQ(pool.stats().n_cached, 1);  // p; s's blocks are in use

  // r needs a block: p is the only one to be had. Evicting it takes its child out of the cache.
  Tokens mr;
  const SeqId r = pool.create();
  ASSERT_TRUE(append(pool, r, mr, head));
  EXPECT_EQ(pool.block_table(r)[0], p);
  EXPECT_EQ(pool.stats().n_evicted, 2u);  // p and its child
  // p's block comes back into the cache under the same chain key...
  pool.cache_prefix(r, head);
  // ...and the old child must not be found under it.
  const SeqId q = pool.create();
  EXPECT_EQ(pool.match_prefix(q, full, 8), 4);
  EXPECT_EQ(pool.block_table(q), std::vector<int32_t>{p});
  // s still reads its rows, and writes on in place: its second block is no longer cached.
  EXPECT_EQ(content_mismatch(pool, s, ms), "");
  pool.truncate(s, 7);
  ms.resize(7);
  ASSERT_TRUE(append(pool, s, ms, {9}));
  EXPECT_EQ(pool.stats().n_cow, 0u);
  EXPECT_EQ(content_mismatch(pool, s, ms), "");
}

TEST(PagedPoolPrefix, ClearDropsOnlyUnheldBlocks) {
  PagedPool pool(pool_params());
  const Tokens prompt = iota_tokens(8, 1);
  Tokens ma;
  const SeqId a = pool.create();
  ASSERT_TRUE(append(pool, a, ma, prompt));
  pool.cache_prefix(a, prompt);
  pool.truncate(a, 4);  // the second block is cached only now
  EXPECT_EQ(pool.stats().n_cached, 1);
  pool.clear_prefix_cache();
  EXPECT_EQ(pool.stats().n_cached, 0);
  EXPECT_EQ(pool.stats().n_free, pool.n_blocks() - 1);
  EXPECT_EQ(pool.match_prefix(pool.create(), prompt, 8), 4);  // the held first block stays
}

// ---------------------------------------------------------------------------------------------
// Counters over a scripted sequence.

TEST(PagedPoolCounters, ScriptedSequence) {
  PagedPool pool(pool_params());
  // One block, all layers, keys and values, f16: computed here from the dimensions.
  const uint64_t block_bytes = uint64_t(kLayers) * 2 * kHeads * kBlock * kDim * 2;
  ASSERT_EQ(paged_block_bytes(pool_params()), int64_t(block_bytes));
  Tokens a, b;
  const SeqId sa = pool.create();
  ASSERT_TRUE(append(pool, sa, a, iota_tokens(6, 1)));  // 6 rows
  KVCounters c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 6u * kLayers);
  EXPECT_EQ(c.n_copying_writes, 0u);
  EXPECT_EQ(c.bytes_copied, 0u);

  const SeqId sb = pool.fork(sa);
  b = a;
  ASSERT_TRUE(append(pool, sb, b, {20}));  // copies the shared partial block
  c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 7u * kLayers);
  EXPECT_EQ(c.n_copying_writes, 1u * kLayers);
  EXPECT_EQ(c.bytes_copied, block_bytes);

  ASSERT_TRUE(append(pool, sa, a, {30, 31, 32}));  // a holds its partial block alone again
  c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 10u * kLayers);
  EXPECT_EQ(c.n_copying_writes, 1u * kLayers);

  pool.cache_prefix(sa, a);  // blocks 0 and 1 of a are full
  pool.truncate(sa, 2);
  a.resize(2);
  ASSERT_TRUE(append(pool, sa, a, {40, 41, 42, 43, 44}));  // copies the cached block 0
  c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 15u * kLayers);
  EXPECT_EQ(c.n_copying_writes, 2u * kLayers);
  EXPECT_EQ(c.bytes_copied, 2 * block_bytes);
  ASSERT_TRUE(append(pool, sa, a, {50}));  // in place
  c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 16u * kLayers);
  EXPECT_EQ(c.n_copying_writes, 2u * kLayers);
  EXPECT_EQ(pool.stats().n_cow, 2u);
  EXPECT_EQ(content_mismatch(pool, sa, a), "");
  EXPECT_EQ(content_mismatch(pool, sb, b), "");
}

// OSPREY_KV_INPLACE_WRITE=0 on the paged path: a sequence that holds its blocks alone still
// copies its partly filled last block before each write into it, keeps every row, and no write
// counts as in place.
TEST(PagedPoolCounters, CopyingArmCopiesEveryPartialBlockAndNothingGoesInPlace) {
  PagedPoolParams p = pool_params();
  p.inplace = false;
  PagedPool pool(p);
  const uint64_t block_bytes = uint64_t(kLayers) * 2 * kHeads * kBlock * kDim * 2;
  Tokens a;
  const SeqId sa = pool.create();
  std::vector<int32_t> last_blocks;
  for (int32_t t = 1; t <= 6; ++t) {  // rows 0..5, one at a time; kBlock is 4
    ASSERT_TRUE(append(pool, sa, a, {t}));
    last_blocks.push_back(pool.block_table(sa).back());
    EXPECT_EQ(content_mismatch(pool, sa, a), "") << "after row " << t - 1;
  }
  // Rows 0 and 4 start a block (nothing to copy); rows 1, 2, 3 and 5 land in a partial block.
  EXPECT_EQ(pool.stats().n_cow, 4u);
  for (size_t r : {1u, 2u, 3u, 5u}) EXPECT_NE(last_blocks[r], last_blocks[r - 1]) << "row " << r << " was not copied";
  const KVCounters c = pool.counters();
  EXPECT_EQ(c.n_inplace_writes, 0u);
  EXPECT_EQ(c.n_copying_writes, 6u * kLayers);
  EXPECT_EQ(c.bytes_copied, 4 * block_bytes);
  // Nothing leaks: the blocks copied out of are free again.
  EXPECT_EQ(pool.stats().n_in_use, 2);
  // The same rows with the switch on: no copy at all.
  PagedPool on(pool_params());
  Tokens b;
  const SeqId sb = on.create();
  for (int32_t t = 1; t <= 6; ++t) ASSERT_TRUE(append(on, sb, b, {t}));
  EXPECT_EQ(on.stats().n_cow, 0u);
  EXPECT_EQ(on.counters().n_inplace_writes, 6u * kLayers);
  EXPECT_EQ(on.counters().n_copying_writes, 0u);
}

TEST(PagedPoolCounters, BlockBytesOverMixedLayers) {
  PagedPoolParams p;
  KVCacheParams l0, l1;
  l0.n_kv_heads = 2;
  l0.head_dim = 4;
  l0.dtype = DType::f16;
  l1.n_kv_heads = 1;
  l1.head_dim = 8;
  l1.dtype = DType::bf16;
  l1.window = 16;  // ignored by the pool
  p.layers = {l0, l1};
  p.block_size = 4;
  p.n_blocks = 3;
  EXPECT_EQ(paged_block_bytes(p), 2 * (2 * 4 * 4) * 2 + 2 * (1 * 4 * 8) * 2);
  PagedPool pool(p);
  EXPECT_EQ(pool.n_layers(), 2u);
  EXPECT_EQ(pool.keys(0).shape(), (Shape{3, 2, 4, 4}));
  EXPECT_EQ(pool.values(1).shape(), (Shape{3, 1, 4, 8}));
  EXPECT_EQ(pool.keys(1).dtype(), DType::bf16);
  EXPECT_EQ(pool.values(0).dtype(), DType::f16);
  EXPECT_EQ(pool.stats().n_free, 3);
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(PagedPoolErrors, BadParams) {
  auto with = [](auto edit) {
    PagedPoolParams p = pool_params();
    edit(p);
    return error_of<InvalidInput>([&] { PagedPool pool(p); });
  };
  EXPECT_NE(with([](PagedPoolParams& p) { p.block_size = 0; }).find("block_size"), std::string::npos);
  EXPECT_NE(with([](PagedPoolParams& p) { p.n_blocks = 0; }).find("n_blocks"), std::string::npos);
  EXPECT_NE(with([](PagedPoolParams& p) { p.layers.clear(); }).find("no layers"), std::string::npos);
  EXPECT_NE(with([](PagedPoolParams& p) { p.layers[1].n_kv_heads = 0; }).find("layer 1"), std::string::npos);
  EXPECT_NE(with([](PagedPoolParams& p) { p.layers[0].head_dim = -4; }).find("head_dim"), std::string::npos);
  EXPECT_NE(with([](PagedPoolParams& p) { p.layers[1].dtype = DType::f32; }).find("float32"), std::string::npos);
  EXPECT_EQ(with([](PagedPoolParams& p) { p.layers[1].dtype = DType::bf16; }), "");
}

TEST(PagedPoolErrors, UnknownAndFreedSequences) {
  PagedPool pool(pool_params());
  const SeqId s = pool.create();
  pool.free(s);
  const Tokens t{1, 2, 3, 4};
  int32_t slot = 0;
  for (SeqId bad : {s, SeqId(77), SeqId(-1)}) {
    const std::string name = "sequence " + std::to_string(bad);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.free(bad); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.fork(bad); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.length(bad); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.block_table(bad); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.reserve(bad, 1); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(bad, 0, 1, &slot); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.commit(bad, 1); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.truncate(bad, 0); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.match_prefix(bad, t, 4); }).find(name), std::string::npos);
    EXPECT_NE(error_of<InvalidInput>([&] { pool.cache_prefix(bad, t); }).find(name), std::string::npos);
  }
  EXPECT_EQ(pool.stats().n_free, pool.n_blocks());
}

TEST(PagedPoolErrors, RowsAndLengths) {
  PagedPool pool(pool_params());
  const SeqId s = pool.create();
  std::vector<int32_t> slots(8);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(s, 0, 1, slots.data()); }).find("not reserved"), std::string::npos);
  ASSERT_TRUE(pool.reserve(s, 5));
  EXPECT_EQ(error_of<InvalidInput>([&] { pool.slots(s, 0, 5, slots.data()); }), "");
  EXPECT_EQ(slots[4], pool.block_table(s)[1] * kBlock + 0);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(s, 2, 4, slots.data()); }).find("[2, 6)"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.commit(s, 6); }).find("reserved up to 5"), std::string::npos);
  pool.commit(s, 5);
  // Committed rows are no longer writable through slots().
  EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(s, 4, 1, slots.data()); }).find("not reserved"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.truncate(s, 6); }).find("to 6 rows (it holds 5)"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.truncate(s, -1); }).find("to -1"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.reserve(s, -1); }).find("-1"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.match_prefix(s, Tokens{1, 2, 3, 4}, 4); }).find("must be empty"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.match_prefix(pool.create(), Tokens{1, 2, 3, 4}, -1); }).find("max_tokens"),
            std::string::npos);
  // A fork takes back the reservation past the length: both reserve again.
  ASSERT_TRUE(pool.reserve(s, 2));
  const SeqId f = pool.fork(s);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(s, 5, 1, slots.data()); }).find("not reserved"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { pool.slots(f, 5, 1, slots.data()); }).find("not reserved"), std::string::npos);
  EXPECT_EQ(pool.block_table(f).size(), 2u);
}

}  // namespace
}  // namespace osprey
