// linear(): a bandwidth-bound GEMV for few rows of x, cuBLAS for many.
//
// GEMV: each warp owns R consecutive rows of w and walks them with 16-byte loads (8 f16/bf16
// or 4 f32 per lane, 512 bytes per warp per row), 8 / R chunks of each per iteration so that 8
// loads per lane are in flight; every chunk of w is multiplied by all NX (<= 8) rows of x, which are
// read through L1 (they are small and shared by all warps). Partial sums are reduced with
// warp shuffles. R follows the shape (pick_rows: enough warps per SM to cover the memory
// latency). Launched for programmatic dependent launch (common.cuh): the first iteration's
// weights are loaded before the kernel waits for x, and the next kernel is released once the
// last weights are read.
//
// Batch invariance (ops::set_batch_invariant runs every n through linear_gemv): the result for
// one row of x must not depend on NX, R, U or the row's place in its chunk. It does not: the
// (w row, x row) pair has its own accumulator, fed by lane l with chunks l, l + 32, ... in
// increasing order (whatever U), element by element with fmaf; warp_sum's xor butterfly gives
// every lane the same tree sum. Keep it so: no accumulator shared between rows of x, no
// reduction whose shape follows NX.
#include <climits>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kWarps = 4;  // warps per GEMV block
// 16-byte loads in flight per lane: R rows x (kLoadsInFlight / R) chunks of each per iteration.
// NOTE: fewer leaves a 4096-row matrix latency-bound at about half the bandwidth.
constexpr int kLoadsInFlight = 8;

template <class Tag>
__device__ __forceinline__ void unpack(const uint4& u, float* f) {
  if constexpr (Tag::kVec == 8) {
    if constexpr (std::is_same_v<Tag, TagF16>)
      unpack8_f16(u, f);
    else
      unpack8_bf16(u, f);
  } else {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
  }
}

// acc[i][j] += w chunk i . x[j, k .. k + VEC) for i < R, j < NX.
template <class Tag, int NX, int R>
__device__ __forceinline__ void gemv_chunk(const uint4 (&wv)[R], const float* __restrict__ x, int64_t in, int64_t k,
                                           float (&acc)[R][NX]) {
  constexpr int VEC = Tag::kVec;
  float wf[R][VEC];
#pragma unroll
  for (int i = 0; i < R; ++i) unpack<Tag>(wv[i], wf[i]);
#pragma unroll
  for (int j = 0; j < NX; ++j) {
    float xv[VEC];
    const float4* xp = reinterpret_cast<const float4*>(x + j * in + k);
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 t = __ldg(xp + q);
      xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[i][j] = fmaf(wf[i][e], xv[e], acc[i][j]);
  }
}

// y[j, r] = x[j, :] . w[r, :] + bias[r] for j < NX, r < out. Requires in % VEC == 0 and x, w
// 16-byte aligned. y row stride ldy.
template <class Tag, int NX, int R>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const float* __restrict__ x, int64_t in,
                                                           const typename Tag::T* __restrict__ w, int64_t out,
                                                           const float* __restrict__ bias, float* __restrict__ y,
                                                           int64_t ldy) {
  constexpr int VEC = Tag::kVec;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= out) {
    pdl_wait();  // the block's other warps read x (see common.cuh)
    return;
  }
  const uint4* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = min(row0 + i, out - 1);  // rows past the end repeat the last; never written
    wr[i] = reinterpret_cast<const uint4*>(w + r * in);
  }
  float acc[R][NX];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NX; ++j) acc[i][j] = 0.0f;

  const int64_t n_chunks = in / VEC;  // 16-byte chunks per row
  constexpr int U = kLoadsInFlight / R;
  int64_t c = lane;
  // The first iteration's weights are loaded before pdl_wait(): they stream in while the
  // kernel before this one finishes (weights are never written by a kernel of the step).
  uint4 wv[U][R];
  bool full = c + 32 * (U - 1) < n_chunks;
  if (full) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < R; ++i) wv[u][i] = __ldcs(wr[i] + c + 32 * u);
  }
  pdl_wait();
  while (full) {
#pragma unroll
    for (int u = 0; u < U; ++u) gemv_chunk<Tag, NX, R>(wv[u], x, in, (c + 32 * u) * VEC, acc);
    c += 32 * U;
    full = c + 32 * (U - 1) < n_chunks;
    if (full) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < R; ++i) wv[u][i] = __ldcs(wr[i] + c + 32 * u);
    }
  }
  for (; c < n_chunks; c += 32) {
    uint4 wt[R];
#pragma unroll
    for (int i = 0; i < R; ++i) wt[i] = __ldcs(wr[i] + c);
    gemv_chunk<Tag, NX, R>(wt, x, in, c * VEC, acc);
  }
  // The weights are read: the next kernel may start (and prefetch its own) during the tail.
  pdl_launch_dependents();

