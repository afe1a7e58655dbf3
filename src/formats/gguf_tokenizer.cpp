#include "formats/gguf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "formats/family_formats.h"

namespace osprey {
namespace {

using nlohmann::json;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum GgufTokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The pre-tokenizer of tokenizer.json for one of llama.cpp's (formats/family_formats.h).
json pre_tokenizer_of(const GgufPreTokenizer& pre) {
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                     {"use_regex", pre.regex == nullptr}};
  json list = json::array();
  if (pre.digits) list.push_back({{"type", "Digits"}, {"individual_digits", true}});
  if (pre.regex)
    list.push_back({{"type", "Split"}, {"pattern", {{"Regex", pre.regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  list.push_back(byte_level);
  return {{"type", "Sequence"}, {"pretokenizers", list}};
}

// SentencePiece's BPE (llama.cpp's llm_tokenizer_spm) merges, at each step, the adjacent pair
// whose concatenation is the vocabulary piece of highest score. The same order as Hugging
// Face BPE merges (its SentencePieceExtractor): every split of a piece into two pieces of
// the vocabulary, ordered by the whole piece's score (highest first), then by ids.
json spm_merges(const std::vector<std::string_view>& tokens, const std::vector<int64_t>& types,
                const std::vector<float>& scores) {
  std::unordered_map<std::string_view, int64_t> id_of;
  id_of.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] != kUnused) id_of.emplace(tokens[i], int64_t(i));
  struct Merge {
    float score;
    int64_t whole, left, right;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != kNormal && types[i] != kUserDefined) continue;
    const std::string_view t = tokens[i];
    for (size_t at = 1; at < t.size(); ++at) {
      if ((static_cast<unsigned char>(t[at]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      const auto l = id_of.find(t.substr(0, at));
      if (l == id_of.end()) continue;
      const auto r = id_of.find(t.substr(at));
      if (r == id_of.end()) continue;
      merges.push_back({scores[i], int64_t(i), l->second, r->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(b.score, a.whole, a.left, a.right) < std::tie(a.score, b.whole, b.left, b.right);
  });
  json out = json::array();
  for (const Merge& m : merges) out.push_back({std::string(tokens[size_t(m.left)]), std::string(tokens[size_t(m.right)])});
  return out;
}

// The vocabulary (id by text) and the added tokens of the file's tokens and their types.
struct Vocabulary {
  json vocab = json::object();
  json added = json::array();
  std::optional<std::string> unk;
};

Vocabulary read_vocabulary(const std::string& where, const std::vector<std::string_view>& tokens,
                           const std::vector<int64_t>& types, bool spm) {
  Vocabulary v;
  auto put = [&](const std::string& text, size_t i) {
    if (v.vocab.contains(text))
      throw InvalidInput(where + ": tokenizer.ggml.tokens holds " + json(text).dump() + " twice (ids " +
                         std::to_string(v.vocab[text].get<int64_t>()) + " and " + std::to_string(i) + ")");
    v.vocab[text] = i;
  };
  // SentencePiece: control and user-defined pieces are in the vocabulary too (the merges
  // reach user-defined ones, as in Hugging Face's tokenizer.json of such a model).
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string text(tokens[i]);
    if (types[i] == kUnknown && !v.unk) v.unk = text;
    if (spm && (types[i] == kControl || types[i] == kUserDefined)) put(text, i);
    switch (types[i]) {
      case kNormal: case kUnknown: case kByte:
        put(text, i);
        break;
      case kControl: case kUserDefined:
        v.added.push_back({{"id", i}, {"content", text}, {"special", types[i] == kControl}, {"normalized", false},
                           {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
        break;
      case kUnused:
        break;  // no token (padding ids)
      default:
        throw InvalidInput(where + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                           std::to_string(types[i]) + " (1 to 6 are token types)");
    }
  }
  return v;
}

// The normalizer, pre-tokenizer and decoder: SentencePiece's U+2581 space, pieces over the
// whole text and <0xXX> byte pieces; or byte-level BPE after the named pre-tokenizer.
void set_pipeline(json& t, bool spm, bool space_prefix, const GgufPreTokenizer* pre) {
  if (spm) {
    const json space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}};
    t["normalizer"] = space_prefix ? json{{"type", "Sequence"},
                                          {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}, space}}}
                                   : space;
    t["pre_tokenizer"] = json();
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    t["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  } else {
    t["normalizer"] = pre->nfc ? json{{"type", "NFC"}} : json();
    t["pre_tokenizer"] = pre_tokenizer_of(*pre);
    t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  }
}

// The post-processor adding the special tokens the file says to add around a text (null when
// it adds none).
json post_processor(const std::string& where, const std::vector<std::string_view>& tokens, bool add_bos,
                    const std::optional<int64_t>& bos, bool add_eos, const std::optional<int64_t>& eos) {
  json single = json::array(), special = json::object();
  auto add_special = [&](const std::optional<int64_t>& id, const char* key) {
    if (!id) throw InvalidInput(where + ": the file adds " + key + ", but tokenizer.ggml." + key + "_token_id is missing");
    const std::string text(tokens[size_t(*id)]);
    single.push_back({{"SpecialToken", {{"id", text}, {"type_id", 0}}}});
    special[text] = {{"id", text}, {"ids", {*id}}, {"tokens", {text}}};
  };
  if (add_bos) add_special(bos, "bos");
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) add_special(eos, "eos");
  if (!add_bos && !add_eos) return json();
  json pair = single;
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}};
}

}  // namespace

GgufTokenizerJson gguf_tokenizer_json(const GgufFile& g) {
  const std::string where = g.path().string();
  const std::string model = g.get_string("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama")
    throw Unsupported(where + ": tokenizer.ggml.model \"" + model +
                      "\" is not supported (\"gpt2\", byte-level BPE, and \"llama\", SentencePiece, are)");
  const bool spm = model == "llama";
  const std::string pre_name = g.has("tokenizer.ggml.pre") ? g.get_string("tokenizer.ggml.pre") : "default";
  const GgufPreTokenizer* pre = gguf_pre_tokenizer(pre_name);
  if (!pre && !spm)
    throw Unsupported(where + ": tokenizer.ggml.pre \"" + pre_name + "\" is not supported (supported: " +
                      gguf_pre_tokenizers_supported() + ")");

  const std::vector<std::string_view> tokens = g.get_string_array("tokenizer.ggml.tokens");
  std::vector<int64_t> types(tokens.size(), kNormal);
  if (g.has("tokenizer.ggml.token_type")) {
    types = g.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != tokens.size())
      throw InvalidInput(where + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                         " entries for " + std::to_string(tokens.size()) + " tokens");
  }
  const Vocabulary v = read_vocabulary(where, tokens, types, spm);
  json merges = json::array();
  if (spm) {
    const std::vector<float> scores = g.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != tokens.size())
      throw InvalidInput(where + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " +
                         std::to_string(tokens.size()) + " tokens");
    merges = spm_merges(tokens, types, scores);
  } else {
    for (std::string_view m : g.get_string_array("tokenizer.ggml.merges")) merges.push_back(std::string(m));
  }

