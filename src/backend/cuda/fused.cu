// Kernels of the decode path that fuse neighbouring ops: the residual add with the next
// RMSNorm, SiLU- and GELU-gating of a fused gate/up projection, and the K/V row write that reads its
// row from device memory (graph-stable).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

// One block per row: x += y, then out = x / rms(x) * (w + w_offset).
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w,
                                    int64_t d, float eps, float w_offset, float* __restrict__ out) {
  pdl_wait();
  __shared__ float red[32];
  float* xr = x + int64_t(blockIdx.x) * d;
  const float* yr = y + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = xr[j] + yr[j];
    xr[j] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + w_offset);
}

__global__ void silu_mul_split_kernel(const float* __restrict__ gu, int64_t n, int64_t f, float* __restrict__ out) {
  pdl_wait();
  const int64_t total = n * f;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / f, j = t - i * f;
    const float g = gu[i * 2 * f + j], u = gu[i * 2 * f + f + j];
    out[t] = g / (1.0f + __expf(-g)) * u;
  }
}

__global__ void gelu_tanh_mul_split_kernel(const float* __restrict__ gu, int64_t n, int64_t f,
                                           float* __restrict__ out) {
  pdl_wait();
  const int64_t total = n * f;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / f, j = t - i * f;
    out[t] = gelu_tanh(gu[i * 2 * f + j]) * gu[i * 2 * f + f + j];
  }
}

// Grid (n, n_kv_heads); each block writes one head's K and V row, rounded to f16 or bf16
// (kBF16); kRing: the row wraps modulo a.ring_rows.
template <bool kBF16, bool kRing>
__global__ void kv_write_kernel(KVWriteArgs a) {
  pdl_wait();
  const int64_t i = blockIdx.x, h = blockIdx.y;
  int64_t row = (a.pos_dev ? int64_t(*a.pos_dev) : a.pos0) + i;
  if constexpr (kRing) row %= a.ring_rows;
  const float* ks = a.k + i * a.k_row_stride + h * a.head_dim;
  const float* vs = a.v + i * a.v_row_stride + h * a.head_dim;
  uint16_t* kd = a.kbuf + h * a.head_stride + row * a.head_dim;
  uint16_t* vd = a.vbuf + h * a.head_stride + row * a.head_dim;
  store_kv_head<kBF16>(kd, vd, ks, vs, a.head_dim);
}

__global__ void fill_i32_kernel(int32_t* p, int32_t value, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

}  // namespace

void fill_i32(int32_t* p, int32_t value, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  fill_i32_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, value, n);
  OSPREY_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* x, const float* y, const float* w, int64_t rows, int64_t d, float eps, float w_offset,
                  float* out, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  if (rows > 0x7fffffffLL) throw Unsupported("add_rms_norm: more than 2^31 - 1 rows");
  const int threads = int(std::min<int64_t>(1024, std::max<int64_t>(32, (d + 31) / 32 * 32)));
  launch_kernel(add_rms_norm_kernel, unsigned(rows), threads, 0, s, x, y, w, d, eps, w_offset, out);
}

void silu_mul_split(const float* gu, int64_t n, int64_t f, float* out, cudaStream_t s) {
  if (n <= 0 || f <= 0) return;
  const int threads = 256;
  launch_kernel(silu_mul_split_kernel, grid_for(n * f, threads), threads, 0, s, gu, n, f, out);
}

void gelu_tanh_mul_split(const float* gu, int64_t n, int64_t f, float* out, cudaStream_t s) {
  if (n <= 0 || f <= 0) return;
  const int threads = 256;
  launch_kernel(gelu_tanh_mul_split_kernel, grid_for(n * f, threads), threads, 0, s, gu, n, f, out);
}

void kv_write(const KVWriteArgs& a, cudaStream_t s) {
  if (a.n <= 0) return;
  if (a.n > 0x7fffffffLL || a.n_kv_heads > 65535) throw Unsupported("kv_write: too many rows or heads");
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (a.head_dim + 31) / 32 * 32)));
  const dim3 grid(unsigned(a.n), unsigned(a.n_kv_heads));
  if (a.ring_rows > 0) {
    if (a.bf16)
      launch_kernel(kv_write_kernel<true, true>, grid, threads, 0, s, a);
    else
      launch_kernel(kv_write_kernel<false, true>, grid, threads, 0, s, a);
  } else {
    if (a.bf16)
      launch_kernel(kv_write_kernel<true, false>, grid, threads, 0, s, a);
    else
      launch_kernel(kv_write_kernel<false, false>, grid, threads, 0, s, a);
  }
}

}  // namespace osprey::cuda
