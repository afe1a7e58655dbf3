// Small hand-written tokenizer.json files: the merge loop, split behaviours, added tokens and
// error reporting, with expected ids worked out by hand from the tiny tables below.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("osprey_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

// Vocabulary (byte-level alphabet: "Ġ" is the space byte):
//   a=0 b=1 c=2 Ġ=3 ab=4 abc=5 Ġa=6 Ġab=7 ca=8 <=12 s=13 >=14 -=15 ab-=16 -c=17 --=18
// Merges by rank: 0 (a,b)  1 (Ġ,a)  2 (ab,c)  3 (Ġa,b)  4 (c,a)
// Added tokens: <s>=10 (special), <tool>=11 (not special).
Json tiny_tokenizer(bool pair_merges) {
  Json vocab = {{"a", 0},  {"b", 1},  {"c", 2},   {"Ġ", 3},   {"ab", 4},  {"abc", 5},
                {"Ġa", 6}, {"Ġab", 7}, {"ca", 8}, {"<", 12},  {"s", 13},  {">", 14},
                {"-", 15}, {"ab-", 16}, {"-c", 17}, {"--", 18}};
  Json merges = pair_merges ? Json::parse(R"([["a","b"],["Ġ","a"],["ab","c"],["Ġa","b"],["c","a"]])")
                            : Json::parse(R"(["a b","Ġ a","ab c","Ġa b","c a"])");
  return {
      {"version", "1.0"},
      {"added_tokens",
       Json::parse(R"([
         {"id": 10, "content": "<s>", "special": true, "lstrip": false, "rstrip": false,
          "normalized": false, "single_word": false},
         {"id": 11, "content": "<tool>", "special": false, "lstrip": false, "rstrip": false,
          "normalized": false, "single_word": false}])")},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", Json::parse(R"({"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [10], "tokens": ["<s>"]}}})")},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
}

Tokenizer load_json(const TempDir& dir, const Json& tokenizer) {
  dir.write("tokenizer.json", tokenizer.dump());
  return Tokenizer::load(dir.path());
}

TEST(TokenizerJson, PairFormatMergesFollowRankOrder) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, tiny_tokenizer(/*pair_merges=*/true));
  // "abc" -> a b c -> ab c (rank 0) -> abc (rank 2)
  EXPECT_EQ(tok.encode("abc"), (Ids{5}));
  // " ab" -> Ġ a b: (a,b) rank 0 beats (Ġ,a) rank 1, and (Ġ,ab) is no merge -> Ġ ab
  EXPECT_EQ(tok.encode(" ab"), (Ids{3, 4}));
  // " ca" -> Ġ c a -> Ġ ca (rank 4); " a" -> Ġa (rank 1); "ba" has no merge
  EXPECT_EQ(tok.encode(" ca"), (Ids{3, 8}));
  EXPECT_EQ(tok.encode(" a"), (Ids{6}));
  EXPECT_EQ(tok.encode("ba"), (Ids{1, 0}));
  // The GPT-2 regex splits "abc ab ca a" into "abc", " ab", " ca", " a".
  EXPECT_EQ(tok.encode("abc ab ca a"), (Ids{5, 3, 4, 3, 8, 6}));
  EXPECT_EQ(tok.encode("abc ab ca a", /*add_special=*/true), (Ids{10, 5, 3, 4, 3, 8, 6}));
  EXPECT_EQ(tok.decode(Ids{5, 3, 4, 3, 8, 6}), "abc ab ca a");
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(10));
  EXPECT_EQ(tok.vocab_size(), 19);
}

TEST(TokenizerJson, StringFormatMergesGiveTheSameIds) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, tiny_tokenizer(/*pair_merges=*/false));
  EXPECT_EQ(tok.encode("abc ab ca a"), (Ids{5, 3, 4, 3, 8, 6}));
}

TEST(TokenizerJson, IgnoreMergesTakesWholeVocabPieces) {
  TempDir dir;
  Json j = tiny_tokenizer(true);
  j["model"]["ignore_merges"] = true;
  const Tokenizer tok = load_json(dir, j);
  // " ab" is the vocab entry Ġab=7 although the merges would give Ġ ab.
  EXPECT_EQ(tok.encode("abc ab ca a"), (Ids{5, 7, 3, 8, 6}));
}

