// The chat route's tool calls, reasoning, logit_bias, GET /v1/models/{id} and refused fields.
// Tool calls and reasoning run end to end on a scripted model (support/scripted_model.h) with
// the real tokenizer and chat template of each family, replying with the family's native call
// syntax (tests/fixtures/chat_templates/tool_round_trips.json); the npm `openai` client reads
// the replies, streamed and not, and sends the round trip's next turn.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda_available.h"
#include "server/scripted_server.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using testing::first_turn;
using testing::round_trip;
using testing::ScriptedServer;

json post_ok(const testing::TestServer& s, const ordered_json& body) {
  auto [status, text] = s.post("/v1/chat/completions", body.dump());
  EXPECT_EQ(status, 200) << text;
  return json::parse(text, nullptr, false);
}

std::vector<json> post_stream(const testing::TestServer& s, ordered_json body) {
  body["stream"] = true;
  auto [status, text] = s.post("/v1/chat/completions", body.dump());
  EXPECT_EQ(status, 200) << text;
  bool done = false;
  std::vector<json> events = testing::sse_events(text, &done);
  EXPECT_TRUE(done);
  return events;
}

TEST(ServerTools, ReasoningThenACallComeBackAsReasoningContentAndToolCalls) {
  const ordered_json c = round_trip("qwen3", "reasoning, then a call");
  ScriptedServer s("qwen3", first_turn(c), c["reply"]);
  const json r = post_ok(*s.server, first_turn(c));
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& m = choice["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null()) << m.dump();
  EXPECT_EQ(m["reasoning_content"], c["reasoning"].get<std::string>());
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  const json& call = m["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Zürich"}}));
}

