#include "formats/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace osprey {
namespace {

float load(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

uint16_t to_storage(float v, DType dt) { return dt == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v); }
float from_storage(uint16_t h, DType dt) { return dt == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h); }

struct RowQuantizer {
  int bits;
  int group_size;
  DType src_dtype;
  DType scale_dtype;
  int64_t in;

  // src: one row [in]; words [in * bits / 32] (zeroed here); scales, biases [in / group_size].
  void operator()(const void* src, uint32_t* words, uint16_t* scales, uint16_t* biases, float* tmp) const {
    const float n_bins = float((1 << bits) - 1);
    const int64_t n_words = in * bits / 32;
    std::memset(words, 0, size_t(n_words) * 4);
    for (int64_t c = 0; c < in; ++c) tmp[c] = load(src, src_dtype, c);
    for (int64_t g = 0; g < in / group_size; ++g) {
      const float* w = tmp + g * group_size;
      float lo = w[0], hi = w[0];
      for (int i = 1; i < group_size; ++i) {
        lo = std::min(lo, w[i]);
        hi = std::max(hi, w[i]);
      }
      const bool min_is_edge = std::fabs(lo) > std::fabs(hi);
      float scale = std::max((hi - lo) / n_bins, 1e-7f);
      if (!min_is_edge) scale = -scale;
      const float edge = min_is_edge ? lo : hi;
      const float q0 = std::nearbyint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      scales[g] = to_storage(scale, scale_dtype);
      biases[g] = to_storage(bias, scale_dtype);
      const float s = from_storage(scales[g], scale_dtype), b = from_storage(biases[g], scale_dtype);
      for (int i = 0; i < group_size; ++i) {
        const float q = std::clamp(std::nearbyint((w[i] - b) / s), 0.0f, n_bins);
        const uint32_t code = uint32_t(q);
        const int64_t bit = (g * group_size + i) * bits;
        const int64_t word = bit >> 5;
        const int shift = int(bit & 31);
        words[word] |= code << shift;
        if (shift + bits > 32) words[word + 1] |= code >> (32 - shift);
      }
    }
  }
};

}  // namespace

QuantizedMatrix quantize_affine(const Array& w, int bits, int group_size, DType scale_dtype) {
  if (!supported_quant_bits(bits))
    throw InvalidInput("quantize: bits must be 2, 3, 4, 6 or 8, got " + std::to_string(bits));
  if (!supported_group_size(group_size))
    throw InvalidInput("quantize: group size must be 32, 64 or 128, got " + std::to_string(group_size));
  if (scale_dtype != DType::f16 && scale_dtype != DType::bf16)
    throw InvalidInput(std::string("quantize: scales must be float16 or bfloat16, got ") + dtype_name(scale_dtype));
  if (!w.defined() || w.ndim() != 2 || !is_float(w.dtype()) || !w.device().is_cpu())
    throw InvalidInput("quantize: expected a float matrix on the CPU, got " + describe(w));
  const int64_t out = w.dim(0), in = w.dim(1);
  if (in % group_size != 0)
    throw InvalidInput("quantize: group size " + std::to_string(group_size) + " does not divide the " +
                       std::to_string(in) + " inputs of " + describe(w));
  const Array src = w.is_contiguous() ? w : ops::cast(w, w.dtype());

  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group_size;
  q.packed = Array::empty({out, in * bits / 32}, DType::u32);
  q.scales = Array::empty({out, in / group_size}, scale_dtype);
  q.biases = Array::empty({out, in / group_size}, scale_dtype);
  const RowQuantizer row{bits, group_size, src.dtype(), scale_dtype, in};
  const auto* base = static_cast<const uint8_t*>(src.raw());
  const size_t row_bytes = size_t(in) * src.itemsize();
  auto* packed = q.packed.data<uint32_t>();
  auto* scales = q.scales.data<uint16_t>();
  auto* biases = q.biases.data<uint16_t>();
  const int64_t n_words = in * bits / 32, n_groups = in / group_size;
  cpu_pool().parallel_for(out, std::max<int64_t>(1, 65536 / in), [&](int64_t begin, int64_t end, int) {
    std::vector<float> tmp(static_cast<size_t>(in));  // [in] one row upcast to f32
    for (int64_t r = begin; r < end; ++r)
      row(base + size_t(r) * row_bytes, packed + r * n_words, scales + r * n_groups, biases + r * n_groups, tmp.data());
  });
  return q;
}

}  // namespace osprey
