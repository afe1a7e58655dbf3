#pragma once
// The KV cache's packed row formats (core/dtype.h), one row of n elements at a time:
//   q8_0: n / 32 blocks of 34 bytes, each the f16 scale d = max|x| / 127 (rounded to f16) then
//     32 int8 q = round(x / d) (half away from zero, as llama.cpp's quantize_row_q8_0 computes
//     it: with the unrounded 127 / max|x|); x' = d * q.
//   fp8_e4m3: the float32 scale s = max|x| / 448 (1 when the row is all zeros), then n OCP e4m3
//     (e4m3fn) codes of x / s rounded to nearest even (saturating at 448); x' = s * e4m3.
// A row's bytes depend on that row alone, so a row quantized where it lands (in place) and the
// same row written by a copying write are the same bytes. Inline, so that the CPU kernels built
// per instruction-set level vectorize the dequantization.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"

namespace osprey::kvq {

constexpr int64_t kQ8Block = 32;
constexpr int64_t kQ8BlockBytes = 34;
constexpr float kE4M3Max = 448.0f;

// e4m3fn code -> float (0x7f / 0xff are NaN; no infinities).
inline float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80) << 24, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  float v;
  if (e == 0) {
    v = float(m) * (1.0f / 512.0f);  // m / 8 * 2^-6
  } else {
    const uint32_t bits = ((e + 120) << 23) | (m << 20);  // exponent e - 7 + 127
    std::memcpy(&v, &bits, 4);
  }
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u |= sign;
  std::memcpy(&v, &u, 4);
  return v;
}

// The 256 code values, for table lookups in the kernels.
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) v[c] = e4m3_to_f32(uint8_t(c));
  }
};
inline const float* e4m3_table() {
  static const E4M3Table t;
  return t.v;
}

// float -> e4m3fn code, rounded to nearest even, saturated to +-448; NaN -> 0x7f. A value that
// rounds to zero gives code 0 (no negative zero).
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::min(std::fabs(x), kE4M3Max);
  uint8_t code;
  if (a < 0.015625f) {
    // Subnormals: multiples of 2^-9, codes 0..7 (8 is the smallest normal, 2^-6).
    const float q = std::nearbyint(a * 512.0f);  // round half to even (default rounding mode)
    code = uint8_t(q);
  } else {
    uint32_t u;
    std::memcpy(&u, &a, 4);
    // Keep 3 mantissa bits, rounding the 20 dropped ones to nearest even.
    const uint32_t lsb = (u >> 20) & 1;
    u += 0x7ffff + lsb;
    const uint32_t e = (u >> 23) - 120, m = (u >> 20) & 7;  // exponent rebased to e4m3's bias 7
    code = uint8_t(std::min<uint32_t>((e << 3) | m, 0x7e));
  }
  return code == 0 ? 0 : uint8_t(code | sign);
}

inline void quantize_row_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* ob = out + b * kQ8BlockBytes;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(ob, &dh, 2);
    for (int64_t i = 0; i < kQ8Block; ++i) ob[2 + i] = uint8_t(int8_t(std::round(xb[i] * id)));
  }
}

// An fp8_e4m3 row with the scale s given (a checkpoint's fixed k_scale / v_scale, s > 0): s, then
// the codes of x / s (saturating at 448). It decodes as every fp8 row does: x' = s * e4m3.
inline void quantize_row_fp8_scaled(const float* x, int64_t n, float s, uint8_t* out) {
  std::memcpy(out, &s, 4);
  for (int64_t i = 0; i < n; ++i) out[4 + i] = f32_to_e4m3(x[i] / s);
}

inline void quantize_row_fp8(const float* x, int64_t n, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  quantize_row_fp8_scaled(x, n, amax > 0.0f ? amax / kE4M3Max : 1.0f, out);
}

// out[0:n] = the row's values.
inline void dequantize_row_q8_0(const uint8_t* row, int64_t n, float* out) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const uint8_t* rb = row + b * kQ8BlockBytes;
    uint16_t dh;
    std::memcpy(&dh, rb, 2);
    const float d = f16_to_f32(dh);
    const int8_t* q = reinterpret_cast<const int8_t*>(rb + 2);
    float* o = out + b * kQ8Block;
    for (int64_t i = 0; i < kQ8Block; ++i) o[i] = d * float(q[i]);
  }
}

inline void dequantize_row_fp8(const uint8_t* row, int64_t n, float* out) {
  float s;
  std::memcpy(&s, row, 4);
  const float* t = e4m3_table();
  for (int64_t i = 0; i < n; ++i) out[i] = s * t[row[4 + i]];
}

}  // namespace osprey::kvq
