#pragma once
// The per-layer KV cache interface and the cache of one sequence (docs/design.md, "The KV
// cache contract"). A cache type is one class implementing KVCache (kv/dense_cache.h is the
// dense one); what a replayed decode step needs from it is the separate, optional
// ReplayableCache (kv/replay.h).
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/array.h"

namespace osprey {

// Rows [row0, row0 + n) of a [heads, rows, head_dim] cache array, as a view (a new identity).
inline Array kv_rows_view(const Array& a, int64_t row0, int64_t n) {
  const Shape& s = a.strides();
  return Array::strided(a.buffer(), a.byte_offset() + size_t(row0 * s[1]) * a.itemsize(), {a.dim(0), n, a.dim(2)}, s,
                        a.dtype());
}

class ReplayableCache;

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
  // The writes between `before` and this (both read from one cache, before earlier).
  KVCounters since(const KVCounters& before) const {
    return {n_inplace_writes - before.n_inplace_writes, n_copying_writes - before.n_copying_writes,
            bytes_copied - before.bytes_copied};
  }
};

// A shared view of a cache's state at some length. Holding it costs nothing (the buffers
// are shared); no later write by anyone changes rows [0, offset) of it.
struct KVState {
  // [n_kv_heads, capacity, packed_row_width(type, head_dim)] in the cache's key type (a
  // rotating cache: its ring)
  Array keys;
  Array values;  // likewise, in the cache's value type
  int64_t offset = 0;
};

// How a sequence's caches are made. The caller sets step and inplace (from the environment:
// OSPREY_KV_STEP, OSPREY_KV_INPLACE_WRITE); the model fills in the rest per layer.
struct KVCacheParams {
  int64_t step = 256;   // capacity growth step, in rows
  bool inplace = true;  // single-row writes may go in place under the ownership guard
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  Device device = Device::cpu();
  // Element type of the stored rows as the model picks it (layer_cache_params): f16, or bf16
  // where activations may pass f16's range.
  DType dtype = DType::f16;
  // The types of the stored keys and values as the user chose them (--cache-type-k,
  // --cache-type-v), each independently: f16, bf16, or a packed row format (q8_0, fp8_e4m3;
  // core/dtype.h), quantized once where the row lands. Unset: `dtype`.
  std::optional<DType> k_type, v_type;
  DType key_dtype() const { return k_type.value_or(dtype); }
  DType value_dtype() const { return v_type.value_or(dtype); }
  // Fixed scales of fp8 keys and values (a checkpoint's k_scale / v_scale, which the model sets
  // in layer_cache_params where that side's type is fp8_e4m3): one per kv head, or one for all;
  // empty: each row its own (ops::KVRowScales). Every write of the cache passes them on.
  std::vector<float> k_scales, v_scales;
  ops::KVRowScales row_scales() const { return {k_scales, v_scales}; }
  // The bytes of n positions' keys and values (all heads).
  uint64_t row_bytes(int64_t n) const {
    auto one = [&](DType dt) { return uint64_t(packed_row_width(dt, head_dim)) * dtype_size(dt); };
    return uint64_t(n * n_kv_heads) * (one(key_dtype()) + one(value_dtype()));
  }
  // 0: the layer attends to every earlier position (a dense cache). > 0: a sliding-window
  // layer that attends to the last `window` positions only, so its cache may keep a bounded
  // ring of rows (see make_kv_cache).
  int64_t window = 0;
};

// What attention reads after a write: the live keys and values, and the facts about them
// that the attention op needs, on every device.
struct KVView {
  // [n_kv_heads, n_keys, packed_row_width(type, head_dim)], a view of the cache's buffers (f16,
  // bf16, or packed rows), keys and values each in their own type
  Array keys;
  Array values;
  int64_t pos0 = 0;  // absolute position of the first row just written (the first query's)
  // i32 [n] on the cache's device: the absolute positions of the rows just written, as the
  // caller passed them (undefined when it passed none). A step that reads them from device
  // memory stays correct when replayed from a captured graph at later positions.
  Array positions;
  // An upper bound on n_keys for as long as these buffers live (the capacity): attention's
  // launch shape depends on it alone, so a captured graph stays valid while n_keys grows.
  int64_t max_keys = 0;
  // Where the keys sit: rows in position order (a dense cache; a rotating cache's recent rows),
  // a ring (a rotating cache's buffers), or a paged pool's blocks (kv/paged_cache.h).
  ops::KeyLayout layout;

  // The attention parameters these facts fix (the caller adds scale, window, softcap).
  ops::AttentionParams attention_params() const {
    ops::AttentionParams p;
    p.q_pos0 = pos0;
    p.positions = positions;
    p.max_keys = max_keys;
    p.keys = layout;
    return p;
  }
};

class KVCache {
 public:
  virtual ~KVCache() = default;

