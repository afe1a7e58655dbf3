#pragma once
// The prompt cache's replay script, shared by tests/server/replay_test.cpp and
// tests/server/prompt_cache_restart_test.cpp: multi-turn conversations sharing a system prompt,
// one history continued two ways at once, and enough of them to overflow a small cache budget,
// sent over HTTP with greedy decoding.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/harness.h"

namespace osprey::testing {

inline const char* kReplaySystem =
    "The following is a conversation at Hartfield between Miss Woodhouse and Mr. Knightley, "
    "who speak plainly to each other.\n";

struct ReplayTurn {
  std::string conversation;  // the history it continues: a key of an earlier turn, or "" for a new one
  std::string key;           // this turn's name
  std::string user;
};

// Pairs with the same `conversation` and adjacent positions run at once (a branch).
inline const std::vector<std::vector<ReplayTurn>> kReplayScript = {
    {{"", "a1", "What do you think of Harriet Smith?"}},
    {{"a1", "a2", "And of Mr. Elton?"}},
    {{"a2", "a3x", "Will you dine with us on Sunday?"}, {"a2", "a3y", "Is the weather fine at Donwell?"}},
    {{"", "b1", "Have you seen Jane Fairfax?"}},
    {{"", "c1", "My father fears the draught."}},
    {{"b1", "b2", "She plays very well."}},
    {{"", "d1", "Frank Churchill writes again."}},
    {{"a3x", "a4", "Then we shall expect you."}},
    {{"c1", "c2x", "Shall I close the window?"}, {"c1", "c2y", "Mr. Perry will call."}},
    {{"a1", "a2z", "I am sure you are mistaken."}},
};

struct ReplayReply {
  std::string text;
  std::vector<std::string> tokens;
  int64_t cached = 0;
};

// Sends the script's groups to a server; the histories carry over from one server to the next
// (a restart between groups).
class Replayer {
 public:
  explicit Replayer(TestServer& s, bool check_snapshots) : s_(&s), check_(check_snapshots) {}

  // Groups [first, last) of the script; returns every reply so far, by turn.
  std::map<std::string, ReplayReply> run(size_t first = 0, size_t last = kReplayScript.size()) {
    for (size_t g = first; g < last && g < kReplayScript.size(); ++g) {
      const auto& group = kReplayScript[g];
      std::vector<std::thread> threads;
      std::vector<ReplayReply> out(group.size());
      for (size_t i = 0; i < group.size(); ++i)
        threads.emplace_back([&, i] { out[i] = ask(prompt_of(group[i])); });
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < group.size(); ++i) {
        history_[group[i].key] = prompt_of(group[i]) + out[i].text;
        replies_[group[i].key] = out[i];
      }
      if (check_) check_snapshots();
    }
    return replies_;
  }

  // Goes on against another server.
  void use(TestServer& s) { s_ = &s; }

 private:
  std::string prompt_of(const ReplayTurn& t) const {
    const std::string before = t.conversation.empty() ? std::string(kReplaySystem) : history_.at(t.conversation) + "\n";
    return before + "Emma: " + t.user + "\nMr. Knightley:";
  }

  ReplayReply ask(const std::string& prompt) {
    auto [status, r] = s_->post_json(
        "/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 0}, {"stop", "\n"}});
    EXPECT_EQ(status, 200) << r.dump();
    if (status != 200) return {};
    ReplayReply rep;
    rep.text = r["choices"][0]["text"];
    for (const nlohmann::json& t : r["choices"][0]["logprobs"]["tokens"]) rep.tokens.push_back(t);
    rep.cached = r["usage"]["prompt_tokens_details"]["cached_tokens"];
    return rep;
  }

  // Every stored snapshot's rows are as they were when stored.
  void check_snapshots() {
    for (const auto& c : s_->server().prompt_cache_checksums()) {
      EXPECT_EQ(c.at_store, c.now) << "a snapshot of " << c.n_tokens << " tokens changed after it was stored";
      ++n_checked_;
    }
  }

  TestServer* s_;
  bool check_;
  std::map<std::string, std::string> history_;
  std::map<std::string, ReplayReply> replies_;

 public:
  size_t n_checked_ = 0;
};

// The script's server options: the dense layout with two slots keeping its snapshots'
// checksums, or the paged one with a pool of 1 MiB (16 blocks of 16 rows of the demo model),
// two sequences and batch invariance.
inline ServerOptions dense_replay_options() {
  ServerOptions o = demo_server_options();
  o.kv_layout = KVLayout::dense;
  o.n_slots = 2;
  o.keep_prompt_cache_checksums = true;
  return o;
}

inline ServerOptions paged_replay_options() {
  ServerOptions o = demo_server_options();
  o.kv_layout = KVLayout::paged;
  o.n_slots = 2;
  o.kv_cache_mib = 1;
  o.batch_invariant = true;
  return o;
}

// A server of options `o` with the whole script run through it.
struct ReplayRun {
  ReplayRun(const ServerOptions& o, bool check_snapshots) : server(o), replayer(server, check_snapshots) {}

  TestServer server;
  Replayer replayer;
  const std::map<std::string, ReplayReply> replies = replayer.run();
};

// Both runs hold the same turns; each of `want`'s has tokens, and `got` the same tokens and text.
inline void expect_same_replies(const std::map<std::string, ReplayReply>& got,
                                const std::map<std::string, ReplayReply>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, rep] : want) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(rep.tokens.empty());
    EXPECT_EQ(got.at(key).tokens, rep.tokens);
    EXPECT_EQ(got.at(key).text, rep.text);
  }
}

// Every reply of `uncached` (a run without the prompt cache: nothing reused) has tokens, and
// `cached` the same tokens and text; returns the prompt tokens that `cached` reused in all.
inline int64_t expect_same_as_uncached(const std::map<std::string, ReplayReply>& cached,
                                       const std::map<std::string, ReplayReply>& uncached) {
  int64_t n_cached = 0;
  for (const auto& [key, rep] : uncached) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(rep.tokens.empty());
    EXPECT_EQ(rep.cached, 0);
    EXPECT_EQ(cached.at(key).tokens, rep.tokens);
    EXPECT_EQ(cached.at(key).text, rep.text);
    n_cached += cached.at(key).cached;
  }
  return n_cached;
}

}  // namespace osprey::testing
