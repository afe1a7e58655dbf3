// linear over FP8 e4m3 weights: the decode GEMV and the dequantize-then-cuBLAS path.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"

namespace osprey::cuda {
namespace {

// The GEMV: a block of kThreads threads owns kRows consecutive output rows and splits their
// inputs: thread t takes the 16-code chunks t, t + kThreads, ... of every row. Each pass it
// holds the codes of kUnroll chunks of all kRows rows in registers and issues the next pass's
// loads before it computes (kRows * kUnroll 16-byte loads in flight a thread), so that the
// codes stream at the memory's rate; x is read through L1 once per kRows rows. The first
// pass's codes load before pdl_wait() (they are weights), the next kernel is released after
// the last load.
constexpr int kThreads = 128;
constexpr int kRows = 4;
constexpr int kUnroll = 2;
// Scratch for the rounded x plus one dequantized chunk of rows (at least kMinChunkBytes).
constexpr size_t kScratchBytes = size_t(64) << 20;
constexpr size_t kMinChunkBytes = size_t(16) << 20;

// Four e4m3 codes (low byte first) as floats.
__device__ __forceinline__ void e4m3x4_to_float(uint32_t word, float (&v)[4]) {
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  const float2 fa = __half22float2(__half2(a)), fb = __half22float2(__half2(b));
  v[0] = fa.x, v[1] = fa.y, v[2] = fb.x, v[3] = fb.y;
}

__device__ __forceinline__ uint32_t word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// y[j, o] for the block's rows o and j < NR: x [NR, in] f32, codes [out, in], scales
// [out, n_groups]; in % 16 == 0, (in / n_groups) % 16 == 0. Per (row of w, row of x) the sum
// runs over the same chunks in the same order whatever NR: a row's result does not depend on
// the other rows of x.
template <int NR>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(const float* __restrict__ x, Fp8Args w,
                                                            const float* __restrict__ bias, float* __restrict__ y) {
  const int tid = threadIdx.x;
  const int n_chunks = int(w.in / 16);
  const int group_chunks = int(w.in / w.n_groups) / 16;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint4* rows[kRows];
  const float* srows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t o = min(row0 + r, w.out - 1);  // rows past the end repeat the last (not written)
    rows[r] = reinterpret_cast<const uint4*>(w.codes + o * w.in);
    srows[r] = w.scales + o * w.n_groups;
  }
  float acc[kRows][NR];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < NR; ++j) acc[r][j] = 0.0f;

  uint4 q[kUnroll][kRows];
  auto load = [&](uint4 (&dst)[kUnroll][kRows], int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int cu = c + u * kThreads;
#pragma unroll
      for (int r = 0; r < kRows; ++r) dst[u][r] = cu < n_chunks ? __ldcs(rows[r] + cu) : make_uint4(0, 0, 0, 0);
    }
  };
  int c = tid;
  load(q, c);
  pdl_wait();
  while (c < n_chunks) {
    const int next = c + kUnroll * kThreads;
    uint4 qn[kUnroll][kRows];
    if (next < n_chunks) load(qn, next);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int cu = c + u * kThreads;
      if (cu < n_chunks) {
        float part[kRows][NR];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int j = 0; j < NR; ++j) part[r][j] = 0.0f;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          float4 xv[NR];
#pragma unroll
          for (int j = 0; j < NR; ++j) xv[j] = __ldg(reinterpret_cast<const float4*>(x + int64_t(j) * w.in) + cu * 4 + wi);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float v[4];
            e4m3x4_to_float(word_of(q[u][r], wi), v);
#pragma unroll
            for (int j = 0; j < NR; ++j) {
              part[r][j] = fmaf(v[0], xv[j].x, part[r][j]);
              part[r][j] = fmaf(v[1], xv[j].y, part[r][j]);
              part[r][j] = fmaf(v[2], xv[j].z, part[r][j]);
              part[r][j] = fmaf(v[3], xv[j].w, part[r][j]);
            }
          }
        }
        const int g = cu / group_chunks;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float scale = __ldg(srows[r] + g);
#pragma unroll
          for (int j = 0; j < NR; ++j) acc[r][j] = fmaf(scale, part[r][j], acc[r][j]);
        }
      }
    }
    if (next < n_chunks) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRows; ++r) q[u][r] = qn[u][r];
    }
    c = next;
  }
  pdl_launch_dependents();

  // Warp sums, then the kThreads / 32 warps' partials summed in order through shared memory.
  __shared__ float part_sums[kThreads / 32][kRows * NR];
  const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const float t = warp_sum(acc[r][j]);
      if (lane == 0) part_sums[warp][r * NR + j] = t;
    }
  __syncthreads();
  if (tid < kRows * NR) {
    const int r = tid / NR, j = tid % NR;
    const int64_t o = row0 + r;
    if (o < w.out) {
      float t = 0.0f;
#pragma unroll
      for (int k = 0; k < kThreads / 32; ++k) t += part_sums[k][tid];
      y[int64_t(j) * w.out + o] = t + (bias ? bias[o] : 0.0f);
    }
  }
}

template <int NR>
void launch_gemv(const float* x, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  const unsigned blocks = unsigned((w.out + kRows - 1) / kRows);
  launch_kernel(fp8_gemv_kernel<NR>, blocks, kThreads, 0, s, x, w, bias, y);
}