TEST(TokenizerJson, AddedTokensAndParseSpecial) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, tiny_tokenizer(true));
  EXPECT_EQ(tok.encode("ab<s>ab<tool>"), (Ids{4, 10, 4, 11}));
  // <s> is special: as plain text it is "<", "s", ">" by the GPT-2 regex; <tool> still matches.
  EXPECT_EQ(tok.encode("ab<s>ab<tool>", false, /*parse_special=*/false), (Ids{4, 12, 13, 14, 4, 11}));
  EXPECT_EQ(tok.decode(Ids{10, 4, 11}, /*skip_special=*/true), "ab<tool>");
  EXPECT_EQ(tok.decode(Ids{10, 4, 11}), "<s>ab<tool>");
  EXPECT_TRUE(tok.is_special(10));
  EXPECT_FALSE(tok.is_special(11));
  EXPECT_FALSE(tok.is_special(4));
  EXPECT_EQ(tok.token_id("<tool>"), std::optional<int32_t>(11));
  EXPECT_EQ(tok.token_text(7), "Ġab");
}

TEST(TokenizerJson, AddedTokenStripFlagsTakeSurroundingSpaces) {
  TempDir dir;
  Json j = tiny_tokenizer(true);
  // Without stripping: "ab " -> ab, Ġ; <tool>; " ab" -> Ġ ab (see PairFormatMergesFollowRankOrder).
  EXPECT_EQ(load_json(dir, j).encode("ab <tool> ab"), (Ids{4, 3, 11, 3, 4}));
  j["added_tokens"][1]["lstrip"] = true;
  j["added_tokens"][1]["rstrip"] = true;
  EXPECT_EQ(load_json(dir, j).encode("ab <tool> ab"), (Ids{4, 11, 4}));
}

// Pre-tokenizer: Split on "-" with the given behaviour, then ByteLevel without regex, with
// ignore_merges so each piece that is a vocab entry shows up as its own id.
Ids split_ids(const std::string& behavior, const std::string& text) {
  TempDir dir;
  Json j = tiny_tokenizer(true);
  j["model"]["ignore_merges"] = true;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return load_json(dir, j).encode(text);
}

TEST(TokenizerJson, SplitBehaviors) {
  EXPECT_EQ(split_ids("Removed", "ab--c"), (Ids{4, 2}));                 // ab | c
  EXPECT_EQ(split_ids("Isolated", "ab--c"), (Ids{4, 15, 15, 2}));        // ab | - | - | c
  EXPECT_EQ(split_ids("MergedWithPrevious", "ab--c"), (Ids{16, 15, 2}));  // ab- | - | c
  EXPECT_EQ(split_ids("MergedWithNext", "ab--c"), (Ids{4, 15, 17}));      // ab | - | -c
  EXPECT_EQ(split_ids("Contiguous", "ab--c"), (Ids{4, 18, 2}));           // ab | -- | c
}

TEST(TokenizerJson, WhitespaceClassMatchesOniguruma) {
  // HF tokenizers runs these patterns with Oniguruma, whose \s also takes U+0085 (NEL).
  // "a\u0085b" split by \S+ is then "a", "\u0085", "b"; with ignore_merges, the vocab entry
  // for the whole string (a, then bytes C2 85 as "Âħ", then b) must not appear.
  TempDir dir;
  Json j = tiny_tokenizer(true);
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"]["Â"] = 19;
  j["model"]["vocab"]["ħ"] = 20;
  j["model"]["vocab"]["aÂħb"] = 21;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\S+"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const Tokenizer tok = load_json(dir, j);
  EXPECT_EQ(tok.encode("a\xC2\x85" "b"), (Ids{0, 19, 20, 1}));
  EXPECT_EQ(tok.decode(Ids{0, 19, 20, 1}), "a\xC2\x85" "b");
}

TEST(TokenizerJson, OnigCompatiblePatternRewrite) {
  EXPECT_EQ(onig_compatible_pattern(R"(\s+(?!\S)|[^\s\p{L}]|\\s|[]\s[:space:]]x)"),
            R"([\s\x{85}]+(?![^\s\x{85}])|[^\s\x{85}\p{L}]|\\s|[]\s\x{85}[:space:]]x)");
}

