#pragma once
// The BPE model of a tokenizer.json: vocabulary, ranked merges, and the merge loop that
// turns one pre-tokenized piece into ids. Internal header.
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_fields.h"
#include "tokenizer/json_reader.h"

namespace osprey::tok {

// Hash for heterogeneous (string_view) lookups in string-keyed maps.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // j is the "model" object with type "BPE"; where names it for errors. Its vocab and
  // merges come from `tables` where read_tokenizer_json took them out of the tree, else
  // from j. Merges may be "a b" strings or ["a", "b"] pairs. Throws InvalidInput for
  // malformed fields and Unsupported for dropout or subword prefixes/suffixes.
  BpeModel(const Json& j, BpeTables tables, const std::string& where);

  // Appends the ids of one piece (a pre-token, in the vocabulary's alphabet). Thread-safe.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  const TokenMap& vocab() const { return vocab_; }

 private:
  void merge(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t char_id(uint32_t cp) const;
  void push_unknown(std::string_view ch, std::vector<int32_t>& symbols) const;

  struct MergeResult {
    int32_t rank;
    int32_t id;
  };

  // (left id, right id) -> merge, open addressing with linear probing: one flat array, so
  // 500k merges load without 500k allocations and look up in about one cache miss.
  class MergeTable {
   public:
    void reserve(std::size_t n);
    // Sets the merge of (a, b), replacing an earlier one.
    void assign(int32_t a, int32_t b, MergeResult m);
    const MergeResult* find(int32_t a, int32_t b) const;

   private:
    struct Slot {
      uint64_t key;  // kEmpty or (a << 32 | b)
      MergeResult merge;
    };
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    std::size_t slot_of(uint64_t key) const;
    std::vector<Slot> slots_;
    std::size_t size_ = 0;
  };

  TokenMap vocab_;
  MergeTable merges_;
  std::vector<int32_t> small_char_ids_;               // single-character tokens below U+0800
  std::unordered_map<uint32_t, int32_t> char_ids_;    // single-character tokens from U+0800
  std::array<int32_t, 256> byte_fallback_ids_{};      // "<0xAB>" tokens, when byte_fallback
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // NOTE: pieces repeat a lot in real text; the cache turns most of them into one lookup.
  static constexpr std::size_t kCacheCapacity = 1 << 16;
  static constexpr std::size_t kMaxCachedPieceBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace osprey::tok
