#pragma once
// Matching of added tokens ("<|eot_id|>", "<tool_call>", ...) in text before it is
// pre-tokenized. Internal header.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

struct AddedToken {
  std::string content;  // the text matched (normalized first when `normalized`)
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;       // the match also takes the ASCII whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not next to a word character
  bool normalized = false;   // matched in normalized text rather than raw text
};

// A piece of text (id < 0) or one matched added token (text is the matched span).
struct Segment {
  std::string_view text;
  int32_t id;
};

// Finds added tokens leftmost-first, longest match at each position (the HF tokenizers rule).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Appends the segments of text to out; segments view into text. With include_special
  // false, special tokens are not matched (their text stays plain text).
  void split(std::string_view text, bool include_special, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ of the token ending here
  };
  int32_t step(int32_t node, unsigned char c) const;
  bool word_boundaries_ok(std::string_view text, std::size_t begin, std::size_t end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
};

}  // namespace osprey::tok
