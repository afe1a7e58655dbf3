// Chat completions and /apply-template with the demo model's chat template:
//   {{ bos_token }}{% for m in messages %}{{ m.role + ': ' + m.content + '\n\n' }}{% endfor %}
//   {% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}
// rendered by hand below.
#include <gtest/gtest.h>

#include "server/harness.h"

namespace osprey {

using nlohmann::json;

TEST(ServerChat, ChatRendersTheTemplateAndAnswersLikeTheSamePromptAsTokens) {
  testing::TestServer s;
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const std::string rendered = "<|begin_of_text|>system: Be brief.\n\nuser: Hi\n\nassistant:";
  auto [ts, t] = s.post_json("/apply-template", {{"messages", messages}});
  ASSERT_EQ(ts, 200) << t.dump();
  EXPECT_EQ(t["prompt"], rendered);
  auto [ks, k] = s.post_json("/tokenize", {{"content", rendered}, {"parse_special", true}});
  ASSERT_EQ(ks, 200);
  EXPECT_EQ(k["tokens"][0], 0);  // one BOS, from the template
  EXPECT_NE(k["tokens"][1], 0);
  auto [cs, c] = s.post_json("/v1/completions", {{"prompt", k["tokens"]}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(cs, 200);
  json body = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}};
  auto [hs, h] = s.post_json("/v1/chat/completions", body);
  ASSERT_EQ(hs, 200) << h.dump();
  EXPECT_EQ(h["object"], "chat.completion");
  EXPECT_EQ(h["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(h["choices"][0]["message"]["content"], c["choices"][0]["text"]);
  EXPECT_EQ(h["usage"]["prompt_tokens"], k["tokens"].size());
  body["stream"] = true;
  auto [ss, text] = s.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(ss, 200);
  bool done = false;
  auto events = testing::sse_events(text, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string joined;
  for (const json& e : events)
    if (e["choices"][0]["delta"].contains("content")) joined += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(joined, h["choices"][0]["message"]["content"].get<std::string>());
  auto [bs, b] = s.post_json("/v1/chat/completions", {{"messages", "Hi"}});
  EXPECT_EQ(bs, 400);
  EXPECT_EQ(b["error"]["param"], "messages");
}

TEST(ServerChat, TokenizeAndDetokenizeRoundTrip) {
  testing::TestServer s;
  auto [ks, k] = s.post_json("/tokenize", {{"content", "Emma Woodhouse"}, {"add_special", true}, {"with_pieces", true}});
  ASSERT_EQ(ks, 200) << k.dump();
  ASSERT_GE(k["tokens"].size(), 2u);
  EXPECT_EQ(k["tokens"][0]["id"], 0);  // BOS from the post-processor
  json ids = json::array();
  std::string pieces;
  for (const json& t : k["tokens"]) {
    ids.push_back(t["id"]);
    pieces += t["piece"].get<std::string>();
  }
  EXPECT_EQ(pieces, "<|begin_of_text|>Emma Woodhouse");
  auto [ds, d] = s.post_json("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(ds, 200);
  EXPECT_EQ(d["content"], "<|begin_of_text|>Emma Woodhouse");
  auto [es, e] = s.post_json("/detokenize", {{"tokens", {1, 999999}}});
  EXPECT_EQ(es, 400);
}

}  // namespace osprey
