#pragma once
// The paged pools of one model (docs/design.md, "The paged pool"): one PagedPool per group of
// layers that attend alike, the full-attention layers in one and each sliding window's layers in
// another, so that a windowed group holds only the blocks its window still sees while the
// full-attention group keeps every row (Gemma 3: five of six layers windowed; Cohere2 three of
// four; Mistral all of them). A model whose layers all attend to every position has one group,
// and behaves as one PagedPool.
//
// A sequence has the same id in every group and the same length; each group has its own
// blocks, block table and prefix cache. A prompt's cached prefix is the longest one every group
// holds. Used from one thread (the engine's).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/paged_pool.h"

namespace osprey {

// The windows of the layers' groups: 0 (full attention) first where some layer has no window,
// then each distinct window, ascending.
std::vector<int64_t> paged_group_windows(const std::vector<KVCacheParams>& layers);

struct PagedPoolsParams {
  std::vector<KVCacheParams> layers;  // every layer of the model, with its window
  int64_t block_size = 16;
  std::vector<int64_t> n_blocks;  // per group, in paged_group_windows' order
  bool inplace = true;
};

// Bytes one block of group `window` takes over its layers (keys and values).
int64_t paged_group_block_bytes(const std::vector<KVCacheParams>& layers, int64_t block_size, int64_t window);

class PagedPools {
 public:
  using SeqId = PagedPool::SeqId;

  // Throws InvalidInput for bad sizes (naming them) or a count of groups that does not match.
  explicit PagedPools(const PagedPoolsParams& params);

  size_t n_groups() const { return groups_.size(); }
  const PagedPool& group(size_t g) const { return *groups_.at(g); }
  int64_t window(size_t g) const { return windows_.at(g); }
  size_t group_of(size_t layer) const { return layer_group_.at(layer); }
  size_t n_layers() const { return layer_group_.size(); }
  // Layer `layer`'s arrays in its group's pool.
  const Array& keys(size_t layer) const;
  const Array& values(size_t layer) const;
  // Layer `layer`'s parameters as the pools were made with them (its types, fixed scales).
  const KVCacheParams& layer_params(size_t layer) const { return layers_.at(layer); }
  int64_t block_size() const { return block_size_; }

  SeqId create();
  void free(SeqId seq);
  SeqId fork(SeqId seq);
  int64_t length(SeqId seq) const { return groups_[0]->length(seq); }
  const std::vector<int32_t>& block_table(SeqId seq, size_t g) const { return groups_.at(g)->block_table(seq); }
  // The first row a group must hand attention for queries from position `pos` on (0 without a
  // window): the rows before it are not seen, and a windowed group may have given them back.
  int64_t first_needed_row(size_t g, int64_t pos) const { return groups_.at(g)->first_needed_row(pos); }

  // The longest prefix every group can attach (PagedPool::usable_prefixes: a windowed group
  // only where its window's blocks still hold their rows), matched in every group.
  int64_t match_prefix(SeqId seq, std::span<const int32_t> tokens, int64_t max_tokens, const std::string& salt = "");
  // Every group reserves n rows, or none changes (false: some group has no room).
  bool reserve(SeqId seq, int64_t n);
  // Whether every group could take `blocks(g)` more blocks now, g over the groups.
  template <class F>
  bool has_room(F&& blocks) const {
    for (size_t g = 0; g < groups_.size(); ++g)
      if (blocks(g) > groups_[g]->n_available()) return false;
    return true;
  }
  // The pool slots of rows [row0, row0 + n) in group g.
  void slots(SeqId seq, size_t g, int64_t row0, int64_t n, int32_t* out) const {
    groups_.at(g)->slots(seq, row0, n, out);
  }
  void commit(SeqId seq, int64_t n);
  void truncate(SeqId seq, int64_t length);
  // The windowed groups give back the blocks no later query sees (PagedPool::release_behind),
  // putting them in their prefix cache first when `cache`. tokens: the sequence's, up to its
  // length.
  void release_behind(SeqId seq, std::span<const int32_t> tokens, bool cache, const std::string& salt);
  // PagedPool::cache_prefix in every group; returns the first group's run.
  PagedPool::CachedRun cache_prefix(SeqId seq, std::span<const int32_t> tokens, const std::string& salt = "");
  // PagedPool::forget_prefix in every group; returns the first group's rows.
  int64_t forget_prefix(std::span<const int32_t> tokens, const std::string& salt = "");
  // Blocks [first, end) of the chain of `tokens` in group g: the sequence's own where its table
  // holds them, else the prefix cache's (a windowed group gives blocks back to it). Empty when
  // some block is in neither.
  std::vector<int32_t> run_blocks(SeqId seq, size_t g, std::span<const int32_t> tokens, int64_t first, int64_t end,
                                  const std::string& salt) const;

  // Bytes of one block of group g, and of the whole pool.
  int64_t block_bytes(size_t g) const { return block_bytes_.at(g); }
  int64_t total_bytes() const;
  // Bytes of the blocks in use (held by a sequence) and of those only the prefix cache holds.
  int64_t bytes_in_use() const;
  int64_t bytes_cached() const;
  PagedPoolStats stats(size_t g) const { return groups_.at(g)->stats(); }
  // Every group's counters, added up.
  KVCounters counters() const;

 private:
  int64_t block_size_ = 0;
  std::vector<int64_t> windows_;
  std::vector<int64_t> block_bytes_;
  std::vector<std::unique_ptr<PagedPool>> groups_;
  std::vector<size_t> layer_group_;  // per model layer: its group
  std::vector<size_t> layer_index_;  // per model layer: its index in its group's pool
  std::vector<KVCacheParams> layers_;  // per model layer
};

}  // namespace osprey
