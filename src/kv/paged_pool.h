#pragma once
// The paged KV pool of batched serving (docs/design.md, "The paged pool"): every layer's K/V
// rows in fixed-size blocks of one device pool, per-sequence block tables, reference counts,
// copy-on-write of a shared block, and automatic prefix caching of full blocks.
//
// Ownership carries over from the dense cache: rows are written in place into a block only
// while one sequence holds it and the prefix cache does not; a write into any other block
// first copies that block alone (copy-on-write) into a fresh one the sequence then owns.
//
// Used from one thread (the engine's).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/array.h"
#include "kv/kv_cache.h"

namespace osprey {

struct PagedPoolParams {
  // One entry per layer: n_kv_heads, head_dim, dtype and device are read (the pool's window is
  // `window`, not the layers').
  std::vector<KVCacheParams> layers;
  // 0: the layers attend to every earlier position. > 0: sliding-window layers, whose query at
  // position p sees positions (p - window, p]: release_behind() gives back the blocks that fall
  // out of every later query's window (kv/paged_pools.h keeps such layers in a pool of their own).
  int64_t window = 0;
  int64_t block_size = 16;  // rows per block
  int64_t n_blocks = 0;     // blocks in the pool (each holds block_size rows of every layer)
  // OSPREY_KV_INPLACE_WRITE. Off: every write is a copying write, as on the dense path: a write
  // into a partly filled block first copies it into a fresh block even when the sequence holds
  // it alone, and every row counts as a copying write (KVCounters), none as in place.
  bool inplace = true;
};

// Bytes one block takes over all layers (keys and values).
int64_t paged_block_bytes(const PagedPoolParams& params);

struct PagedPoolStats {
  int64_t n_blocks = 0;
  int64_t n_free = 0;        // held by nothing
  int64_t n_cached = 0;      // held by the prefix cache only (evictable)
  int64_t n_in_use = 0;      // held by at least one sequence
  uint64_t n_cow = 0;        // copy-on-write block copies
  uint64_t n_evicted = 0;    // cached blocks evicted to make room
  uint64_t n_prefix_hits = 0;     // blocks found again by match_prefix
  uint64_t n_prefix_queries = 0;  // full blocks match_prefix looked for
};

class PagedPool {
 public:
  using SeqId = int32_t;

  // Allocates every layer's keys and values, [n_blocks, n_kv_heads, block_size, head_dim] in
  // the layer's dtype on its device. Throws InvalidInput for bad sizes (naming them).
  explicit PagedPool(const PagedPoolParams& params);
  virtual ~PagedPool() = default;
  PagedPool(const PagedPool&) = delete;
  PagedPool& operator=(const PagedPool&) = delete;

  const Array& keys(size_t layer) const;
  const Array& values(size_t layer) const;
  size_t n_layers() const;
  int64_t block_size() const;
  int64_t n_blocks() const;

  // A new, empty sequence.
  SeqId create();
  // Drops the sequence's hold on its blocks; full blocks the prefix cache holds stay there.
  void free(SeqId seq);
  // A new sequence sharing every block of `seq` (its length and table), each block's reference
  // count raised. Rows reserved past the length are not shared, and `seq` loses its own
  // reservation of them: both reserve() again before writing (the shared partial block then
  // goes through copy-on-write).
  SeqId fork(SeqId seq);

  int64_t length(SeqId seq) const;
  // Block ids of the sequence, in order (ceil(length / block_size) of them after reserve()'s
  // rows are committed; reserve() may add blocks ahead of the length). A windowed pool's table
  // starts with -1 for each block release_behind() gave back (released_rows() / block_size).
  const std::vector<int32_t>& block_table(SeqId seq) const;
  // Rows [0, released_rows) of the sequence were given back (whole blocks; 0 unless windowed).
  int64_t released_rows(SeqId seq) const;
  // A windowed pool: the first row that a query at position `length` (or later) still sees,
  // max(0, length - window + 1); 0 for a pool without a window.
  int64_t first_needed_row(int64_t length) const;
  // A windowed pool: gives back the sequence's blocks that no query at its length or later
  // sees (their last row before first_needed_row(length)), leaving -1 in their table entries.
  // With `cache`, each full block is first put in the prefix cache after the chain of
  // tokens[0 ..) (the sequence's tokens, at least up to those blocks' rows; `salt` as for
  // cache_prefix), continuing from where the last call stopped, so that a later prompt can
  // find them again until they are evicted. Returns the rows given back by this call.
  int64_t release_behind(SeqId seq, std::span<const int32_t> tokens, bool cache, const std::string& salt = "");
  // The cached blocks of the chain of tokens[0 .. n_blocks * block_size), as match_prefix
  // finds them (nothing is held or touched); fewer when the chain is cached for fewer blocks.
  // In a windowed pool an entry may be a link whose rows were evicted (an id >= n_blocks(),
  // see match_prefix).
  std::vector<int32_t> find_chain(std::span<const int32_t> tokens, int64_t n_blocks, const std::string& salt = "") const;
  // Which cached prefixes of tokens[0 .. max_tokens) this pool could attach: entry k (k = 0 ..
  // max_tokens / block_size) says whether match_prefix could give a sequence k blocks. Without
  // a window: every k up to the cached chain's length. A windowed pool: k up to the chain's
  // length whose window, the rows a query at k * block_size sees, lies in blocks that still
  // hold their rows.
  std::vector<bool> usable_prefixes(std::span<const int32_t> tokens, int64_t max_tokens,
                                    const std::string& salt = "") const;
  // The blocks reserve(seq, n) would take (0 when it needs none); n_available() must cover it.
  int64_t blocks_to_reserve(SeqId seq, int64_t n) const;

