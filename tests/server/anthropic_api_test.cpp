// The Anthropic Messages request reader, error bodies and event stream (server/anthropic_api.h).
#include "server/anthropic_api.h"

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/scripted_server.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json base() {
  return {{"model", "demo"}, {"max_tokens", 16}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
}

ordered_json read(const ordered_json& body, AnthropicRoute route = AnthropicRoute::messages) {
  return read_anthropic_request(body, route);
}

// The 400 a body gets; fails the test when it is accepted.
ApiError refusal(const ordered_json& body, AnthropicRoute route = AnthropicRoute::messages) {
  try {
    read(body, route);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return {};
}

TEST(AnthropicRequest, MaxTokensIsRequiredForMessagesOnly) {
  ordered_json body = base();
  body.erase("max_tokens");
  const ApiError e = refusal(body);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("max_tokens"), std::string::npos) << e.message;
  EXPECT_EQ(anthropic_error_body(e)["error"]["type"], "invalid_request_error");
  // count_tokens takes no max_tokens, and refuses the generation fields.
  EXPECT_EQ(read(body, AnthropicRoute::count_tokens)["messages"].size(), 1u);
  EXPECT_EQ(refusal(base(), AnthropicRoute::count_tokens).param, "max_tokens");
  body["max_tokens"] = 0;
  EXPECT_EQ(refusal(body).param, "max_tokens");
}

TEST(AnthropicRequest, EveryRefusedFieldIsNamed) {
  const ordered_json image = {{"type", "image"}, {"source", {{"type", "url"}, {"url", "http://x/y.png"}}}};
  const ordered_json document = {{"type", "document"}, {"source", {{"type", "text"}, {"data", "d"}}}};
  const ordered_json tool = {{"name", "f"}, {"input_schema", {{"type", "object"}}}};
  auto user = [](ordered_json content) { return ordered_json::array({{{"role", "user"}, {"content", content}}}); };
  const std::vector<std::pair<ordered_json, std::string>> cases = {
      {{{"service_tier", "auto"}}, "service_tier"},
      {{{"container", "c"}}, "container"},
      {{{"mcp_servers", json::array()}}, "mcp_servers"},
      {{{"context_management", json::object()}}, "context_management"},
      {{{"inference_geo", "us"}}, "inference_geo"},
      {{{"speed", "fast"}}, "speed"},
      {{{"no_such_field", 1}}, "no_such_field"},
      {{{"temperature", 1.5}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_k", -1}}, "top_k"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stop_sequences", {""}}}, "stop_sequences"},
      {{{"metadata", {{"user_id", "u"}, {"tier", 1}}}}, "metadata.tier"},
      {{{"system", {{{"type", "image"}}}}}, "system[0]"},
      {{{"thinking", {{"type", "between_tools"}}}}, "thinking.type"},
      {{{"thinking", {{"type", "enabled"}, {"budget_tokens", 512}}}}, "thinking.budget_tokens"},
      {{{"thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}}, {"max_tokens", 2048}}, "thinking.budget_tokens"},
      {{{"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}, {"display", "omitted"}}}, {"max_tokens", 2048}},
       "thinking.display"},
      {{{"output_config", {{"effort", "low"}}}}, "output_config.effort"},
      {{{"output_config", {{"format", {{"type", "xml"}}}}}}, "output_config.format.type"},
      {{{"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}}, "tools[0].type"},
      {{{"tools", {tool, {{"name", "g"}, {"input_schema", {{"type", "object"}}}, {"strict", true}}}}}, "tools[1].strict"},
      {{{"tools", {{{"name", "g"}, {"input_schema", {{"type", "object"}}}, {"defer_loading", true}}}}},
       "tools[0].defer_loading"},
      {{{"tools", {{{"name", "g"}}}}}, "tools[0].input_schema"},
      {{{"tool_choice", {{"type", "sometimes"}}}}, "tool_choice.type"},
      {{{"tool_choice", {{"type", "tool"}}}}, "tool_choice.name"},
      {{{"tool_choice", {{"type", "none"}, {"disable_parallel_tool_use", true}}}}, "tool_choice.disable_parallel_tool_use"},
      {{{"messages", user({{{"type", "text"}, {"text", "look:"}}, image})}}, "messages[0].content[1].source.type"},
      {{{"messages", user({document})}}, "messages[0].content[0]"},
      {{{"messages", user({{{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", {image}}}})}},
       "messages[0].content[0].content[0]"},
      {{{"messages", user({{{"type", "text"}, {"text", "a"}, {"citations", {{{"type", "char_location"}}}}}})}},
       "messages[0].content[0].citations"},
      {{{"messages", user({{{"type", "server_tool_use"}, {"id", "s"}, {"name", "web_search"}, {"input", json::object()}}})}},
       "messages[0].content[0]"},
      {{{"messages", user({{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}, {"input", json::object()}}})}},
       "messages[0].content[0]"},
      {{{"messages", {{{"role", "user"}, {"content", "Hi"}, {"name", "me"}}}}}, "messages[0].name"},
      {{{"messages", {{{"role", "tool"}, {"content", "Hi"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "The answer is"}}}}},
       "messages[1]"},
      {{{"messages", json::array()}}, "messages"},
  };
  for (const auto& [extra, param] : cases) {
    ordered_json body = base();
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
    const ApiError e = refusal(body);
    EXPECT_EQ(e.status, 400) << extra.dump();
    EXPECT_EQ(e.param, param) << extra.dump() << ": " << e.message;
    EXPECT_NE(e.message.find("'" + param + "'"), std::string::npos) << e.message;
  }
}

TEST(AnthropicRequest, FieldsAcceptedWithoutEffect) {
  ordered_json body = base();
  body["metadata"] = {{"user_id", "someone"}};
  body["cache_control"] = {{"type", "ephemeral"}};
  body["messages"] = {{{"role", "user"},
                       {"content", {{{"type", "text"}, {"text", "Hi"}, {"cache_control", {{"type", "ephemeral"}}}}}}}};
  const ordered_json r = read(body);
  EXPECT_EQ(r, ordered_json({{"model", "demo"},
                             {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                             {"max_tokens", 16}}));
}

TEST(AnthropicRequest, SystemAsAStringOrTextBlocks) {
  ordered_json body = base();
  body["system"] = {{{"type", "text"}, {"text", "You are terse."}, {"cache_control", {{"type", "ephemeral"}}}},
                    {{"type", "text"}, {"text", "Answer in French."}}};
  ordered_json r = read(body);
  ASSERT_EQ(r["messages"].size(), 2u);
  EXPECT_EQ(r["messages"][0], ordered_json({{"role", "system"}, {"content", "You are terse.\nAnswer in French."}}));
  EXPECT_EQ(r["messages"][1], ordered_json({{"role", "user"}, {"content", "Hi"}}));
  body["system"] = "Be brief.";
  EXPECT_EQ(read(body)["messages"][0], ordered_json({{"role", "system"}, {"content", "Be brief."}}));
}

TEST(AnthropicRequest, ToolResultBlocksBecomeToolMessages) {
  ordered_json body = base();
  body["messages"] = {
      {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
      {{"role", "assistant"},
       {"content",
        {{{"type", "thinking"}, {"thinking", "Two cities."}, {"signature", "sig"}},
         {{"type", "redacted_thinking"}, {"data", "opaque"}},
         {{"type", "text"}, {"text", "Looking both up."}},
         {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "weather"}, {"input", {{"city", "Paris"}}}},
         {{"type", "tool_use"}, {"id", "toolu_2"}, {"name", "weather"}, {"input", {{"city", "Rome"}}}}}}},
      {{"role", "user"},
       {"content",
        {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "21 C"}},
         {{"type", "tool_result"},
          {"tool_use_id", "toolu_2"},
          {"content", {{{"type", "text"}, {"text", "no station"}}}},
          {"is_error", true}},
         {{"type", "text"}, {"text", "And tomorrow?"}}}}}};
  const ordered_json m = read(body)["messages"];
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[1], ordered_json::parse(R"({"role": "assistant", "content": "Looking both up.",
      "reasoning_content": "Two cities.", "tool_calls": [
      {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
      {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}]})"));
  EXPECT_EQ(m[2], ordered_json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "21 C"}}));
  EXPECT_EQ(m[3], ordered_json({{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "Error: no station"}}));
  EXPECT_EQ(m[4], ordered_json({{"role", "user"}, {"content", "And tomorrow?"}}));
}

TEST(AnthropicRequest, ToolsToolChoiceThinkingAndSampling) {
  ordered_json body = base();
  body["tools"] = {{{"name", "weather"},
                    {"description", "Current weather"},
                    {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}},
                    {"cache_control", {{"type", "ephemeral"}}}}};
  body["tool_choice"] = {{"type", "tool"}, {"name", "weather"}, {"disable_parallel_tool_use", true}};
  body["thinking"] = {{"type", "disabled"}};
  body["stop_sequences"] = {"END"};
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["top_k"] = 40;
  body["stream"] = true;
  const ordered_json r = read(body);
  // The tool's keys in the order transformers' callers send them (a template's tojson shows it).
  EXPECT_EQ(r["tools"].dump(),
            R"([{"type":"function","function":{"name":"weather","description":"Current weather","parameters":)"
            R"({"type":"object","properties":{"city":{"type":"string"}}}}}])");
  EXPECT_EQ(r["tool_choice"], ordered_json({{"type", "function"}, {"function", {{"name", "weather"}}}}));
  EXPECT_EQ(r["parallel_tool_calls"], false);
  EXPECT_EQ(r["chat_template_kwargs"], ordered_json({{"enable_thinking", false}}));
  EXPECT_EQ(r["stop"], ordered_json({"END"}));
  EXPECT_EQ(r["temperature"], 0.5);
  EXPECT_EQ(r["top_p"], 0.9);
  EXPECT_EQ(r["top_k"], 40);
  EXPECT_EQ(r["stream"], true);
  body["tool_choice"] = {{"type", "any"}};
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  body["max_tokens"] = 4096;
  const ordered_json r2 = read(body);
  EXPECT_EQ(r2["tool_choice"], "required");
  EXPECT_FALSE(r2.contains("parallel_tool_calls"));
  EXPECT_EQ(r2["chat_template_kwargs"], ordered_json({{"enable_thinking", true}}));
  body["tool_choice"] = {{"type", "none"}};
  EXPECT_EQ(read(body)["tool_choice"], "none");
  body["output_config"] = {{"format", {{"type", "json_schema"}, {"schema", {{"type", "object"}}}}}};
  EXPECT_EQ(read(body)["response_format"]["json_schema"]["schema"], ordered_json({{"type", "object"}}));
}

// A conversation with a call and its result, sent in Anthropic's shape, renders as
// transformers renders the same conversation in OpenAI's (the fixture's "output").
TEST(AnthropicRequest, AToolRoundTripRendersAsTransformersDoes) {
  if (!std::filesystem::exists(testing::tokenizer_dir("qwen2_5")))
    GTEST_SKIP() << "node_modules/@lenml is missing: run npm ci";
  const ordered_json c = testing::round_trip("qwen2_5", "one call");
  const ordered_json& m = c["request"]["messages"];
  const ordered_json tools = testing::anthropic_tools(c);
  const auto& call = m[2]["tool_calls"][0];
  ordered_json body = {
      {"max_tokens", 100},
      {"system", {{{"type", "text"}, {"text", m[0]["content"]}}}},
      {"tools", tools},
      {"messages",
       {{{"role", "user"}, {"content", m[1]["content"]}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "tool_use"}, {"id", call["id"]}, {"name", call["function"]["name"]}, {"input", call["function"]["arguments"]}}}}},
        {{"role", "user"},
         {"content", {{{"type", "tool_result"}, {"tool_use_id", call["id"]}, {"content", m[3]["content"]}}}}}}}};
  ordered_json r = read(body);
  prepare_chat_messages(r);
  EXPECT_EQ(ChatTemplate::load(testing::tokenizer_dir("qwen2_5")).render(r), c["output"].get<std::string>());
}

TEST(AnthropicErrors, TheTypeFollowsTheStatus) {
  const std::vector<std::pair<int, std::string>> cases = {
      {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
      {413, "request_too_large"},     {429, "rate_limit_error"},     {500, "api_error"},
      {503, "overloaded_error"},      {405, "invalid_request_error"}};
  for (const auto& [status, type] : cases) {
    ApiError e = bad_request("m");
    e.status = status;
    const ordered_json b = anthropic_error_body(e);
    EXPECT_EQ(b, ordered_json({{"type", "error"}, {"error", {{"type", type}, {"message", "m"}}}})) << status;
  }
}

// The events of a stream in order: (event name, data).
std::vector<std::pair<std::string, json>> events_of(const std::string& sse) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string e = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = e.find('\n');
    EXPECT_EQ(e.rfind("event: ", 0), 0u) << e;
    EXPECT_EQ(e.compare(nl + 1, 6, "data: "), 0) << e;
    out.emplace_back(e.substr(7, nl - 7), json::parse(e.substr(nl + 7)));
    EXPECT_EQ(out.back().first, out.back().second["type"].get<std::string>()) << e;
  }
  return out;
}

TEST(AnthropicEvents, BlocksOpenAndCloseInIndexOrder) {
  AnthropicEventStream s("msg_1", "demo");
  std::string sse = s.start({10, 4, 1});
  sse += s.push("Hm", "", {});
  sse += s.push(" ok.", "Sure", {});
  sse += s.push("", "", {{"toolu_a", "f", "{\"x\"", 0}});
  sse += s.push("", "", {{"", "", ": 1}", 0}, {"toolu_b", "g", "{}", 1}});
  AnthropicStop stop;
  stop.finish_reason = "stop";
  stop.called = true;
  sse += s.finish(stop, {10, 4, 7});
  const auto ev = events_of(sse);
  std::vector<std::string> names;
  for (const auto& [name, data] : ev) names.push_back(name + (data.contains("index") ? std::to_string(data["index"].get<int>()) : ""));
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start0", "content_block_delta0",
                                             "content_block_delta0", "content_block_stop0", "content_block_start1",
                                             "content_block_delta1", "content_block_stop1", "content_block_start2",
                                             "content_block_delta2", "content_block_delta2", "content_block_stop2",
                                             "content_block_start3", "content_block_delta3", "content_block_stop3",
                                             "message_delta", "message_stop"}));
  EXPECT_EQ(ev[0].second["message"]["usage"],
            json({{"input_tokens", 6}, {"output_tokens", 1}, {"cache_read_input_tokens", 4},
                  {"cache_creation_input_tokens", 0}}));
  EXPECT_EQ(ev[0].second["message"]["content"], json::array());
  EXPECT_EQ(ev[2].second["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[4].second["delta"], json({{"type", "thinking_delta"}, {"thinking", " ok."}}));
  EXPECT_EQ(ev[7].second["delta"], json({{"type", "text_delta"}, {"text", "Sure"}}));
  EXPECT_EQ(ev[9].second["content_block"],
            json({{"type", "tool_use"}, {"id", "toolu_a"}, {"name", "f"}, {"input", json::object()}}));
  EXPECT_EQ(ev[11].second["delta"], json({{"type", "input_json_delta"}, {"partial_json", ": 1}"}}));
  EXPECT_EQ(ev[16].second["delta"], json({{"stop_reason", "tool_use"}, {"stop_sequence", nullptr}}));
  EXPECT_EQ(ev[16].second["usage"]["output_tokens"], 7);
}

TEST(AnthropicReply, StopReasonsAndTheMessageObject) {
  AnthropicStop s;
  s.finish_reason = "length";
  EXPECT_EQ(anthropic_stop_reason(s), "max_tokens");
  s.context_full = true;
  EXPECT_EQ(anthropic_stop_reason(s), "model_context_window_exceeded");
  s = {};
  s.finish_reason = "stop";
  EXPECT_EQ(anthropic_stop_reason(s), "end_turn");
  s.stop_sequence = "\n\n";
  EXPECT_EQ(anthropic_stop_reason(s), "stop_sequence");
  const ordered_json m =
      anthropic_message_json("msg_2", "demo", "Hello", "", {{"toolu_x", "f", R"({"b":1,"a":[2]})", 0}}, s, {5, 0, 3});
  EXPECT_EQ(m.dump(), R"({"id":"msg_2","type":"message","role":"assistant","model":"demo","content":[)"
                      R"({"type":"text","text":"Hello"},{"type":"tool_use","id":"toolu_x","name":"f","input":{"b":1,"a":[2]}}],)"
                      R"("stop_reason":"stop_sequence","stop_sequence":"\n\n","usage":{"input_tokens":5,"output_tokens":3,)"
                      R"("cache_creation_input_tokens":0,"cache_read_input_tokens":0}})");
}

}  // namespace
}  // namespace osprey
