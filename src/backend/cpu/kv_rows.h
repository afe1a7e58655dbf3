#pragma once
// The element formats of cached K/V rows as the CPU attention kernels (attention.cpp,
// paged_attention.cpp) read them: 16-bit rows (simd::F16, simd::BF16) or packed ones (q8_0,
// fp8_e4m3: backend/kv_quant.h), and the dispatch from the runtime formats to a kernel's
// template.
#include <cstdint>
#include <type_traits>

#include "backend/cpu/gemm_simd.h"
#include "backend/cpu/level_only.h"
#include "backend/kernel_args.h"
#include "backend/kv_quant.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// The stored element of packed rows (KVElem q8_0 or fp8_e4m3, a runtime choice): rows of bytes,
// read through dequantize_row.
struct Packed {
  using T = uint8_t;
};
template <class L>
constexpr bool kPacked = std::is_same_v<L, Packed>;

// One head's packed row (packed_row_width(elem, head_dim) bytes) -> out[0:head_dim].
inline void dequantize_row(KVElem elem, const uint8_t* row, int64_t head_dim, float* out) {
  if (elem == KVElem::q8_0)
    kvq::dequantize_row_q8_0(row, head_dim, out);
  else
    kvq::dequantize_row_fp8(row, head_dim, out);
}

// A row's width in its stored elements: bytes for a packed format, else head_dim.
inline int64_t row_width(KVElem elem, int64_t head_dim) {
  switch (elem) {
    case KVElem::q8_0: return packed_row_width(DType::q8_0, head_dim);
    case KVElem::fp8_e4m3: return packed_row_width(DType::fp8_e4m3, head_dim);
    default: return head_dim;
  }
}

// Calls fn.template operator()<LK, LV>() with the element formats of k and v.
template <class Fn>
inline void run_for_elems(KVElem k, KVElem v, Fn&& fn) {
  auto with_v = [&]<class LK>() {
    switch (v) {
      case KVElem::f16: fn.template operator()<LK, simd::F16>(); break;
      case KVElem::bf16: fn.template operator()<LK, simd::BF16>(); break;
      default: fn.template operator()<LK, Packed>(); break;
    }
  };
  switch (k) {
    case KVElem::f16: with_v.template operator()<simd::F16>(); break;
    case KVElem::bf16: with_v.template operator()<simd::BF16>(); break;
    default: with_v.template operator()<Packed>(); break;
  }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
