#pragma once
// The element formats of cached K/V rows as the CPU attention kernels (attention.cpp,
// paged_attention.cpp) read them: 16-bit rows (simd::F16, simd::BF16) or packed ones (Q8_0Rows,
// E4M3Rows: backend/kv_quant.h), and the dispatch from the runtime formats to a kernel's
// template.
//
// A packed row is decoded in registers as it is read, kWidth elements at a time (load_at), so
// that a decode step reads each stored byte once and writes no f32 copy of it. The values are
// those of kvq::dequantize_row_q8_0 / _fp8 bit for bit: q8_0 gives d * float(q); fp8 gives
// (s * 256) * h, h the code as an f16 (exactly the e4m3 value / 256, so the product is the one
// rounding of s * e4m3 that kvq computes).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/gemm_simd.h"
#include "backend/cpu/level_only.h"
#include "backend/cpu/x86_intrinsics.h"
#include "backend/kernel_args.h"
#include "backend/kv_quant.h"
#include "core/half.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// An f16 scale in a row's bytes, as f32.
inline float load_f16_scale(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

#if defined(__AVX2__) && defined(__F16C__)
// Eight e4m3 codes (sign-extended to 16-bit lanes) -> the f16 bits of code value / 256: the
// code's seven magnitude bits become the f16 exponent and mantissa fields (exponent bias 15
// against e4m3's 7, so every normal and subnormal code is its value times 2^-8), the sign bit
// the f16 sign; the NaN codes (0x7f, 0xff) get an all-ones exponent, an f16 NaN (unless
// kMayNaN is false: the caller knows there are none).
template <bool kMayNaN = true>
inline __m128i e4m3_to_f16_bits(__m128i w) {
  const __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(int16_t(0xbf80)));
  if constexpr (!kMayNaN) return h;
  const __m128i mag = _mm_set1_epi16(0x3f80);
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, mag), mag);
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7c00)));
}
#endif
#if defined(__AVX512F__)
// Sixteen codes at once, as e4m3_to_f16_bits.
template <bool kMayNaN = true>
inline __m256i e4m3_to_f16_bits16(__m256i w) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(int16_t(0xbf80)));
  if constexpr (!kMayNaN) return h;
  const __m256i mag = _mm256_set1_epi16(0x3f80);
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, mag), mag);
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7c00)));
}
#endif

// q8_0 rows (kvq: head_dim / 32 blocks of an f16 scale and 32 int8). load(row, d): elements
// [d, d + kWidth) for d a multiple of kWidth (kWidth divides 32, so they share one block);
// load_codes(row, d): the same elements' int8 codes as f32, to be scaled by block_scale(row, d).
struct Q8_0Rows {
  using T = uint8_t;
  static constexpr KVElem kElem = KVElem::q8_0;
  static float block_scale(const uint8_t* row, int64_t d) {
    return load_f16_scale(row + (d / kvq::kQ8Block) * kvq::kQ8BlockBytes);
  }
  static simd::Vec load_codes(const uint8_t* row, int64_t d) {
    const uint8_t* q = row + (d / kvq::kQ8Block) * kvq::kQ8BlockBytes + 2 + d % kvq::kQ8Block;
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
#elif defined(__AVX2__) && defined(__F16C__)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
#else
    return float(int8_t(*q));
#endif
  }
  static simd::Vec load(const uint8_t* row, int64_t d) {
    return simd::mul(load_codes(row, d), simd::set1(block_scale(row, d)));
  }
  static float scalar(const uint8_t* row, int64_t d) {
    const uint8_t* blk = row + (d / kvq::kQ8Block) * kvq::kQ8BlockBytes;
    return load_f16_scale(blk) * float(int8_t(blk[2 + d % kvq::kQ8Block]));
  }
};

// fp8 rows (kvq: a float32 scale s, then head_dim e4m3 codes). load(row, d): elements
// [d, d + kWidth), any d; load_codes(row, d): the same elements' codes as f32, to be scaled by
// row_scale(row).
struct E4M3Rows {
  using T = uint8_t;
  static constexpr KVElem kElem = KVElem::fp8_e4m3;
  static float row_scale(const uint8_t* row) {
    float s;
    std::memcpy(&s, row, 4);
#if defined(__AVX2__) && defined(__F16C__)
    return s * 256.0f;  // load_codes gives the code's value / 256
#else
    return s;
#endif
  }
  // kMayNaN false: the row holds no NaN code (has_nan), so the NaN lanes need no fixing.
  template <bool kMayNaN = true>
  static simd::Vec load_codes(const uint8_t* row, int64_t d) {
    const uint8_t* c = row + 4 + d;
#if defined(__AVX512F__)
    return _mm512_cvtph_ps(
        e4m3_to_f16_bits16<kMayNaN>(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)))));
#elif defined(__AVX2__) && defined(__F16C__)
    return _mm256_cvtph_ps(
        e4m3_to_f16_bits<kMayNaN>(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)))));
#else
    return kvq::e4m3_table()[*c];
#endif
  }
  static simd::Vec load(const uint8_t* row, int64_t d) {
    return simd::mul(load_codes(row, d), simd::set1(row_scale(row)));
  }
  // Whether any of the row's n codes is a NaN code (0x7f, 0xff; only a NaN input writes one).
  static bool has_nan(const uint8_t* row, int64_t n) {
    uint8_t any = 0;  // an OR over every code, without an early exit, so that it vectorizes
    for (int64_t i = 0; i < n; ++i) any |= uint8_t((row[4 + i] & 0x7f) == 0x7f);
    return any != 0;
  }
  static float scalar(const uint8_t* row, int64_t d) {
    float s;
    std::memcpy(&s, row, 4);
    return s * kvq::e4m3_table()[row[4 + d]];
  }
};

template <class L>
constexpr bool kPacked = std::is_same_v<L, Q8_0Rows> || std::is_same_v<L, E4M3Rows>;

// Elements [d, d + kWidth) of a row in format L as f32 (d a multiple of kWidth).
template <class L>
__attribute__((always_inline)) inline simd::Vec load_at(const typename L::T* row, int64_t d) {
  if constexpr (kPacked<L>)
    return L::load(row, d);
  else
    return L::load(row + d);
}

// Element d of a row in format L as f32.
template <class L>
inline float scalar_at(const typename L::T* row, int64_t d) {
  if constexpr (kPacked<L>)
    return L::scalar(row, d);
  else
    return L::scalar(row[d]);
}

// One head's row in format L -> out[0:head_dim].
template <class L>
inline void dequantize_row(const typename L::T* row, int64_t head_dim, float* out) {
  const int64_t d_vec = head_dim - head_dim % simd::kWidth;
  for (int64_t d = 0; d < d_vec; d += simd::kWidth) simd::store(out + d, load_at<L>(row, d));
  for (int64_t d = d_vec; d < head_dim; ++d) out[d] = scalar_at<L>(row, d);
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
      case KVElem::q8_0: fn.template operator()<LK, Q8_0Rows>(); break;
      case KVElem::fp8_e4m3: fn.template operator()<LK, E4M3Rows>(); break;
    }
  };
  switch (k) {
    case KVElem::f16: with_v.template operator()<simd::F16>(); break;
    case KVElem::bf16: with_v.template operator()<simd::BF16>(); break;
    case KVElem::q8_0: with_v.template operator()<Q8_0Rows>(); break;
    case KVElem::fp8_e4m3: with_v.template operator()<E4M3Rows>(); break;
  }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
