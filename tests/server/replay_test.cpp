// The prompt cache's replay test: multi-turn conversations sharing a system prompt, one
// history continued two ways at once, and enough of them to overflow a small cache budget,
// replayed over HTTP against three servers: prompt cache on with in-place KV writes, prompt
// cache on with copying writes only, and prompt cache off. Every reply must be the same token
// for token; the cache must have restored, branched and evicted; and no stored snapshot's rows
// may change while later requests restore and extend it. The script is server/replay_script.h
// (tests/server/prompt_cache_restart_test.cpp runs it across a restart).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <thread>

#include "kv/dense_cache.h"
#include "server/harness.h"
#include "server/replay_script.h"

namespace osprey {
namespace {

using nlohmann::json;

using testing::Replayer;
using testing::ReplayRun;

}  // namespace

TEST(PromptCacheReplay, RepliesAreIdenticalWithAndWithoutTheCacheAndSnapshotsNeverChange) {
  // A snapshot of the demo model's cache under 256 rows holds 1 MiB: three fit in the budget.
  ServerOptions o = testing::dense_replay_options();
  o.cache.inplace = true;
  o.prompt_cache_mib = 3;
  ReplayRun inplace(o, true);
  o.cache.inplace = false;
  ReplayRun copying(o, true);
  o.cache.inplace = true;
  o.prompt_cache_mib = 0;
  ReplayRun uncached(o, false);

  ASSERT_EQ(inplace.replies.size(), 12u);
  EXPECT_GT(testing::expect_same_as_uncached(inplace.replies, uncached.replies), 0);
  for (const auto& [key, rep] : uncached.replies) EXPECT_EQ(copying.replies.at(key).tokens, rep.tokens) << key;

  for (const ReplayRun* r : {&inplace, &copying}) {
    EXPECT_GE(r->server.metric("osprey:prompt_cache_hits_total"), 8);
    EXPECT_GT(r->server.metric("osprey:prompt_cache_restored_tokens_total"), 200);
    EXPECT_GE(r->server.metric("osprey:prompt_cache_evictions_total"), 1);
    EXPECT_LE(r->server.metric("osprey:prompt_cache_bytes"), 3 << 20);
    EXPECT_GT(r->replayer.n_checked_, 10u);
  }
  EXPECT_GT(inplace.server.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(copying.server.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(uncached.server.metric("osprey:prompt_cache_hits_total"), 0);
}

// The same script over the paged layout: the prefix cache restores whole blocks of the pool,
// two branches decode in one batch, and a pool of 1 MiB (16 blocks of 16 rows of the demo
// model: two branches may not fit at once, and then one is preempted) makes the cache evict.
// With batch invariance on, every reply is token for token the
// one without the prefix cache (the pool's own tests prove that no cached block is written:
// tests/kv/paged_pool_test.cpp).
TEST(PromptCacheReplay, PagedPrefixCacheRepliesAreIdenticalWithAndWithoutIt) {
  ServerOptions o = testing::paged_replay_options();
  ReplayRun cached(o, false);
  o.prompt_cache_mib = 0;
  ReplayRun uncached(o, false);

  ASSERT_EQ(cached.replies.size(), 12u);
  EXPECT_GT(testing::expect_same_as_uncached(cached.replies, uncached.replies), 0);
  for (const auto& [key, rep] : cached.replies) EXPECT_EQ(rep.cached % 16, 0) << key << ": whole blocks";
  EXPECT_GE(cached.server.metric("osprey:prompt_cache_hits_total"), 8);
  EXPECT_GT(cached.server.metric("osprey:prompt_cache_restored_tokens_total"), 200);
  EXPECT_GE(cached.server.metric("osprey:prompt_cache_evictions_total"), 1);
  EXPECT_EQ(cached.server.metric("osprey:kv_pool_blocks_in_use"), 0);
  EXPECT_EQ(uncached.server.metric("osprey:prompt_cache_hits_total"), 0);
  EXPECT_EQ(uncached.server.metric("osprey:kv_pool_blocks_cached"), 0);
}

// OSPREY_KV_INPLACE_WRITE governs the paged path as it does the dense one: the same script
// with the switch off gives the same replies, and its counters show copying writes only.
TEST(PromptCacheReplay, PagedKVWriteSwitchGivesTheSameRepliesAndCountsEachArm) {
  ServerOptions o = testing::paged_replay_options();
  o.cache.inplace = true;
  ReplayRun inplace(o, false);
  o.cache.inplace = false;
  ReplayRun copying(o, false);

  ASSERT_EQ(inplace.replies.size(), 12u);
  ASSERT_EQ(copying.replies.size(), 12u);
  testing::expect_same_replies(copying.replies, inplace.replies);
  const testing::TestServer &on = inplace.server, &off = copying.server;
  EXPECT_GT(on.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(off.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_GT(off.metric("osprey:kv_copying_writes_total"), on.metric("osprey:kv_copying_writes_total"));
  EXPECT_GT(off.metric("osprey:kv_bytes_copied_total"), on.metric("osprey:kv_bytes_copied_total"));
}

// The dense cache without the guard's identity and length rules (the cache's test seam): every
// single-row write that fits goes in place, whoever else holds the buffers.
class UnguardedKVCache final : public DenseKVCache {
 public:
  using DenseKVCache::DenseKVCache;

 protected:
  bool owns_current_state() const override { return true; }
};

// A sequence cache of unguarded layers shaped as the demo model's (read from its config.json).
SequenceCache unguarded_demo_cache() {
  std::ifstream in(testing::demo_server_options().model_dir / "config.json");
  const json c = json::parse(in);
  KVCacheParams p;
  p.n_kv_heads = c.value("num_key_value_heads", c.at("num_attention_heads").get<int64_t>());
  p.head_dim = c.contains("head_dim") ? c.at("head_dim").get<int64_t>()
                                      : c.at("hidden_size").get<int64_t>() / c.at("num_attention_heads").get<int64_t>();
  std::vector<std::unique_ptr<KVCache>> layers;
  for (int64_t i = 0; i < c.at("num_hidden_layers").get<int64_t>(); ++i) layers.push_back(std::make_unique<UnguardedKVCache>(p));
  return SequenceCache(std::move(layers));
}

// The snapshot check must bite: with the ownership guard's identity and length rules dropped
// (the cache's test seam), a restored prompt whose last token differs from the entry's is written in
// place over the entry's row, and the checksums see it. With the guard, they never do.
TEST(PromptCacheReplay, TheSnapshotCheckSeesWritesThatBypassTheGuard) {
  for (bool unsafe : {false, true}) {
    SCOPED_TRACE(unsafe ? "guard off" : "guard on");
    ServerOptions o = testing::demo_server_options();
    o.kv_layout = KVLayout::dense;
    o.keep_prompt_cache_checksums = true;
    if (unsafe) o.make_cache = unguarded_demo_cache;
    testing::TestServer s(o);
    std::vector<int32_t> p = {0, 300, 301, 302, 303, 304};
    auto [st1, r1] = s.post_json("/v1/completions", {{"prompt", p}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(st1, 200) << r1.dump();
    p.back() = 305;
    auto [st2, r2] = s.post_json("/v1/completions", {{"prompt", p}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(st2, 200) << r2.dump();
    EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
    bool changed = false;
    for (const auto& c : s.server().prompt_cache_checksums()) changed |= c.at_store != c.now;
    EXPECT_EQ(changed, unsafe);
  }
}

}  // namespace osprey
