#pragma once
// What a Split pre-tokenizer, a Replace normalizer and a Replace decoder match: a literal
// string or a regex, written {"String": "..."} or {"Regex": "..."} in tokenizer.json.
// Internal header: only the tokenizer's .cpp files include it.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace osprey::tok {

class Pattern {
 public:
  // Parses {"String": s} (s not empty) or {"Regex": r}; errors are InvalidInput naming
  // `where` and the field.
  static Pattern parse(const Json& pattern, const std::string& where);
  explicit Pattern(std::unique_ptr<Regex> regex) : regex_(std::move(regex)) {}

  bool is_regex() const { return regex_ != nullptr; }

  // Calls on_match(begin, end) for each successive non-overlapping match (byte offsets),
  // leftmost first. A regex needs valid UTF-8 text (not re-checked).
  void for_each_match(std::string_view text, const std::function<void(std::size_t, std::size_t)>& on_match) const;

  // text with every match replaced by `content`.
  std::string replace(std::string_view text, const std::string& content) const;

 private:
  explicit Pattern(std::string literal) : literal_(std::move(literal)) {}

  std::unique_ptr<Regex> regex_;  // null for a literal
  std::string literal_;
};

}  // namespace osprey::tok