#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const float v = warp_sum(acc[i][j]);
      const int64_t r = row0 + i;
      if (lane == (i * NX + j) % 32 && r < out) y[j * ldy + r] = bias ? v + bias[r] : v;
    }
}

// Fallback for unaligned w or x, or in % VEC != 0: one warp per row, scalar loads.
template <class Tag, int NX>
__global__ void __launch_bounds__(kWarps * 32) gemv_scalar_kernel(const float* __restrict__ x, int64_t in,
                                                                  const typename Tag::T* __restrict__ w, int64_t out,
                                                                  const float* __restrict__ bias,
                                                                  float* __restrict__ y, int64_t ldy) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= out) return;
  const typename Tag::T* wr = w + r * in;
  float acc[NX];
#pragma unroll
  for (int j = 0; j < NX; ++j) acc[j] = 0.0f;
  for (int64_t k = lane; k < in; k += 32) {
    const float wk = Tag::load(wr + k);
#pragma unroll
    for (int j = 0; j < NX; ++j) acc[j] = fmaf(wk, x[j * in + k], acc[j]);
  }
#pragma unroll
  for (int j = 0; j < NX; ++j) {
    const float v = warp_sum(acc[j]);
    if (lane == j) y[j * ldy + r] = bias ? v + bias[r] : v;
  }
}

// Output rows per warp (rows: 1, 2 or 4 forces it): 4 while that leaves about 16 warps per
// SM, 2 while about 12, else 1; and 1 for a few long rows (the timings behind the thresholds:
// docs/benchmark_results/2026-12-05-cuda-kernel-tuning-notes.md).
// Blocks of the GEMV grid for `out` rows at `r` rows per warp.
unsigned gemv_blocks(int64_t out, int r) { return unsigned((out + kWarps * r - 1) / (kWarps * r)); }

int pick_rows(int64_t out, int64_t in, int rows) {
  if (rows == 1 || rows == 2 || rows == 4) return rows;
  const int64_t sms = multiprocessor_count();
  if (gemv_blocks(out, 4) >= 4 * sms) return 4;
  if (in >= 8192) return 1;  // long rows: more warps in flight beat the shared x reads
  return gemv_blocks(out, 2) >= 3 * sms ? 2 : 1;
}

template <class Tag, int NX>
void launch_gemv_nx(const float* x, int64_t in, const typename Tag::T* w, int64_t out, const float* bias, float* y,
                    int64_t ldy, cudaStream_t s, int rows) {
  const bool vec = in % Tag::kVec == 0 && aligned16(x) && aligned16(w);
  if (!vec) {
    const int64_t blocks = (out + kWarps - 1) / kWarps;
    launch_kernel(gemv_scalar_kernel<Tag, NX>, unsigned(blocks), kWarps * 32, 0, s, x, in, w, out, bias, y, ldy);
    return;
  }
  switch (pick_rows(out, in, rows)) {
    case 4: launch_kernel(gemv_kernel<Tag, NX, 4>, gemv_blocks(out, 4), kWarps * 32, 0, s, x, in, w, out, bias, y, ldy); break;
    case 2: launch_kernel(gemv_kernel<Tag, NX, 2>, gemv_blocks(out, 2), kWarps * 32, 0, s, x, in, w, out, bias, y, ldy); break;
    default: launch_kernel(gemv_kernel<Tag, NX, 1>, gemv_blocks(out, 1), kWarps * 32, 0, s, x, in, w, out, bias, y, ldy);
  }
}

