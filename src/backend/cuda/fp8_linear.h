#pragma once
// CUDA linear over FP8 e4m3 weights kept as loaded (backend/quant.h's Fp8Matrix, as Fp8Args).
// Internal header: only src/backend/cuda, the ops dispatch and the CUDA tests include it.
// Every pointer is a device pointer; every function enqueues its work on `s`.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/quant_args.h"
#include "core/dtype.h"

namespace osprey::cuda {

// Rows of x up to which linear_fp8 takes the GEMV (when it takes the shape).
// NOTE: the GEMV reads the codes once per 8 rows (1 byte a weight each time); the cuBLAS path
// reads them once, writes and reads bf16 (5 bytes a weight): the GEMV costs fewer bytes up to
// 32 rows, but from 4 rows it is bound by reading x through L1, and slower than bf16 weights
// (docs/benchmark_results/2026-12-06-h100-fp8.md).
constexpr int64_t kFp8GemvMaxRows = 32;
// Rows of x up to which linear_fp8 takes the GEMV when the tensor-core GEMM (linear_fp8_mma)
// takes the shape too (OSPREY_CUDA_FP8_MMA on); more rows go to the GEMM.
constexpr int64_t kFp8GemvMaxRowsBesideMma = 1;

// y[n, out] = x[n, in] * w^T + bias (bias may be nullptr); x, y f32 contiguous.
// With OSPREY_CUDA_FP8_MMA on and linear_fp8_mma_takes(x, w): the GEMV up to
// kFp8GemvMaxRowsBesideMma rows (when it takes the shape), linear_fp8_mma above. Otherwise the
// GEMV up to kFp8GemvMaxRows rows (when it takes the shape), linear_fp8_gemm above.
void linear_fp8(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s);

// Whether the GEMV takes x and w: in a multiple of 16, each scale group a multiple of 16
// inputs, codes and x 16-byte aligned.
bool linear_fp8_gemv_takes(const float* x, const Fp8Args& w);

// Decode GEMV, any n >= 1 (chunks of 8 rows of x): a block of 128 threads owns 4 output rows
// and splits their inputs in 16-code chunks (8 chunks of codes in flight a thread, the next
// pass's loaded while the current one computes), converts pairs to half2 (the hardware
// conversion on sm_89 and later), multiplies by x in f32 and applies each group's scale to its
// f32 partial sum. A row's result does not depend on the other rows of x. Allocates nothing
// (capturable in a CUDA graph; launched with programmatic dependent launch). Unsupported
// unless linear_fp8_gemv_takes(x, w).
void linear_fp8_gemv(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s);

// Many rows (prefill, large batches), any shape: w dequantized to bf16 in scratch() a chunk of
// rows at a time, multiplied by cuBLAS with x rounded to bf16, f32 accumulation.
void linear_fp8_gemm(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s);

// Whether linear_fp8_mma takes x and w: one scale per row (per-tensor and per-channel
// checkpoints; block scales do not), in a multiple of 16, out a multiple of 4, codes and x
// 16-byte aligned, and a device of compute capability 8.9 or later (FP8 tensor cores).
bool linear_fp8_mma_takes(const float* x, const Fp8Args& w);
// Whether the current device has FP8 tensor cores (compute capability 8.9 and later).
bool fp8_mma_device();

// W8A8 on the FP8 tensor cores, any n >= 1: each row of x quantized to e4m3 with its own scale
// (max |x_j| / 448, round to nearest even, saturating: dynamic per-token quantization), then
// cuBLASLt's e4m3 x e4m3 GEMM with f32 accumulation, scaled by x's row scale and w's row scale.
// A row's result does not depend on the other rows' values, but cuBLASLt's algorithm (and so
// its summation order) depends on n. scale_in_cublas false applies the scales in a kernel of
// its own after an unscaled product (what this path does where cuBLASLt lacks per-row scales;
// for tests). Uses scratch() for the codes, scales and cuBLASLt's workspace; unsupported
// unless linear_fp8_mma_takes(x, w).
void linear_fp8_mma(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s,
                    bool scale_in_cublas = true);

// dst [w.out, w.in] = w dequantized to bf16 (raw bits).
void dequantize_fp8(const Fp8Args& w, uint16_t* dst, cudaStream_t s);

}  // namespace osprey::cuda
