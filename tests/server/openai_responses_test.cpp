// The official `openai` npm client's `responses` resource (pinned in package.json) as a client
// of the server's /v1/responses routes: on the demo model, and on scripted models
// (support/scripted_model.h) with Qwen2.5's and Qwen3's tokenizers and templates for tool calls
// and reasoning, whose prompts must render as transformers renders the fixtures.
#include <gtest/gtest.h>

#include <cstdio>

#include "chat/chat_template.h"
#include "server/scripted_server.h"
#include "support/scripted_model.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string message_text(const json& response) {
  std::string text;
  for (const auto& item : response["output"])
    if (item["type"] == "message")
      for (const auto& part : item["content"]) text += part["text"].get<std::string>();
  return text;
}

TEST(ServerResponsesClient, TheNodeClientCreatesStreamsChainsRetrievesAndDeletes) {
  if (const std::string why = testing::node_client_missing("openai"); !why.empty()) GTEST_SKIP() << why;
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"test-key"};
  testing::TestServer s(o);
  auto [rc, out] = testing::run_node_script("openai_responses.mjs", {"text", std::to_string(s.port()), "test-key", "demo"});
  ASSERT_EQ(rc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;

  // A whole response: one message item, cut by max_output_tokens.
  const json& whole = r["whole"];
  EXPECT_EQ(whole["object"], "response");
  EXPECT_EQ(whole["id"].get<std::string>().rfind("resp_", 0), 0u) << whole["id"];
  EXPECT_EQ(whole["model"], "demo");
  EXPECT_EQ(whole["status"], "incomplete");
  EXPECT_EQ(whole["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  ASSERT_EQ(whole["output"].size(), 1u) << whole.dump();
  const json& item = whole["output"][0];
  EXPECT_EQ(item["type"], "message");
  EXPECT_EQ(item["role"], "assistant");
  EXPECT_EQ(item["status"], "incomplete");
  EXPECT_EQ(item["id"].get<std::string>().rfind("msg_", 0), 0u) << item["id"];
  const std::string text = r["whole_text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text, message_text(whole));
  EXPECT_EQ(whole["usage"]["output_tokens"], 20);
  EXPECT_GT(whole["usage"]["input_tokens"].get<int64_t>(), 1);
  EXPECT_EQ(whole["usage"]["total_tokens"].get<int64_t>(), whole["usage"]["input_tokens"].get<int64_t>() + 20);
  EXPECT_EQ(whole["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  // The request's settings come back.
  EXPECT_EQ(whole["max_output_tokens"], 20);
  EXPECT_EQ(whole["temperature"], 0);
  EXPECT_EQ(whole["store"], true);
  EXPECT_EQ(whole["tool_choice"], "auto");
  EXPECT_EQ(whole["truncation"], "disabled");

  // The same streamed: the client's snapshot is the joined deltas, and greedy gives the same text.
  std::string joined;
  for (const auto& d : r["deltas"]) joined += d.get<std::string>();
  EXPECT_GT(r["deltas"].size(), 5u);
  EXPECT_EQ(r["streamed_text"], joined);
  EXPECT_EQ(joined, text);
  EXPECT_EQ(r["streamed"]["status"], "incomplete");
  EXPECT_EQ(r["streamed"]["usage"]["output_tokens"], 20);
  const json& events = r["events"];
  ASSERT_GE(events.size(), 9u);
  EXPECT_EQ(events[0], "response.created");
  EXPECT_EQ(events[1], "response.in_progress");
  EXPECT_EQ(events[2], "response.output_item.added");
  EXPECT_EQ(events[3], "response.content_part.added");
  EXPECT_EQ(events[4], "response.output_text.delta");
  EXPECT_EQ(events[events.size() - 4], "response.output_text.done");
  EXPECT_EQ(events[events.size() - 3], "response.content_part.done");
  EXPECT_EQ(events[events.size() - 2], "response.output_item.done");
  EXPECT_EQ(events[events.size() - 1], "response.incomplete");
  for (size_t i = 0; i < r["sequence"].size(); ++i) EXPECT_EQ(r["sequence"][i], i);
  EXPECT_EQ(r["raw_types"], events);

  // A chained turn renders the same prompt as the conversation sent whole.
  EXPECT_EQ(r["chained"]["previous_response_id"], whole["id"]);
  EXPECT_EQ(r["chained"]["metadata"], json({{"turn", "2"}}));
  EXPECT_GT(r["chained"]["usage"]["input_tokens"].get<int64_t>(), whole["usage"]["input_tokens"].get<int64_t>() + 20);
  EXPECT_EQ(r["chained"]["usage"]["input_tokens"], r["sent_whole"]["usage"]["input_tokens"]);
  EXPECT_EQ(r["chained"]["output_text"], r["sent_whole"]["output_text"]);
  EXPECT_EQ(r["retrieved"]["id"], r["chained"]["id"]);
  EXPECT_EQ(message_text(r["retrieved"]), message_text(r["chained"]));

  // store false, a deleted response and an unknown id: 404s naming the id.
  for (const char* which : {"unstored_get", "deleted_get", "deleted_chain", "unknown_previous"}) {
    SCOPED_TRACE(which);
    EXPECT_EQ(r[which]["status"], 404) << r[which].dump();
    EXPECT_EQ(r[which]["not_found"], true);
    EXPECT_NE(r[which]["message"].get<std::string>().find("'resp_"), std::string::npos) << r[which].dump();
  }
  EXPECT_EQ(r["unknown_previous"]["param"], "previous_response_id");
  EXPECT_EQ(r["unknown_previous"]["code"], "previous_response_not_found");
  EXPECT_EQ(r["web_search"]["status"], 400);
  EXPECT_EQ(r["web_search"]["bad_request"], true);
  EXPECT_EQ(r["web_search"]["param"], "tools[0]");
  EXPECT_NE(r["web_search"]["message"].get<std::string>().find("web_search"), std::string::npos);
  EXPECT_EQ(r["bad_key"]["status"], 401);
}

// The fixture's first turn in the Responses shape: instructions, one user message, function
// tools.
ordered_json responses_first_turn(const ordered_json& c, const std::string& model) {
  const ordered_json& m = c["request"]["messages"];
  ordered_json tools = ordered_json::array();
  for (const auto& t : c["request"]["tools"])
    tools.push_back({{"type", "function"},
                     {"name", t["function"]["name"]},
                     {"description", t["function"]["description"]},
                     {"parameters", t["function"]["parameters"]},
                     {"strict", false}});
  return {{"model", model},
          {"instructions", m[0]["content"]},
          {"input", {{{"role", "user"}, {"content", m[1]["content"]}}}},
          {"tools", tools}};
}

// A forced call on a scripted Qwen2.5 that writes the fixture's call; then the call's result,
// through previous_response_id, renders as transformers renders the fixture's whole
// conversation.
TEST(ServerResponsesClient, AForcedCallComesBackAsAFunctionCallItemAndItsResultContinuesTheChain) {
  if (const std::string why = testing::node_client_missing("openai"); !why.empty()) GTEST_SKIP() << why;
  const ordered_json c = testing::round_trip("qwen2_5", "one call");
  testing::ScriptedServer s("qwen2_5", testing::first_turn(c), c["reply"]);
  ordered_json request = responses_first_turn(c, "qwen2_5");
  request["tool_choice"] = {{"type", "function"}, {"name", "get_weather"}};
  testing::TempDir tmp;
  testing::write_file(tmp / "request.json", request.dump());
  const ordered_json& m = c["request"]["messages"];
  auto [rc, out] =
      testing::run_node_script("openai_responses.mjs", {"tools", std::to_string(s.server->port()), (tmp / "request.json").string(), m[3]["content"].get<std::string>()});
  ASSERT_EQ(rc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  const json arguments = json::parse(c["calls"][0]["arguments"].dump());
  for (const char* which : {"whole", "streamed"}) {
    SCOPED_TRACE(which);
    const json& resp = r[which];
    EXPECT_EQ(resp["status"], "completed") << resp.dump();
    ASSERT_EQ(resp["output"].size(), 1u) << resp.dump();
    const json& call = resp["output"][0];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u) << call.dump();
    EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u) << call.dump();
    EXPECT_EQ(call["name"], "get_weather");
    EXPECT_EQ(call["status"], "completed");
    EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), arguments);
    EXPECT_EQ(resp["tool_choice"], json({{"type", "function"}, {"name", "get_weather"}}));
  }
  // The arguments streamed in fragments that, joined, are the arguments.
  EXPECT_GT(r["arguments_deltas"].size(), 1u) << r["arguments_deltas"].dump();
  std::string joined;
  for (const auto& f : r["arguments_deltas"]) joined += f.get<std::string>();
  EXPECT_EQ(joined, r["arguments_done"].get<std::string>());
  EXPECT_EQ(json::parse(joined), arguments);
  // The next turn's prompt is transformers' rendering of the call and its result (the scripted
  // model then ends at once), whether chained or sent whole.
  const Tokenizer tok = Tokenizer::load(testing::tokenizer_dir("qwen2_5"));
  const size_t n_next = tok.encode(c["output"].get<std::string>(), false, true).size();
  EXPECT_EQ(r["next"]["usage"]["input_tokens"], n_next) << r["next"].dump();
  EXPECT_EQ(r["next_whole"]["usage"]["input_tokens"], n_next) << r["next_whole"].dump();
  EXPECT_EQ(r["next"]["status"], "completed");
  EXPECT_EQ(r["next"]["previous_response_id"], r["whole"]["id"]);
}

// Text then two calls on a scripted Qwen2.5: a message item and two function_call items; the
// next turn (both results, chained) renders as transformers renders the fixture's conversation,
// where the text and both calls are one assistant message.
TEST(ServerResponsesClient, TextThenTwoCallsAndTheirResultsRenderAsOneAssistantTurn) {
  if (!std::filesystem::exists(testing::tokenizer_dir("qwen2_5"))) GTEST_SKIP() << "node_modules/@lenml is missing";
  const ordered_json c = testing::round_trip("qwen2_5", "content, then two calls");
  testing::ScriptedServer s("qwen2_5", testing::first_turn(c), c["reply"]);
  const ordered_json request = responses_first_turn(c, "qwen2_5");
  auto [status, text] = s.server->post("/v1/responses", request.dump());
  ASSERT_EQ(status, 200) << text;
  const json r = json::parse(text);
  ASSERT_EQ(r["output"].size(), 3u) << r.dump();
  EXPECT_EQ(message_text(r), c["content"].get<std::string>());
  EXPECT_EQ(r["output"][0]["status"], "completed");
  for (size_t i = 0; i < 2; ++i) {
    const json& call = r["output"][i + 1];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["name"], c["calls"][i]["name"]);
    EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json::parse(c["calls"][i]["arguments"].dump()));
  }
  EXPECT_NE(r["output"][1]["call_id"], r["output"][2]["call_id"]);
  const ordered_json& m = c["request"]["messages"];
  ordered_json next = {{"instructions", request["instructions"]},
                       {"tools", request["tools"]},
                       {"previous_response_id", r["id"]},
                       {"input",
                        {{{"type", "function_call_output"}, {"call_id", r["output"][1]["call_id"]}, {"output", m[3]["content"]}},
                         {{"type", "function_call_output"}, {"call_id", r["output"][2]["call_id"]}, {"output", m[4]["content"]}}}}};
  auto [st2, t2] = s.server->post("/v1/responses", next.dump());
  ASSERT_EQ(st2, 200) << t2;
  const Tokenizer tok = Tokenizer::load(testing::tokenizer_dir("qwen2_5"));
  EXPECT_EQ(json::parse(t2)["usage"]["input_tokens"], tok.encode(c["output"].get<std::string>(), false, true).size()) << t2;
}

