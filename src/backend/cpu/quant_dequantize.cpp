// Row decoding (quant_decode.h), dequantize_rows and dequantize (quant_kernels.h).
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/quant_decode.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_simd.h"
#include "core/error.h"
#include "core/half.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

using namespace simd;

// Code c of a row: stream bits [c * bits, (c + 1) * bits) of its words.
inline uint32_t code_at(const uint32_t* words, int64_t c, int bits) {
  const int64_t bit = c * bits;
  const int off = int(bit & 31);
  uint64_t v = words[bit >> 5] >> off;
  if (off + bits > 32) v |= uint64_t(words[(bit >> 5) + 1]) << (32 - off);
  return uint32_t(v) & ((1u << bits) - 1u);
}

// B == w.bits for the SIMD loop, 0 for code_at alone (any bits).
template <class SF, int B>
void decode_impl(const QuantArgs& w, int64_t row, int64_t k0, int64_t kc, float* dst) {
  const int64_t g_size = w.group_size, n_groups = w.in / g_size;
  const auto* scales = static_cast<const uint16_t*>(w.scales) + row * n_groups;
  const auto* biases = static_cast<const uint16_t*>(w.biases) + row * n_groups;
  const int64_t words_per_row = w.in * w.bits / 32;
  const uint32_t* words = w.packed + row * words_per_row;
  // Bits 3 and 6 read 16 bytes per vector: the last vectors of a row, which would read past its
  // end (and past the matrix for the last row), take code_at.
  const int64_t vec_end = B == 3 || B == 6 ? (words_per_row * 4 - 16) * 8 / std::max(B, 1) : INT64_MAX;
  const int64_t end = k0 + kc;
  for (int64_t c = k0; c < end;) {
    const int64_t g = c / g_size, g_end = std::min(end, (g + 1) * g_size);
    const float s = load_scalar<SF>(scales + g), b = load_scalar<SF>(biases + g);
    if constexpr (B != 0 && kWidth > 1 && (kHasCodeShuffle || (B != 3 && B != 6))) {
      // Groups start at multiples of 32, so vectors never straddle one.
      const Vec vs = set1(s), vb = set1(b);
      for (; c + kWidth <= g_end && c <= vec_end; c += kWidth) {
        Vec q;
        if constexpr (B == 2)
          q = load_codes2(words, c);
        else if constexpr (B == 4)
          q = load_codes4(words, c);
        else if constexpr (B == 8)
          q = load_codes8(words, c);
        else
          q = load_codes_bytes<B>(reinterpret_cast<const uint8_t*>(words), c);
        store(dst + (c - k0), fma(q, vs, vb));
      }
    }
    for (; c < g_end; ++c) dst[c - k0] = std::fma(s, float(code_at(words, c, w.bits)), b);
  }
}

template <class SF>
void decode_bits(const QuantArgs& w, int64_t row, int64_t k0, int64_t kc, float* dst) {
  switch (w.bits) {
    case 2: decode_impl<SF, 2>(w, row, k0, kc, dst); break;
    case 3: decode_impl<SF, 3>(w, row, k0, kc, dst); break;
    case 4: decode_impl<SF, 4>(w, row, k0, kc, dst); break;
    case 6: decode_impl<SF, 6>(w, row, k0, kc, dst); break;
    case 8: decode_impl<SF, 8>(w, row, k0, kc, dst); break;
    default: decode_impl<SF, 0>(w, row, k0, kc, dst); break;
  }
}

}  // namespace

void decode_row(const QuantArgs& w, int64_t row, int64_t k0, int64_t kc, float* dst) {
  if (w.scale_dtype == DType::bf16)
    decode_bits<BF16>(w, row, k0, kc, dst);
  else
    decode_bits<F16>(w, row, k0, kc, dst);
}

void dequantize_rows(const QuantArgs& w, const int32_t* rows, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float* dst = out + i * w.in;  // [in]
    decode_row(w, rows[i], 0, w.in, dst);
    if (scale != 1.0f)
      for (int64_t c = 0; c < w.in; ++c) dst[c] *= scale;
  }
}

void dequantize(const QuantArgs& w, DType out_dtype, void* out) {
  if (out_dtype == DType::f32) {
    for (int64_t r = 0; r < w.out; ++r) decode_row(w, r, 0, w.in, static_cast<float*>(out) + r * w.in);
    return;
  }
  if (out_dtype != DType::f16 && out_dtype != DType::bf16)
    throw Unsupported(std::string("dequantize: output dtype ") + dtype_name(out_dtype) +
                      " (want f32, f16 or bf16)");
  thread_local std::vector<float> row_f32;  // [in]
  if (int64_t(row_f32.size()) < w.in) row_f32.resize(size_t(w.in));
  float* src = row_f32.data();
  for (int64_t r = 0; r < w.out; ++r) {
    decode_row(w, r, 0, w.in, src);
    uint16_t* dst = static_cast<uint16_t*>(out) + r * w.in;  // [in]
    int64_t c = 0;
    if (out_dtype == DType::f16) {
      for (; c + kWidth <= w.in; c += kWidth) store_f16(dst + c, load(src + c));
      for (; c < w.in; ++c) dst[c] = f32_to_f16(src[c]);
    } else {
      for (; c < w.in; ++c) dst[c] = f32_to_bf16(src[c]);
    }
  }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