template <class Tag>
void launch_gemv(const float* x, int64_t n, int64_t in, const typename Tag::T* w, int64_t out, const float* bias,
                 float* y, cudaStream_t s, int rows) {
  for (int64_t j0 = 0; j0 < n; j0 += kGemvMaxRows) {
    const int nx = int(std::min<int64_t>(kGemvMaxRows, n - j0));
    const float* xj = x + j0 * in;
    float* yj = y + j0 * out;
    switch (nx) {
      case 1: launch_gemv_nx<Tag, 1>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 2: launch_gemv_nx<Tag, 2>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 3: launch_gemv_nx<Tag, 3>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 4: launch_gemv_nx<Tag, 4>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 5: launch_gemv_nx<Tag, 5>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 6: launch_gemv_nx<Tag, 6>(xj, in, w, out, bias, yj, out, s, rows); break;
      case 7: launch_gemv_nx<Tag, 7>(xj, in, w, out, bias, yj, out, s, rows); break;
      default: launch_gemv_nx<Tag, 8>(xj, in, w, out, bias, yj, out, s, rows); break;
    }
  }
}

void check_dims(const char* op, int64_t n, int64_t in, int64_t out) {
  if (n > INT_MAX || in > INT_MAX || out > INT_MAX)
    throw Unsupported(std::string(op) + ": a dimension is 2^31 or more (n=" + std::to_string(n) +
                      ", in=" + std::to_string(in) + ", out=" + std::to_string(out) + ")");
}

}  // namespace

void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s, int rows_per_warp) {
  if (n <= 0 || out <= 0) return;
  check_dims("linear", n, in, out);
  if ((out + kWarps - 1) / kWarps > INT_MAX) throw Unsupported("linear: too many output rows");
  switch (wdt) {
    case DType::f32: launch_gemv<TagF32>(x, n, in, static_cast<const float*>(w), out, bias, y, s, rows_per_warp); break;
    case DType::f16: launch_gemv<TagF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, s, rows_per_warp); break;
    case DType::bf16: launch_gemv<TagBF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, s, rows_per_warp); break;
    default: throw Unsupported(unsupported_dtype("linear (weight)", wdt));
  }
}

void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s) {
  linear_gemv(x, n, in, w, wdt, out, bias, y, s, 0);
}

void linear_gemm(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s) {
  if (n <= 0 || out <= 0) return;
  check_dims("linear", n, in, out);
  if (wdt != DType::f32 && wdt != DType::f16 && wdt != DType::bf16)
    throw Unsupported(unsupported_dtype("linear (weight)", wdt));
  cublasHandle_t h = cublas();
  cudaStream_t cur = nullptr;
  OSPREY_CUBLAS_CHECK(cublasGetStream(h, &cur));
  if (cur != s) OSPREY_CUBLAS_CHECK(cublasSetStream(h, s));
  // Row-major y[n, out] = x[n, in] w[out, in]^T is column-major y^T[out, n] = w^T' x^T, where
  // w (row-major [out, in]) is the column-major [in, out] matrix taken transposed.
  const float alpha = 1.0f, beta = 0.0f;
  const int m_ = int(out), n_ = int(n), k_ = int(in);
  if (wdt == DType::f32) {
    OSPREY_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, static_cast<const float*>(w), k_,
                                    x, k_, &beta, y, m_));
  } else {
    const bool bf16 = wdt == DType::bf16;
    auto* xr = static_cast<uint16_t*>(scratch(size_t(n) * size_t(in) * sizeof(uint16_t)));
    round_to_16bit(x, xr, n * in, bf16, s);
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    OSPREY_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, w, t, k_, xr, t, k_, &beta, y,
                                     CUDA_R_32F, m_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (bias) add_bias_rows(y, bias, n, out, s);
}

void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
            float* y, cudaStream_t s) {
  if (n <= kGemvMaxRows)
    linear_gemv(x, n, in, w, wdt, out, bias, y, s);
  else
    linear_gemm(x, n, in, w, wdt, out, bias, y, s);
}

}  // namespace osprey::cuda
