// The OpenAI Responses request reader, the items-to-messages mapping, the reply's items and
// events (server/responses_api.h), and the response store (server/response_store.h).
#include "server/responses_api.h"

#include <gtest/gtest.h>

#include "server/completion_request.h"
#include "server/response_store.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json base() { return {{"model", "demo"}, {"input", "Hi"}}; }

ordered_json with(ordered_json body, const ordered_json& extra) {
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = *it;
  return body;
}

// The 400 a body gets; fails the test when it is accepted.
ApiError refusal(const ordered_json& body) {
  try {
    read_responses_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return {};
}

TEST(ResponsesRequest, EveryRefusedFieldIsNamed) {
  const ordered_json fn = {{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "object"}}}};
  auto input = [](ordered_json item) { return ordered_json{{"input", ordered_json::array({item})}}; };
  const std::vector<std::pair<ordered_json, std::string>> cases = {
      {{{"conversation", "conv_1"}}, "conversation"},
      {{{"prompt", {{"id", "pmpt_1"}}}}, "prompt"},
      {{{"service_tier", "auto"}}, "service_tier"},
      {{{"max_tool_calls", 3}}, "max_tool_calls"},
      {{{"top_logprobs", 2}}, "top_logprobs"},
      {{{"no_such_field", 1}}, "no_such_field"},
      {{{"background", true}}, "background"},
      {{{"truncation", "auto"}}, "truncation"},
      {{{"include", {"message.output_text.logprobs"}}}, "include"},
      {{{"include", "reasoning.encrypted_content"}}, "include"},
      {{{"temperature", 2.5}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"max_output_tokens", 0}}, "max_output_tokens"},
      {{{"stream", "yes"}}, "stream"},
      {{{"store", 1}}, "store"},
      {{{"previous_response_id", 7}}, "previous_response_id"},
      {{{"instructions", {"a"}}}, "instructions"},
      {{{"metadata", {{"k", 1}}}}, "metadata.k"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options.include_usage"},
      {{{"text", {{"verbosity", "low"}}}}, "text.verbosity"},
      {{{"text", {{"format", {{"type", "xml"}}}}}}, "text.format.type"},
      {{{"text", {{"format", {{"type", "json_schema"}, {"name", "n"}}}}}}, "text.format.schema"},
      {{{"reasoning", {{"effort", "max"}}}}, "reasoning.effort"},
      {{{"reasoning", {{"summary", "long"}}}}, "reasoning.summary"},
      {{{"tools", {{{"type", "web_search"}}}}}, "tools[0]"},
      {{{"tools", {fn, {{"type", "file_search"}, {"vector_store_ids", {"v"}}}}}}, "tools[1]"},
      {{{"tools", {{{"type", "web_search_preview"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "computer_use_preview"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "code_interpreter"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "image_generation"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "mcp"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "local_shell"}}}}}, "tools[0]"},
      {{{"tools", {{{"type", "custom"}, {"name", "apply_patch"}}}}}, "tools[0].type"},
      {{{"tools", {{{"type", "function"}, {"name", "f"}, {"defer_loading", true}}}}}, "tools[0].defer_loading"},
      {{{"tools", {{{"type", "function"}}}}}, "tools[0].name"},
      {{{"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", "x"}}}}}, "tools[0].parameters"},
      {{{"tool_choice", "any"}}, "tool_choice"},
      {{{"tool_choice", {{"type", "web_search_preview"}}}}, "tool_choice.type"},
      {{{"tool_choice", {{"type", "allowed_tools"}, {"mode", "auto"}}}}, "tool_choice.type"},
      {input({{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "http://x/y.png"}}}}}),
       "input[0].content[0].image_url"},
      {input({{"role", "user"}, {"content", {{{"type", "input_image"}, {"file_id", "file-1"}}}}}),
       "input[0].content[0].file_id"},
      {input({{"role", "assistant"}, {"content", {{{"type", "input_image"}, {"image_url", "data:image/png;base64,AAAA"}}}}}),
       "input[0].content[0]"},
      {input({{"role", "user"}, {"content", {{{"type", "input_file"}, {"file_id", "f"}}}}}), "input[0].content[0]"},
      {input({{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "a"}, {"x", 1}}}}}),
       "input[0].content[0].x"},
      {input({{"role", "tool"}, {"content", "x"}}), "input[0].role"},
      {input({{"role", "user"}}), "input[0].content"},
      {input({{"type", "item_reference"}, {"id", "msg_1"}}), "input[0]"},
      {input({{"type", "web_search_call"}, {"id", "ws_1"}}), "input[0]"},
      {input({{"content", "no role"}}), "input[0].type"},
      {input({{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", "[1]"}}), "input[0].arguments"},
      {input({{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}), "input[0].call_id"},
      {input({{"type", "function_call_output"}, {"call_id", "c"}}), "input[0].output"},
      {input({{"type", "reasoning"}, {"summary", {{{"type", "reasoning_text"}, {"text", "t"}}}}}),
       "input[0].summary[0].type"},
      {{{"input", 3}}, "input"},
  };
  for (const auto& [extra, param] : cases) {
    SCOPED_TRACE(extra.dump());
    const ApiError e = refusal(with(base(), extra));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.message;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  }
  ordered_json no_input = base();
  no_input.erase("input");
  EXPECT_EQ(refusal(no_input).param, "input");
  // A hosted tool is named in the message.
  EXPECT_NE(refusal(with(base(), {{"tools", {{{"type", "web_search"}}}}})).message.find("'web_search'"),
            std::string::npos);
}

TEST(ResponsesRequest, FieldsAcceptedWithoutEffectAndTheirDefaults) {
  const ResponsesRequest r = read_responses_request(
      with(base(), {{"include", {"reasoning.encrypted_content"}},
                    {"store", false},
                    {"user", "u"},
                    {"safety_identifier", "s"},
                    {"prompt_cache_key", "k"},
                    {"truncation", "disabled"},
                    {"background", false},
                    {"stream_options", {{"include_obfuscation", false}}},
                    {"text", {{"verbosity", "medium"}}}}));
  EXPECT_FALSE(r.store);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.chat, ordered_json({{"model", "demo"}}));
  EXPECT_EQ(r.echo["store"], false);
  EXPECT_EQ(r.echo["user"], "u");
  EXPECT_EQ(r.echo["tool_choice"], "auto");
  EXPECT_EQ(r.echo["text"], ordered_json({{"format", {{"type", "text"}}}, {"verbosity", "medium"}}));
  EXPECT_EQ(r.echo["truncation"], "disabled");
  const ResponsesRequest d = read_responses_request(base());
  EXPECT_TRUE(d.store);
  EXPECT_EQ(d.echo["tools"], ordered_json::array());
  EXPECT_EQ(d.echo["metadata"], ordered_json::object());
  EXPECT_TRUE(d.echo["previous_response_id"].is_null());
}

TEST(ResponsesRequest, SettingsBecomeTheChatRequestsFields) {
  const ordered_json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  const ResponsesRequest r = read_responses_request(with(
      base(), {{"tools", {{{"type", "function"}, {"name", "f"}, {"description", "d"}, {"parameters", schema}, {"strict", true}}}},
               {"tool_choice", {{"type", "function"}, {"name", "f"}}},
               {"parallel_tool_calls", false},
               {"max_output_tokens", 64},
               {"temperature", 0.5},
               {"top_p", 0.9},
               {"stream", true},
               {"text", {{"format", {{"type", "json_schema"}, {"name", "out"}, {"schema", schema}, {"strict", true}}}}},
               {"reasoning", {{"effort", "none"}, {"summary", "auto"}}},
               {"previous_response_id", "resp_1"},
               {"metadata", {{"k", "v"}}}}));
  const ordered_json expected = {
      {"model", "demo"},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"description", "d"}, {"parameters", schema}}}}}},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},
      {"parallel_tool_calls", false},
      {"max_tokens", 64},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "out"}, {"schema", schema}, {"strict", true}}}}},
      {"chat_template_kwargs", {{"enable_thinking", false}}},
      {"stream", true}};
  EXPECT_EQ(json::parse(r.chat.dump()), json::parse(expected.dump()));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.reasoning_summary);
  EXPECT_EQ(r.previous_response_id, "resp_1");
  EXPECT_EQ(r.echo["tools"][0],
            ordered_json({{"type", "function"}, {"name", "f"}, {"description", "d"}, {"parameters", schema}, {"strict", true}}));
  EXPECT_EQ(r.echo["reasoning"], ordered_json({{"effort", "none"}, {"summary", "auto"}}));
  EXPECT_EQ(r.echo["metadata"], ordered_json({{"k", "v"}}));
  // The chat route reads what it became.
  const CompletionRequest c = read_completion_fields(json::parse(responses_chat_request(r, r.input).dump()), true);
  EXPECT_EQ(c.tool_names, std::vector<std::string>{"f"});
  EXPECT_EQ(c.tool_choice.mode, "function");
  EXPECT_FALSE(c.parallel_tool_calls);
  EXPECT_EQ(c.max_tokens, 64);
  EXPECT_TRUE(c.stream);
  // effort low to xhigh turns thinking on; json_object passes through.
  const ResponsesRequest on = read_responses_request(
      with(base(), {{"reasoning", {{"effort", "high"}}}, {"text", {{"format", {{"type", "json_object"}}}}}}));
  EXPECT_EQ(on.chat["chat_template_kwargs"], ordered_json({{"enable_thinking", true}}));
  EXPECT_EQ(on.chat["response_format"], ordered_json({{"type", "json_object"}}));
  EXPECT_FALSE(on.reasoning_summary);
}

