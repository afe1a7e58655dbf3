#pragma once
// The server's prompt cache: snapshots of whole sequence caches (every layer's KVState),
// each keyed by the full token sequence its rows hold. A lookup finds the entry sharing the
// longest common prefix with a prompt, comparing tokens one by one (a hash never decides);
// eviction is least-recently-used under a byte budget.
//
// An entry is immutable once stored: restoring it into a cache is a foreign adoption, which
// the cache's ownership guard answers with one copying write, so nothing that restores an
// entry ever writes into its buffers (see kv/kv_cache.h).
//
// Thread-safe; the engine thread stores and looks up, other threads read stats().
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "serve/serve_stats.h"

namespace osprey {

class PromptCache {
 public:
  struct Entry {
    std::vector<int32_t> tokens;  // the rows [0, tokens.size()) of every layer
    std::vector<KVState> states;  // one per layer, each with offset == tokens.size()
    uint64_t bytes = 0;
    uint64_t checksum = 0;  // of the rows when stored, when checksums are kept (tests)
    std::string salt;       // only lookups with the same salt see it
  };
  struct Match {
    std::shared_ptr<const Entry> entry;  // null on a miss
    size_t n_common = 0;                 // leading tokens shared with the prompt
  };

  // budget_bytes 0 disables the cache: lookups miss without counting, stores are dropped.
  // keep_checksums: hash every entry's rows as it is stored (tests; CPU caches only).
  explicit PromptCache(uint64_t budget_bytes, bool keep_checksums = false);

  bool enabled() const { return budget_ > 0; }
  uint64_t budget_bytes() const { return budget_; }
  // The entry sharing the longest common prefix with `tokens` (the most recently used one on
  // a tie), marked as used. Counts a hit or a miss; `n_use` (<= n_common) is what the caller
  // restores, counted as restored tokens.
  // Only entries stored under `salt` are considered.
  Match lookup(std::span<const int32_t> tokens, size_t max_use, const std::string& salt = "");
  // The caller could not use the match a lookup returned (a sliding-window layer's ring no
  // longer holds the rows before the common prefix's end, so the prompt is computed from the
  // start): that lookup counts as unusable instead of as a hit, and its `n_use` tokens are
  // no longer counted as restored.
  void unusable(size_t n_use);
  // What store() did: the entry it keeps (null when it kept none: the tokens were covered by
  // an entry's, or the entry was larger than the budget) and the entries it replaced.
  struct Stored {
    std::shared_ptr<const Entry> entry;
    std::vector<std::shared_ptr<const Entry>> replaced;
  };
  // Stores `states` under `tokens`. An entry whose tokens are a prefix of `tokens` is
  // replaced; when `tokens` is a prefix of an entry's (or equals one), nothing is stored.
  // Evicts the least recently used entries past the budget; an entry larger than the whole
  // budget is not kept.
  // Entries of another salt are neither replaced nor counted as covering it.
  Stored store(std::vector<int32_t> tokens, std::vector<KVState> states, const std::string& salt = "");
  // The entry of this salt whose tokens begin with `tokens` (the one of exactly these tokens
  // first, else the shortest), not marked as used; null when none does.
  std::shared_ptr<const Entry> find(std::span<const int32_t> tokens, const std::string& salt = "") const;
  // Drops the entry stored under exactly these tokens and salt; whether there was one.
  bool erase(std::span<const int32_t> tokens, const std::string& salt = "");

  PromptCacheStats stats() const;
  // For every entry, most recently used first: its token count, the checksum of its rows when
  // it was stored and their checksum now (FNV-1a over the live rows, keys then values of each
  // layer). Requires keep_checksums.
  struct Checksum {
    size_t n_tokens = 0;
    uint64_t at_store = 0, now = 0;
  };
  std::vector<Checksum> checksums() const;

 private:
  void evict_to(uint64_t limit);

  uint64_t budget_;
  bool keep_checksums_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<const Entry>> lru_;  // most recently used first
  PromptCacheStats stats_;
};

// Bytes of the buffers a snapshot holds (its capacity, not only its live rows).
uint64_t snapshot_bytes(const std::vector<KVState>& states);

}  // namespace osprey
