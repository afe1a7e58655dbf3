#pragma once
// MLX's affine quantizer (docs/design.md, "Quantized weights"), on the CPU: what `osprey convert` writes.
//
// Per group of `group_size` consecutive inputs of a row, in float32: n_bins = 2^bits - 1;
// scale = max((max - min) / n_bins, 1e-7), negated unless |min| > |max|; edge = min if
// |min| > |max| else max; q0 = round(edge / scale); if q0 != 0 then scale = edge / q0 and
// bias = edge, else bias = 0. scale and bias are then rounded to the storage dtype, and the
// codes are computed from the rounded values: q = clamp(round((w - bias) / scale), 0, n_bins).
// round is round-half-to-even, as MLX's.
#include "backend/quant.h"

namespace osprey {

// w [out, in] f32 | f16 | bf16 on the CPU (any strides) -> a QuantizedMatrix of CPU arrays:
// packed u32 [out, in * bits / 32], scales and biases [out, in / group_size] in scale_dtype
// (f16 | bf16). Rows are quantized in parallel on cpu_pool(). Throws InvalidInput for
// unsupported bits or group size, a group size that does not divide `in`, or a bad dtype.
QuantizedMatrix quantize_affine(const Array& w, int bits, int group_size, DType scale_dtype);

}  // namespace osprey
