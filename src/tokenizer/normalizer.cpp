#include <functional>
#include <map>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_norm.h"

namespace osprey::tok {
namespace {

class NfcNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return unicode::nfc(text); }
};

class NfdNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return unicode::nfd(text); }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string normalize(std::string text) const override {
    for (const auto& p : parts_) text = p->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Replaces every match of a literal string or a regex by `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const Json& j, const std::string& where)
      : content_(string_field(j, "content", where)) {
    const Json& pattern = require(j, "pattern", where);
    const std::string pwhere = child(where, "pattern");
    if (const Json* s = optional(pattern, "String")) {
      literal_ = as_string(*s, child(pwhere, "String"));
      if (literal_.empty()) fail(child(pwhere, "String"), "empty pattern");
    } else if (const Json* r = optional(pattern, "Regex")) {
      regex_ = std::make_unique<Regex>(as_string(*r, child(pwhere, "Regex")), child(pwhere, "Regex"));
    } else {
      fail(pwhere, "expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }

  std::string normalize(std::string text) const override {
    std::string out;
    std::size_t prev = 0;
    auto on_match = [&](std::size_t b, std::size_t e) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    };
    if (regex_) {
      regex_->for_each_match(text, on_match);
    } else {
      for (std::size_t pos = text.find(literal_); pos != std::string::npos;
           pos = text.find(literal_, pos + literal_.size()))
        on_match(pos, pos + literal_.size());
    }
    if (prev == 0) return text;
    out.append(text, prev, std::string::npos);
    return out;
  }

 private:
  std::string content_;
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// Prepends a string to non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

using NormalizerBuilder =
    std::function<std::unique_ptr<Normalizer>(const Json&, const std::string&)>;

const std::map<std::string, NormalizerBuilder>& normalizer_builders() {
  static const std::map<std::string, NormalizerBuilder> builders = {
      {"NFC", [](const Json&, const std::string&) { return std::make_unique<NfcNormalizer>(); }},
      {"NFD", [](const Json&, const std::string&) { return std::make_unique<NfdNormalizer>(); }},
      {"Sequence",
       [](const Json& j, const std::string& where) -> std::unique_ptr<Normalizer> {
         const Json& list = require(j, "normalizers", where);
         if (!list.is_array()) fail(child(where, "normalizers"), "expected an array");
         std::vector<std::unique_ptr<Normalizer>> parts;
         for (std::size_t i = 0; i < list.size(); ++i) {
           auto p = make_normalizer(list[i], child(child(where, "normalizers"), i));
           if (p) parts.push_back(std::move(p));
         }
         return std::make_unique<SequenceNormalizer>(std::move(parts));
       }},
      {"Replace",
       [](const Json& j, const std::string& where) {
         return std::make_unique<ReplaceNormalizer>(j, where);
       }},
      {"Prepend",
       [](const Json& j, const std::string& where) {
         return std::make_unique<PrependNormalizer>(string_field(j, "prepend", where));
       }},
  };
  return builders;
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  const auto& builders = normalizer_builders();
  const auto it = builders.find(type);
  if (it == builders.end())
    throw Unsupported(where + ": " + type + " normalizer is not supported");
  return it->second(j, where);
}

}  // namespace osprey::tok
