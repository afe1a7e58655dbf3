// `osprey serve --spec-ngram` with the default (paged) layout: it answers, its greedy replies are
// the dense layout's plain replies (no drafts), drafts ran (/metrics), and a second request
// served from the prefix cache after drafted steps gives the same reply again; past
// --spec-max-batch no step drafts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/harness.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::TestServer;

std::string quoting_prompt() {
  return testing::read_file(testing::source_dir() / "docs/benchmark_results/2026-12-07-cpu-speculative-prompt.txt");
}

json completion(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

}  // namespace

TEST(SpeculativeServer, PagedDraftingRepliesAreTheDenseLayoutsPlainReplies) {
  const std::string prompt = quoting_prompt();
  ASSERT_FALSE(prompt.empty());
  std::string dense_text;
  {
    ServerOptions o = testing::demo_server_options();
    o.kv_layout = KVLayout::dense;
    TestServer dense(o);
    auto [status, r] = dense.post_json("/v1/completions", completion(prompt, 48));
    ASSERT_EQ(status, 200) << r.dump();
    dense_text = r["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(dense.metric("osprey:spec_drafted_tokens_total"), 0);
  }
  ServerOptions o = testing::demo_server_options();
  o.spec.ngram = true;
  ASSERT_EQ(o.kv_layout, KVLayout::paged) << "the default layout";
  TestServer paged(o);
  auto [status, r] = paged.post_json("/v1/completions", completion(prompt, 48));
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], dense_text);
  EXPECT_EQ(r["usage"]["completion_tokens"], 48);
  EXPECT_GT(paged.metric("osprey:spec_drafted_tokens_total"), 0);
  EXPECT_GT(paged.metric("osprey:spec_accepted_tokens_total"), 0);
  // Again: the prompt's blocks come from the prefix cache, the reply is the same.
  auto [status2, r2] = paged.post_json("/v1/completions", completion(prompt, 48));
  ASSERT_EQ(status2, 200) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["text"], dense_text);
  EXPECT_GT(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
}

// Two sequences at once past --spec-max-batch 1: no step drafts, and the replies are plain batched
// decoding's (a paused step runs the batch as without drafting); at a limit of 2 they draft.
TEST(SpeculativeServer, AStepPastTheBatchLimitIsPlainBatchedDecoding) {
  const std::string prompt = quoting_prompt();
  const json body = {{"prompt", json::array({prompt, "[1] " + prompt})},
                     {"max_tokens", 32},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  auto texts = [](const json& r) {
    std::vector<std::string> t(2);
    for (const json& c : r["choices"]) t[c["index"].get<size_t>()] = c["text"].get<std::string>();
    return t;
  };
  std::vector<std::string> plain;
  {
    ServerOptions o = testing::demo_server_options();
    o.n_slots = 2;
    TestServer s(o);
    auto [status, r] = s.post_json("/v1/completions", body);
    ASSERT_EQ(status, 200) << r.dump();
    plain = texts(r);
  }
  for (int limit : {1, 2}) {
    SCOPED_TRACE(limit);
    ServerOptions o = testing::demo_server_options();
    o.n_slots = 2;
    o.spec.ngram = true;
    o.spec.max_batch = limit;
    TestServer s(o);
    auto [status, r] = s.post_json("/v1/completions", body);
    ASSERT_EQ(status, 200) << r.dump();
    if (limit == 1) {
      EXPECT_EQ(texts(r), plain);
      EXPECT_EQ(s.metric("osprey:spec_drafted_tokens_total"), 0);
      EXPECT_GT(s.metric("osprey:spec_paused_steps_total"), 0);
    } else {
      EXPECT_GT(s.metric("osprey:spec_drafted_tokens_total"), 0);
      EXPECT_EQ(s.metric("osprey:spec_paused_steps_total"), 0);
    }
  }
}

}  // namespace osprey
