// osprey generate --grammar-file and --json-schema on the demo model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace osprey {
namespace {

using testing::run_osprey;

std::string gen(const std::string& flags) {
  return "generate -m " + (testing::source_dir() / "models/demo").string() + " --device cpu -q --json " + flags;
}

TEST(GenerateGrammar, JsonSchemaAndGrammarFileConstrainTheReply) {
  const auto r = run_osprey(gen("-n 120 --temp 1.2 --seed 5 -p 'A record:' --json-schema "
                                "'{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 3, "
                                "\"maximum\": 9}, \"ok\": {\"type\": \"boolean\"}}, \"required\": [\"n\", \"ok\"]}'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  ASSERT_EQ(out["stop_reason"], "stop") << r.out;
  const nlohmann::json v = nlohmann::json::parse(out["text"].get<std::string>());
  EXPECT_TRUE(v["n"].is_number_integer() && v["n"] >= 3 && v["n"] <= 9) << v;
  EXPECT_TRUE(v["ok"].is_boolean()) << v;
  EXPECT_EQ(v.size(), 2u) << v;

  const auto dir = std::filesystem::temp_directory_path() / ("osprey_grammar_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "g.gbnf") << "root ::= \"id-\" [0-9]{3} (\"!\" | \"?\")\n";
  const auto g = run_osprey(gen("-n 40 --temp 1.5 --seed 9 -p 'Code:' --grammar-file " + (dir / "g.gbnf").string()));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const std::string text = nlohmann::json::parse(g.out)["text"];
  ASSERT_EQ(text.size(), 7u) << text;
  EXPECT_EQ(text.substr(0, 3), "id-");
  EXPECT_TRUE(std::isdigit(uint8_t(text[3])) && std::isdigit(uint8_t(text[4])) && std::isdigit(uint8_t(text[5])));
  EXPECT_TRUE(text[6] == '!' || text[6] == '?') << text;

  std::ofstream(dir / "bad.gbnf") << "root ::= item\n";
  const auto bad = run_osprey(gen("-n 4 -p x --grammar-file " + (dir / "bad.gbnf").string()));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--grammar-file: grammar: line 1"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("rule 'item' is used but not defined"), std::string::npos) << bad.err;
  std::filesystem::remove_all(dir);

  const auto schema = run_osprey(gen("-n 4 -p x --json-schema '{\"type\": \"string\", \"format\": \"ipv4\"}'"));
  EXPECT_EQ(schema.exit_code, 2) << schema.err;
  EXPECT_NE(schema.err.find("--json-schema: json_schema: /: 'format' \"ipv4\" is not supported"), std::string::npos)
      << schema.err;
  const auto both = run_osprey(gen("-n 4 -p x --json-schema '{}' --grammar-file /nonexistent"));
  EXPECT_EQ(both.exit_code, 2) << both.err;
}

}  // namespace
}  // namespace osprey
