#pragma once
// Hugging Face tokenizer.json tokenizers with a BPE model: byte-level BPE as Llama 3.x,
// Qwen2.5 and Command-R use it, and BPE over SentencePiece pieces with byte fallback as
// Gemma 3 uses it; with added/special tokens, normalizers (NFC, NFD, Replace, Prepend,
// Sequence), pre-tokenizers (Split, ByteLevel, Digits, Sequence), post-processors
// (TemplateProcessing, ByteLevel, Roberta/Bert, Sequence) and decoders (ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Sequence); plus the special-token settings and chat template of
// tokenizer_config.json.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace osprey {

// Immutable after load; every method is thread-safe. Copies are cheap and share the loaded
// data.
class Tokenizer {
 public:
  struct Impl;  // opaque: defined in the implementation

  // Loads dir/tokenizer.json and, if present, dir/tokenizer_config.json. Throws IoError when
  // tokenizer.json is missing or unreadable, or either file is not a regular file (checked
  // before opening, so a FIFO does not block); InvalidInput for malformed JSON (naming the
  // file and field) and for token ids outside [0, 2^24) or beyond 2 * (number of tokens) +
  // 1024 (naming the token and the id); Unsupported naming a component type that is not
  // implemented (e.g. "WordPiece model").
  static Tokenizer load(const std::filesystem::path& dir);
  // The same from the texts of a tokenizer.json and a tokenizer_config.json ("{}" for none),
  // as another container holds them (a GGUF file's metadata, formats/gguf_tokenizer.h); `where`
  // names that source in errors.
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json,
                             const std::string& where);

  // text must be valid UTF-8 (InvalidInput otherwise, naming the byte offset).
  // add_special: apply the post-processor (Llama 3 prepends <|begin_of_text|>).
  // parse_special: when false, special added tokens written in the text are tokenized as
  // plain text (HF split_special_tokens=True); non-special added tokens still match.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false,
                              bool parse_special = true) const;

  // Concatenates the tokens' bytes; invalid UTF-8 becomes U+FFFD. Ids without a token are
  // skipped (as HF tokenizers does). skip_special drops special added tokens. No clean-up of
  // tokenization spaces is done.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw vocabulary string of id (byte-level form, e.g. "Ġhello"), or an added token's
  // content. Throws InvalidInput for an id without a token.
  std::string token_text(int32_t id) const;
  // The bytes decode() emits for id alone (not made valid UTF-8; "" for an id without a
  // token), as constrained decoding matches them.
  std::string token_bytes(int32_t id) const;
  // Max id + 1 over the vocabulary and the added tokens.
  int32_t vocab_size() const;
  // Id of a raw vocabulary string or added token content.
  std::optional<int32_t> token_id(std::string_view token) const;
  // True for added tokens marked special; false for other or unknown ids.
  bool is_special(int32_t id) const;

  // tokenizer_config.json bos_token when set; otherwise the fixed first id of the
  // post-processor's template, if any.
  std::optional<int32_t> bos_id() const;
  // tokenizer_config.json eos_token (empty when absent).
  std::vector<int32_t> eos_ids() const;
  // Token texts from tokenizer_config.json (empty when absent), for chat templates.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // tokenizer_config.json chat_template (the "default" one when a list); empty if none.
  const std::string& chat_template() const;
  // tokenizer_config.json add_bos_token, when present. Informational: encode() adds
  // special tokens only through the post-processor.
  std::optional<bool> add_bos_token() const;

  // Turns ids into text one at a time without ever splitting a UTF-8 character: push()
  // returns only complete characters and holds back up to 3 bytes of an unfinished one.
  // The concatenation of all push() results and flush() equals decode(ids, skip_special).
  // Not thread-safe (one per stream); keeps the tokenizer's data alive.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
    std::string push(int32_t id);
    // Returns what is held back (an unfinished character becomes U+FFFD) and resets.
    std::string flush();

   private:
    std::shared_ptr<const Impl> impl_;
    bool skip_special_;
    std::string pending_;
  };

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace osprey
