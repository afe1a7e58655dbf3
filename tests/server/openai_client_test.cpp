// The official `openai` npm client (pinned in package.json) as a client of the server.
#include <gtest/gtest.h>

#include <cstdio>

#include "server/harness.h"

namespace osprey {

TEST(ServerOpenAIClient, TheNodeClientCompletesStreamsAndSeesErrors) {
  if (const std::string why = testing::node_client_missing("openai"); !why.empty()) GTEST_SKIP() << why;
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"test-key"};
  // Blocks of one row: the prefix cache reuses all but the last prompt token of a repeated
  // prompt, as the script expects (with 16-row blocks a 5-token prompt has no full block).
  o.block_size = 1;
  testing::TestServer s(o);
  const auto [rc, out] = testing::run_node_script("openai_client.mjs", {std::to_string(s.port()), "test-key"});
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json r = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_EQ(r["models"], nlohmann::json::array({"demo"}));
  EXPECT_FALSE(r["text"].get<std::string>().empty());
  EXPECT_EQ(r["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 20);
  std::string joined;
  for (const auto& c : r["chunks"]) joined += c.get<std::string>();
  EXPECT_EQ(joined, r["text"].get<std::string>());
  EXPECT_GT(r["chunks"].size(), 5u);
  EXPECT_EQ(r["stream_usage"]["completion_tokens"], r["usage"]["completion_tokens"]);
  EXPECT_EQ(r["stream_usage"]["prompt_tokens"], r["usage"]["prompt_tokens"]);
  // The streamed request repeats the first one's prompt: all of it but its last token is reused.
  EXPECT_EQ(r["stream_usage"]["prompt_tokens_details"]["cached_tokens"], r["usage"]["prompt_tokens"].get<int>() - 1);
  std::string chat;
  for (const auto& c : r["chat_chunks"]) chat += c.get<std::string>();
  EXPECT_FALSE(r["chat_text"].get<std::string>().empty());
  EXPECT_EQ(chat, r["chat_text"].get<std::string>());
  EXPECT_EQ(r["bad_model"]["status"], 404);
  EXPECT_EQ(r["bad_model"]["code"], "model_not_found");
  EXPECT_EQ(r["bad_key"]["status"], 401);
  EXPECT_EQ(r["bad_key"]["type"], "authentication_error");
}

}  // namespace osprey
