#pragma once
// CUDA kernels behind the quantized ops of backend/quant.h (MLX affine quantization; the
// layout is QuantArgs's, backend/quant_args.h). Internal header: only src/backend/cuda and
// the ops dispatch include it. Every pointer is a device pointer; every function enqueues its
// work on `s` and returns at once (no host synchronisation). Callers check shapes; these
// functions throw Unsupported for bits, group sizes or scale dtypes the kernels do not take.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/quant_args.h"
#include "core/dtype.h"

namespace osprey::cuda {

// y[n, out] = x[n, in] * dequant(w)^T + bias (bias may be nullptr); x, y f32 contiguous.
// 4-bit weights with 16-byte aligned words and x, kQuantMmaMinRows <= n <=
// linear_q_mma_max_rows(w) (quant_linear.h): the tensor-core kernel, w dequantized in registers to f16 (bf16 when the
// scales are bf16) against x rounded to the same type, f32 accumulation, nothing allocated
// (capturable in a CUDA graph). Otherwise n <= kGemvMaxRows (kernels.h): a fused
// dequantize-GEMV with f32 accumulation of exact products, allocating nothing. Larger n: w is
// dequantized to that 16-bit type a chunk at a time and multiplied by cuBLAS with x rounded
// to it, as linear_gemm does; scratch() holds the rounded x and one chunk, 64 MiB in all
// unless x alone needs more than 48 MiB (a chunk gets at least 16 MiB).
// NOTE: with f16 scales, |x| or a dequantised |w| beyond 65504 overflows in the many-rows path.
void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s);
// embedding_q and dequantize: op_list.inc.

}  // namespace osprey::cuda
