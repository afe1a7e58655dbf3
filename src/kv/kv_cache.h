#pragma once
// The per-layer KV cache interface and the dense fp16 cache with in-place single-token
// writes under an ownership guard (DESIGN §1).
//
// Layout: keys and values are fp16 arrays of [n_kv_heads, capacity, head_dim] over one
// buffer each; rows [0, offset) are live. Capacity grows in steps of `step` rows.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/array.h"

namespace osprey {

struct KVCounters {
  uint64_t n_inplace_writes = 0;
  uint64_t n_copying_writes = 0;
  uint64_t bytes_copied = 0;  // old rows carried over by copying writes (keys + values)

  KVCounters& operator+=(const KVCounters& o) {
    n_inplace_writes += o.n_inplace_writes;
    n_copying_writes += o.n_copying_writes;
    bytes_copied += o.bytes_copied;
    return *this;
  }
};

// A shared view of a cache's state at some length. Holding it costs nothing (the buffers
// are shared); no later write by anyone changes rows [0, offset) of it.
struct KVState {
  Array keys;    // [n_kv_heads, capacity, head_dim] f16
  Array values;  // [n_kv_heads, capacity, head_dim] f16
  int64_t offset = 0;
};

struct KVCacheParams {
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t step = 256;       // capacity growth step (OSPREY_KV_STEP)
  bool inplace = true;      // OSPREY_KV_INPLACE_WRITE
  Device device = Device::cpu();
  // Test hook only: drops the identity and length rules of the guard, so tests can show
  // that the snapshot tests detect the corruption this would cause. Never set elsewhere.
  bool unsafe_skip_ownership_check = false;
};

class KVCache {
 public:
  virtual ~KVCache() = default;

  // k, v: [n, n_kv_heads, head_dim] f32 (rows may be strided, heads contiguous), the rows of
  // positions offset() .. offset() + n - 1. Writes them and returns the live keys and values,
  // [n_kv_heads, offset(), head_dim] f16 views (offset() already advanced). `positions`, when
  // defined (i32 [n] on the cache's device, positions[0] == offset()), lets an in-place write
  // take its row from device memory, so that a captured CUDA graph replays it correctly.
  virtual std::pair<Array, Array> update_and_fetch(const Array& k, const Array& v, const Array& positions = {}) = 0;
  virtual int64_t offset() const = 0;
  // Logical rewind by n rows (clamped at 0). The next write copies.
  virtual void trim(int64_t n) = 0;
  // Discards the last n rows of this cache's own last write (pipelined decode ran one step
  // past a stop). The guard stays armed, so the next write may go in place at the new length.
  // The caller guarantees that no snapshot was taken since that write; otherwise this is trim().
  virtual void rewind_own_write(int64_t n) { trim(n); }

  // Graph replay support (DESIGN §2). The buffers a replayed step writes into; a graph stays
  // valid while these stay the same.
  virtual std::pair<const void*, const void*> buffers() const = 0;
  // Whether the next single-row write would go in place without growing the buffers.
  virtual bool next_write_in_place(int64_t n_rows) const = 0;
  // The bookkeeping of one in-place single-row write whose device work a replayed graph did
  // (exactly what update_and_fetch does on that path, minus the kernel). Requires
  // next_write_in_place(1).
  virtual void commit_replayed_write() = 0;
  virtual int64_t capacity() const = 0;

  // O(1): shares the buffers.
  virtual KVState snapshot() const = 0;
  // Makes `state` current. It counts as foreign: the next write copies.
  virtual void restore(const KVState& state) = 0;
  // Moves the state out, leaving the cache empty.
  virtual KVState detach() = 0;

  virtual KVCounters counters() const = 0;
};

class DenseKVCache final : public KVCache {
 public:
  explicit DenseKVCache(const KVCacheParams& params);

  std::pair<Array, Array> update_and_fetch(const Array& k, const Array& v, const Array& positions = {}) override;
  int64_t offset() const override { return offset_; }
  void trim(int64_t n) override;
  void rewind_own_write(int64_t n) override;
  std::pair<const void*, const void*> buffers() const override;
  bool next_write_in_place(int64_t n_rows) const override;
  void commit_replayed_write() override;
  KVState snapshot() const override;
  void restore(const KVState& state) override;
  KVState detach() override;
  KVCounters counters() const override { return counters_; }

  int64_t capacity() const override { return keys_.defined() ? keys_.dim(1) : 0; }

 private:
  void copying_write(const Array& k, const Array& v, int64_t n);
  void inplace_write(const Array& k, const Array& v, int64_t n, const Array& positions);
  void adopt_inplace(int64_t n);
  std::pair<Array, Array> live() const;

  KVCacheParams params_;
  Array keys_, values_;          // current state
  int64_t offset_ = 0;
  Array own_keys_, own_values_;  // what this cache's last write produced (handles held)
  int64_t own_length_ = -1;      // the length that write left
  KVCounters counters_;
};

// All layers' caches of one sequence.
class SequenceCache {
 public:
  SequenceCache() = default;
  explicit SequenceCache(std::vector<std::unique_ptr<KVCache>> layers) : layers_(std::move(layers)) {}

  KVCache& layer(size_t i) { return *layers_[i]; }
  size_t n_layers() const { return layers_.size(); }
  int64_t offset() const { return layers_.empty() ? 0 : layers_[0]->offset(); }
  void trim(int64_t n);
  void rewind_own_write(int64_t n);
  // Whether every layer's next single-row write goes in place without growth.
  bool next_write_in_place() const;
  void commit_replayed_write();
  // Every layer's buffers, in order (a replayed graph's key).
  std::vector<const void*> buffers() const;
  // Whether buffers() equals `key` (no allocation: checked every decode step).
  bool has_buffers(const std::vector<const void*>& key) const;
  std::vector<KVState> snapshot() const;
  void restore(const std::vector<KVState>& states);
  KVCounters counters() const;

 private:
  std::vector<std::unique_ptr<KVCache>> layers_;
};

}  // namespace osprey
