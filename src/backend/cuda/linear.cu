// linear(): a bandwidth-bound GEMV for few rows of x, cuBLAS for many.
//
// GEMV: each warp owns R consecutive rows of w and walks them with 16-byte loads (8 f16/bf16
// or 4 f32 per lane, 512 bytes per warp per row), 8 / R chunks of each per iteration so that 8
// loads per lane are in flight; every chunk of w is multiplied by all NX (<= 8) rows of x, which are
// read through L1 (they are small and shared by all warps). Partial sums are reduced with
// warp shuffles. R is chosen so that the grid still has about two blocks per SM.
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
constexpr int kInPlain = GemvFusion::kPlain, kInRmsNorm = GemvFusion::kRmsNorm, kInSiluGate = GemvFusion::kSiluGate;
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

// The x operand as the kernel reads it (XM, GemvFusion::In): row j of x itself, rms_norm of
// it, or silu(gate) * up of row j of a [n, 2 in] gate/up matrix. Rows j >= n (when NX is
// rounded up) re-read row n - 1; they are never written.
template <int XM, int NX>
struct XRows {
  const float* rows[NX];
  const float* __restrict__ norm_w;
  float w_offset;
  float rinv[NX];   // In::rms_norm: 1 / rms of row j
  int64_t up_off;   // In::silu_gate: the up half's offset from the gate half (in)

  // x'[j, k .. k + 4), k a multiple of 4.
  __device__ __forceinline__ float4 load4(int j, int64_t k) const {
    const float4 v = __ldg(reinterpret_cast<const float4*>(rows[j] + k));
    if constexpr (XM == kInRmsNorm) {
      // As rms_norm_kernel: x * inv * (w + w_offset).
      const float4 w = __ldg(reinterpret_cast<const float4*>(norm_w + k));
      return make_float4(v.x * rinv[j] * (w.x + w_offset), v.y * rinv[j] * (w.y + w_offset),
                         v.z * rinv[j] * (w.z + w_offset), v.w * rinv[j] * (w.w + w_offset));
    } else if constexpr (XM == kInSiluGate) {
      // As silu_mul_split_kernel: g / (1 + e^-g) * u.
      const float4 u = __ldg(reinterpret_cast<const float4*>(rows[j] + up_off + k));
      return make_float4(v.x / (1.0f + __expf(-v.x)) * u.x, v.y / (1.0f + __expf(-v.y)) * u.y,
                         v.z / (1.0f + __expf(-v.z)) * u.z, v.w / (1.0f + __expf(-v.w)) * u.w);
    } else {
      return v;
    }
  }
};

// acc[i][j] += w chunk i . x'[j, k .. k + VEC) for i < R, j < NX.
template <class Tag, int NX, int R, int XM>
__device__ __forceinline__ void gemv_chunk(const uint4 (&wv)[R], const XRows<XM, NX>& x, int64_t k,
                                           float (&acc)[R][NX]) {
  constexpr int VEC = Tag::kVec;
  float wf[R][VEC];
#pragma unroll
  for (int i = 0; i < R; ++i) unpack<Tag>(wv[i], wf[i]);
#pragma unroll
  for (int j = 0; j < NX; ++j) {
    float xv[VEC];
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 t = x.load4(j, k + 4 * q);
      xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[i][j] = fmaf(wf[i][e], xv[e], acc[i][j]);
  }
}

struct GemvArgs {
  const float* x;  // row j at x + j * ldx
  int64_t ldx, in;
  const void* w;   // [out, in]
  int64_t out;
  const float* bias;
  float* y;        // row j at y + j * ldy
  int64_t ldy;
  int n;           // rows of x and y, 1 <= n <= NX
  bool accumulate; // y += result
  const float* norm_w;
  float eps, w_offset;
};

// y[j, r] (+)= x'[j, :] . w[r, :] + bias[r] for j < n, r < out. Requires in % VEC == 0 and
// x, w 16-byte aligned (and ldx a multiple of 4).
template <class Tag, int NX, int R, int XM>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvArgs a) {
  constexpr int VEC = Tag::kVec;
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t in = a.in, out = a.out;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  const bool active = row0 < out;
  const auto* w = static_cast<const typename Tag::T*>(a.w);
  const uint4* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = min(row0 + i, out - 1);  // rows past the end repeat the last; never written
    wr[i] = reinterpret_cast<const uint4*>(w + r * in);
  }
  XRows<XM, NX> xr;
