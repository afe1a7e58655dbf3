#include "backend/ops.h"
#include "core/error.h"
#include "kv/dense_cache.h"

namespace osprey {

DenseKVCache::DenseKVCache(const KVCacheParams& params) : GuardedKVCache(params) {
  if (params.n_kv_heads <= 0 || params.head_dim <= 0 || params.step <= 0)
    throw InvalidInput("KV cache needs positive n_kv_heads, head_dim and step");
}

DenseKVCache::~DenseKVCache() { evict_buffers(); }

void DenseKVCache::evict_buffers() {
  // Snapshots may still hold these buffers; the hint takes effect when the last one goes.
  for (const Array* a : {&keys_, &values_, &own_keys_, &own_values_})
    if (a->defined()) a->buffer()->evict_on_release();
}

bool DenseKVCache::next_write_in_place(int64_t n) const {
  if (!params_.inplace || n != 1 || !keys_.defined()) return false;
  return owns_current_state() && offset_ + n <= capacity();
}

bool DenseKVCache::write_in_place(int64_t n) const {
  if (n > 1 && multirow_inplace_ && params_.inplace && keys_.defined())
    return owns_current_state() && offset_ + n <= capacity();
  return next_write_in_place(n);
}

KVView DenseKVCache::update_and_fetch(const Array& k, const Array& v, const Array& positions) {
  check_write(k, v, positions);
  const int64_t n = k.dim(0), pos0 = offset_;
  if (write_in_place(n)) {
    // Rows [offset, offset + n) of buffers no snapshot reads past offset (the guard): a verify
    // step's rows land here, and rewind_own_write() gives the rejected ones back.
    ops::write_kv_rows(keys_, values_, k, v, offset_, positions, 0, params_.row_scales());
    adopt_inplace(n);
  } else {
    copying_write(k, v, n);
  }
  // Every write, copying or in place, re-arms the guard.
  arm_guard();
  KVView view;
  view.keys = kv_rows_view(keys_, 0, offset_);
  view.values = kv_rows_view(values_, 0, offset_);
  view.pos0 = pos0;
  view.positions = positions;
  view.max_keys = capacity();
  return view;
}

void DenseKVCache::commit_replayed_write() {
  if (!next_write_in_place(1)) throw InvalidInput("KV cache: a replayed write needs the in-place path");
  adopt_inplace(1);
  arm_guard();
}

void DenseKVCache::copying_write(const Array& k, const Array& v, int64_t n) {
  const int64_t needed = offset_ + n;
  int64_t cap = capacity();
  if (needed > cap) cap = (std::max(needed, reserved_) + params_.step - 1) / params_.step * params_.step;
  // The buffers this write replaces: at the same capacity the next layer's write takes them
  // up; after a growth nothing asks for their size again.
  evict_buffers();
  Array nk = Array::empty(buffer_shape(params_.key_dtype(), cap), params_.key_dtype(), params_.device);
  Array nv = Array::empty(buffer_shape(params_.value_dtype(), cap), params_.value_dtype(), params_.device);
  if (offset_ > 0) {
    ops::copy_into(kv_rows_view(nk, 0, offset_), kv_rows_view(keys_, 0, offset_));
    ops::copy_into(kv_rows_view(nv, 0, offset_), kv_rows_view(values_, 0, offset_));
    counters_.bytes_copied += row_bytes(offset_);
  }
  ops::write_kv_rows(nk, nv, k, v, offset_, {}, 0, params_.row_scales());
  keys_ = std::move(nk);
  values_ = std::move(nv);
  offset_ = needed;
  ++counters_.n_copying_writes;
}

void DenseKVCache::trim(int64_t n) { offset_ = std::max<int64_t>(0, offset_ - std::max<int64_t>(0, n)); }

KVState DenseKVCache::snapshot() const { return {keys_, values_, offset_}; }

void DenseKVCache::restore(const KVState& state) {
  if (state.keys.defined() && (!fits_state(state) || state.offset > state.keys.dim(1)))
    throw InvalidInput("KV cache restore: state " + describe(state.keys) + " at offset " +
                       std::to_string(state.offset) + " does not fit this cache");
  keys_ = state.keys;
  values_ = state.values;
  offset_ = state.keys.defined() ? state.offset : 0;
}


}  // namespace osprey
