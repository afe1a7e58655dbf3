#include "tokenizer/components.h"
#include "tokenizer/pattern.h"
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
      : content_(string_field(j, "content", where)),
        pattern_(Pattern::parse(require(j, "pattern", where), child(where, "pattern"))) {}

  std::string normalize(std::string text) const override { return pattern_.replace(text, content_); }

 private:
  std::string content_;
  Pattern pattern_;
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

const std::map<std::string, StageBuilder<Normalizer>>& normalizer_builders() {
  static const std::map<std::string, StageBuilder<Normalizer>> builders = {
      {"NFC", [](const Json&, const std::string&) { return std::make_unique<NfcNormalizer>(); }},
      {"NFD", [](const Json&, const std::string&) { return std::make_unique<NfdNormalizer>(); }},
      {"Sequence", sequence_builder<Normalizer, SequenceNormalizer>("normalizers", make_normalizer)},
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
  return build_stage(normalizer_builders(), j, where, "normalizer");
}

}  // namespace osprey::tok
