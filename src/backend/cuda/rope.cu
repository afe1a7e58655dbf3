// Rotary position embedding, in place.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

// One block per token row: the row's cos/sin table ([half] each, in shared memory) is formed
// once and applied to every head.
// Grid (n, head groups): block (i, g) rotates heads [g * kHeadsPerBlock, ...) of row i.
constexpr int64_t kHeadsPerBlock = 4;

__global__ void rope_kernel(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                            bool interleaved, float mscale) {
  pdl_wait();
  extern __shared__ float cs[];  // [2][half]: cos, then sin
  const int64_t half = head_dim / 2;
  float* sn = cs + half;
  const int64_t i = blockIdx.x;
  const float pos = float(positions[i]);
  for (int64_t k = threadIdx.x; k < half; k += blockDim.x) {
    // NOTE: the angle is formed in f32 as the reference implementations do.
    const float angle = pos * inv_freq[k];
    float sv, cv;
    sincosf(angle, &sv, &cv);
    cs[k] = cv * mscale;
    sn[k] = sv * mscale;
  }
  __syncthreads();
  const int64_t h0 = int64_t(blockIdx.y) * kHeadsPerBlock;
  const int64_t nh = min(kHeadsPerBlock, heads - h0);
  float* row = x + i * row_stride + h0 * head_dim;
  for (int64_t t = threadIdx.x; t < nh * half; t += blockDim.x) {
    const int64_t h = t / half, k = t % half;
    float* v = row + h * head_dim;
    const int64_t a = interleaved ? 2 * k : k;
    const int64_t b = interleaved ? 2 * k + 1 : k + half;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cs[k] - x1 * sn[k];
    v[b] = x1 * cs[k] + x0 * sn[k];
  }
}

}  // namespace

void rope_inplace(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
                  const float* inv_freq, bool interleaved, float mscale, cudaStream_t s) {
  if (n <= 0 || heads <= 0 || head_dim < 2) return;
  if (n > 0x7fffffffLL) throw Unsupported("rope: more than 2^31 - 1 rows");
  if (head_dim % 2 != 0) throw Unsupported("rope: odd head_dim " + std::to_string(head_dim));
  const size_t smem = size_t(head_dim) * sizeof(float);
  if (smem > 48 * 1024) throw Unsupported("rope: head_dim " + std::to_string(head_dim) + " too large");
  const int64_t groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (groups > 65535) throw Unsupported("rope: too many heads");
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (kHeadsPerBlock * head_dim / 2 + 31) / 32 * 32)));
  launch_kernel(rope_kernel, dim3(unsigned(n), unsigned(groups)), threads, smem, s, x, heads, head_dim, row_stride, positions,
                                                                          inv_freq, interleaved, mscale);
}

}  // namespace osprey::cuda