TEST(ServerTools, StreamSendsReasoningThenTheCallsIdAndNameThenItsArguments) {
  const ordered_json c = round_trip("qwen3", "reasoning, then a call");
  ScriptedServer s("qwen3", first_turn(c), c["reply"]);
  const std::vector<json> events = post_stream(*s.server, first_turn(c));
  std::string reasoning, content;
  std::vector<json> call_deltas;
  std::string finish;
  for (const json& e : events) {
    ASSERT_EQ(e["choices"].size(), 1u) << e.dump();
    const json& ch = e["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) call_deltas.push_back(d["tool_calls"]);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(reasoning, c["reasoning"].get<std::string>());
  EXPECT_EQ(content, "");
  EXPECT_EQ(finish, "tool_calls");
  // The id and name first, then the arguments in fragments, as generated.
  ASSERT_GT(call_deltas.size(), 3u);
  EXPECT_EQ(call_deltas[0][0]["index"], 0);
  EXPECT_EQ(call_deltas[0][0]["function"]["name"], "get_weather");
  EXPECT_EQ(call_deltas[0][0]["function"]["arguments"], "");
  EXPECT_TRUE(call_deltas[0][0]["id"].is_string());
  std::string arguments;
  for (size_t i = 1; i < call_deltas.size(); ++i) {
    EXPECT_FALSE(call_deltas[i][0].contains("id"));
    EXPECT_EQ(call_deltas[i][0]["index"], 0);
    arguments += call_deltas[i][0]["function"]["arguments"].get<std::string>();
  }
  // The same arguments string as the whole reply's.
  const json whole = post_ok(*s.server, first_turn(c));
  EXPECT_EQ(arguments, whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_EQ(json::parse(arguments), json({{"city", "Zürich"}}));
}

TEST(ServerTools, ContentBeforeTwoCallsAndParallelToolCallsFalse) {
  const ordered_json c = round_trip("qwen2_5", "content, then two calls");
  ScriptedServer s("qwen2_5", first_turn(c), c["reply"]);
  ordered_json body = first_turn(c);
  json m = post_ok(*s.server, body)["choices"][0]["message"];
  EXPECT_EQ(m["content"], "Let me look both up.");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][1]["function"]["name"], "search_flights");
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
  body["parallel_tool_calls"] = false;
  m = post_ok(*s.server, body)["choices"][0]["message"];
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  // tool_choice "none": the tools are rendered (the same prompt), the reply is plain text.
  body.erase("parallel_tool_calls");
  body["tool_choice"] = "none";
  const json r = post_ok(*s.server, body);
  EXPECT_EQ(r["choices"][0]["message"]["content"], c["reply"].get<std::string>());
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST(ServerTools, LlamaJsonCall) {
  const ordered_json c = round_trip("llama3_2", "one call");
  ScriptedServer s("llama3_2", first_turn(c), c["reply"]);
  for (bool stream : {false, true}) {
    std::string name, args, content, finish;
    if (!stream) {
      const json r = post_ok(*s.server, first_turn(c));
      const json& m = r["choices"][0]["message"];
      ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
      name = m["tool_calls"][0]["function"]["name"];
      args = m["tool_calls"][0]["function"]["arguments"];
      finish = r["choices"][0]["finish_reason"];
    } else {
      for (const json& e : post_stream(*s.server, first_turn(c))) {
        const json& ch = e["choices"][0];
        if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
        if (ch["delta"].contains("tool_calls")) {
          const json& f = ch["delta"]["tool_calls"][0]["function"];
          if (f.contains("name")) name = f["name"];
          args += f["arguments"].get<std::string>();
        }
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      }
      EXPECT_EQ(content, "");
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(json::parse(args), json({{"city", "Zürich"}, {"unit", "celsius"}}));
    EXPECT_EQ(finish, "tool_calls");
  }
}

TEST(ServerTools, ReasoningFormatNoneLeavesTheRawText) {
  const ordered_json c = round_trip("qwen3", "reasoning, then a call");
  ordered_json body = first_turn(c);
  body["tool_choice"] = "none";
  ScriptedServer s("qwen3", body, c["reply"], /*split_reasoning=*/false);
  const json m = post_ok(*s.server, body)["choices"][0]["message"];
  EXPECT_EQ(m["content"], c["reply"].get<std::string>());
  EXPECT_FALSE(m.contains("reasoning_content"));
}

// Qwen3 with thinking off: the template closes an empty block in the prompt; the reply is
// content.
TEST(ServerTools, EnableThinkingFalseAnswersAsContent) {
  const ordered_json body = {{"messages", {{{"role", "user"}, {"content", "2+2?"}}}},
                             {"chat_template_kwargs", {{"enable_thinking", false}}}};
  ScriptedServer s("qwen3", body, "It is 4.");
  const json m = post_ok(*s.server, body)["choices"][0]["message"];
  EXPECT_EQ(m["content"], "It is 4.");
  EXPECT_FALSE(m.contains("reasoning_content"));
}

// The npm `openai` client: a tool call read whole and streamed (its own stream accumulator
// assembles the deltas), then the next turn with the call and its result, whose prompt must
// be transformers' rendering.
TEST(ServerTools, OpenAIClientToolCallRoundTrip) {
  const auto script = testing::source_dir() / "tests" / "server" / "openai_tools.mjs";
  if (!std::filesystem::exists(testing::source_dir() / "node_modules" / "openai" / "package.json"))
    GTEST_SKIP() << "node_modules/openai is missing: run npm ci";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  const ordered_json c = round_trip("qwen2_5", "content, then two calls");
  ScriptedServer s("qwen2_5", first_turn(c), c["reply"]);
  testing::TempDir tmp;
  testing::write_file(tmp / "request.json", first_turn(c).dump());
  std::vector<std::string> results;
  for (size_t i = 3; i < c["request"]["messages"].size(); ++i)
    results.push_back(c["request"]["messages"][i]["content"]);
  testing::write_file(tmp / "results.json", ordered_json(results).dump());
  const std::string cmd = "cd '" + testing::source_dir().string() + "' && node '" + script.string() + "' " +
                          std::to_string(s.server->port()) + " '" + (tmp / "request.json").string() + "' '" +
                          (tmp / "results.json").string() + "' 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  for (const char* which : {"whole", "streamed"}) {
    SCOPED_TRACE(which);
    const json& m = r[which]["message"];
    EXPECT_EQ(r[which]["finish_reason"], "tool_calls");
    EXPECT_EQ(m["content"], c["content"].get<std::string>());
    ASSERT_EQ(m["tool_calls"].size(), c["calls"].size()) << m.dump();
    for (size_t i = 0; i < c["calls"].size(); ++i) {
      EXPECT_EQ(m["tool_calls"][i]["function"]["name"], c["calls"][i]["name"].get<std::string>());
      EXPECT_EQ(ordered_json::parse(m["tool_calls"][i]["function"]["arguments"].get<std::string>()),
                c["calls"][i]["arguments"]);
    }
  }
  EXPECT_EQ(r["next_prompt"], c["output"].get<std::string>());
  EXPECT_EQ(r["next_finish_reason"], "stop");  // n = 2, streamed: both choices carry the calls; each call's arguments came in fragments
  // that, joined, parse to the call's arguments.
  ASSERT_EQ(r["streamed_n2"].size(), 2u) << out;
  for (size_t k = 0; k < 2; ++k) {
    const json& ch = r["streamed_n2"][k];
    EXPECT_EQ(ch["index"], k);
    EXPECT_EQ(ch["finish_reason"], "tool_calls");
    ASSERT_EQ(ch["message"]["tool_calls"].size(), c["calls"].size()) << ch.dump();
    for (size_t i = 0; i < c["calls"].size(); ++i) {
      const std::string key = std::to_string(k) + "." + std::to_string(i);
      EXPECT_EQ(ordered_json::parse(ch["message"]["tool_calls"][i]["function"]["arguments"].get<std::string>()),
                c["calls"][i]["arguments"]);
      EXPECT_GT(r["fragments"][key].size(), 1u) << key << ": " << r["fragments"].dump();
      EXPECT_EQ(r["parsed"][key], json::parse(c["calls"][i]["arguments"].dump())) << key;
    }
  }
}

// ---- the rest of the surface, on the demo model ----

// On the CPU, and on CUDA where there is a device (a biased request samples on the host).
class ServerLogitBias : public ::testing::TestWithParam<bool> {};

TEST_P(ServerLogitBias, BansTheGreedyTokenAndForcesAnother) {
  ServerOptions o = testing::demo_server_options();
  if (GetParam()) {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
    o.device = Device::cuda(0);
  }
  testing::TestServer s(o);
  json body = {{"prompt", "Mr. Knightley was"}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}};
  auto first_token = [&](const json& b) {
    auto [status, j] = s.post_json("/v1/completions", b);
    EXPECT_EQ(status, 200) << j.dump();
    return j["choices"][0]["logprobs"]["tokens"][0].get<std::string>();
  };
  auto tokenize = [&](const std::string& piece) {
    auto [status, j] = s.post_json("/tokenize", {{"content", piece}});
    EXPECT_EQ(status, 200);
    return j["tokens"];
  };
  const std::string greedy = first_token(body);
  const json ids = tokenize(greedy);
  ASSERT_EQ(ids.size(), 1u);
  body["logit_bias"] = {{std::to_string(ids[0].get<int>()), -100}};
  const std::string second = first_token(body);
  EXPECT_NE(second, greedy);
  // Banning the runner-up too moves on again; a +100 bias forces an unlikely token.
  body["logit_bias"][std::to_string(tokenize(second)[0].get<int>())] = -100;
  EXPECT_NE(first_token(body), second);
  body["logit_bias"] = {{"42", 100}};
  auto [status, j] = s.post_json("/detokenize", {{"tokens", {42}}});
  ASSERT_EQ(status, 200);
  EXPECT_EQ(first_token(body), j["content"].get<std::string>());
  // Sampled too (temperature 1): the banned token never comes.
  body["temperature"] = 1;
  body["max_tokens"] = 40;
  body["seed"] = 7;
  body["logit_bias"] = {{std::to_string(ids[0].get<int>()), -100}};
  auto [st2, r2] = s.post_json("/v1/completions", body);
  ASSERT_EQ(st2, 200) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["logprobs"]["tokens"].size(), 40u);
  for (const auto& t : r2["choices"][0]["logprobs"]["tokens"]) EXPECT_NE(t, greedy);
}