#pragma unroll
  for (int j = 0; j < NX; ++j) xr.rows[j] = a.x + int64_t(min(j, a.n - 1)) * a.ldx;
  xr.norm_w = a.norm_w;
  xr.w_offset = a.w_offset;
  xr.up_off = in;
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
  bool full = active && c + 32 * (U - 1) < n_chunks;
  if (full) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < R; ++i) wv[u][i] = __ldcs(wr[i] + c + 32 * u);
  }
  pdl_wait();
  if constexpr (XM == kInRmsNorm) block_rms_rows<NX>(xr.rows, in, a.eps, xr.rinv);
  if (!active) return;
  while (full) {
#pragma unroll
    for (int u = 0; u < U; ++u) gemv_chunk<Tag, NX, R>(wv[u], xr, (c + 32 * u) * VEC, acc);
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
    gemv_chunk<Tag, NX, R>(wt, xr, c * VEC, acc);
  }

#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const float v = warp_sum(acc[i][j]);
      const int64_t r = row0 + i;
      if (lane == (i * NX + j) % 32 && r < out && j < a.n) {
        const float o = a.bias ? v + a.bias[r] : v;
        float* dst = a.y + j * a.ldy + r;
        *dst = a.accumulate ? *dst + o : o;
      }
    }
}

// Fallback for unaligned w or x, or in % VEC != 0: one warp per row, scalar loads.
template <class Tag, int NX>
__global__ void __launch_bounds__(kWarps * 32) gemv_scalar_kernel(const float* __restrict__ x, int64_t in,
                                                                  const typename Tag::T* __restrict__ w, int64_t out,
                                                                  const float* __restrict__ bias,
                                                                  float* __restrict__ y, int64_t ldy) {
  pdl_launch_dependents();
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

// One launch of the vectorized kernel for rows [0, a.n) of x (a.n <= NX): 4 output rows per
// warp while that leaves about two blocks per SM, else 2, else 1.
template <class Tag, int NX, int XM>
void launch_gemv_vec(const GemvArgs& a, cudaStream_t s) {
  const int64_t want = 2 * int64_t(multiprocessor_count());
  auto blocks_for = [&](int64_t r) { return (a.out + kWarps * r - 1) / (kWarps * r); };
  if (blocks_for(4) >= want)
    launch_kernel(gemv_kernel<Tag, NX, 4, XM>, unsigned(blocks_for(4)), kWarps * 32, 0, s, a);
  else if (blocks_for(2) >= want)
    launch_kernel(gemv_kernel<Tag, NX, 2, XM>, unsigned(blocks_for(2)), kWarps * 32, 0, s, a);
  else
    launch_kernel(gemv_kernel<Tag, NX, 1, XM>, unsigned(blocks_for(1)), kWarps * 32, 0, s, a);
  OSPREY_CUDA_CHECK_LAUNCH();
}

template <class Tag, int NX>
void launch_gemv_nx(const float* x, int64_t in, const typename Tag::T* w, int64_t out, const float* bias, float* y,
                    int64_t ldy, cudaStream_t s) {
  const bool vec = in % Tag::kVec == 0 && aligned16(x) && aligned16(w);
  if (!vec) {
    const int64_t blocks = (out + kWarps - 1) / kWarps;
    launch_kernel(gemv_scalar_kernel<Tag, NX>, unsigned(blocks), kWarps * 32, 0, s, x, in, w, out, bias, y, ldy);
    OSPREY_CUDA_CHECK_LAUNCH();
    return;
  }
  GemvArgs a{};
  a.x = x, a.ldx = in, a.in = in, a.w = w, a.out = out, a.bias = bias, a.y = y, a.ldy = ldy, a.n = NX;
  launch_gemv_vec<Tag, NX, kInPlain>(a, s);
}

template <class Tag>
void launch_gemv(const float* x, int64_t n, int64_t in, const typename Tag::T* w, int64_t out, const float* bias,
                 float* y, cudaStream_t s) {
  for (int64_t j0 = 0; j0 < n; j0 += kGemvMaxRows) {
    const int nx = int(std::min<int64_t>(kGemvMaxRows, n - j0));
    const float* xj = x + j0 * in;
    float* yj = y + j0 * out;
    switch (nx) {
      case 1: launch_gemv_nx<Tag, 1>(xj, in, w, out, bias, yj, out, s); break;
      case 2: launch_gemv_nx<Tag, 2>(xj, in, w, out, bias, yj, out, s); break;
      case 3: launch_gemv_nx<Tag, 3>(xj, in, w, out, bias, yj, out, s); break;
      case 4: launch_gemv_nx<Tag, 4>(xj, in, w, out, bias, yj, out, s); break;
      case 5: launch_gemv_nx<Tag, 5>(xj, in, w, out, bias, yj, out, s); break;
      case 6: launch_gemv_nx<Tag, 6>(xj, in, w, out, bias, yj, out, s); break;
      case 7: launch_gemv_nx<Tag, 7>(xj, in, w, out, bias, yj, out, s); break;
      default: launch_gemv_nx<Tag, 8>(xj, in, w, out, bias, yj, out, s); break;
    }
  }
}

// The fused kernels take n rounded up to 1, 2, 4 or 8 (fewer instantiations; rows past n
// re-read row n - 1 and are not written).
template <class Tag, int XM>
void launch_gemv_fused(const GemvArgs& a, cudaStream_t s) {
  if (a.n == 1) return launch_gemv_vec<Tag, 1, XM>(a, s);
  if (a.n == 2) return launch_gemv_vec<Tag, 2, XM>(a, s);
  if (a.n <= 4) return launch_gemv_vec<Tag, 4, XM>(a, s);
  launch_gemv_vec<Tag, 8, XM>(a, s);
}

template <class Tag>
void launch_gemv_fused_in(const GemvArgs& a, int in_mode, cudaStream_t s) {
  switch (in_mode) {
    case kInRmsNorm: return launch_gemv_fused<Tag, kInRmsNorm>(a, s);
    case kInSiluGate: return launch_gemv_fused<Tag, kInSiluGate>(a, s);
    default: return launch_gemv_fused<Tag, kInPlain>(a, s);
  }
}

void check_dims(const char* op, int64_t n, int64_t in, int64_t out) {
  if (n > INT_MAX || in > INT_MAX || out > INT_MAX)
    throw Unsupported(std::string(op) + ": a dimension is 2^31 or more (n=" + std::to_string(n) +
                      ", in=" + std::to_string(in) + ", out=" + std::to_string(out) + ")");
}

}  // namespace

