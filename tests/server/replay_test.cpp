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

}  // namespace

TEST(PromptCacheReplay, RepliesAreIdenticalWithAndWithoutTheCacheAndSnapshotsNeverChange) {
  // A snapshot of the demo model's cache under 256 rows holds 1 MiB: three fit in the budget.
  ServerOptions o = testing::demo_server_options();
  o.kv_layout = KVLayout::dense;
  o.n_slots = 2;
  o.keep_prompt_cache_checksums = true;

  o.cache.inplace = true;
  o.prompt_cache_mib = 3;
  testing::TestServer inplace(o);
  Replayer r1(inplace, true);
  const auto with_inplace = r1.run();

  o.cache.inplace = false;
  testing::TestServer copying(o);
  Replayer r2(copying, true);
  const auto with_copying = r2.run();

  o.cache.inplace = true;
  o.prompt_cache_mib = 0;
  testing::TestServer uncached(o);
  Replayer r3(uncached, false);
  const auto without_cache = r3.run();

  ASSERT_EQ(with_inplace.size(), 12u);
  int64_t n_cached = 0;
  for (const auto& [key, rep] : without_cache) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(rep.tokens.empty());
    EXPECT_EQ(rep.cached, 0);
    EXPECT_EQ(with_inplace.at(key).tokens, rep.tokens);
    EXPECT_EQ(with_inplace.at(key).text, rep.text);
    EXPECT_EQ(with_copying.at(key).tokens, rep.tokens);
    n_cached += with_inplace.at(key).cached;
  }
  EXPECT_GT(n_cached, 0);

  for (testing::TestServer* s : {&inplace, &copying}) {
    EXPECT_GE(s->metric("osprey:prompt_cache_hits_total"), 8);
    EXPECT_GT(s->metric("osprey:prompt_cache_restored_tokens_total"), 200);
    EXPECT_GE(s->metric("osprey:prompt_cache_evictions_total"), 1);
    EXPECT_LE(s->metric("osprey:prompt_cache_bytes"), 3 << 20);
  }
  EXPECT_GT(inplace.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(copying.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(uncached.metric("osprey:prompt_cache_hits_total"), 0);
  EXPECT_GT(r1.n_checked_, 10u);
  EXPECT_GT(r2.n_checked_, 10u);
}

// The same script over the paged layout: the prefix cache restores whole blocks of the pool,
// two branches decode in one batch, and a pool of 1 MiB (16 blocks of 16 rows of the demo
// model: two branches may not fit at once, and then one is preempted) makes the cache evict.
// With batch invariance on, every reply is token for token the
// one without the prefix cache (the pool's own tests prove that no cached block is written:
// tests/kv/paged_pool_test.cpp).
TEST(PromptCacheReplay, PagedPrefixCacheRepliesAreIdenticalWithAndWithoutIt) {
  ServerOptions o = testing::demo_server_options();
  o.kv_layout = KVLayout::paged;
  o.n_slots = 2;
  o.kv_cache_mib = 1;
  o.batch_invariant = true;
  testing::TestServer cached(o);
  Replayer r1(cached, false);
  const auto with_cache = r1.run();

  o.prompt_cache_mib = 0;
  testing::TestServer uncached(o);
  Replayer r2(uncached, false);
  const auto without_cache = r2.run();

  ASSERT_EQ(with_cache.size(), 12u);
  int64_t n_cached = 0;
  for (const auto& [key, rep] : without_cache) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(rep.tokens.empty());
    EXPECT_EQ(rep.cached, 0);
    EXPECT_EQ(with_cache.at(key).tokens, rep.tokens);
    EXPECT_EQ(with_cache.at(key).text, rep.text);
    EXPECT_EQ(with_cache.at(key).cached % 16, 0) << "whole blocks";
    n_cached += with_cache.at(key).cached;
  }
  EXPECT_GT(n_cached, 0);
  EXPECT_GE(cached.metric("osprey:prompt_cache_hits_total"), 8);
  EXPECT_GT(cached.metric("osprey:prompt_cache_restored_tokens_total"), 200);
  EXPECT_GE(cached.metric("osprey:prompt_cache_evictions_total"), 1);
  EXPECT_EQ(cached.metric("osprey:kv_pool_blocks_in_use"), 0);
  EXPECT_EQ(uncached.metric("osprey:prompt_cache_hits_total"), 0);
  EXPECT_EQ(uncached.metric("osprey:kv_pool_blocks_cached"), 0);
}

// OSPREY_KV_INPLACE_WRITE governs the paged path as it does the dense one: the same script
// with the switch off gives the same replies, and its counters show copying writes only.
TEST(PromptCacheReplay, PagedKVWriteSwitchGivesTheSameRepliesAndCountsEachArm) {
  ServerOptions o = testing::demo_server_options();
  o.kv_layout = KVLayout::paged;
  o.n_slots = 2;
  o.kv_cache_mib = 1;
  o.batch_invariant = true;
  o.cache.inplace = true;
  testing::TestServer inplace(o);
  Replayer r1(inplace, false);
  const auto with_inplace = r1.run();

  o.cache.inplace = false;
  testing::TestServer copying(o);
  Replayer r2(copying, false);
  const auto with_copying = r2.run();

  ASSERT_EQ(with_inplace.size(), 12u);
  ASSERT_EQ(with_copying.size(), 12u);
  for (const auto& [key, rep] : with_inplace) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(rep.tokens.empty());
    EXPECT_EQ(with_copying.at(key).tokens, rep.tokens);
    EXPECT_EQ(with_copying.at(key).text, rep.text);
  }
  EXPECT_GT(inplace.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(copying.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_GT(copying.metric("osprey:kv_copying_writes_total"), inplace.metric("osprey:kv_copying_writes_total"));
  EXPECT_GT(copying.metric("osprey:kv_bytes_copied_total"), inplace.metric("osprey:kv_bytes_copied_total"));
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
