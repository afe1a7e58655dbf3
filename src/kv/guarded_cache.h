#pragma once
// What the dense and the rotating cache share: one sequence's layer held as a keys and a values
// buffer, and the ownership guard over them (docs/design.md, "The KV cache contract"): a
// single-token write goes in place only while the current arrays are exactly the ones this
// cache's own last write produced (compared by identity) at the length that write left.
#include <utility>

#include "kv/kv_cache.h"
#include "kv/replay.h"

namespace osprey {

class GuardedKVCache : public KVCache, public ReplayableCache {
 public:
  int64_t offset() const override { return offset_; }
  void rewind_own_write(int64_t n) override;
  KVState detach() override;
  KVCounters counters() const override { return counters_; }
  ReplayableCache* replayable() override { return this; }
  std::pair<const void*, const void*> buffers() const override;

 protected:
  // Throws Unsupported for key and value types the device cannot store (check_kv_cache_types).
  explicit GuardedKVCache(const KVCacheParams& params);
  // [n_kv_heads, rows, packed_row_width(dt, head_dim)]: a buffer of `rows` rows of type dt.
  Shape buffer_shape(DType dt, int64_t rows) const;
  // Whether a defined state's keys and values have this cache's types, heads and row width, and
  // one row count.
  bool fits_state(const KVState& state) const;

  // The guard's identity and length rules: whether the current buffers are the ones this
  // cache's last write produced, at the length that write left. Nothing else may be written
  // in place. Virtual only as a test seam: a test subclass drops the rules to prove that the
  // snapshot tests catch the corruption that would follow.
  virtual bool owns_current_state() const;
  // Every write, copying or in place, re-arms the guard on the arrays it leaves.
  void arm_guard();
  // After an in-place write of n rows: the outputs adopt the same buffers as new arrays.
  void adopt_inplace(int64_t n);
  // Throws InvalidInput unless k and v are f32 [n, n_kv_heads, head_dim] and positions,
  // when defined, i32 [n].
  void check_write(const Array& k, const Array& v, const Array& positions) const;
  // The bytes of n rows of keys and values, for KVCounters::bytes_copied.
  uint64_t row_bytes(int64_t n) const;

  KVCacheParams params_;
  Array keys_, values_;          // the current state
  int64_t offset_ = 0;
  Array own_keys_, own_values_;  // what this cache's last write produced (handles held)
  int64_t own_length_ = -1;      // the length that write left
  KVCounters counters_;
};

}  // namespace osprey