  // Attaches to an empty sequence the longest run of cached full blocks whose tokens equal
  // tokens[0 ..), looking them up by a chain key over (parent block, the block's token ids) and
  // verifying each block's stored token ids and parent (a key alone never decides). At most
  // max_tokens tokens are matched (rounded down to whole blocks; a caller that must compute the
  // last prompt token passes tokens.size() - 1). Returns the number of tokens the sequence now
  // holds (its length). Throws InvalidInput for a sequence that is not empty. `salt` keys the
  // chain: only blocks cached under the same salt match (a chain's first block keeps it and is
  // verified against it), so requests with different salts never share a block.
  //
  // A windowed pool keeps a chain's links (tokens, parent, key) when it evicts the rows of a
  // block that other cached blocks continue, so that a chain stays verifiable from its first
  // block after its head's rows are gone; it matches the longest prefix usable_prefixes()
  // allows, and the sequence holds only the blocks of that prefix's window (its table starts
  // with -1 for the others, as after release_behind). `usable` (PagedPools: every group's
  // usable_prefixes, combined) further restricts the lengths that may be matched.
  int64_t match_prefix(SeqId seq, std::span<const int32_t> tokens, int64_t max_tokens, const std::string& salt = "",
                       const std::vector<bool>* usable = nullptr);

  // Makes rows [length, length + n) of the sequence writable by it alone: allocates blocks
  // (evicting the least recently used cached blocks when none is free) and copies a shared
  // partial last block first. Returns false, changing nothing, when the pool cannot hold them.
  bool reserve(SeqId seq, int64_t n);
  // The pool slots (block * block_size + row % block_size) of rows [row0, row0 + n) of the
  // sequence, written to out[0 .. n). The rows must be reserved and not yet committed
  // (length <= row0, row0 + n <= length + the rows reserve() granted).
  void slots(SeqId seq, int64_t row0, int64_t n, int32_t* out) const;
  // Advances the length by n rows (written through slots()) and counts the writes: each row
  // in every layer is one in-place write (one copying write with `inplace` off).
  void commit(SeqId seq, int64_t n);
  // Rewinds the sequence to `length` rows, freeing its blocks past the new end. Throws
  // InvalidInput when release_behind() gave back rows that a query at `length` sees.
  void truncate(SeqId seq, int64_t length);

  // Puts the sequence's full blocks, whose tokens are tokens[0 .. length), in the prefix
  // cache (blocks already there stay; the first block of each new chain key wins). Returns the
  // blocks it added: indexes [first, end) of the sequence's table (first == end: none), always
  // the tail of the chain it registered.
  struct CachedRun {
    int64_t first = 0, end = 0;
  };
  CachedRun cache_prefix(SeqId seq, std::span<const int32_t> tokens, const std::string& salt = "");
  // Takes the cached chain of tokens[0 ..) (as match_prefix finds it) out of the prefix cache
  // from its last block back, as long as a block is held by no sequence and no other cached
  // block continues it. Returns the number of rows (whole blocks) taken out.
  int64_t forget_prefix(std::span<const int32_t> tokens, const std::string& salt = "");
  // Drops every cached block no sequence holds (they become free).
  void clear_prefix_cache();

  // Blocks that reserve() could take now (free plus evictable cached ones).
  int64_t n_available() const;
  PagedPoolStats stats() const;
  // Writes counted as the dense cache counts them: in-place row writes and copy-on-write
  // block copies per layer, bytes copied.
  KVCounters counters() const;

 protected:
  // Whether `block` may be written by `seq` in place: the sequence is its only holder and the
  // prefix cache does not hold it. The copy-on-write rule's only seam (a test subclass that
  // answers true proves the tests of shared blocks can fail).
  virtual bool writable_in_place(SeqId seq, int32_t block) const;
  // The prefix cache's chain key of a full block: a hash of the parent's key (kRootChainKey for
  // a sequence's first block) and the block's token ids. Lookups verify what it finds, so a
  // collision costs a miss, never a wrong block (a test subclass answers a constant to prove it).
  virtual uint64_t chain_key(uint64_t parent_key, std::span<const int32_t> tokens) const;
  static constexpr uint64_t kRootChainKey = 0x243f6a8885a308d3ull;

 private:
  // The chain key a sequence's first block starts from: kRootChainKey without a salt.
  static uint64_t root_key(const std::string& salt);
  // One step of a chain being cached: block `b` of a sequence (-1: given back) holding tokens
  // `t` after the chain settled so far (`key`, `parent`: its last block's key and cached block,
  // -1 before the first). Advances key and parent and says how the block was settled.
  enum class ChainStep { found, added, stop };
  ChainStep cache_block(uint64_t& key, int32_t& parent, std::span<const int32_t> t, int32_t b, const std::string& salt);
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace osprey
