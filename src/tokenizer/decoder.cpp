#include "tokenizer/components.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace osprey::tok {
namespace {

// Maps each character of the byte-level alphabet back to its byte. A token with any
// character outside the alphabet (an added token such as "<|eot_id|>" written with other
// characters) is passed through as its UTF-8 bytes, as HF tokenizers does.
class ByteLevelDecoder final : public Decoder {
 public:
  std::string token_bytes(std::string_view token) const override {
    std::string out;
    out.reserve(token.size());
    for (std::size_t i = 0; i < token.size();) {
      const int b = utf8::cp_to_byte(utf8::next(token, i));
      if (b < 0) return std::string(token);
      out.push_back(char(b));
    }
    return out;
  }
};

// Replaces every match of a literal string or a regex by `content` ("▁" by " " for
// SentencePiece vocabularies).
class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const Json& j, const std::string& where)
      : content_(string_field(j, "content", where)),
        pattern_(Pattern::parse(require(j, "pattern", where), child(where, "pattern"))) {}

  std::string token_bytes(std::string_view token) const override {
    // NOTE: the regex needs valid UTF-8; an earlier stage may have produced raw bytes.
    if (pattern_.is_regex() && utf8::find_invalid(token) != std::string_view::npos) return std::string(token);
    return pattern_.replace(token, content_);
  }

 private:
  std::string content_;
  Pattern pattern_;
};

// "<0xAB>" stands for the byte 0xAB (SentencePiece byte fallback); other tokens pass.
class ByteFallbackDecoder final : public Decoder {
 public:
  std::string token_bytes(std::string_view token) const override {
    if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::string(token);
    const int hi = hex_digit(token[3]), lo = hex_digit(token[4]);
    if (hi < 0 || lo < 0) return std::string(token);
    return std::string(1, char(hi * 16 + lo));
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
};

// Removes up to `start` leading and `stop` trailing occurrences of one character from each
// token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::string token_bytes(std::string_view token) const override {
    for (std::size_t i = 0; i < start_ && token.starts_with(content_); ++i) token.remove_prefix(content_.size());
    for (std::size_t i = 0; i < stop_ && token.ends_with(content_); ++i) token.remove_suffix(content_.size());
    return std::string(token);
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

class IdentityDecoder final : public Decoder {
 public:
  std::string token_bytes(std::string_view token) const override { return std::string(token); }
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::string token_bytes(std::string_view token) const override {
    std::string t(token);
    for (const auto& p : parts_) t = p->token_bytes(t);
    return t;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

const std::map<std::string, StageBuilder<Decoder>>& decoder_builders() {
  static const std::map<std::string, StageBuilder<Decoder>> builders = {
      {"ByteLevel",
       [](const Json&, const std::string&) { return std::make_unique<ByteLevelDecoder>(); }},
      {"Replace",
       [](const Json& j, const std::string& where) { return std::make_unique<ReplaceDecoder>(j, where); }},
      {"ByteFallback",
       [](const Json&, const std::string&) { return std::make_unique<ByteFallbackDecoder>(); }},
      // Joins the tokens into one string: decoding already concatenates them.
      {"Fuse", [](const Json&, const std::string&) { return std::make_unique<IdentityDecoder>(); }},
      {"Strip",
       [](const Json& j, const std::string& where) -> std::unique_ptr<Decoder> {
         const std::string content = string_field(j, "content", where);
         if (content.empty() || utf8::seq_len(static_cast<unsigned char>(content[0])) != content.size() ||
             utf8::find_invalid(content) != std::string::npos)
           fail(child(where, "content"), "expected a single character");
         auto count = [&](std::string_view key) {
           const Json& v = require(j, key, where);
           if (!v.is_number_unsigned() || v.get<uint64_t>() > 1024)
             fail(child(where, key), "expected a count from 0 to 1024");
           return std::size_t(v.get<uint64_t>());
         };
         return std::make_unique<StripDecoder>(content, count("start"), count("stop"));
       }},
      {"Sequence",
       [](const Json& j, const std::string& where) -> std::unique_ptr<Decoder> {
         const Json& list = require(j, "decoders", where);
         const std::string lwhere = child(where, "decoders");
         if (!list.is_array()) fail(lwhere, "expected an array");
         std::vector<std::unique_ptr<Decoder>> parts;
         bool fused = false;
         for (std::size_t i = 0; i < list.size(); ++i) {
           // After a Fuse, a step sees the whole decoded text rather than one token;
           // only steps that act the same on each token and on the whole are taken.
           const std::string type = type_of(list[i], child(lwhere, i));
           if (fused && type != "Replace" && type != "Fuse")
             throw Unsupported(child(lwhere, i) + ": " + type +
                               " decoder after Fuse (acting on the whole decoded text) is not supported");
           fused = fused || type == "Fuse";
           parts.push_back(make_decoder(list[i], child(lwhere, i)));
         }
         return std::make_unique<SequenceDecoder>(std::move(parts));
       }},
  };
  return builders;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where) {
  if (j.is_null()) return std::make_unique<IdentityDecoder>();
  return build_stage(decoder_builders(), j, where, "decoder");
}

}  // namespace osprey::tok