// A Qwen3 reply that reasons, then calls: a reasoning item (reasoning_text content, or
// summary_text when a summary is asked), then a function_call item, whole and streamed.
TEST(ServerResponsesClient, ReasoningComesBackAsAReasoningItemBeforeTheCall) {
  if (!std::filesystem::exists(testing::tokenizer_dir("qwen3"))) GTEST_SKIP() << "node_modules/@lenml is missing";
  const ordered_json c = testing::round_trip("qwen3", "reasoning, then a call");
  testing::ScriptedServer s("qwen3", testing::first_turn(c), c["reply"]);
  const json arguments = json::parse(c["calls"][0]["arguments"].dump());
  const std::string reasoning = c["reasoning"];
  for (bool summary : {false, true}) {
    SCOPED_TRACE(summary ? "summary" : "content");
    ordered_json request = responses_first_turn(c, "qwen3");
    if (summary) request["reasoning"] = {{"summary", "auto"}};
    auto [status, text] = s.server->post("/v1/responses", request.dump());
    ASSERT_EQ(status, 200) << text;
    const json r = json::parse(text);
    ASSERT_EQ(r["output"].size(), 2u) << r.dump();
    const json& rs = r["output"][0];
    EXPECT_EQ(rs["type"], "reasoning");
    EXPECT_EQ(rs["id"].get<std::string>().rfind("rs_", 0), 0u);
    if (summary) {
      EXPECT_EQ(rs["summary"], json::array({{{"type", "summary_text"}, {"text", reasoning}}}));
      EXPECT_FALSE(rs.contains("content"));
    } else {
      EXPECT_EQ(rs["summary"], json::array());
      EXPECT_EQ(rs["content"], json::array({{{"type", "reasoning_text"}, {"text", reasoning}}}));
    }
    EXPECT_EQ(r["output"][1]["type"], "function_call");
    EXPECT_EQ(json::parse(r["output"][1]["arguments"].get<std::string>()), arguments);
    EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), 0);

    request["stream"] = true;
    auto [st2, body] = s.server->post("/v1/responses", request.dump());
    ASSERT_EQ(st2, 200) << body;
    std::string streamed_reasoning, args;
    std::vector<std::string> items;
    json completed;
    int64_t seq = 0;
    for (const auto& [name, data] : testing::sse_named_events(body)) {
      EXPECT_EQ(name, data["type"].get<std::string>());
      EXPECT_EQ(data["sequence_number"], seq++);
      if (name == "response.output_item.added") items.push_back(data["item"]["type"]);
      if (name == (summary ? "response.reasoning_summary_text.delta" : "response.reasoning_text.delta"))
        streamed_reasoning += data["delta"].get<std::string>();
      if (name == "response.function_call_arguments.delta") args += data["delta"].get<std::string>();
      EXPECT_NE(name, "response.output_text.delta") << data.dump();
      if (name == "response.completed") completed = data["response"];
    }
    EXPECT_EQ(items, (std::vector<std::string>{"reasoning", "function_call"}));
    EXPECT_EQ(streamed_reasoning, reasoning);
    EXPECT_EQ(json::parse(args), arguments);
    ASSERT_TRUE(completed.is_object()) << body;
    EXPECT_EQ(completed["output"][0]["type"], "reasoning");
    EXPECT_EQ(completed["output"][1]["arguments"], args);
  }
}

