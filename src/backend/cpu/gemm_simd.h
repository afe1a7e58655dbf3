#pragma once
// A thin f32 vector layer over the widest instruction set of the level being built (level.h): AVX-512F
// (16 lanes), AVX2 + FMA + F16C (8 lanes), or plain scalar code (1 lane). The kernels in this
// folder are written once against it. Internal to src/backend/cpu.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/level_only.h"
#include "backend/cpu/x86_intrinsics.h"
#include "core/half.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace simd {

#if defined(__AVX512F__)

constexpr int kWidth = 16;
constexpr int kRegisters = 32;
using Vec = __m512;

inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec set1(float f) { return _mm512_set1_ps(f); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec load_bf16(const uint16_t* p) {
  __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
// 2 * kWidth 16-bit values as kWidth 32-bit lanes (lane l holds p[2l] low, p[2l + 1] high).
inline Vec load_pairs(const uint16_t* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
// From lanes of bf16 pairs: the low (even) or high (odd) halves as f32.
inline Vec bf16_even(Vec pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(pairs), 16)); }
inline Vec bf16_odd(Vec pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(pairs), _mm512_set1_epi32(int(0xffff0000u))));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }

// exp(x) for x <= 88.7, to about 2 ulp; exactly 0 below -87.3 (and for -inf).
inline Vec exp(Vec x) {
  const Vec lo = set1(-87.3f);
  __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), set1(88.7f));
  Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  Vec r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
  Vec p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  p = fma(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set1(1.0f)));
  return _mm512_maskz_scalef_ps(__mmask16(~under), p, n);
}

// In-place transpose of a kWidth x kWidth block held as kWidth row vectors.
inline void transpose(Vec r[16]) {
  Vec t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
  for (int c = 0; c < 4; ++c) {
    Vec x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    Vec x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    Vec y0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    Vec y1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(x0, y0, 0xdd);
    t[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Lane i of the result = sum of the lanes of r[i] (kWidth horizontal sums at once).
inline Vec sum_rows(const Vec r[16]) {
  Vec u[8], v[4];
  for (int i = 0; i < 8; ++i)
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]), _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    v[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // v[i], 128-bit lane L: rows 4i..4i+3 summed over lane L.
  const Vec w01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xdd));
  const Vec w23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x88), _mm512_shuffle_f32x4(v[2], v[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xdd));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

constexpr int kWidth = 8;
constexpr int kRegisters = 16;
using Vec = __m256;

inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec set1(float f) { return _mm256_set1_ps(f); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load_bf16(const uint16_t* p) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
// 2 * kWidth 16-bit values as kWidth 32-bit lanes (lane l holds p[2l] low, p[2l + 1] high).
inline Vec load_pairs(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// From lanes of bf16 pairs: the low (even) or high (odd) halves as f32.
inline Vec bf16_even(Vec pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pairs), 16)); }
inline Vec bf16_odd(Vec pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(pairs), _mm256_set1_epi32(int(0xffff0000u))));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float reduce_add(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(Vec v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 88.7, to about 2 ulp; exactly 0 below -87.3 (and for -inf).
inline Vec exp(Vec x) {
  const Vec lo = set1(-87.3f);
  Vec keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), set1(88.7f));
  Vec n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
  Vec p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  p = fma(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
  // 2^n for n in [-126, 128]: split in two factors so that n = 128 does not overflow the exponent.
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i half = _mm256_srai_epi32(ni, 1);
  Vec s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  Vec s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), keep);
}

// In-place transpose of a kWidth x kWidth block held as kWidth row vectors.
inline void transpose(Vec r[8]) {
  Vec t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    r[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x20);
    t[4 + c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// Lane i of the result = sum of the lanes of r[i] (kWidth horizontal sums at once).
inline Vec sum_rows(const Vec r[8]) {
  Vec u[4], v[2];
  for (int i = 0; i < 4; ++i)
    u[i] = _mm256_add_ps(_mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]), _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    v[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
}

#else

constexpr int kWidth = 1;
constexpr int kRegisters = 16;
using Vec = float;

inline Vec zero() { return 0.0f; }
inline Vec set1(float f) { return f; }
inline Vec load(const float* p) { return *p; }
inline void store(float* p, Vec v) { *p = v; }
inline Vec load_f16(const uint16_t* p) { return f16_to_f32(*p); }
inline Vec load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
// 2 * kWidth 16-bit values as kWidth 32-bit lanes (lane l holds p[2l] low, p[2l + 1] high).
inline Vec load_pairs(const uint16_t* p) { return std::bit_cast<float>(uint32_t(p[0]) | uint32_t(p[1]) << 16); }
// From lanes of bf16 pairs: the low (even) or high (odd) halves as f32.
inline Vec bf16_even(Vec pairs) { return bf16_to_f32(uint16_t(std::bit_cast<uint32_t>(pairs))); }
inline Vec bf16_odd(Vec pairs) { return bf16_to_f32(uint16_t(std::bit_cast<uint32_t>(pairs) >> 16)); }
inline Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec add(Vec a, Vec b) { return a + b; }
inline Vec sub(Vec a, Vec b) { return a - b; }
inline Vec div(Vec a, Vec b) { return a / b; }
inline Vec mul(Vec a, Vec b) { return a * b; }
inline Vec max(Vec a, Vec b) { return a > b ? a : b; }
inline float reduce_add(Vec v) { return v; }
inline float reduce_max(Vec v) { return v; }
inline Vec exp(Vec x) { return x < -87.3f ? 0.0f : std::exp(x); }
inline void transpose(Vec*) {}
inline Vec sum_rows(const Vec* r) { return r[0]; }

#endif

// Makes v opaque to the optimiser, so that it stays in a register: GCC otherwise folds a
// loaded vector that feeds several FMAs back into each FMA as a memory operand, turning one load
// into many.
inline void pin(Vec& v) {
#if defined(__AVX512F__)
  __asm__("" : "+v"(v));  // any of the 32 vector registers
#elif defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#else
  (void)v;
#endif
}

// Weight element formats, as tags for templates: load kWidth elements as f32.
struct F32 {
  using T = float;
  static Vec load(const float* p) { return simd::load(p); }
  static float scalar(float v) { return v; }
};
struct F16 {
  using T = uint16_t;
  static Vec load(const uint16_t* p) { return simd::load_f16(p); }
  static float scalar(uint16_t v) { return f16_to_f32(v); }
};
struct BF16 {
  using T = uint16_t;
  static Vec load(const uint16_t* p) { return simd::load_bf16(p); }
  static float scalar(uint16_t v) { return bf16_to_f32(v); }
};

}  // namespace simd
OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
