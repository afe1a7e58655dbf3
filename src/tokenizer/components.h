#pragma once
// The pipeline stages of a tokenizer.json, each built from its JSON object by a factory that
// dispatches on "type". All stages are immutable after construction and thread-safe.
// Internal header (includes nlohmann).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_fields.h"

namespace osprey::tok {

// Text -> text before pre-tokenization. Input and output are valid UTF-8.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// Supported: NFC, NFD, Sequence, Replace, Prepend. Returns nullptr for JSON null.
// Throws Unsupported naming the normalizer type otherwise.
std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where);

// Splits pieces into smaller pieces (and may rewrite them, as ByteLevel does). Pieces are
// never empty.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// Supported: Sequence, Split, ByteLevel, Digits. Returns nullptr for JSON null.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where);

// Adds the special tokens of a single sequence (encode with add_special = true).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // The id the processor puts first, if it always puts a fixed one there (a BOS).
  virtual std::optional<int32_t> leading_id() const { return std::nullopt; }
};

// Supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence.
// Returns nullptr for JSON null.
std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& where);

// Maps one vocabulary token to the bytes it stands for. Decoding a sequence is the
// concatenation of its tokens' bytes (then UTF-8 with lossy replacement), so stream
// decoding can work token by token.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::string token_bytes(std::string_view token) const = 0;
};

// Supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, and Sequence of supported
// decoders (after a Fuse only Replace, whose matches must then lie within one token). For
// JSON null the decoder returns tokens unchanged (HF would join them with spaces).
// NOTE: HF's ByteFallback turns a run of "<0xNN>" tokens that is not valid UTF-8 into one
// U+FFFD per token; here the bytes go through the lossy UTF-8 decoding of the whole
// output, which gives one U+FFFD per maximal invalid subsequence. Valid text is the same.
std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where);

// A factory for one "type" of stage T: (its JSON object, where) -> the stage.
template <class T>
using StageBuilder = std::function<std::unique_ptr<T>(const Json&, const std::string&)>;

// Builds j with the builder registered for its "type" (null j: no stage, nullptr); throws
// Unsupported "where: <type> <what> is not supported" for a type not in `builders`.
template <class T>
std::unique_ptr<T> build_stage(const std::map<std::string, StageBuilder<T>>& builders, const Json& j,
                               const std::string& where, std::string_view what) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  const auto it = builders.find(type);
  if (it == builders.end()) throw Unsupported(where + ": " + type + " " + std::string(what) + " is not supported");
  return it->second(j, where);
}

// The stages of the array j[key], each built by make(item, where); null results are dropped.
template <class T, class Make>
std::vector<std::unique_ptr<T>> build_stage_list(const Json& j, std::string_view key, const std::string& where,
                                                 Make make) {
  const Json& list = require(j, key, where);
  const std::string lwhere = child(where, key);
  if (!list.is_array()) fail(lwhere, "expected an array");
  std::vector<std::unique_ptr<T>> parts;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto p = make(list[i], child(lwhere, i));
    if (p) parts.push_back(std::move(p));
  }
  return parts;
}

// The builder of a "Sequence" stage: a Seq of the stages of the array j[key], each built by make.
template <class T, class Seq>
StageBuilder<T> sequence_builder(std::string_view key, std::unique_ptr<T> (*make)(const Json&, const std::string&)) {
  return [key, make](const Json& j, const std::string& where) -> std::unique_ptr<T> {
    return std::make_unique<Seq>(build_stage_list<T>(j, key, where, make));
  };
}

}  // namespace osprey::tok
