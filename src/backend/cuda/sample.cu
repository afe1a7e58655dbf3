// Greedy sampling: argmax over a row of logits, on the device (the token stays there).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 1024;

// (value, index) with NaN ranked below everything and ties to the lower index.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ float key(float v) { return v != v ? kNegInf : v; }

// One block scans the row; each thread keeps its best, then a warp / block reduction.
__global__ void argmax_kernel(const float* __restrict__ x, int64_t n, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float bv = kNegInf;
  int64_t bi = n;  // n: none yet (any real index wins a tie against it)
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = key(x[i]);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x >> 5;
    bv = lane < n_warps ? sv[lane] : kNegInf;
    bi = lane < n_warps ? si[lane] : n;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) out[0] = int32_t(bi < n ? bi : 0);
  }
}

}  // namespace

void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s) {
  if (n <= 0) throw InvalidInput("argmax: empty row");
  if (n > 0x7fffffffLL) throw Unsupported("argmax: row longer than 2^31 - 1");
  argmax_kernel<<<1, kThreads, 0, s>>>(x, n, out);
  OSPREY_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
