// linear over FP8 e4m3 weights: the decode GEMV and the dequantize-then-cuBLAS path.
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/env.h"
#include "core/log.h"

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

// dst[i, c] = bf16(e4m3(codes[i, c]) * scales[i, c / group]) for rows [0, rows). When in and
// the group are multiples of 16 and the codes 16-byte aligned (vec16), a thread converts 16
// consecutive codes of one group with one 16-byte load and two 16-byte stores; else one code.
template <bool Vec16>
__global__ void fp8_dequant_kernel(Fp8Args w, int64_t rows, uint16_t* __restrict__ dst) {
  const int64_t per = Vec16 ? 16 : 1;
  const int64_t total = rows * w.in / per, group = w.in / w.n_groups;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t e = idx * per, r = e / w.in, c = e - r * w.in;
    const float scale = w.scales[r * w.n_groups + c / group];
    if constexpr (Vec16) {
      const uint4 q = *reinterpret_cast<const uint4*>(w.codes + e);
      uint32_t out[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[4];
        e4m3x4_to_float(word_of(q, i), v);
        out[2 * i] = uint32_t(f32_to_bf16_bits(v[0] * scale)) | (uint32_t(f32_to_bf16_bits(v[1] * scale)) << 16);
        out[2 * i + 1] = uint32_t(f32_to_bf16_bits(v[2] * scale)) | (uint32_t(f32_to_bf16_bits(v[3] * scale)) << 16);
      }
      uint4* d = reinterpret_cast<uint4*>(dst + e);
      d[0] = make_uint4(out[0], out[1], out[2], out[3]);
      d[1] = make_uint4(out[4], out[5], out[6], out[7]);
    } else {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(w.codes[e]), __NV_E4M3);
      dst[e] = f32_to_bf16_bits(__half2float(__half(h)) * scale);
    }
  }
}

// W8A8: row j of x [n, in] f32 as e4m3 codes q[j, :] = sat(x[j, :] * 448 / amax_j) (round to
// nearest even) and its scale sx[j] = amax_j / 448 (1 for a row of zeros). One block a row;
// in % 4 == 0 and x 16-byte aligned.
constexpr int kQuantThreads = 256;
__global__ void __launch_bounds__(kQuantThreads) fp8_quantize_rows_kernel(const float* __restrict__ x, int64_t in,
                                                                         uint8_t* __restrict__ q,
                                                                         float* __restrict__ sx) {
  __shared__ float red[32];
  const int64_t j = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + j * in);
  const int64_t n4 = in / 4;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < n4; i += kQuantThreads) {
    const float4 v = xr[i];
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kQuantThreads / 32; ++k) amax = fmaxf(amax, red[k]);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const float inv = amax > 0.0f ? 448.0f / amax : 1.0f;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + j * in);
  for (int64_t i = threadIdx.x; i < n4; i += kQuantThreads) {
    const float4 v = xr[i];
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x * inv, v.y * inv), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z * inv, v.w * inv), __NV_SATFINITE, __NV_E4M3);
    qr[i] = lo | (hi << 16);
  }
  if (threadIdx.x == 0) sx[j] = scale;
}

// y[j, o] = y[j, o] * sx[j] * sw[o] + bias[o]: the scales cuBLAS did not apply (scalar mode).
__global__ void fp8_scale_rows_kernel(float* __restrict__ y, int64_t n, int64_t out, const float* __restrict__ sx,
                                      const float* __restrict__ sw, const float* __restrict__ bias) {
  const int64_t total = n * out, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t j = i / out, o = i - j * out;
    y[i] = y[i] * (sx[j] * sw[o]) + (bias ? bias[o] : 0.0f);
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

// The tensor-core path: cuBLASLt's FP8 GEMM, e4m3 x e4m3 with f32 accumulation (not the fast,
// lower-precision accumulation) into f32 y. One plan per (out, in, rows of x): descriptors, and
// the heuristic's first algorithm, found once (a host query of tens of microseconds) and kept
// for the process; the scale pointers are set on each call under the lock, then the matmul is
// enqueued.
// NOTE: the per-row scales go to cuBLASLt as OUTER_VEC_32F vectors (M of them for A = w, N for
// B = x); where that mode has no algorithm (Hopper, with cuBLAS 13.0), the product runs
// unscaled and fp8_scale_rows_kernel applies sx[j] * sw[o] and the bias after it (the log says
// so once).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
// Plans kept at most (prompt lengths vary: a server would otherwise keep one per length seen).
constexpr size_t kMaxLtPlans = 4096;

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool outer_vec = false;  // the scales are applied by cuBLASLt
};

struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t>, LtPlan> plans;
  bool logged_scalar = false;
};

LtState& lt_state() {
  static LtState* st = new LtState();  // never destroyed, as the runtime's handles
  return *st;
}

void destroy_plan(LtPlan& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.d);
  cublasLtMatmulDescDestroy(p.desc);
  p = LtPlan{};
}

