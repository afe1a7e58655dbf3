#pragma once
// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the tokenizer's splitters.
// Internal header: only the tokenizer's .cpp files include it.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace osprey {

// Rewrites \s and \S so that PCRE2 classifies whitespace as Oniguruma (the regex engine of
// HF tokenizers) does. Exposed for tests.
std::string onig_compatible_pattern(std::string_view pattern);

class Regex {
 public:
  // Compiles onig_compatible_pattern(pattern). Throws InvalidInput naming `where` (the file
  // and field) when it does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each successive non-empty, non-overlapping match in text
  // (byte offsets, leftmost-first like Oniguruma and Rust's regex). text must be valid UTF-8
  // (not re-checked). Empty matches are skipped. Thread-safe: the compiled pattern is shared,
  // match state is per call. Throws InvalidInput if the engine fails (e.g. a resource limit).
  void for_each_match(std::string_view text,
                      const std::function<void(std::size_t, std::size_t)>& on_match) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string where_;
};

}  // namespace osprey
