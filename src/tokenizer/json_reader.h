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

// model.vocab and model.merges of a BPE model, in file order.
struct BpeTables {
  bool has_vocab = false;   // model.vocab was an object (read into `vocab`)
  bool has_merges = false;  // model.merges was an array (read into `merges`)
  std::vector<std::pair<std::string, int32_t>> vocab;       // ids checked by check_token_id
  std::vector<std::pair<std::string, std::string>> merges;  // (left, right) by rank
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
