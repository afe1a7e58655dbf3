#pragma once
// The two paths of linear_q (quant_kernels.h), with its contract, exposed for tests and
// benchmarks. Internal header: only src/backend/cuda and the CUDA tests include it.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/quant_args.h"

namespace osprey::cuda {

// Fused dequantize-GEMV, any n >= 1 (runs in chunks of 8 rows of x); allocates nothing.
// rows_per_block: 0 picks by shape; 1, 4 or 8 forces the fast kernel's rows per block (for
// benchmarks; ignored by the generic kernel).
void linear_q_gemv(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s,
                   int rows_per_block = 0);

// Dequantize to 16 bits in scratch() (in chunks), then cuBLAS with x rounded to 16 bits.
void linear_q_gemm(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s);

// 4-bit weights on the tensor cores (quant_mma.cu), any n >= 1: the packed words are read once
// per tile of x rows (8, 16 or 32 rows) and dequantized in registers into the MMA operands;
// x is rounded to f16 (bf16 when the scales are bf16) and the weights to the same type, as in
// linear_q_gemm; f32 accumulation. Allocates nothing (capturable in a CUDA graph). Needs
// linear_q_mma_supported(x, w). x_tiles: 1, 2 or 4 eight-row tiles of x per block, 0 picks by
// n; warps: 4 or 8 warps splitting the input dimension, 0 picks (benchmarks force them).
// NOTE: with f16 scales, |x| or a dequantised |w| beyond 65504 overflows, as in linear_q_gemm.
bool linear_q_mma_supported(const float* x, const QuantArgs& w);
void linear_q_mma(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s,
                  int x_tiles = 0, int warps = 0);
// linear_q takes linear_q_mma (when supported) for kQuantMmaMinRows <= n <=
// linear_q_mma_max_rows(w), the fused GEMV below and dequantize + cuBLAS above; the maximum is 0
// with OSPREY_CUDA_QUANT_MMA=0.
constexpr int64_t kQuantMmaMinRows = 4;
int64_t linear_q_mma_max_rows(const QuantArgs& w);

// Dequantizes rows [0, w.out) x columns [k0, k0 + kc) of w into dst [w.out, ld] (element
// (r, k0 + c) at dst[r * ld + c]) as out_dtype (f32 | f16 | bf16). k0 and kc multiples of 32.
void dequantize_block(const QuantArgs& w, int64_t k0, int64_t kc, DType out_dtype, void* dst, int64_t ld,
                      cudaStream_t s);

// Throws Unsupported when w is outside what the kernels take (bits, group size, scale dtype,
// shape); `op` names the caller in the message.
void check_quant_args(const char* op, const QuantArgs& w);

}  // namespace osprey::cuda
