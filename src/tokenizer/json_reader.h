#pragma once
// Reads a tokenizer.json in one pass. The BPE vocabulary and merges (256k and 500k entries
// in current files) go straight into flat tables instead of a JSON tree; everything else
// becomes a tree. Internal header.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/json_fields.h"

namespace osprey::tok {

// Merge rules by rank, their strings packed in one buffer: left and right lie side by side,
// so the merged token's text is a view too.
class MergeList {
 public:
  void add(std::string_view left, std::string_view right) {
    bounds_.push_back(text_.size());
    text_.append(left);
    bounds_.push_back(text_.size());
    text_.append(right);
  }
  std::size_t size() const { return bounds_.size() / 2; }
  std::string_view left(std::size_t r) const { return span(bounds_[2 * r], bounds_[2 * r + 1]); }
  std::string_view right(std::size_t r) const { return span(bounds_[2 * r + 1], end(r)); }
  std::string_view joined(std::size_t r) const { return span(bounds_[2 * r], end(r)); }

 private:
  std::size_t end(std::size_t r) const { return 2 * r + 2 < bounds_.size() ? bounds_[2 * r + 2] : text_.size(); }
  std::string_view span(std::size_t b, std::size_t e) const { return std::string_view(text_).substr(b, e - b); }
  std::string text_;
  std::vector<std::size_t> bounds_;  // per merge: where left starts, where right starts
};

// model.vocab and model.merges of a BPE model, in file order.
struct BpeTables {
  bool has_vocab = false;   // model.vocab was an object (read into `vocab`)
  bool has_merges = false;  // model.merges was an array (read into `merges`)
  std::vector<std::pair<std::string, int32_t>> vocab;       // ids checked by check_token_id
  MergeList merges;
};

struct TokenizerJson {
  Json tree;  // the file without model.vocab / model.merges when those were read as tables
  BpeTables tables;
};

// Parses text (the contents of `file`). Throws InvalidInput naming the file for malformed
// JSON, a top level that is not an object, a vocabulary id outside [0, kMaxTokenId) or that
// is not an integer, and merges that are neither "left right" strings nor pairs of strings.
TokenizerJson read_tokenizer_json(std::string_view text, const std::string& file);

}  // namespace osprey::tok
