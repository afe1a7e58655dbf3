#pragma once
// CPU kernels for MLX affine-quantized matrices (backend/quant_args.h): the quantized linear
// layer, embedding lookups and whole-matrix dequantization. Callers (src/backend/quant_ops.cpp)
// check shapes, bits (2, 3, 4, 6, 8) and group sizes (32, 64, 128); these functions trust
// their arguments. Bits 2, 4 and 8 have SIMD paths; 3 and 6 a generic one. Dequantized weights
// are fma(scale, q, bias) in f32. Scratch memory is thread_local and grows once; the decode
// path (n == 1) allocates nothing.
#include <cstdint>

#include "backend/cpu/level.h"
#include "backend/quant_args.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// y[n, out] = x[n, in] * dequant(w)^T + bias[out] (bias may be nullptr); x, y f32 contiguous.
// 4-bit weights with n == 1 or n > 16 (or n <= 8 where w.tiles is set), when the CPU has AVX2 or better: x rounded to two int8
// parts per block of 32 values and integer dot products (quant_int8.h; each value of x off by
// at most 1/32512 of its block's largest |x|). Otherwise linear_q_f32. Runs on `pool` and blocks until done
// (not from inside a task of `pool`).
void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool);

// linear_q with x kept in f32, accumulating in f32 over the dequantized weights:
// n <= 16: a fused dequantize-matvec (w streamed once, rows split across the pool's threads);
// larger n: dequantize tiles of w to f32 panels and run the blocked GEMM micro-kernel.
void linear_q_f32(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool);

// out[i, :] = dequant(w)[rows[i], :] * scale, out [n, in] f32 (embedding lookups). rows must
// lie in [0, w.out). Runs on the calling thread.
void dequantize_rows(const QuantArgs& w, const int32_t* rows, int64_t n, float scale, float* out);

// The whole matrix dequantized, out [w.out, w.in] in out_dtype (f32 | f16 | bf16; f16 and
// bf16 round the f32 value to nearest even). Runs on the calling thread. Throws Unsupported
// for another out_dtype.
void dequantize(const QuantArgs& w, DType out_dtype, void* out);

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
