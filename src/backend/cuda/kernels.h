#pragma once
// CUDA kernels behind the ops of backend/ops.h (declared in op_list.inc). Internal header: only src/backend/cuda and the
// ops dispatch include it. Every pointer is a device pointer; every function enqueues its work
// on `s` and returns at once (no host synchronisation). Activations are f32; weights f32, f16
// or bf16 as named by a DType. Callers (ops.cpp) check shapes and dtypes; these functions
// check only what the kernels themselves need (alignment, supported sizes) and throw
// Unsupported otherwise. Launch failures throw osprey::Error (see runtime.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/kernel_args.h"
#include "backend/quant_args.h"
#include "core/dtype.h"

namespace osprey::cuda {

using osprey::AttentionArgs;
using osprey::KVWriteArgs;
using osprey::PagedAttentionArgs;
using osprey::PagedGatherArgs;
using osprey::PagedKVWriteArgs;
using osprey::SampleArgs;

// The kernel behind each op of op_list.inc, which states its contract.
#define OSPREY_CUDA_OP(name, params, args) void name(OSPREY_UNPAREN params, cudaStream_t s);
#define OSPREY_CUDA_ENTRY(ret, name, params)
#include "backend/cuda/op_list.inc"
#undef OSPREY_CUDA_OP
#undef OSPREY_CUDA_ENTRY

// y[n, out] = x[n, in] w[out, in]^T + bias[out] (bias may be nullptr); x, y f32 contiguous,
// w f32|f16|bf16 row-major contiguous. n <= kGemvMaxRows: a GEMV that streams w once with
// 16-byte loads, f32 accumulation (exact products of the f32 x and the stored weights).
// Larger n: x is rounded to w's 16-bit type and multiplied by cuBLAS (f32 accumulate, f32 out;
// f32 w uses SGEMM). Uses scratch() for the rounded x.
// NOTE: with f16 weights, |x| beyond 65504 overflows in the cuBLAS path.
constexpr int64_t kGemvMaxRows = 8;
void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
            float* y, cudaStream_t s);
// The two paths of linear(), with its contract, exposed for tests and benchmarks. linear_gemv
// takes any n >= 1 (it runs in chunks of kGemvMaxRows rows); rows_per_warp 1, 2 or 4 forces
// the GEMV's output rows per warp (benchmarks), 0 picks by shape.
void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s, int rows_per_warp);
void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s);
void linear_gemm(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s);

// The current device's non-finite flag (device memory, int32): 1 when the logits of the last
// argmax() or sample() on the device held a NaN or an Inf, else 0. The token readback copies
// it with each token and clears it.
const int32_t* non_finite_flag();

}  // namespace osprey::cuda
