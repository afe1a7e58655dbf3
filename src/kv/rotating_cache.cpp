#include "kv/rotating_cache.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {

RotatingKVCache::RotatingKVCache(const KVCacheParams& params) : GuardedKVCache(params), rows_(params.window) {
  if (params.n_kv_heads <= 0 || params.head_dim <= 0 || params.window <= 0)
    throw InvalidInput("rotating KV cache needs positive n_kv_heads, head_dim and window");
}

bool RotatingKVCache::sole_holder() const {
  // keys_ and own_keys_ are one handle (owns_current_state): any other holder of the buffer is
  // a snapshot, a restored or detached state, or a view handed out earlier.
  return keys_.buffer().use_count() == 1 && values_.buffer().use_count() == 1;
}

bool RotatingKVCache::next_write_in_place(int64_t n) const {
  if (!params_.inplace || n != 1 || !keys_.defined() || !owns_current_state()) return false;
  // Row offset % R holds position offset - R once the ring has wrapped.
  return offset_ < rows_ || sole_holder();
}

KVView RotatingKVCache::ring_view(int64_t pos0, const Array& positions) const {
  KVView view;
  view.keys = kv_rows_view(keys_, 0, rows_);
  view.values = kv_rows_view(values_, 0, rows_);
  view.pos0 = pos0;
  view.positions = positions;
  view.max_keys = rows_;
  view.layout = ops::RingKeys{rows_};
  return view;
}

KVView RotatingKVCache::update_and_fetch(const Array& k, const Array& v, const Array& positions) {
  check_write(k, v, positions);
  const int64_t n = k.dim(0), pos0 = offset_;
  if (n < 1) throw InvalidInput("KV cache write: no rows");
  KVView view;
  if (next_write_in_place(n)) {
    ops::write_kv_rows(keys_, values_, k, v, offset_, positions, rows_, params_.row_scales());
    adopt_inplace_row();
    view = ring_view(pos0, positions);
  } else if (n == 1) {
    copying_write_row(k, v);
    view = ring_view(pos0, positions);
  } else {
    view = copying_write_chunk(k, v, positions);
  }
  // Every write, copying or in place, re-arms the guard.
  arm_guard();
  return view;
}

void RotatingKVCache::adopt_inplace_row() {
  GuardedKVCache::adopt_inplace(1);
  held_lo_ = std::max<int64_t>(held_lo_, offset_ - rows_);
}

void RotatingKVCache::commit_replayed_write() {
  if (!next_write_in_place(1)) throw InvalidInput("KV cache: a replayed write needs the in-place path");
  adopt_inplace_row();
  arm_guard();
}

void RotatingKVCache::copy_positions(const Array& dst, int64_t dst_row0, const Array& src, int64_t p0, int64_t n) {
  if (n <= 0) return;
  const int64_t r0 = p0 % rows_, first = std::min(n, rows_ - r0);
  ops::copy_into(kv_rows_view(dst, dst_row0, first), kv_rows_view(src, r0, first));
  if (first < n) ops::copy_into(kv_rows_view(dst, dst_row0 + first, n - first), kv_rows_view(src, 0, n - first));
}

void RotatingKVCache::copying_write_row(const Array& k, const Array& v) {
  // The positions the new row's query sees before it, into a new ring at the same rows.
  const int64_t keep_lo = std::max<int64_t>(0, offset_ - rows_ + 1), keep = offset_ - keep_lo;
  Array nk = Array::empty(buffer_shape(params_.key_dtype(), rows_), params_.key_dtype(), params_.device);
  Array nv = Array::empty(buffer_shape(params_.value_dtype(), rows_), params_.value_dtype(), params_.device);
  if (keep > 0) {
    const int64_t r0 = keep_lo % rows_;
    const int64_t first = std::min(keep, rows_ - r0);
    ops::copy_into(kv_rows_view(nk, r0, first), kv_rows_view(keys_, r0, first));
    ops::copy_into(kv_rows_view(nv, r0, first), kv_rows_view(values_, r0, first));
    if (first < keep) {
      ops::copy_into(kv_rows_view(nk, 0, keep - first), kv_rows_view(keys_, 0, keep - first));
      ops::copy_into(kv_rows_view(nv, 0, keep - first), kv_rows_view(values_, 0, keep - first));
    }
    counters_.bytes_copied += row_bytes(keep);
  }
  ops::write_kv_rows(nk, nv, k, v, offset_, {}, rows_, params_.row_scales());
  keys_ = std::move(nk);
  values_ = std::move(nv);
  ++offset_;
  held_lo_ = keep_lo;
  ++counters_.n_copying_writes;
}