// Tries one scale mode; false when the heuristic offers no algorithm for it.
bool make_plan(cublasLtHandle_t h, int64_t out, int64_t in, int64_t n, bool outer_vec, LtPlan& p) {
  OSPREY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  OSPREY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  OSPREY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const int32_t mode = outer_vec ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  OSPREY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
  OSPREY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  // Row-major y[n, out] = x[n, in] w[out, in]^T is column-major y^T [out, n] = (w^T)^T x^T: A is
  // w read as column-major [in, out] and transposed, B is x as column-major [in, n].
  OSPREY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(in), uint64_t(out), in));
  OSPREY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(in), uint64_t(n), in));
  OSPREY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, uint64_t(out), uint64_t(n), out));
  cublasLtMatmulPreference_t pref = nullptr;
  OSPREY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  OSPREY_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.d, p.d, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy_plan(p);
    return false;
  }
  p.algo = res.algo;
  p.outer_vec = outer_vec;
  return true;
}



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
  if (w.in % 16 == 0 && (w.in / w.n_groups) % 16 == 0 && aligned16(w.codes) && aligned16(dst))
    fp8_dequant_kernel<true><<<grid_for(w.out * w.in / 16, 256), 256, 0, s>>>(w, w.out, dst);
  else
    fp8_dequant_kernel<false><<<grid_for(w.out * w.in, 256), 256, 0, s>>>(w, w.out, dst);
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

bool fp8_mma_device() {
  static const bool has = [] {
    int major = 0, minor = 0;
    const int dev = current_device();
    OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor >= 89;
  }();
  return has;
}

bool linear_fp8_mma_takes(const float* x, const Fp8Args& w) {
  // out % 4: y's rows (f32, the GEMM's leading dimension) start 16-byte aligned; cuBLASLt offers
  // no FP8 algorithm otherwise (an H100 with cuBLAS 13.0 refused out = 77).
  return w.n_groups == 1 && w.in % 16 == 0 && w.out % 4 == 0 && aligned16(w.codes) && aligned16(x) &&
         fp8_mma_device();
}

void linear_fp8_mma(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s,
                    bool scale_in_cublas) {
  if (n <= 0) return;
  check_fp8_args("linear_fp8_mma", w);
  if (n > INT_MAX) throw Unsupported("linear_fp8_mma: " + std::to_string(n) + " rows of x are 2^31 or more");
  if (!linear_fp8_mma_takes(x, w))
    throw Unsupported("linear_fp8_mma: an FP8 weight [" + std::to_string(w.out) + ", " + std::to_string(w.in) +
                      "] with " + std::to_string(w.n_groups) +
                      " scale groups per row (it takes one scale per row, inputs a multiple of 16, outputs a "
                      "multiple of 4, codes and x 16-byte aligned, compute capability 8.9 or later)");
  const int64_t in = w.in, out = w.out;
  const int64_t q_bytes = round_up(n * in, 256), sx_bytes = round_up(n * 4, 256);
  auto* buf = static_cast<char*>(scratch(size_t(q_bytes + sx_bytes) + kLtWorkspaceBytes));
  auto* q = reinterpret_cast<uint8_t*>(buf);
  auto* sx = reinterpret_cast<float*>(buf + q_bytes);
  void* workspace = buf + q_bytes + sx_bytes;
  launch_kernel(fp8_quantize_rows_kernel, unsigned(n), kQuantThreads, 0, s, x, in, q, sx);

  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.handle) OSPREY_CUBLAS_CHECK(cublasLtCreate(&st.handle));
  const auto key = std::make_tuple(out, in, scale_in_cublas ? n : -n);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    if (st.plans.size() >= kMaxLtPlans) {
      for (auto& [k, old] : st.plans) destroy_plan(old);
      st.plans.clear();
    }
    LtPlan p;
    if (!(scale_in_cublas && make_plan(st.handle, out, in, n, true, p))) {
      if (!make_plan(st.handle, out, in, n, false, p))
        throw Unsupported("linear_fp8_mma: cuBLASLt offers no FP8 GEMM for [" + std::to_string(n) + ", " +
                          std::to_string(in) + "] x [" + std::to_string(out) + ", " + std::to_string(in) + "]^T");
      if (scale_in_cublas && !st.logged_scalar) {
        log_info("FP8 GEMM: cuBLASLt offers no per-row-scaled (OUTER_VEC_32F) algorithm on this device; the scales "
                 "are applied after the product");
        st.logged_scalar = true;
      }
    }
    it = st.plans.emplace(key, p).first;
  }
  LtPlan& p = it->second;
  // Scalar mode: null scale pointers mean 1 (the scales are applied after the product).
  const void* a_scale = p.outer_vec ? static_cast<const void*>(w.scales) : nullptr;
  const void* b_scale = p.outer_vec ? static_cast<const void*>(sx) : nullptr;
  OSPREY_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  OSPREY_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  const float alpha = 1.0f, beta = 0.0f;
  OSPREY_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.desc, &alpha, w.codes, p.a, q, p.b, &beta, y, p.d, y, p.d, &p.algo,
                                     workspace, kLtWorkspaceBytes, s));
  if (!p.outer_vec) {
    fp8_scale_rows_kernel<<<grid_for(n * out, 256), 256, 0, s>>>(y, n, out, sx, w.scales, bias);
    OSPREY_CUDA_CHECK_LAUNCH();
  } else if (bias) {
    add_bias_rows(y, bias, n, out, s);
  }
}

void linear_fp8(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, cudaStream_t s) {
  // NOTE: a weights-only checkpoint keeps x 16-bit (w.fp8_activations false): its prompts and
  // batches dequantize the weights and run cuBLAS instead of the FP8 tensor cores.
  const bool mma = env_options().cuda_fp8_mma && w.fp8_activations && linear_fp8_mma_takes(x, w);
  if (n <= (mma ? kFp8GemvMaxRowsBesideMma : kFp8GemvMaxRows) && linear_fp8_gemv_takes(x, w))
    linear_fp8_gemv(x, n, w, bias, y, s);
  else if (mma)
    linear_fp8_mma(x, n, w, bias, y, s);
  else
    linear_fp8_gemm(x, n, w, bias, y, s);
}

}  // namespace osprey::cuda