// dst[i, c] = bf16(e4m3(codes[i, c]) * scales[i, c / group]) for rows [0, rows).
__global__ void fp8_dequant_kernel(Fp8Args w, int64_t rows, uint16_t* __restrict__ dst) {
  const int64_t total = rows * w.in, group = w.in / w.n_groups;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t r = idx / w.in, c = idx - r * w.in;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(w.codes[idx]), __NV_E4M3);
    dst[idx] = f32_to_bf16_bits(__half2float(__half(h)) * w.scales[r * w.n_groups + c / group]);
  }
}

void check_fp8_args(const char* op, const Fp8Args& w) {
  if (w.out <= 0 || w.in <= 0 || w.n_groups <= 0 || w.in % w.n_groups != 0)
    throw Unsupported(std::string(op) + ": an FP8 weight [" + std::to_string(w.out) + ", " + std::to_string(w.in) +
                      "] with " + std::to_string(w.n_groups) + " scale groups per row (they must divide the inputs)");
  if (w.out > INT_MAX || w.in > INT_MAX)
    throw Unsupported(std::string(op) + ": a dimension is 2^31 or more (out=" + std::to_string(w.out) +
                      ", in=" + std::to_string(w.in) + ")");
}

int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

}  // namespace

bool linear_fp8_gemv_takes(const float* x, const Fp8Args& w) {
  return w.in % 16 == 0 && (w.in / std::max<int64_t>(w.n_groups, 1)) % 16 == 0 && aligned16(w.codes) && aligned16(x);
}

void linear_fp8_gemv(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  if (n <= 0) return;
  check_fp8_args("linear_fp8_gemv", w);
  if (!linear_fp8_gemv_takes(x, w))
    throw Unsupported("linear_fp8_gemv: an FP8 weight of " + std::to_string(w.in) + " inputs in scale groups of " +
                      std::to_string(w.in / w.n_groups) +
                      " (both must be multiples of 16, with codes and x 16-byte aligned)");
  for (int64_t r0 = 0; r0 < n; r0 += kGemvMaxRows) {
    const int64_t nr = std::min<int64_t>(kGemvMaxRows, n - r0);
    const float* xr = x + r0 * w.in;
    float* yr = y + r0 * w.out;
    switch (nr) {
      case 1: launch_gemv<1>(xr, w, bias, yr, s); break;
      case 2: launch_gemv<2>(xr, w, bias, yr, s); break;
      case 3: launch_gemv<3>(xr, w, bias, yr, s); break;
      case 4: launch_gemv<4>(xr, w, bias, yr, s); break;
      case 5: launch_gemv<5>(xr, w, bias, yr, s); break;
      case 6: launch_gemv<6>(xr, w, bias, yr, s); break;
      case 7: launch_gemv<7>(xr, w, bias, yr, s); break;
      default: launch_gemv<8>(xr, w, bias, yr, s); break;
    }
  }
}

void dequantize_fp8(const Fp8Args& w, uint16_t* dst, cudaStream_t s) {
  check_fp8_args("dequantize_fp8", w);
  fp8_dequant_kernel<<<grid_for(w.out * w.in, 256), 256, 0, s>>>(w, w.out, dst);
  OSPREY_CUDA_CHECK_LAUNCH();
}

void linear_fp8_gemm(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  if (n <= 0) return;
  check_fp8_args("linear_fp8", w);
  if (n > INT_MAX) throw Unsupported("linear_fp8: " + std::to_string(n) + " rows of x are 2^31 or more");
  const int64_t in = w.in, out = w.out;
  const int64_t x_bytes = round_up(n * in * 2, 256);
  const int64_t budget = std::max<int64_t>(int64_t(kScratchBytes) - x_bytes, int64_t(kMinChunkBytes));
  const int64_t rows = std::min(out, std::max<int64_t>(128, budget / (in * 2) / 128 * 128));
  auto* buf = static_cast<char*>(scratch(size_t(x_bytes) + size_t(rows) * size_t(in) * 2));
  auto* xr = reinterpret_cast<uint16_t*>(buf);       // [n, in] x rounded to bf16
  auto* wc = reinterpret_cast<uint16_t*>(buf + x_bytes);  // [rows, in] one dequantized chunk
  round_to_16bit(x, xr, n * in, true, s);

  cublasHandle_t h = cublas();
  cudaStream_t cur = nullptr;
  OSPREY_CUBLAS_CHECK(cublasGetStream(h, &cur));
  if (cur != s) OSPREY_CUBLAS_CHECK(cublasSetStream(h, s));
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[n, out] = x[n, in] w[out, in]^T is column-major y^T = w^T' x^T (see linear_gemm).
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    const int64_t rc = std::min(rows, out - r0);
    Fp8Args part = w;
    part.codes = w.codes + r0 * in;
    part.scales = w.scales + r0 * w.n_groups;
    part.out = rc;
    dequantize_fp8(part, wc, s);
    OSPREY_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rc), int(n), int(in), &one, wc, CUDA_R_16BF,
                                     int(in), xr, CUDA_R_16BF, int(in), &zero, y + r0, CUDA_R_32F, int(out),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (bias) add_bias_rows(y, bias, n, out, s);
}

void linear_fp8(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  if (n <= kFp8GemvMaxRows && linear_fp8_gemv_takes(x, w))
    linear_fp8_gemv(x, n, w, bias, y, s);
  else
    linear_fp8_gemm(x, n, w, bias, y, s);
}

}  // namespace osprey::cuda
