// Constrained decoding through the server: fuzzed schemas judged by ajv (the node script), the
// request fields' errors, greedy and forced tool-call grammars.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "server/harness.h"
#include "server/structured_output.h"

namespace osprey {
namespace {

using nlohmann::json;

std::string run_node(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) out = "exit status non-zero: " + out;
  return out;
}

TEST(StructuredOutput, FuzzedSchemasAllValidateWithAjv) {
  const auto script = testing::source_dir() / "tests" / "server" / "structured_output.mjs";
  if (!std::filesystem::exists(testing::source_dir() / "node_modules" / "ajv" / "package.json"))
    GTEST_SKIP() << "node_modules/ajv is missing: run npm ci";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  ServerOptions o = testing::demo_server_options();
  o.n_slots = 8;
  o.timeout_s = 120;
  testing::TestServer s(o);
  const std::string out = run_node("cd '" + testing::source_dir().string() + "' && node '" + script.string() + "' " +
                                   std::to_string(s.port()) + " 240 20261205 2>&1");
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_EQ(r["n"], 240) << out;
  EXPECT_EQ(r["failed"], 0) << r["failures"].dump(1);
  EXPECT_EQ(r["invalid"], 0) << r["invalid_examples"].dump(1);
  // Outputs cut by max_tokens or the context are counted apart; bounded schemas rarely are.
  EXPECT_LT(r["cut"].get<int>(), 240 / 5) << out;
  EXPECT_EQ(r["valid"].get<int>() + r["cut"].get<int>(), 240);
  EXPECT_TRUE(r["stream"]["valid"].get<bool>()) << r["stream"].dump();
  EXPECT_EQ(r["stream"]["finish_reason"], "stop");
  EXPECT_GT(r["stream"]["chunks"].get<int>(), 3);
}

TEST(StructuredOutput, GreedyJsonObjectParses) {
  testing::TestServer s;
  for (const char* route : {"/v1/chat/completions", "/v1/completions"}) {
    json body = {{"model", "demo"}, {"max_tokens", 200}, {"temperature", 0}, {"response_format", {{"type", "json_object"}}}};
    if (std::string(route) == "/v1/completions") body["prompt"] = "A record:";
    else body["messages"] = json::array({{{"role", "user"}, {"content", "A record as JSON."}}});
    auto [status, r] = s.post_json(route, body);
    ASSERT_EQ(status, 200) << r.dump();
    const json& c = r["choices"][0];
    const std::string text = c.contains("message") ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    if (c["finish_reason"] == "length") continue;
    EXPECT_EQ(c["finish_reason"], "stop");
    const json v = json::parse(text, nullptr, false);
    EXPECT_TRUE(v.is_object()) << text;
  }
}

TEST(StructuredOutput, TopLevelGrammarConstrainsTheText) {
  testing::TestServer s;
  auto [status, r] = s.post_json("/v1/completions", {{"model", "demo"},
                                                     {"prompt", "Answer:"},
                                                     {"max_tokens", 50},
                                                     {"temperature", 1.3},
                                                     {"seed", 3},
                                                     {"grammar", "root ::= (\"yes\" | \"no\") \", \" [0-9]{2}"}});
  ASSERT_EQ(status, 200) << r.dump();
  const std::string text = r["choices"][0]["text"];
  EXPECT_TRUE(text.size() == 7 || text.size() == 6) << text;
  EXPECT_TRUE(text.rfind("yes, ", 0) == 0 || text.rfind("no, ", 0) == 0) << text;
  EXPECT_TRUE(std::isdigit(uint8_t(text[text.size() - 1])) && std::isdigit(uint8_t(text[text.size() - 2]))) << text;
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST(StructuredOutput, BadGrammarsAndSchemasAre400sNamingTheProblem) {
  testing::TestServer s;
  auto err = [&](json extra) {
    json body = {{"model", "demo"}, {"prompt", "x"}, {"max_tokens", 5}};
    body.update(extra);
    auto [status, r] = s.post_json("/v1/completions", body);
    EXPECT_EQ(status, 400) << r.dump();
    return std::make_pair(r["error"]["param"].is_string() ? r["error"]["param"].get<std::string>() : "",
                          r["error"]["message"].get<std::string>());
  };
  auto [p1, m1] = err({{"grammar", "root ::= foo"}});
  EXPECT_EQ(p1, "grammar");
  EXPECT_NE(m1.find("rule 'foo' is used but not defined"), std::string::npos) << m1;
  auto [p2, m2] = err({{"json_schema", {{"type", "string"}, {"format", "hostname"}}}});
  EXPECT_EQ(p2, "json_schema");
  EXPECT_NE(m2.find("'format' \"hostname\" is not supported"), std::string::npos) << m2;
  const json rf = json::parse(R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}})");
  auto [p3, m3] = err({{"response_format", rf}});
  EXPECT_EQ(p3, "response_format");
  EXPECT_NE(m3.find("'not' is not supported"), std::string::npos) << m3;
  auto [p4, m4] = err({{"grammar", "root ::= \"a\""}, {"json_schema", {{"type", "string"}}}});
  EXPECT_NE(m4.find("both constrain the output"), std::string::npos) << m4;
  auto [p5, m5] = err({{"response_format", {{"type", "xml"}}}});
  EXPECT_EQ(p5, "response_format");
  auto [p6, m6] = err({{"grammar", 5}});
  EXPECT_EQ(p6, "grammar");
}

// The forced-call grammars accept the family's call text with arguments that match the
// parameters, and the tool-call parser reads that text back as the call.
TEST(StructuredOutput, ForcedToolCallGrammarsMatchTheParsersFormat) {
  ToolChoice t;
  t.mode = "required";
  t.names = {"get_weather", "add"};
  t.schemas = {json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"),
               json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                               "required": ["a", "b"]})")};
  t.parallel = false;
  auto accepts = [](const std::string& gbnf, const std::string& text) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    auto trie = std::make_shared<const grammar::TokenTrie>(bytes, std::vector<bool>{});
    grammar::Matcher m(std::make_shared<grammar::Automaton>(grammar::parse_gbnf(gbnf), trie, std::vector<int32_t>{}));
    return m.accept_bytes(text) && m.can_end();
  };
  const std::string hermes = tool_call_gbnf(t, ToolCallFormat::hermes);
  const std::string call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": -2}}\n</tool_call>";
  EXPECT_TRUE(accepts(hermes, call));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"sub\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, call + "\n" + call));  // parallel_tool_calls false: one call
  ToolCallParser parser({ToolCallFormat::hermes, t.names, true, "call_"});
  const ToolCallOutput parsed = parser.parse(call);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "add");
  EXPECT_EQ(json::parse(parsed.calls[0].arguments), json::parse(R"({"a": 1, "b": -2})"));

  t.mode = "function";
  t.function = "get_weather";
  t.parallel = true;
  const std::string llama = tool_call_gbnf(t, ToolCallFormat::llama3_json);
  EXPECT_TRUE(accepts(llama, R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"));
  EXPECT_FALSE(accepts(llama, R"({"name": "add", "parameters": {"a": 1, "b": 2}})"));
  EXPECT_THROW(tool_call_gbnf(t, ToolCallFormat::mistral), InvalidInput);
}

}  // namespace
}  // namespace osprey
