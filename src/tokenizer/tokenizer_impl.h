#pragma once
// The loaded state behind osprey::Tokenizer. Internal header.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

struct Tokenizer::Impl {
  enum class Kind : uint8_t { kNone, kVocab, kAdded, kSpecial };

  std::unique_ptr<tok::Normalizer> normalizer;       // may be null
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<tok::BpeModel> model;
  std::unique_ptr<tok::PostProcessor> post_processor;  // may be null
  std::unique_ptr<tok::Decoder> decoder;
  tok::AddedTokenMatcher raw_added;         // added tokens with normalized == false
  tok::AddedTokenMatcher normalized_added;  // added tokens with normalized == true

  // Indexed by id, [vocab_size].
  std::vector<std::string> id_to_token;  // "" where kind == kNone
  std::vector<std::string> id_bytes;     // what decode() emits for the id
  std::vector<Kind> kind;
  tok::TokenMap added_to_id;  // added tokens' contents; they take precedence over the vocabulary

  std::string bos_token, eos_token, chat_template;
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  std::optional<bool> add_bos_token;

  bool known(int32_t id) const {
    return id >= 0 && std::size_t(id) < kind.size() && kind[id] != Kind::kNone;
  }
  bool special(int32_t id) const { return known(id) && kind[id] == Kind::kSpecial; }
  // Id of an added token's content or of a vocabulary string.
  std::optional<int32_t> id_of(std::string_view token) const {
    if (const auto it = added_to_id.find(token); it != added_to_id.end()) return it->second;
    if (const auto it = model->vocab().find(token); it != model->vocab().end()) return it->second;
    return std::nullopt;
  }

  // Tokenizes text that holds no added token of the raw stage.
  void encode_plain(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
};

}  // namespace osprey
