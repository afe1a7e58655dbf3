#pragma once
// Device helpers shared by the two samplers (sample.cu: one row over the whole device;
// sample_rows.cu: a batch of rows, each over blocks of kChunk logits): the order-preserving
// key of a logit, fixed-point masses, the last-block handshake, the scan from the top digit
// down of a radix pass, and the best-score reductions of the draw. Internal header (CUDA).
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/sample_noise.h"

namespace osprey::cuda::sampling {

constexpr int kDrawThreads = 512;
constexpr int kPerThread = 2;
constexpr int kChunk = kDrawThreads * kPerThread;
constexpr int kDrawWarps = kDrawThreads / 32;
constexpr int kMaxBins = 2048;
constexpr float kMassOne = 1099511627776.0f;  // 2^40: the fixed-point weight of the maximum
// A logit whose (best - logit) / T exceeds this cannot win a block's draw against its best
// logit: the Gumbel noise spans less than kNoiseGumbelMax - kNoiseGumbelMin < 40.35.
constexpr float kPruneSpan = 42.0f;

static_assert(kMaxBins % kDrawThreads == 0 && 1024 % kDrawThreads == 0, "bins split evenly over threads");
static_assert(kNoiseGumbelMax - kNoiseGumbelMin < kPruneSpan - 1.0, "pruning margin");

// Float -> unsigned key with the same order (-0 ranked with +0); NaN is handled by the callers.
__device__ __forceinline__ unsigned int order_key(float f) {
  unsigned int b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// The inverse of order_key (key 0, never a non-NaN logit's key, maps to NaN).
__device__ __forceinline__ float key_value(unsigned int k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}


__device__ __forceinline__ unsigned int warp_max_u32(unsigned int k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  return k;
}

// w = exp((v - m) / T) in 2^-40 fixed point; v <= m, both non-NaN (v == m, infinities
// included, weighs 1).
__device__ __forceinline__ unsigned long long fixed_mass(float v, float m, float t) {
  if (v == m) return 1ull << 40;
  return __float2ull_rn(expf((v - m) / t) * kMassOne);
}

// The last-block handshake. Call from all threads after this block's global updates; true in
// every thread of the block that finished last, which then sees all other blocks' updates.
__device__ __forceinline__ bool last_block(unsigned int* ticket, int* s_flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    if (last) *ticket = 0;  // every block has taken its ticket: ready for the next pass
    *s_flag = last;
  }
  __syncthreads();
  if (!*s_flag) return false;
  __threadfence();
  return true;
}

// Running sums over bins taken from the highest digit down: thread t owns digits
// kBins-1 - (t*kPer + j), j < kPer. `own` is their sum, `excl` the sum of all higher digits.
struct TopScan {
  unsigned long long excl, own, total;
};

template <int kBins, class V>
__device__ TopScan scan_from_top(const V* values, unsigned long long* red) {
  constexpr int kPer = kBins / kDrawThreads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long own = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) own += values[kBins - 1 - (threadIdx.x * kPer + j)];
  unsigned long long inc = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = lane < kDrawWarps ? red[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    __syncwarp();
    if (lane < kDrawWarps) red[lane] = w;
  }
  __syncthreads();
  TopScan s;
  s.own = own;
  s.excl = (warp > 0 ? red[warp - 1] : 0) + inc - own;
  s.total = red[kDrawWarps - 1];
  return s;
}

// The digit at which the running sum from the top first reaches `target`
// (1 <= target <= total), and the sum of the digits above it, into shared memory. Exactly one
// thread writes; the caller synchronises before reading.
template <int kBins, class V>
__device__ void locate(const V* values, const TopScan& s, unsigned long long target, int* s_digit,
                       unsigned long long* s_above) {
  constexpr int kPer = kBins / kDrawThreads;
  if (!(s.excl < target && target <= s.excl + s.own)) return;
  unsigned long long acc = s.excl;
  for (int j = 0; j < kPer; ++j) {
    const int d = kBins - 1 - (threadIdx.x * kPer + j);
    if (acc + values[d] >= target) {
      *s_digit = d;
      *s_above = acc;
      return;
    }
    acc += values[d];
  }
}

__device__ __forceinline__ bool better_score(double s, int i, double bs, int bi) {
  return s > bs || (s == bs && i < bi);
}

__device__ __forceinline__ void warp_best(double& bs, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double os = __shfl_xor_sync(0xffffffffu, bs, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better_score(os, oi, bs, bi)) bs = os, bi = oi;
  }
}

// The block's best (score, index) into thread 0's bs, bi (other threads' are partial); every
// thread of the block calls it.
__device__ __forceinline__ void block_best(double& bs, int& bi, double* s_score, int* s_index) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  warp_best(bs, bi);
  if (lane == 0) s_score[warp] = bs, s_index[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kDrawWarps; ++w)
      if (better_score(s_score[w], s_index[w], bs, bi)) bs = s_score[w], bi = s_index[w];
}

}  // namespace osprey::cuda::sampling