// A device that fails mid-reply: a whole response is a 503, a stream that had begun ends with an
// error event after the items it had opened, and neither is stored.
TEST(ServerResponsesClient, AFailureMidStreamEndsItWithAnErrorEvent) {
  if (!std::filesystem::exists(testing::tokenizer_dir("qwen2_5"))) GTEST_SKIP() << "node_modules/@lenml is missing";
  testing::register_scripted_family();
  testing::TempDir dir;
  const Tokenizer tok = Tokenizer::load(testing::tokenizer_dir("qwen2_5"));
  const ordered_json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  const std::string prompt = ChatTemplate::load(testing::tokenizer_dir("qwen2_5")).render(chat);
  const int64_t n_prompt = int64_t(tok.encode(prompt, false, true).size());
  // A few tokens come out, then a decode step finds the device gone.
  testing::write_scripted_model(dir.path(), testing::tokenizer_dir("qwen2_5"), tok.vocab_size(), tok.eos_ids().at(0),
                                n_prompt, tok.encode("Hello there, how are you?", false, true), n_prompt + 3);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    ServerOptions o = testing::demo_server_options();
    o.model_dir = dir.path();
    testing::TestServer s(o);
    const ordered_json body = {{"input", "Hi"}, {"temperature", 0}, {"stream", stream}};
    auto [status, text] = s.post("/v1/responses", body.dump());
    if (!stream) {
      EXPECT_EQ(status, 503) << text;
      EXPECT_EQ(json::parse(text)["error"]["code"], "device_lost") << text;
      continue;
    }
    EXPECT_EQ(status, 200) << text;
    const auto events = testing::sse_named_events(text);
    ASSERT_GE(events.size(), 4u) << text;
    EXPECT_EQ(events.front().first, "response.created");
    const std::string id = events.front().second["response"]["id"];
    EXPECT_EQ(events.back().first, "error") << text;
    EXPECT_EQ(events.back().second["code"], "device_lost") << text;
    EXPECT_EQ(events.back().second["sequence_number"], events.size() - 1);
    std::string streamed;
    for (const auto& [name, data] : events) {
      EXPECT_NE(name, "response.completed");
      if (name == "response.output_text.delta") streamed += data["delta"].get<std::string>();
    }
    // What came out before the failure: a part of the script.
    const std::string script = "Hello there, how are you?";
    EXPECT_FALSE(streamed.empty());
    EXPECT_LT(streamed.size(), script.size());
    EXPECT_EQ(script.rfind(streamed, 0), 0u) << streamed;
    EXPECT_EQ(s.get("/v1/responses/" + id).first, 404);
  }
}

