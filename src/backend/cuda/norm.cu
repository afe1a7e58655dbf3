// RMSNorm and LayerNorm: one block per row, warp-shuffle reductions in f32; the per-head
// RMSNorm of q/k heads: one warp per head.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

int threads_for(int64_t d) {
  // NOTE: one pass of the block covers the row when d <= 1024; rows are re-read from L1/L2.
  return int(std::min<int64_t>(1024, std::max<int64_t>(32, (d + 31) / 32 * 32)));
}

__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t d, float eps, float w_offset,
                                float* out) {
  pdl_wait();
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss = fmaf(xr[j], xr[j], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + w_offset);
}

__global__ void layer_norm_kernel(const float* x, const float* __restrict__ w, const float* __restrict__ b, int64_t d,
                                  float eps, float* out) {
  pdl_wait();
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += xr[j];
  const float mean = block_sum(sum, red) / float(d);
  float var = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = xr[j] - mean;
    var = fmaf(c, c, var);
  }
  var = block_sum(var, red) / float(d);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = (xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.0f);
}

// One warp per head: block (i, g) normalises heads [g * kHeadsPerBlock, ...) of row i.
constexpr int kHeadsPerBlock = 4;

__global__ void head_rms_norm_kernel(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                                     const float* __restrict__ w, float eps, float w_offset) {
  pdl_wait();
  const int64_t h = int64_t(blockIdx.y) * kHeadsPerBlock + (threadIdx.x >> 5);
  if (h >= heads) return;
  const int lane = threadIdx.x & 31;
  float* v = x + int64_t(blockIdx.x) * row_stride + h * head_dim;
  float ss = 0.0f;
  for (int64_t j = lane; j < head_dim; j += 32) ss = fmaf(v[j], v[j], ss);
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
  for (int64_t j = lane; j < head_dim; j += 32) v[j] = v[j] * inv * (w[j] + w_offset);
}

void check_rows(const char* op, int64_t rows) {
  if (rows > 0x7fffffffLL) throw Unsupported(std::string(op) + ": more than 2^31 - 1 rows");
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out,
              cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  check_rows("rms_norm", rows);
  launch_kernel(rms_norm_kernel, unsigned(rows), threads_for(d), 0, s, x, w, d, eps, w_offset, out);
}

void head_rms_norm(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const float* w,
                   float eps, float w_offset, cudaStream_t s) {
  if (n <= 0 || heads <= 0 || head_dim <= 0) return;
  check_rows("head_rms_norm", n);
  const int64_t groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (groups > 65535) throw Unsupported("head_rms_norm: too many heads");
  launch_kernel(head_rms_norm_kernel, dim3(unsigned(n), unsigned(groups)), kHeadsPerBlock * 32, 0, s, x, heads, head_dim,
                                                                                            row_stride, w, eps, w_offset);
}

void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* out,
                cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  check_rows("layer_norm", rows);
  launch_kernel(layer_norm_kernel, unsigned(rows), threads_for(d), 0, s, x, w, b, d, eps, out);
}

}  // namespace osprey::cuda