template <typename E>
std::string error_of(const TempDir& dir) {
  try {
    Tokenizer::load(dir.path());
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

TEST(TokenizerJson, MissingFileIsIoError) {
  TempDir dir;
  const std::string msg = error_of<IoError>(dir);
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
}

TEST(TokenizerJson, MalformedFilesNameTheProblem) {
  {
    TempDir dir;
    dir.write("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
    const std::string msg = error_of<InvalidInput>(dir);
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j.erase("model");
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<InvalidInput>(dir);
    EXPECT_NE(msg.find("missing field \"model\""), std::string::npos) << msg;
  }
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j["model"]["merges"][1] = Json::array({"Ġ", "z"});
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<InvalidInput>(dir);
    EXPECT_NE(msg.find("model.merges[1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"z\""), std::string::npos) << msg;
  }
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<InvalidInput>(dir);
    EXPECT_NE(msg.find("pre_tokenizer.pattern.Regex"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<nope>"}})");
    dir.write("tokenizer.json", tiny_tokenizer(true).dump());
    const std::string msg = error_of<InvalidInput>(dir);
    EXPECT_NE(msg.find("tokenizer_config.json: eos_token"), std::string::npos) << msg;
  }
}

TEST(TokenizerJson, UnsupportedComponentsAreNamed) {
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j["model"] = {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "a"}};
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<Unsupported>(dir);
    EXPECT_NE(msg.find("WordPiece model"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<Unsupported>(dir);
    EXPECT_NE(msg.find("Metaspace pre-tokenizer"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    Json j = tiny_tokenizer(true);
    j["normalizer"] = {{"type", "NFKC"}};
    dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of<Unsupported>(dir);
    EXPECT_NE(msg.find("NFKC normalizer"), std::string::npos) << msg;
  }
}

TEST(TokenizerJson, ConfigSpecialTokensAndTemplate) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"bos_token": "<tool>", "eos_token": {"content": "<s>"},
      "add_bos_token": true, "chat_template": [{"name": "tool_use", "template": "T"},
      {"name": "default", "template": "D"}]})");
  const Tokenizer tok = load_json(dir, tiny_tokenizer(true));
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(11));  // the config wins over the template
  EXPECT_EQ(tok.eos_ids(), (Ids{10}));
  EXPECT_EQ(tok.bos_token(), "<tool>");
  EXPECT_EQ(tok.chat_template(), "D");
  EXPECT_EQ(tok.add_bos_token(), std::optional<bool>(true));
}

// A SentencePiece-style vocabulary (spaces as "▁", byte fallback, no byte-level alphabet):
//   <unk>=0 <0xE2>=1 <0x82>=2 <0xAC>=3 ▁=4 a=5 b=6 ▁a=7 ab=8 ▁ab=9 <s>=10
// Merges by rank: 0 (▁,a)  1 (a,b)  2 (▁a,b).
Json sentencepiece_tokenizer(const Json& decoders) {
  return {
      {"added_tokens", Json::parse(R"([{"id": 10, "content": "<s>", "special": true}])")},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true},
        {"vocab", {{"<unk>", 0}, {"<0xE2>", 1}, {"<0x82>", 2}, {"<0xAC>", 3}, {"▁", 4}, {"a", 5},
                   {"b", 6}, {"▁a", 7}, {"ab", 8}, {"▁ab", 9}, {"<s>", 10}}},
        {"merges", Json::parse(R"([["▁","a"],["a","b"],["▁a","b"]])")}}},
  };
}

const Json kSentencePieceDecoders = Json::parse(R"([
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}])");

TEST(TokenizerJson, ByteFallbackAndSentencePieceSpaces) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, sentencepiece_tokenizer(kSentencePieceDecoders));
  // "▁ab€ab": € (E2 82 AC) has no token and falls back to its bytes; (a,b) at rank 1 merges
  // before (▁a,b) at rank 2, which (▁,a) at rank 0 made possible.
  EXPECT_EQ(tok.encode(" ab\xE2\x82\xAC" "ab"), (Ids{9, 1, 2, 3, 8}));
  EXPECT_EQ(tok.decode(Ids{9, 1, 2, 3, 8}), " ab\xE2\x82\xAC" "ab");
  // "x" has neither a token nor a byte token: unknown, and fuse_unk makes "xx" one <unk>.
  EXPECT_EQ(tok.encode("xx"), (Ids{0}));
  EXPECT_EQ(tok.encode("axxb"), (Ids{5, 0, 6}));
  // Byte tokens stream as one character once it is complete.
  Tokenizer::StreamDecoder stream(tok, false);
  EXPECT_EQ(stream.push(9), " ab");
  EXPECT_EQ(stream.push(1), "");
  EXPECT_EQ(stream.push(2), "");
  EXPECT_EQ(stream.push(3), "\xE2\x82\xAC");
  EXPECT_EQ(stream.push(10), "<s>");
}

TEST(TokenizerJson, StripDecoderActsOnEachTokenBeforeFuse) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, sentencepiece_tokenizer(Json::parse(R"([
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}, {"type": "ByteFallback"}])")));
  EXPECT_EQ(tok.decode(Ids{9, 7, 4, 8}), "abaab");
  TempDir fused;
  fused.write("tokenizer.json", sentencepiece_tokenizer(Json::parse(R"([
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}])")).dump());
  const std::string msg = error_of<Unsupported>(fused);
  EXPECT_NE(msg.find("decoder.decoders[2]: Strip decoder after Fuse"), std::string::npos) << msg;
}

// The message of the InvalidInput that loading `tokenizer` throws.
std::string invalid_input_of(const Json& tokenizer) {
  TempDir dir;
  dir.write("tokenizer.json", tokenizer.dump());
  return error_of<InvalidInput>(dir);
}

void expect_words(const std::string& msg, std::initializer_list<std::string> words) {
  for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "\"" << w << "\" not in: " << msg;
}