  auto token_id = [&](const char* key) -> std::optional<int64_t> {
    if (!g.has(key)) return std::nullopt;
    const uint64_t id = g.get_uint(key);
    if (id >= tokens.size())
      throw InvalidInput(where + ": " + key + " is " + std::to_string(id) + ", past the " +
                         std::to_string(tokens.size()) + " tokens");
    return int64_t(id);
  };
  const auto bos = token_id("tokenizer.ggml.bos_token_id");
  const auto eos = token_id("tokenizer.ggml.eos_token_id");
  // llama.cpp's defaults: SentencePiece adds BOS and a space before the text unless told not to.
  const bool add_bos =
      g.has("tokenizer.ggml.add_bos_token") ? g.get_bool("tokenizer.ggml.add_bos_token") : spm;
  const bool space_prefix =
      spm && (g.has("tokenizer.ggml.add_space_prefix") ? g.get_bool("tokenizer.ggml.add_space_prefix") : true);
  const bool add_eos = g.has("tokenizer.ggml.add_eos_token") && g.get_bool("tokenizer.ggml.add_eos_token");

  json t = json::object();
  t["version"] = "1.0";
  t["model"] = {{"type", "BPE"},   {"vocab", v.vocab},  {"merges", merges}, {"byte_fallback", spm},
                {"ignore_merges", pre && pre->ignore_merges}, {"fuse_unk", spm}};
  if (spm && v.unk) t["model"]["unk_token"] = *v.unk;
  t["added_tokens"] = v.added;
  set_pipeline(t, spm, space_prefix, pre);
  json post = post_processor(where, tokens, add_bos, bos, add_eos, eos);
  if (!post.is_null()) t["post_processor"] = std::move(post);

  json c = json::object();
  if (bos) c["bos_token"] = std::string(tokens[size_t(*bos)]);
  if (eos) c["eos_token"] = std::string(tokens[size_t(*eos)]);
  c["add_bos_token"] = add_bos;
  if (g.has("tokenizer.chat_template")) c["chat_template"] = g.get_string("tokenizer.chat_template");
  // NOTE: invalid UTF-8 in a token (a hostile file) is replaced, not thrown, by dump().
  return {t.dump(-1, ' ', false, json::error_handler_t::replace), c.dump(-1, ' ', false, json::error_handler_t::replace)};
}

}  // namespace osprey
