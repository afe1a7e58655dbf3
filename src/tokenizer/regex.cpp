#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace osprey {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// Owns per-call match state; the JIT stack is created only if the default one overflows.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ~MatchState() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    if (context != nullptr) pcre2_match_context_free(context);
    if (data != nullptr) pcre2_match_data_free(data);
  }
};

}  // namespace

std::string onig_compatible_pattern(std::string_view pattern) {
  // PCRE2's \s (with UCP) is Z plus \t \n \v \f \r; Oniguruma's, which HF tokenizers
  // uses, also takes U+0085 (NEL).
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's')
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (e == 'S' && !in_class)
        out += "[^\\s\\x{85}]";
      else
        (out += '\\') += e;
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const std::size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i + 1, close + 2 - (i + 1)));
        i = close + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& where)
    : code_(std::make_unique<Code>()), where_(where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string compiled = onig_compatible_pattern(pattern);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_->code == nullptr)
    throw InvalidInput(where + ": regex does not compile at offset " + std::to_string(offset) +
                       ": " + pcre2_message(error) + " (pattern " + compiled + ")");
  // Without JIT support pcre2_match falls back to the interpreter, so a failure is not fatal.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view text,
                           const std::function<void(std::size_t, std::size_t)>& on_match) const {
  MatchState st;
  st.data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (st.data == nullptr) throw OutOfMemory(where_ + ": cannot allocate regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, st.data,
                         st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && st.jit_stack == nullptr) {
      st.context = pcre2_match_context_create(nullptr);
      st.jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
      if (st.context == nullptr || st.jit_stack == nullptr)
        throw OutOfMemory(where_ + ": cannot allocate a regex JIT stack");
      pcre2_jit_stack_assign(st.context, nullptr, st.jit_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw InvalidInput(where_ + ": regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const std::size_t b = ov[0], e = ov[1];
    if (e > b) {
      on_match(b, e);
      start = e;
    } else {
      // Empty match: resume one code point later.
      if (b >= text.size()) return;
      start = b + utf8::seq_len(static_cast<unsigned char>(text[b]));
    }
  }
}

}  // namespace osprey