TEST(TokenizerJson, OutOfRangeTokenIdsAreRefused) {
  // Ids that once overflowed `max id + 1` and wrote outside the id tables.
  for (const std::string id : {"2147483647", "-1", "-2147483648", "4294967296", "16777216",
                               "18446744073709551615", "99999999999999999999999"}) {
    Json j = tiny_tokenizer(true);
    j["model"]["vocab"]["zz"] = Json::parse(id);
    const std::string msg = invalid_input_of(j);
    // The largest literal is beyond 64 bits; the JSON reader takes it as a float.
    if (id.size() > 20)
      expect_words(msg, {"tokenizer.json: model.vocab.zz", "expected an integer token id"});
    else
      expect_words(msg, {"tokenizer.json: model.vocab", "\"zz\"", "has id " + id, "16777216"});
  }
  for (const std::string id : {"2147483647", "-5", "18446744073709551615"}) {
    Json j = tiny_tokenizer(true);
    j["added_tokens"][1]["id"] = Json::parse(id);
    expect_words(invalid_input_of(j), {"tokenizer.json: added_tokens[1]", "\"<tool>\"", "has id " + id});
  }
  {
    Json j = tiny_tokenizer(true);
    j["added_tokens"][0]["id"] = 1.5;
    expect_words(invalid_input_of(j), {"added_tokens[0].id", "expected an integer token id"});
  }
  {
    Json j = tiny_tokenizer(true);
    j["post_processor"]["special_tokens"]["<s>"]["ids"][0] = 4294967306LL;
    expect_words(invalid_input_of(j), {"post_processor", "4294967306", "out of range"});
  }
}

TEST(TokenizerJson, SparseTokenIdsAreRefused) {
  // Below 2^24 but far beyond what 18 tokens need: the id tables would be mostly holes.
  Json j = tiny_tokenizer(true);
  j["model"]["vocab"]["zz"] = 100000;
  expect_words(invalid_input_of(j), {"tokenizer.json", "\"zz\"", "has id 100000", "too sparse", "19 tokens"});
  Json k = tiny_tokenizer(true);
  k["added_tokens"][1]["id"] = 5000;
  expect_words(invalid_input_of(k), {"\"<tool>\"", "has id 5000", "too sparse"});
  // A few holes are fine: ids up to 2 * tokens + 1024 load.
  Json ok = tiny_tokenizer(true);
  ok["added_tokens"][1]["id"] = 1000;
  TempDir dir;
  const Tokenizer tok = load_json(dir, ok);
  EXPECT_EQ(tok.vocab_size(), 1001);
  EXPECT_EQ(tok.encode("<tool>"), (Ids{1000}));
}

TEST(TokenizerJson, NonRegularFilesAreRefusedWithoutBlocking) {
  {
    TempDir dir;
    ASSERT_EQ(::mkfifo((dir.path() / "tokenizer.json").c_str(), 0600), 0);
    expect_words(error_of<IoError>(dir), {"tokenizer.json", "expected a regular file, found a FIFO"});
  }
  {
    TempDir dir;
    dir.write("tokenizer.json", tiny_tokenizer(true).dump());
    ASSERT_EQ(::mkfifo((dir.path() / "tokenizer_config.json").c_str(), 0600), 0);
    expect_words(error_of<IoError>(dir), {"tokenizer_config.json", "expected a regular file, found a FIFO"});
  }
  {
    TempDir dir;
    std::filesystem::create_directory(dir.path() / "tokenizer.json");
    expect_words(error_of<IoError>(dir), {"tokenizer.json", "found a directory"});
  }
  {
    TempDir dir;
    dir.write("tokenizer.json", tiny_tokenizer(true).dump());
    std::filesystem::create_directory(dir.path() / "tokenizer_config.json");
    expect_words(error_of<IoError>(dir), {"tokenizer_config.json", "found a directory"});
  }
}

TEST(TokenizerJson, MergesInTheTablesNameTheirRank) {
  for (const char* merges : {R"(["a b", "a b c"])", R"([["a", "b"], ["a"]])", R"([["a", "b"], 7])",
                             R"([["a", "b"], ["a", 7]])", R"([["a", "b"], {"a": "b"}])"}) {
    Json j = tiny_tokenizer(true);
    j["model"]["merges"] = Json::parse(merges);
    expect_words(invalid_input_of(j), {"tokenizer.json: model.merges[1]", "expected"});
  }
  Json j = tiny_tokenizer(true);
  j["model"]["vocab"]["zz"] = "7";
  expect_words(invalid_input_of(j), {"model.vocab.zz", "expected an integer token id"});
  Json k = tiny_tokenizer(true);
  k["model"]["vocab"] = Json::array();
  expect_words(invalid_input_of(k), {"model.vocab", "expected an object"});
}

}  // namespace
}  // namespace osprey