TEST(ResponsesRequest, InputFormsBecomeItems) {
  EXPECT_EQ(read_responses_request(base()).input,
            ordered_json::array({{{"type", "message"}, {"role", "user"}, {"content", "Hi"}}}));
  // A message without "type" is a message; parts are kept as sent.
  const ordered_json parts = {{{"type", "input_text"}, {"text", "a"}}, {{"type", "input_text"}, {"text", "b"}}};
  const ResponsesRequest r = read_responses_request(with(base(), {{"input", {{{"role", "user"}, {"content", parts}}}}}));
  EXPECT_EQ(r.input, ordered_json::array({{{"role", "user"}, {"content", parts}, {"type", "message"}}}));
  EXPECT_EQ(responses_chat_messages("", r.input), ordered_json::array({{{"role", "user"}, {"content", "a\nb"}}}));
}

TEST(ResponsesRequest, ItemsMapToChatMessagesInOrder) {
  const ordered_json input = ordered_json::parse(R"([
    {"role": "developer", "content": "Be terse."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Two calls."}],
     "encrypted_content": "opaque"},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "w", "arguments": "{\"city\":\"Paris\"}",
     "status": "completed"},
    {"type": "function_call", "call_id": "call_2", "name": "w", "arguments": "{\"city\":\"Rome\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "21"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "25"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Answer."}]},
    {"role": "assistant", "content": "Paris 21, Rome 25."},
    {"role": "system", "content": "Now in French."},
    {"type": "function_call", "call_id": "call_3", "name": "w", "arguments": "{}"}
  ])");
  const ResponsesRequest r = read_responses_request(with(base(), {{"input", input}, {"instructions", "You help."}}));
  const ordered_json expected = ordered_json::parse(R"([
    {"role": "system", "content": "You help."},
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Two calls.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Rome\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    {"role": "tool", "tool_call_id": "call_2", "content": "25"},
    {"role": "assistant", "content": "Paris 21, Rome 25.", "reasoning_content": "Answer."},
    {"role": "system", "content": "Now in French."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}
  ])");
  EXPECT_EQ(responses_chat_messages(r.instructions, r.input), expected);
  // The chat route's preparation reads the calls' arguments as objects.
  ordered_json chat = responses_chat_request(r, r.input);
  prepare_chat_messages(chat);
  EXPECT_EQ(chat["messages"][3]["tool_calls"][0]["function"]["arguments"], ordered_json({{"city", "Paris"}}));
}

