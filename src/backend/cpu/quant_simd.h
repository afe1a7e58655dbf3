#pragma once
// Integer vector helpers for the quantized kernels, over the same instruction-set choice as
// gemm_simd.h (a 32-bit integer lane per f32 lane of simd::Vec). Internal to src/backend/cpu.
#include <cstdint>
#include <type_traits>

#include "backend/cpu/gemm_simd.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace simd {

// For load_codes_bytes: lane l takes bytes B * l / 8 and the next one as its low 16 bits
// (shuffle indices; 0x80 zeroes a byte), then shifts right by B * l % 8.
constexpr int byte_pair(int bits, int l) {
  const uint32_t lo = uint32_t(bits * l / 8);
  return int(lo | (lo + 1) << 8 | 0x80800000u);
}
constexpr int bit_shift(int bits, int l) { return bits * l % 8; }

#if defined(__AVX512F__)

using IVec = __m512i;

inline IVec load_words(const uint32_t* p) { return _mm512_loadu_si512(p); }
template <uint32_t M>
inline IVec and_bits(IVec v) { return _mm512_and_si512(v, _mm512_set1_epi32(int(M))); }
template <int S>
inline IVec shift_right(IVec v) { return _mm512_srli_epi32(v, S); }
// Lane l = l * step + offset.
inline IVec lane_index(int step, int offset) {
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(step)),
                          _mm512_set1_epi32(offset));
}
// Lane l = p[idx[l]].
inline Vec gather(const float* p, IVec idx) { return _mm512_i32gather_ps(idx, p, 4); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
// Lane l = p[l / WPG]; reads kWidth floats from p.
template <int WPG>
inline Vec spread(const float* p) {
  const __m512i idx = _mm512_setr_epi32(0 / WPG, 1 / WPG, 2 / WPG, 3 / WPG, 4 / WPG, 5 / WPG, 6 / WPG, 7 / WPG,
                                        8 / WPG, 9 / WPG, 10 / WPG, 11 / WPG, 12 / WPG, 13 / WPG, 14 / WPG, 15 / WPG);
  return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(p));
}
// Codes c .. c + kWidth - 1 of a 4-bit row (c a multiple of kWidth), as f32.
inline Vec load_codes4(const uint32_t* row, int64_t c) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 8));
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}
// Codes c .. c + kWidth - 1 of a 2-bit row (c a multiple of kWidth), as f32.
inline Vec load_codes2(const uint32_t* row, int64_t c) {
  const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i q = _mm512_srlv_epi32(_mm512_set1_epi32(int(row[c / 16])), shifts);
  return _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(3)));
}
// Codes c .. c + kWidth - 1 of an 8-bit row (c a multiple of kWidth), as f32.
inline Vec load_codes8(const uint32_t* row, int64_t c) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 4))));
}
#if defined(__AVX512BW__)
constexpr bool kHasCodeShuffle = true;
// Codes c .. c + kWidth - 1 of a B-bit row (B 3 or 6; c a multiple of kWidth), as f32. Reads the
// 16 bytes from byte c * B / 8 of the row.
template <int B>
inline Vec load_codes_bytes(const uint8_t* row, int64_t c) {
  const __m512i idx = _mm512_setr_epi32(
      byte_pair(B, 0), byte_pair(B, 1), byte_pair(B, 2), byte_pair(B, 3), byte_pair(B, 4), byte_pair(B, 5),
      byte_pair(B, 6), byte_pair(B, 7), byte_pair(B, 8), byte_pair(B, 9), byte_pair(B, 10), byte_pair(B, 11),
      byte_pair(B, 12), byte_pair(B, 13), byte_pair(B, 14), byte_pair(B, 15));
  const __m512i shifts = _mm512_setr_epi32(
      bit_shift(B, 0), bit_shift(B, 1), bit_shift(B, 2), bit_shift(B, 3), bit_shift(B, 4), bit_shift(B, 5),
      bit_shift(B, 6), bit_shift(B, 7), bit_shift(B, 8), bit_shift(B, 9), bit_shift(B, 10), bit_shift(B, 11),
      bit_shift(B, 12), bit_shift(B, 13), bit_shift(B, 14), bit_shift(B, 15));
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * B / 8)));
  const __m512i q = _mm512_srlv_epi32(_mm512_shuffle_epi8(bytes, idx), shifts);
  return _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32((1 << B) - 1)));
}
#else
constexpr bool kHasCodeShuffle = false;
template <int B>
inline Vec load_codes_bytes(const uint8_t*, int64_t) { return zero(); }
#endif
// kWidth f32 values rounded to f16 (nearest even).
inline void store_f16(uint16_t* p, Vec v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

using IVec = __m256i;

inline IVec load_words(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
template <uint32_t M>
inline IVec and_bits(IVec v) { return _mm256_and_si256(v, _mm256_set1_epi32(int(M))); }
template <int S>
inline IVec shift_right(IVec v) { return _mm256_srli_epi32(v, S); }
inline IVec lane_index(int step, int offset) {
  return _mm256_add_epi32(_mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(step)),
                          _mm256_set1_epi32(offset));
}
inline Vec gather(const float* p, IVec idx) { return _mm256_i32gather_ps(p, idx, 4); }
inline Vec to_float(IVec v) { return _mm256_cvtepi32_ps(v); }
template <int WPG>
inline Vec spread(const float* p) {
  const __m256i idx = _mm256_setr_epi32(0 / WPG, 1 / WPG, 2 / WPG, 3 / WPG, 4 / WPG, 5 / WPG, 6 / WPG, 7 / WPG);
  return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), idx);
}
inline Vec load_codes4(const uint32_t* row, int64_t c) {
  const __m128i b = _mm_cvtsi32_si128(int(row[c / 8]));
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}
inline Vec load_codes2(const uint32_t* row, int64_t c) {
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32(int(row[c / 16] >> (2 * (c % 16)))), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(3)));
}
inline Vec load_codes8(const uint32_t* row, int64_t c) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 4))));
}
constexpr bool kHasCodeShuffle = true;
template <int B>
inline Vec load_codes_bytes(const uint8_t* row, int64_t c) {
  const __m256i idx = _mm256_setr_epi32(byte_pair(B, 0), byte_pair(B, 1), byte_pair(B, 2), byte_pair(B, 3),
                                        byte_pair(B, 4), byte_pair(B, 5), byte_pair(B, 6), byte_pair(B, 7));
  const __m256i shifts = _mm256_setr_epi32(bit_shift(B, 0), bit_shift(B, 1), bit_shift(B, 2), bit_shift(B, 3),
                                           bit_shift(B, 4), bit_shift(B, 5), bit_shift(B, 6), bit_shift(B, 7));
  const __m256i bytes =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * B / 8)));
  const __m256i q = _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, idx), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32((1 << B) - 1)));
}
inline void store_f16(uint16_t* p, Vec v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#else

using IVec = uint32_t;

inline IVec load_words(const uint32_t* p) { return *p; }
template <uint32_t M>
inline IVec and_bits(IVec v) { return v & M; }
template <int S>
inline IVec shift_right(IVec v) { return v >> S; }
inline IVec lane_index(int step, int offset) { return uint32_t(offset); }
inline Vec gather(const float* p, IVec idx) { return p[idx]; }
inline Vec to_float(IVec v) { return float(int32_t(v)); }
template <int WPG>
inline Vec spread(const float* p) { return *p; }
inline Vec load_codes4(const uint32_t* row, int64_t c) { return float((row[c / 8] >> (4 * (c % 8))) & 15u); }
inline Vec load_codes2(const uint32_t* row, int64_t c) { return float((row[c / 16] >> (2 * (c % 16))) & 3u); }
inline Vec load_codes8(const uint32_t* row, int64_t c) { return float((row[c / 4] >> (8 * (c % 4))) & 255u); }
constexpr bool kHasCodeShuffle = false;
template <int B>
inline Vec load_codes_bytes(const uint8_t*, int64_t) { return 0.0f; }
inline void store_f16(uint16_t* p, Vec v) { *p = f32_to_f16(v); }

#endif

// One f16 / bf16 scale or bias as f32.
template <class SF>
inline float load_scalar(const uint16_t* p) {
#if defined(__F16C__)
  if constexpr (std::is_same_v<SF, F16>) return _cvtsh_ss(*p);
#endif
  return SF::scalar(*p);
}

}  // namespace simd
OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