// Raw HTTP: GET and DELETE of stored responses, 404s, 405, the metrics' route labels, and
// refusals in OpenAI's error shape.
TEST(ServerResponsesClient, StoredResponsesErrorsAndRouteLabels) {
  testing::TestServer s;
  const std::string body = R"({"input": "Hi", "max_output_tokens": 3, "metadata": {"k": "v"}})";
  auto [status, text] = s.post("/v1/responses", body);
  ASSERT_EQ(status, 200) << text;
  const json r = json::parse(text);
  const std::string id = r["id"];
  EXPECT_EQ(r["metadata"], json({{"k", "v"}}));
  auto [st2, t2] = s.get("/v1/responses/" + id);
  EXPECT_EQ(st2, 200) << t2;
  EXPECT_EQ(json::parse(t2), r);
  auto d = s.client()->Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200) << d->body;
  EXPECT_EQ(json::parse(d->body), json({{"id", id}, {"object", "response"}, {"deleted", true}}));
  auto d2 = s.client()->Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->status, 404);
  auto [st3, t3] = s.get("/v1/responses/" + id);
  EXPECT_EQ(st3, 404);
  const json e = json::parse(t3)["error"];
  EXPECT_EQ(e["code"], "response_not_found");
  EXPECT_NE(e["message"].get<std::string>().find(id), std::string::npos);
  // store false: answered, not kept.
  auto [st4, t4] = s.post("/v1/responses", R"({"input": "Hi", "max_output_tokens": 2, "store": false,
                                               "include": ["reasoning.encrypted_content"]})");
  ASSERT_EQ(st4, 200) << t4;
  EXPECT_EQ(json::parse(t4)["store"], false);
  EXPECT_EQ(s.get("/v1/responses/" + json::parse(t4)["id"].get<std::string>()).first, 404);
  // Refusals name the field.
  auto [st5, t5] = s.post("/v1/responses", R"({"input": "Hi", "truncation": "auto"})");
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(json::parse(t5)["error"]["param"], "truncation");
  auto [st6, t6] = s.post("/v1/responses", R"({"input": "Hi", "tools": [{"type": "code_interpreter"}]})");
  EXPECT_EQ(st6, 400);
  EXPECT_NE(json::parse(t6)["error"]["message"].get<std::string>().find("code_interpreter"), std::string::npos) << t6;
  EXPECT_EQ(s.post("/v1/responses/" + id, "{}").first, 405);
  const std::string metrics = s.server().metrics_text();
  EXPECT_NE(metrics.find("route=\"/v1/responses\""), std::string::npos);
  EXPECT_NE(metrics.find("route=\"/v1/responses/{id}\""), std::string::npos);
}

