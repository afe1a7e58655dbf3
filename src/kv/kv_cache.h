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

  // k, v: [n, n_kv_heads, head_dim] f32, the rows of positions offset() .. offset() + n - 1.
  // Writes them and returns the live keys and values, [n_kv_heads, offset(), head_dim] f16
  // views (offset() already advanced).
  virtual std::pair<Array, Array> update_and_fetch(const Array& k, const Array& v) = 0;
  virtual int64_t offset() const = 0;
  // Logical rewind by n rows (clamped at 0). The next write copies.
  virtual void trim(int64_t n) = 0;

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

  std::pair<Array, Array> update_and_fetch(const Array& k, const Array& v) override;
  int64_t offset() const override { return offset_; }
  void trim(int64_t n) override;
  KVState snapshot() const override;
  void restore(const KVState& state) override;
  KVState detach() override;
  KVCounters counters() const override { return counters_; }

  int64_t capacity() const { return keys_.defined() ? keys_.dim(1) : 0; }
  // Whether the next single-token write would go in place (the guard, DESIGN §1).
  bool next_write_in_place(int64_t n_rows) const;

 private:
  void copying_write(const Array& k, const Array& v, int64_t n);
  void inplace_write(const Array& k, const Array& v, int64_t n);
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
  std::vector<KVState> snapshot() const;
  void restore(const std::vector<KVState>& states);
  KVCounters counters() const;

 private:
  std::vector<std::unique_ptr<KVCache>> layers_;
};

}  // namespace osprey
