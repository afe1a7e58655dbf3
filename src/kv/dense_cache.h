#pragma once
// The dense cache: single-token writes go in place under an ownership guard
// (docs/design.md, "The KV cache contract").
//
// Layout: keys and values are f16 or bf16 (params.dtype) arrays of [n_kv_heads, capacity,
// head_dim] over one buffer each; row i holds position i, and rows [0, offset) are live. Capacity grows in
// steps of `step` rows, straight to the reserved rows (reserve) when it first grows past them.
// The buffers a copying write replaces, and those held when the cache goes, are released with
// Buffer::evict_on_release: the next layer's write of the same size still takes them, but
// after a growth the allocator returns them to the system before it asks for more, so growth
// does not strand memory in its cache.
#include <algorithm>

#include "kv/guarded_cache.h"

namespace osprey {

class DenseKVCache : public GuardedKVCache {
 public:
  explicit DenseKVCache(const KVCacheParams& params);
  ~DenseKVCache() override;

  KVView update_and_fetch(const Array& k, const Array& v, const Array& positions = {}) override;
  int64_t capacity() const override { return keys_.defined() ? keys_.dim(1) : 0; }
  void reserve(int64_t n) override { reserved_ = std::max(reserved_, n); }
  void trim(int64_t n) override;
  bool gives_back_rows() const override { return true; }
  void set_multirow_inplace(bool on) override { multirow_inplace_ = on; }
  KVState snapshot() const override;
  void restore(const KVState& state) override;

  // ReplayableCache
  bool next_write_in_place(int64_t n_rows) const override;
  void commit_replayed_write() override;

 private:
  void copying_write(const Array& k, const Array& v, int64_t n);
  void evict_buffers();

  int64_t reserved_ = 0;  // rows the next growth reaches at least (reserve)
  bool multirow_inplace_ = false;  // set_multirow_inplace: n > 1 rows may go in place too
  // Whether a write of n rows goes in place: the guard's rules, one row (or n while
  // multirow_inplace_), and room in the buffers.
  bool write_in_place(int64_t n) const;
};

}  // namespace osprey