INSTANTIATE_TEST_SUITE_P(Devices, ServerLogitBias, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "cuda" : "cpu"; });

TEST(ServerSurface, LogitBiasIsChecked) {
  testing::TestServer s;
  for (const json& bias : {json({{"x", 1}}), json({{"-1", 1}}), json({{"100000000", 1}}), json({{"5", 101}}),
                           json({{"5", "a"}}), json::array({1})}) {
    auto [status, j] = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}, {"logit_bias", bias}});
    EXPECT_EQ(status, 400) << bias.dump();
    EXPECT_EQ(j["error"]["param"], "logit_bias") << j.dump();
  }
}

TEST(ServerSurface, ModelByIdAndUnknownModel) {
  testing::TestServer s;
  auto [status, body] = s.get("/v1/models/demo");
  ASSERT_EQ(status, 200) << body;
  const json m = json::parse(body);
  EXPECT_EQ(m["id"], "demo");
  EXPECT_EQ(m["object"], "model");
  auto [st2, b2] = s.get("/v1/models/gpt-4o");
  EXPECT_EQ(st2, 404);
  const json e = json::parse(b2);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("gpt-4o"), std::string::npos);
}

TEST(ServerSurface, UnsupportedFieldsAreRefusedByName) {
  testing::TestServer s;
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}};
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"best_of", 2}}, "best_of"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"not", json::object()}}}}}}}},
       "response_format"},
      {{{"functions", json::array({tool["function"]})}}, "functions"},
      {{{"tools", {tool}}, {"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", {tool}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}, "tool_choice"},
      {{{"tools", {tool}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}, "tool_choice"},
      {{{"tools", {{{"type", "function"}}}}}, "tools"},
      // the demo model's template takes no tools: no format to parse calls in (or force them)
      {{{"tools", {tool}}}, "tools"},
      {{{"modalities", {"text", "audio"}}}, "modalities"},
      {{{"grammar", "root ::= a"}}, "grammar"},
      {{{"json_schema", {{"type", "number"}, {"multipleOf", 2}}}}, "json_schema"},
      {{{"reasoning_effort", "low"}}, "reasoning_effort"},
      {{{"messages", {{{"role", "user"},
                       {"content", {{{"type", "text"}, {"text", "what is it?"}},
                                    {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}}}}}}}},
       "messages[0].content[1]"},  // the demo model has no vision tower
  };
  for (const auto& [extra, param] : cases) {
    json body = chat;
    body.update(extra);
    auto [status, j] = s.post_json("/v1/chat/completions", body);
    EXPECT_EQ(status, 400) << extra.dump() << " " << j.dump();
    EXPECT_EQ(j["error"]["param"], param) << extra.dump() << " " << j.dump();
  }
  auto [status, j] = s.post_json("/v1/completions", {{"prompt", "a"}, {"suffix", "b"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "suffix");
  // What is allowed stays allowed: tool_choice "none" renders nothing to parse; best_of 1.
  json ok = chat;
  ok["tools"] = {tool};
  ok["tool_choice"] = "none";
  ok["response_format"] = {{"type", "text"}};
  EXPECT_EQ(s.post_json("/v1/chat/completions", ok).first, 200);
  EXPECT_EQ(s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}, {"best_of", 1}}).first, 200);
}

}  // namespace
}  // namespace osprey