void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s) {
  if (n <= 0 || out <= 0) return;
  check_dims("linear", n, in, out);
  if ((out + kWarps - 1) / kWarps > INT_MAX) throw Unsupported("linear: too many output rows");
  switch (wdt) {
    case DType::f32: launch_gemv<TagF32>(x, n, in, static_cast<const float*>(w), out, bias, y, s); break;
    case DType::f16: launch_gemv<TagF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, s); break;
    case DType::bf16: launch_gemv<TagBF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, s); break;
    default: throw Unsupported(unsupported_dtype("linear (weight)", wdt));
  }
}

bool linear_gemv_fused(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out,
                       const float* bias, float* y, const GemvFusion& f, cudaStream_t s) {
  if (n <= 0 || out <= 0) return true;
  if (n > kGemvMaxRows || (wdt != DType::f16 && wdt != DType::bf16)) return false;
  if (in % 8 != 0 || !aligned16(x) || !aligned16(w) || (f.in == GemvFusion::kRmsNorm && !aligned16(f.norm_w)))
    return false;
  check_dims("linear", n, in, out);
  if ((out + kWarps - 1) / kWarps > INT_MAX) throw Unsupported("linear: too many output rows");
  GemvArgs a{};
  a.x = x, a.ldx = f.in == GemvFusion::kSiluGate ? 2 * in : in, a.in = in, a.w = w, a.out = out, a.bias = bias;
  a.y = y, a.ldy = out, a.n = int(n), a.accumulate = f.accumulate;
  a.norm_w = f.norm_w, a.eps = f.eps, a.w_offset = f.w_offset;
  if (wdt == DType::f16)
    launch_gemv_fused_in<TagF16>(a, f.in, s);
  else
    launch_gemv_fused_in<TagBF16>(a, f.in, s);
  return true;
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
