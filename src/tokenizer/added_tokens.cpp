#include "tokenizer/added_tokens.h"

namespace osprey::tok {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Word characters for single_word: ASCII alphanumerics, '_' and any non-ASCII byte (letters
// of other scripts are treated as word characters).
bool is_word_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || u == '_' || (u >= '0' && u <= '9') || ((u | 0x20) >= 'a' && (u | 0x20) <= 'z');
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  trie_.emplace_back();
  for (std::size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t].content;
    if (s.empty()) continue;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      int32_t next = step(node, c);
      if (next < 0) {
        next = int32_t(trie_.size());
        trie_[node].children.emplace_back(c, next);
        trie_.emplace_back();
      }
      node = next;
    }
    trie_[node].token = int32_t(t);
  }
}

int32_t AddedTokenMatcher::step(int32_t node, unsigned char c) const {
  for (const auto& [byte, next] : trie_[node].children)
    if (byte == c) return next;
  return -1;
}

bool AddedTokenMatcher::word_boundaries_ok(std::string_view text, std::size_t begin,
                                           std::size_t end) const {
  return (begin == 0 || !is_word_byte(text[begin - 1])) &&
         (end == text.size() || !is_word_byte(text[end]));
}

void AddedTokenMatcher::split(std::string_view text, bool include_special,
                              std::vector<Segment>& out) const {
  if (tokens_.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  std::size_t seg_start = 0;  // start of the pending plain-text segment
  std::size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest allowed token starting at i.
    int32_t best = -1;
    std::size_t best_end = 0;
    int32_t node = 0;
    for (std::size_t j = i; j < text.size(); ++j) {
      node = step(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      const int32_t t = trie_[node].token;
      if (t < 0) continue;
      const AddedToken& tok = tokens_[t];
      if (tok.special && !include_special) continue;
      if (tok.single_word && !word_boundaries_ok(text, i, j + 1)) continue;
      best = t;
      best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    std::size_t begin = i, end = best_end;
    if (tok.lstrip)
      while (begin > seg_start && is_ascii_space(text[begin - 1])) --begin;
    if (tok.rstrip)
      while (end < text.size() && is_ascii_space(text[end])) ++end;
    if (begin > seg_start) out.push_back({text.substr(seg_start, begin - seg_start), -1});
    out.push_back({text.substr(begin, end - begin), tok.id});
    seg_start = i = end;
  }
  if (seg_start < text.size()) out.push_back({text.substr(seg_start), -1});
}

}  // namespace osprey::tok