TEST(ResponsesRequest, AChainedRequestContinuesThePreviousConversation) {
  StoredResponse prev;
  prev.input = ordered_json::array({{{"type", "message"}, {"role", "user"}, {"content", "Weather?"}}});
  prev.response = {{"id", "resp_1"},
                   {"output", {{{"type", "function_call"}, {"id", "fc_1"}, {"call_id", "call_1"}, {"name", "w"},
                                {"arguments", "{}"}, {"status", "completed"}}}}};
  const ResponsesRequest r = read_responses_request(
      with(base(), {{"previous_response_id", "resp_1"},
                    {"input", {{{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}}}}}));
  const ordered_json items = responses_conversation(r, &prev);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0], prev.input[0]);
  EXPECT_EQ(items[1], prev.response["output"][0]);
  EXPECT_EQ(items[2], r.input[0]);
  const ApiError e = response_not_found("resp_x", "previous_response_id");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_NE(e.message.find("'resp_x'"), std::string::npos);
}

TEST(ResponsesReply, AWholeReplyIsItsItemsInOrder) {
  ResponsesReply reply("resp_ab1", 100, "demo", read_responses_request(base()).echo, false);
  reply.push("think", "Hello", {{"call_ab1_0_0", "f", "{\"a\":1}", 0}});
  reply.finish(false, {10, 4, 7, 2});
  const ordered_json r = reply.response();
  EXPECT_EQ(r["id"], "resp_ab1");
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  const ordered_json expected_output = ordered_json::parse(R"([
    {"id": "rs_ab1_0", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
    {"id": "msg_ab1_1", "type": "message", "status": "completed", "role": "assistant",
     "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
    {"id": "fc_ab1_0_0", "type": "function_call", "status": "completed", "arguments": "{\"a\":1}",
     "call_id": "call_ab1_0_0", "name": "f"}
  ])");
  EXPECT_EQ(r["output"], expected_output);
  EXPECT_EQ(r["usage"], ordered_json::parse(R"({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
    "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 17})"));
}

TEST(ResponsesReply, AStreamNumbersItsEventsAndEndsIncompleteWhenCut) {
  ResponsesReply reply("resp_x", 100, "demo", read_responses_request(base()).echo, true);
  std::string sse = reply.start();
  sse += reply.push("a", "", {});
  sse += reply.push("b", "", {});
  sse += reply.push("", "Hel", {});
  sse += reply.push("", "lo", {});
  sse += reply.finish(true, {1, 0, 4, 1});
  std::vector<std::string> types;
  size_t pos = 0;
  int64_t seq = 0;
  ordered_json last;
  while ((pos = sse.find("event: ", pos)) != std::string::npos) {
    const size_t nl = sse.find('\n', pos);
    const size_t end = sse.find("\n\n", nl);
    types.push_back(sse.substr(pos + 7, nl - pos - 7));
    last = ordered_json::parse(sse.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(last["type"], types.back());
    EXPECT_EQ(last["sequence_number"], seq++);
    pos = end;
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_summary_part.added",
      "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.incomplete"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(last["response"]["status"], "incomplete");
  EXPECT_EQ(last["response"]["incomplete_details"], ordered_json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(last["response"]["output"][0]["summary"], ordered_json::parse(R"([{"type": "summary_text", "text": "ab"}])"));
  EXPECT_EQ(last["response"]["output"][1]["status"], "incomplete");
  EXPECT_EQ(last["response"]["output"][1]["content"][0]["text"], "Hello");
  // An error event carries the error's code and message.
  ApiError e;
  e.status = 503;
  e.code = "shutting_down";
  e.message = "the server is shutting down";
  const std::string err = reply.error(e);
  EXPECT_EQ(err.rfind("event: error\n", 0), 0u) << err;
  EXPECT_NE(err.find("\"code\":\"shutting_down\""), std::string::npos) << err;
}

TEST(ResponseStore, TheOldestAreEvictedPastEitherBound) {
  auto entry = [](size_t n) { return StoredResponse{{{"text", std::string(n, 'x')}}, ordered_json::array()}; };
  ResponseStore by_count(2, 1 << 20);
  by_count.put("a", entry(1));
  by_count.put("b", entry(1));
  by_count.put("c", entry(1));
  EXPECT_FALSE(by_count.get("a"));
  EXPECT_TRUE(by_count.get("b"));
  EXPECT_TRUE(by_count.get("c"));
  EXPECT_TRUE(by_count.erase("b"));
  EXPECT_FALSE(by_count.erase("b"));
  EXPECT_EQ(by_count.size(), 1u);

  ResponseStore by_bytes(100, 1000);
  for (const char* id : {"a", "b", "c"}) by_bytes.put(id, entry(300));
  EXPECT_TRUE(by_bytes.get("a"));
  by_bytes.put("d", entry(300));  // past 1000 bytes: a goes
  EXPECT_FALSE(by_bytes.get("a"));
  EXPECT_TRUE(by_bytes.get("d"));
  EXPECT_LE(by_bytes.bytes(), 1000u);
  by_bytes.put("huge", entry(2000));  // larger than the budget alone: not kept, nothing evicted
  EXPECT_FALSE(by_bytes.get("huge"));
  EXPECT_TRUE(by_bytes.get("b"));
  // Deleting and storing again many times keeps the bounds.
  for (int i = 0; i < 1000; ++i) {
    by_bytes.put("tmp", entry(1));
    by_bytes.erase("tmp");
  }
  EXPECT_EQ(by_bytes.size(), 3u);
  EXPECT_EQ(by_bytes.get("c")->response["text"], std::string(300, 'x'));
}

}  // namespace
}  // namespace osprey
