#pragma once
// The rotating cache of a sliding-window layer: a ring of `window` rows per kv head, so its
// memory is bounded however long the sequence (docs/design.md, "The rotating cache").
//
// Layout: keys and values are [n_kv_heads, R, head_dim] (f16 or bf16) over one buffer each,
// R = params.window; position p sits at row p % R, and the ring holds the last R positions
// written. A query at position q sees keys (q - window, q].
//
// Writes:
// - a single row (decode) returns a ring view (KVView::layout a RingKeys of R rows, max_keys = R). It goes in
//   place under the dense cache's guard (the current arrays are this cache's own last write, at
//   the length it left) and, once the row to write holds a live position (offset >= R), only
//   when this cache is the sole holder of its buffers: no snapshot, restored or detached state
//   and no earlier view holds them. Otherwise one copying write into a new ring.
// - n > 1 rows (a prefill chunk, any n, possibly wrapping) is a copying write: the view is a
//   linear buffer of the min(offset, window - 1) positions before the chunk followed by the
//   chunk's rows (KVView::layout LinearKeys from its first position), so each query of the chunk finds its
//   own last `window` positions; the last R positions then go into a new ring.
//
// A view is valid until the cache's next write; to keep rows, take a snapshot (its arrays are
// new views of the buffers, so a later write that would change them copies instead).
#include "kv/guarded_cache.h"

namespace osprey {

class RotatingKVCache : public GuardedKVCache {
 public:
  // params.window > 0 is the ring's row count.
  explicit RotatingKVCache(const KVCacheParams& params);

  KVView update_and_fetch(const Array& k, const Array& v, const Array& positions = {}) override;
  // The ring's rows: the buffers never grow.
  int64_t capacity() const override { return keys_.defined() ? rows_ : 0; }
  // After the ring has wrapped, the rows of older positions are gone: a trim is possible only
  // while the positions the next query sees, (offset - n - window, offset - n), are still held
  // (or to 0).
  bool can_trim(int64_t n) const override;
  // Throws InvalidInput when !can_trim(n).
  void trim(int64_t n) override;
  KVState snapshot() const override;
  void restore(const KVState& state) override;
  KVState detach() override;

  // ReplayableCache
  bool next_write_in_place(int64_t n_rows) const override;
  void commit_replayed_write() override;

 protected:
  // The rule after the wrap: no one but this cache holds its buffers. Virtual only as a test
  // seam: a test subclass drops it to prove that the snapshot tests catch the corruption.
  virtual bool sole_holder() const;

 private:
  void copying_write_row(const Array& k, const Array& v);
  KVView copying_write_chunk(const Array& k, const Array& v, const Array& positions);
  void adopt_inplace_row();  // adopt_inplace(1), and the ring's lowest held position
  // Rows [row0, row0 + n) of a [heads, rows, head_dim] array, as a view.
  KVView ring_view(int64_t pos0, const Array& positions) const;
  // Copies positions [p0, p0 + n) of the ring `src` (rows p % R) to rows dst_row0.. of `dst`.
  void copy_positions(const Array& dst, int64_t dst_row0, const Array& src, int64_t p0, int64_t n);

  int64_t rows_;        // R (keys_ and values_ are [n_kv_heads, R, head_dim])
  int64_t held_lo_ = 0;  // the lowest position whose row the current ring still holds
};

}  // namespace osprey