KVView RotatingKVCache::copying_write_chunk(const Array& k, const Array& v, const Array& positions) {
  const int64_t n = k.dim(0), L = offset_;
  // [m old positions | n new ones]: the first query (at L) sees L - window + 1 .. L.
  const int64_t m = std::min(L, rows_ - 1), lin_pos0 = L - m;
  Array lk = Array::empty(buffer_shape(params_.key_dtype(), m + n), params_.key_dtype(), params_.device);
  Array lv = Array::empty(buffer_shape(params_.value_dtype(), m + n), params_.value_dtype(), params_.device);
  if (m > 0) {
    copy_positions(lk, 0, keys_, lin_pos0, m);
    copy_positions(lv, 0, values_, lin_pos0, m);
    counters_.bytes_copied += row_bytes(m);
  }
  ops::write_kv_rows(lk, lv, k, v, m, {}, 0, params_.row_scales());

  // The new ring: the last R positions, each at row p % R.
  const int64_t end = L + n, ring_lo = std::max<int64_t>(0, end - rows_);
  Array nk = Array::empty(buffer_shape(params_.key_dtype(), rows_), params_.key_dtype(), params_.device);
  Array nv = Array::empty(buffer_shape(params_.value_dtype(), rows_), params_.value_dtype(), params_.device);
  for (int64_t p = ring_lo; p < end;) {
    const int64_t r = p % rows_, run = std::min(end - p, rows_ - r);
    ops::copy_into(kv_rows_view(nk, r, run), kv_rows_view(lk, p - lin_pos0, run));
    ops::copy_into(kv_rows_view(nv, r, run), kv_rows_view(lv, p - lin_pos0, run));
    p += run;
  }
  keys_ = std::move(nk);
  values_ = std::move(nv);
  offset_ = end;
  held_lo_ = ring_lo;
  ++counters_.n_copying_writes;

  KVView view;
  view.keys = std::move(lk);
  view.values = std::move(lv);
  view.pos0 = L;
  view.positions = positions;
  view.max_keys = m + n;
  view.layout = ops::LinearKeys{lin_pos0};
  return view;
}

bool RotatingKVCache::can_trim(int64_t n) const {
  const int64_t to = std::max<int64_t>(0, offset_ - std::max<int64_t>(0, n));
  return to == 0 || to == offset_ || std::max<int64_t>(0, to - params_.window + 1) >= held_lo_;
}

void RotatingKVCache::trim(int64_t n) {
  if (!can_trim(n))
    throw InvalidInput("rotating KV cache: cannot trim " + std::to_string(n) + " of " + std::to_string(offset_) +
                       " positions: the ring of " + std::to_string(rows_) + " rows no longer holds position " +
                       std::to_string(std::max<int64_t>(0, offset_ - n - params_.window + 1)));
  offset_ = std::max<int64_t>(0, offset_ - std::max<int64_t>(0, n));
  if (offset_ == 0) held_lo_ = 0;
}

KVState RotatingKVCache::snapshot() const {
  // New views of the buffers: they count as holders, so the wrap's in-place writes spare them.
  if (!keys_.defined()) return {Array(), Array(), offset_};
  return {kv_rows_view(keys_, 0, rows_), kv_rows_view(values_, 0, rows_), offset_};
}

void RotatingKVCache::restore(const KVState& state) {
  if (state.keys.defined() &&
      (!fits_state(state) || state.keys.dim(1) != rows_ || state.offset < 0))
    throw InvalidInput("rotating KV cache restore: state " + describe(state.keys) + " at offset " +
                       std::to_string(state.offset) + " does not fit a ring of " + std::to_string(rows_) + " rows");
  keys_ = state.keys;
  values_ = state.values;
  offset_ = state.keys.defined() ? state.offset : 0;
  // A state holds at least the positions its next query sees: (offset - R, offset).
  held_lo_ = std::max<int64_t>(0, offset_ - rows_ + 1);
}

KVState RotatingKVCache::detach() {
  held_lo_ = 0;
  return GuardedKVCache::detach();
}

}  // namespace osprey
