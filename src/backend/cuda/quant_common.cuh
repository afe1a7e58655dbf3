#pragma once
// Device helpers for the MLX affine-quantized kernels (quant_gemv.cu, quant_linear.cu): code
// extraction from the packed bit stream, scale loads, and the unit dequantizer.
//
// A "unit" is 32 consecutive elements of a row: exactly `B` packed words (32 * B bits), and
// always inside one group (group sizes are multiples of 32), so one scale and one bias apply.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/quant_args.h"

namespace osprey::cuda {

// Code k (0 <= k < 32) of a unit held in w[0 .. B). With k a compile-time constant (unrolled
// loops) the branch folds away and a straddling code costs one funnel shift.
template <int B>
__device__ __forceinline__ uint32_t unit_code(const uint32_t (&w)[B], int k) {
  const int p = k * B, wi = p >> 5, off = p & 31;
  constexpr uint32_t mask = (1u << B) - 1u;
  if (off + B <= 32) return (w[wi] >> off) & mask;
  return __funnelshift_r(w[wi], w[wi + 1], off) & mask;
}

// A code (< 2^23) as an exact float: the integer goes in the mantissa of 2^23.
__device__ __forceinline__ float code_to_float(uint32_t q) { return __uint_as_float(q | 0x4B000000u) - 8388608.0f; }

// One f16 / bf16 scale or bias as f32, through the read-only cache.
template <bool BF16>
__device__ __forceinline__ float load_param(const uint16_t* p) {
  const uint16_t h = __ldg(p);
  return BF16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
}

// The B words of unit `u` of a row (4-byte loads: units of 3 or 6 bits are not 16-byte aligned).
template <int B>
__device__ __forceinline__ void load_unit(const uint32_t* __restrict__ row, int64_t u, uint32_t (&w)[B]) {
#pragma unroll
  for (int t = 0; t < B; ++t) w[t] = __ldg(row + u * B + t);
}

// v[k] = s * q_k + b for the 32 codes of a unit.
template <int B>
__device__ __forceinline__ void dequant_unit(const uint32_t (&w)[B], float s, float b, float (&v)[32]) {
#pragma unroll
  for (int k = 0; k < 32; ++k) v[k] = fmaf(s, code_to_float(unit_code<B>(w, k)), b);
}
// A unit of two groups of 16 (8-bit codes with group size 16): (s0, b0) for codes 0-15, (s1, b1) after.
template <int B>
__device__ __forceinline__ void dequant_unit(const uint32_t (&w)[B], float s0, float b0, float s1, float b1,
                                             float (&v)[32]) {
#pragma unroll
  for (int k = 0; k < 32; ++k) v[k] = fmaf(k < 16 ? s0 : s1, code_to_float(unit_code<B>(w, k)), k < 16 ? b0 : b1);
}

inline int group_shift(int group_size) {
  return group_size == 16 ? 4 : group_size == 32 ? 5 : group_size == 64 ? 6 : 7;
}

}  // namespace osprey::cuda