// With several API keys, a key sees only the responses made with it.
TEST(ServerResponsesClient, AStoredResponseBelongsToItsAPIKey) {
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"k1", "k2"};
  testing::TestServer s(o);
  const httplib::Headers k1 = {{"Authorization", "Bearer k1"}}, k2 = {{"Authorization", "Bearer k2"}};
  auto [status, text] = s.post("/v1/responses", R"({"input": "Hi", "max_output_tokens": 2})", k1);
  ASSERT_EQ(status, 200) << text;
  const std::string id = json::parse(text)["id"];
  EXPECT_EQ(s.get("/v1/responses/" + id, k1).first, 200);
  EXPECT_EQ(s.get("/v1/responses/" + id, k2).first, 404);
  const std::string chained = R"({"input": "Hi", "max_output_tokens": 2, "previous_response_id": ")" + id + "\"}";
  EXPECT_EQ(s.post("/v1/responses", chained, k2).first, 404);
  EXPECT_EQ(s.post("/v1/responses", chained, k1).first, 200);
  auto d = s.client()->Delete(("/v1/responses/" + id).c_str(), k2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 404);
  EXPECT_EQ(s.get("/v1/responses/" + id, k1).first, 200);
}

// A store of two: the third response evicts the first.
TEST(ServerResponsesClient, TheStoreEvictsTheOldestPastItsBound) {
  ServerOptions o = testing::demo_server_options();
  o.response_store_entries = 2;
  testing::TestServer s(o);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto [status, text] = s.post("/v1/responses", R"({"input": "Hi", "max_output_tokens": 2})");
    ASSERT_EQ(status, 200) << text;
    ids.push_back(json::parse(text)["id"]);
  }
  EXPECT_EQ(s.get("/v1/responses/" + ids[0]).first, 404);
  EXPECT_EQ(s.get("/v1/responses/" + ids[1]).first, 200);
  EXPECT_EQ(s.get("/v1/responses/" + ids[2]).first, 200);
  auto [status, text] =
      s.post("/v1/responses", R"({"input": "Hi", "max_output_tokens": 2, "previous_response_id": ")" + ids[0] + "\"}");
  EXPECT_EQ(status, 404) << text;
}

}  // namespace
}  // namespace osprey