  // k, v: [n, n_kv_heads, head_dim] f32 (rows may be strided, heads contiguous), the rows of
  // positions offset() .. offset() + n - 1. Writes them and returns the live keys and values
  // (offset() already advanced). `positions`, when defined, is i32 [n] on the cache's device
  // with positions[0] == offset() before the write: an in-place write then takes its row from
  // device memory, so that a captured graph replays it correctly.
  virtual KVView update_and_fetch(const Array& k, const Array& v, const Array& positions = {}) = 0;
  // The sequence length: the number of positions written (not the number of rows held).
  virtual int64_t offset() const = 0;
  // Rows the buffers hold before they must grow.
  virtual int64_t capacity() const = 0;
  // The sequence will hold about n positions (a bench's depth plus its tokens, a prompt): a
  // cache that grows makes its next growth at least that large, so a prefill in chunks lands
  // in one buffer size instead of a growth per chunk. A hint: it allocates nothing by itself,
  // and writes past n grow as before. A cache of bounded size ignores it.
  virtual void reserve(int64_t n) { (void)n; }
  // Whether trim(n) can be honoured: a cache that no longer holds the rows of older positions
  // (a rotating cache after its ring wrapped) cannot rewind past them. Trimming to 0 always can.
  virtual bool can_trim(int64_t n) const {
    (void)n;
    return true;
  }
  // Logical rewind by n rows (clamped at 0). The next write copies. Throws InvalidInput when
  // !can_trim(n).
  virtual void trim(int64_t n) = 0;
  // Discards the last n rows of this cache's own last write (pipelined decode ran one step
  // past a stop). The guard stays armed, so the next write may go in place at the new length.
  // The caller guarantees that no snapshot was taken since that write; otherwise this is trim().
  virtual void rewind_own_write(int64_t n) { trim(n); }
  // Speculative decoding (docs/design.md, "Speculative decoding"): whether this cache can take
  // a verify step's rows (the last token and the drafted ones, one multi-row write) in place
  // under the guard and give the rejected ones back with rewind_own_write(), so that the next
  // write goes in place at the new length. False (the default): a cache that cannot (a
  // rotating ring of `window` rows, whose rows past the window overwrite positions a later
  // query still sees).
  virtual bool gives_back_rows() const { return false; }
  // While on (the default is off), a write of n > 1 rows may go in place under the guard as a
  // one-row write does: a verify step. Off, multi-row writes (prefill chunks) copy as before.
  virtual void set_multirow_inplace(bool on) { (void)on; }

  // O(1): shares the buffers.
  virtual KVState snapshot() const = 0;
  // Makes `state` current. It counts as foreign: the next write copies.
  virtual void restore(const KVState& state) = 0;
  // Moves the state out, leaving the cache empty.
  virtual KVState detach() = 0;

  virtual KVCounters counters() const = 0;

  // The graph-replay hooks of this cache, or null when its writes cannot be replayed from a
  // captured graph (the decode step then runs eagerly). Owned by the cache.
  virtual ReplayableCache* replayable() { return nullptr; }
};

// The cache for one layer as `params` describe it: the dense cache (kv/dense_cache.h) when
// params.window == 0; for a sliding-window layer, the rotating cache (kv/rotating_cache.h),
// which holds only the rows its window still sees. Model::make_cache calls it with what the family's layer_cache_params says.
std::unique_ptr<KVCache> make_kv_cache(const KVCacheParams& params);

// A cache type as --cache-type-k / --cache-type-v spell it: f16, bf16, q8_0 or fp8 (e4m3 with a
// float32 scale per head and row). Throws InvalidInput naming `flag`, the value and the accepted
// ones otherwise.
DType parse_kv_cache_type(std::string_view value, std::string_view flag);
// The flag's spelling of a cache type (f16, bf16, q8_0, fp8).
const char* kv_cache_type_name(DType dt);
// Throws Unsupported, naming the flag and the device, unless `params`' key and value types can
// be stored and attended on its device: the CPU takes every type and any K/V pair; CUDA takes
// f16 or bf16, the same for keys and values.
void check_kv_cache_types(const KVCacheParams& params);

// All layers' caches of one sequence.
class SequenceCache {
 public:
  SequenceCache() = default;
  explicit SequenceCache(std::vector<std::unique_ptr<KVCache>> layers) {
    for (auto& l : layers) layers_.push_back(std::move(l));
  }
  SequenceCache(SequenceCache&&) = default;
  SequenceCache& operator=(SequenceCache&&) = default;
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  // One cache of every part's layers in order: a tensor-parallel model's sequence, each rank
  // holding its own K/V heads of every layer. Trimming, snapshots and restores then move
  // every rank together.
  static SequenceCache concat(std::vector<SequenceCache> parts);
  // Layers [first, first + count) as a cache that shares them with this one (a rank's part of
  // a concatenated cache); writes through either are the same writes.
  SequenceCache share_layers(size_t first, size_t count);

  KVCache& layer(size_t i) { return *layers_[i]; }
  size_t n_layers() const { return layers_.size(); }
  int64_t offset() const { return layers_.empty() ? 0 : layers_[0]->offset(); }
  void reserve(int64_t n);  // KVCache::reserve on every layer
  // Whether every layer can trim n (KVCache::can_trim); trim() throws InvalidInput otherwise,
  // leaving every layer as it was.
  bool can_trim(int64_t n) const;
  void trim(int64_t n);
  void rewind_own_write(int64_t n);
  // KVCache::gives_back_rows of every layer (false for a cache of no layers).
  bool gives_back_rows() const;
  void set_multirow_inplace(bool on);  // on every layer
  std::vector<KVState> snapshot() const;
  void restore(const std::vector<KVState>& states);
  KVCounters counters() const;

 private:
  // Shared only between a concatenated cache and the views share_layers() gives of it.
  std::vector<std::shared_ptr<KVCache>> layers_;
};

}  // namespace osprey
