#pragma once
// The parameters of the small KV caches the tests build.
#include <cstdint>

#include "core/dtype.h"
#include "kv/kv_cache.h"

namespace osprey::testing {

// n_kv_heads heads of head_dim values a row, stored as `dtype`; every other field at its default.
inline KVCacheParams kv_params(int64_t n_kv_heads, int64_t head_dim, DType dtype = DType::f16) {
  KVCacheParams p;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.dtype = dtype;
  return p;
}

}  // namespace osprey::testing
