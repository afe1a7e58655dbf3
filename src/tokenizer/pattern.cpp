#include "tokenizer/pattern.h"

namespace osprey::tok {

Pattern Pattern::parse(const Json& pattern, const std::string& where) {
  if (const Json* s = optional(pattern, "String")) {
    std::string literal = as_string(*s, child(where, "String"));
    if (literal.empty()) fail(child(where, "String"), "empty pattern");
    return Pattern(std::move(literal));
  }
  if (const Json* r = optional(pattern, "Regex")) {
    const std::string rwhere = child(where, "Regex");
    return Pattern(std::make_unique<Regex>(as_string(*r, rwhere), rwhere));
  }
  fail(where, "expected {\"String\": ...} or {\"Regex\": ...}");
}

void Pattern::for_each_match(std::string_view text,
                             const std::function<void(std::size_t, std::size_t)>& on_match) const {
  if (regex_) {
    regex_->for_each_match(text, on_match);
    return;
  }
  for (std::size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size()))
    on_match(pos, pos + literal_.size());
}

std::string Pattern::replace(std::string_view text, const std::string& content) const {
  std::string out;
  std::size_t prev = 0;
  for_each_match(text, [&](std::size_t b, std::size_t e) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  });
  out.append(text, prev, std::string_view::npos);
  return out;
}

}  // namespace osprey::tok
