#include <functional>
#include <map>

#include "tokenizer/components.h"
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

using DecoderBuilder = std::function<std::unique_ptr<Decoder>(const Json&, const std::string&)>;

const std::map<std::string, DecoderBuilder>& decoder_builders() {
  static const std::map<std::string, DecoderBuilder> builders = {
      {"ByteLevel",
       [](const Json&, const std::string&) { return std::make_unique<ByteLevelDecoder>(); }},
      {"Sequence",
       [](const Json& j, const std::string& where) -> std::unique_ptr<Decoder> {
         const Json& list = require(j, "decoders", where);
         if (!list.is_array()) fail(child(where, "decoders"), "expected an array");
         std::vector<std::unique_ptr<Decoder>> parts;
         for (std::size_t i = 0; i < list.size(); ++i)
           parts.push_back(make_decoder(list[i], child(child(where, "decoders"), i)));
         return std::make_unique<SequenceDecoder>(std::move(parts));
       }},
  };
  return builders;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where) {
  if (j.is_null()) return std::make_unique<IdentityDecoder>();
  const std::string type = type_of(j, where);
  const auto& builders = decoder_builders();
  const auto it = builders.find(type);
  if (it == builders.end()) throw Unsupported(where + ": " + type + " decoder is not supported");
  return it->second(j, where);
}

}  // namespace osprey::tok
