#include <algorithm>
#include <array>
#include <functional>
#include <map>

#include "tokenizer/components.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace osprey::tok {
namespace {

// The regex GPT-2 (and the ByteLevel pre-tokenizer with use_regex) splits words with.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  static const std::map<std::string, Behavior> names = {
      {"Removed", Behavior::kRemoved},
      {"Isolated", Behavior::kIsolated},
      {"MergedWithPrevious", Behavior::kMergedWithPrevious},
      {"MergedWithNext", Behavior::kMergedWithNext},
      {"Contiguous", Behavior::kContiguous},
  };
  const auto it = names.find(s);
  if (it == names.end()) fail(where, "unknown split behavior \"" + s + "\"");
  return it->second;
}

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// Splits `text` at the matches of a literal or a regex, the way HF tokenizers'
// NormalizedString::split does for each SplitDelimiterBehavior.
class Splitter {
 public:
  Splitter(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void split(const std::string& text, std::vector<std::string>& out) const {
    std::vector<Span> spans;
    std::size_t prev = 0;
    auto on_match = [&](std::size_t b, std::size_t e) {
      if (b > prev) spans.push_back({prev, b, false});
      spans.push_back({b, e, true});
      prev = e;
    };
    pattern_.for_each_match(text, on_match);
    if (prev < text.size()) spans.push_back({prev, text.size(), false});
    if (invert_)
      for (auto& s : spans) s.is_match = !s.is_match;

    std::vector<Span> pieces;
    switch (behavior_) {
      case Behavior::kRemoved:
        for (const auto& s : spans)
          if (!s.is_match) pieces.push_back(s);
        break;
      case Behavior::kIsolated:
        pieces = spans;
        break;
      case Behavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const auto& s : spans) {
          if (s.is_match && !previous_match && !pieces.empty())
            pieces.back().end = s.end;
          else
            pieces.push_back(s);
          previous_match = s.is_match;
        }
        break;
      }
      case Behavior::kMergedWithNext: {
        bool previous_match = false;
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          if (it->is_match && !previous_match && !pieces.empty())
            pieces.back().begin = it->begin;
          else
            pieces.push_back(*it);
          previous_match = it->is_match;
        }
        std::reverse(pieces.begin(), pieces.end());
        break;
      }
      case Behavior::kContiguous: {
        bool previous_match = false;
        for (const auto& s : spans) {
          if (s.is_match == previous_match && !pieces.empty())
            pieces.back().end = s.end;
          else
            pieces.push_back(s);
          previous_match = s.is_match;
        }
        break;
      }
    }
    for (const auto& p : pieces)
      if (p.end > p.begin) out.emplace_back(text, p.begin, p.end - p.begin);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  explicit SplitPreTokenizer(Splitter splitter) : splitter_(std::move(splitter)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    for (const auto& p : pieces) splitter_.split(p, out);
    pieces = std::move(out);
  }

 private:
  Splitter splitter_;
};

Splitter make_splitter(const Json& j, const std::string& where) {
  const Json& pattern = require(j, "pattern", where);
  const Behavior behavior = parse_behavior(string_field(j, "behavior", where), child(where, "behavior"));
  const bool invert = bool_field(j, "invert", false, where);
  return Splitter(Pattern::parse(pattern, child(where, "pattern")), behavior, invert);
}

// Optionally prefixes a space and splits with the GPT-2 regex, then rewrites every byte in
// the byte-level alphabet.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      gpt2_ = std::make_unique<Splitter>(Pattern(std::make_unique<Regex>(kGpt2Pattern, where)),
                                         Behavior::kIsolated, false);
    const auto& to_cp = utf8::byte_to_cp();
    for (int b = 0; b < 256; ++b) utf8::append(mapped_[b], to_cp[b]);
  }

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.front() != ' ') p.insert(p.begin(), ' ');
    if (gpt2_) {
      std::vector<std::string> out;
      out.reserve(pieces.size() * 4);
      for (const auto& p : pieces) gpt2_->split(p, out);
      pieces = std::move(out);
    }
    for (auto& p : pieces) {
      std::string m;
      m.reserve(p.size() * 2);
      for (const char c : p) m += mapped_[static_cast<unsigned char>(c)];
      p = std::move(m);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Splitter> gpt2_;
  std::array<std::string, 256> mapped_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

const std::map<std::string, StageBuilder<PreTokenizer>>& pre_tokenizer_builders() {
  static const std::map<std::string, StageBuilder<PreTokenizer>> builders = {
      {"Sequence", sequence_builder<PreTokenizer, SequencePreTokenizer>("pretokenizers", make_pre_tokenizer)},
      {"Split",
       [](const Json& j, const std::string& where) {
         return std::make_unique<SplitPreTokenizer>(make_splitter(j, where));
       }},
      {"ByteLevel",
       [](const Json& j, const std::string& where) {
         return std::make_unique<ByteLevelPreTokenizer>(
             bool_field(j, "add_prefix_space", true, where),
             bool_field(j, "use_regex", true, where), where);
       }},
      {"Digits",
       [](const Json& j, const std::string& where) {
         const bool individual = bool_field(j, "individual_digits", false, where);
         return std::make_unique<SplitPreTokenizer>(
             Splitter(Pattern(std::make_unique<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", where)),
                      Behavior::kIsolated, false));
       }},
  };
  return builders;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where) {
  return build_stage(pre_tokenizer_builders(), j, where, "pre-tokenizer");
}

}  // namespace osprey::tok
