#include "kv/guarded_cache.h"

#include "core/error.h"

namespace osprey {

GuardedKVCache::GuardedKVCache(const KVCacheParams& params) : params_(params) { check_kv_cache_types(params); }

Shape GuardedKVCache::buffer_shape(DType dt, int64_t rows) const {
  return {params_.n_kv_heads, rows, packed_row_width(dt, params_.head_dim)};
}

bool GuardedKVCache::fits_state(const KVState& state) const {
  auto fits = [&](const Array& a, DType dt) {
    return a.ndim() == 3 && a.dtype() == dt && a.dim(0) == params_.n_kv_heads &&
           a.dim(2) == packed_row_width(dt, params_.head_dim);
  };
  return fits(state.keys, params_.key_dtype()) && fits(state.values, params_.value_dtype()) &&
         state.keys.dim(1) == state.values.dim(1);
}

bool GuardedKVCache::owns_current_state() const {
  return keys_.id() == own_keys_.id() && values_.id() == own_values_.id() && offset_ == own_length_;
}

void GuardedKVCache::arm_guard() {
  own_keys_ = keys_;
  own_values_ = values_;
  own_length_ = offset_;
}

void GuardedKVCache::adopt_inplace(int64_t n) {
  keys_ = Array::strided(keys_.buffer(), keys_.byte_offset(), keys_.shape(), keys_.strides(), keys_.dtype());
  values_ = Array::strided(values_.buffer(), values_.byte_offset(), values_.shape(), values_.strides(), values_.dtype());
  offset_ += n;
  ++counters_.n_inplace_writes;
}

void GuardedKVCache::check_write(const Array& k, const Array& v, const Array& positions) const {
  if (k.ndim() != 3 || k.dim(1) != params_.n_kv_heads || k.dim(2) != params_.head_dim || !(k.shape() == v.shape()) ||
      k.dtype() != DType::f32 || v.dtype() != DType::f32)
    throw InvalidInput("KV cache write: k " + describe(k) + " and v " + describe(v) + " must be float32 [n, " +
                       std::to_string(params_.n_kv_heads) + ", " + std::to_string(params_.head_dim) + "]");
  const int64_t n = k.dim(0);
  if (positions.defined() && (positions.dtype() != DType::i32 || positions.numel() != n))
    throw InvalidInput("KV cache write: positions " + describe(positions) + " must be int32 [" + std::to_string(n) +
                       "]");
}

uint64_t GuardedKVCache::row_bytes(int64_t n) const { return params_.row_bytes(n); }

std::pair<const void*, const void*> GuardedKVCache::buffers() const {
  return {keys_.defined() ? keys_.buffer().get() : nullptr, values_.defined() ? values_.buffer().get() : nullptr};
}

void GuardedKVCache::rewind_own_write(int64_t n) {
  const bool own = keys_.defined() && owns_current_state();
  trim(n);
  if (own) own_length_ = offset_;
}

KVState GuardedKVCache::detach() {
  KVState s{std::move(keys_), std::move(values_), offset_};
  keys_ = Array();
  values_ = Array();
  own_keys_ = Array();
  own_values_ = Array();
  own_length_ = -1;
  offset_ = 0;
  return s;
}

}  // namespace osprey
