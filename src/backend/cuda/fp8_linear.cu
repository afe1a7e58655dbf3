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

constexpr int kWarps = 8;  // output rows per block of the GEMV
// Scratch for the rounded x plus one dequantized chunk of rows (at least kMinChunkBytes).
constexpr size_t kScratchBytes = size_t(64) << 20;
constexpr size_t kMinChunkBytes = size_t(16) << 20;

// Two e4m3 codes (low byte first) as floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return __half22float2(__half2(h));
}

// y[r, o] for r < NR: warp `o` of the grid reads row o of the codes once.
// x [NR, in] f32, codes [out, in], scales [out, n_groups]; in % 16 == 0, group % 16 == 0.
template <int NR>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemv_kernel(const float* __restrict__ x, Fp8Args w,
                                                               const float* __restrict__ bias, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t o = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (o >= w.out) return;
  const int64_t group = w.in / w.n_groups;
  const uint8_t* row = w.codes + o * w.in;
  const float* srow = w.scales + o * w.n_groups;
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
  // NOTE: x is read in f32 from L1/L2 by every warp: 4 bytes per code byte and row of x, so
  // beyond a few rows the GEMV is bound by L1 rather than by the codes' DRAM bandwidth (x
  // staged in shared memory as f16 would cut it by 2 to 4 times; not measured yet).
#pragma unroll 2
  for (int64_t k = int64_t(lane) * 16; k < w.in; k += 32 * 16) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(row + k));
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float v[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = e4m3x2_to_float2(uint16_t(words[j] & 0xffffu));
      const float2 b = e4m3x2_to_float2(uint16_t(words[j] >> 16));
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = b.x, v[4 * j + 3] = b.y;
    }
    const float scale = __ldg(srow + k / group);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float4* xr = reinterpret_cast<const float4*>(x + r * w.in + k);
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 xv = xr[j];
        part = fmaf(v[4 * j], xv.x, part);
        part = fmaf(v[4 * j + 1], xv.y, part);
        part = fmaf(v[4 * j + 2], xv.z, part);
        part = fmaf(v[4 * j + 3], xv.w, part);
      }
      acc[r] = fmaf(scale, part, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const float t = warp_sum(acc[r]);
    if (lane == 0) y[r * w.out + o] = t + (bias ? bias[o] : 0.0f);
  }
}

template <int NR>
void launch_gemv(const float* x, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  const unsigned blocks = unsigned((w.out + kWarps - 1) / kWarps);
  fp8_gemv_kernel<NR><<<blocks, kWarps * 32, 0, s>>>(x, w, bias, y);
  OSPREY_CUDA_CHECK_LAUNCH();
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
