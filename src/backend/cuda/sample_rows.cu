// Token choice for a batch of rows at once (op_list.inc's sample_rows): one block per row runs
// sample/sampler.h's whole chain on its row, so that a batch of sampled sequences costs one
// launch and only token ids cross to the host.
//
// Each cut is a radix select over an order-preserving 32-bit key, done inside the block: three
// passes (digits of 11, 11 and 10 bits) over the row, each building a histogram of the digit
// in shared memory (counts for top-k, 2^-40 fixed-point masses for top-p and typical-p), then
// a scan from the top digit down finds the digit where the running count or mass reaches the
// target. A pass stops the select early when its digit settles the cut. The row stays in L2
// between passes (a 128k-token row is 512 KiB).
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sample.h"
#include "backend/sample_noise.h"

namespace osprey::cuda {

namespace {

constexpr int kRowThreads = 1024;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowBins = 2048;  // the widest digit: 11 bits
constexpr float kRowMassOne = 1099511627776.0f;  // 2^40: the fixed-point weight of the maximum
// A logit whose (best - logit) / T exceeds this cannot win the draw against the best kept
// logit: the Gumbel noise spans less than kNoiseGumbelMax - kNoiseGumbelMin < 40.35.
constexpr float kRowPruneSpan = 42.0f;
static_assert(kNoiseGumbelMax - kNoiseGumbelMin < kRowPruneSpan - 1.0, "pruning margin");
static_assert(kRowBins % kRowThreads == 0, "bins split evenly over threads");

struct RowShared {
  unsigned int count[kRowBins];
  unsigned long long mass[kRowBins];
  unsigned long long red[kRowWarps];
  double dred[kRowWarps];
  float fred[kRowWarps];
  int ired[kRowWarps];
  unsigned long long above;
  int digit;
};

// Float -> unsigned key with the same order (-0 ranked with +0); callers skip NaN.
__device__ __forceinline__ unsigned int row_key(float f) {
  unsigned int b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// exp(x) in 2^-40 fixed point, x <= 0 (x == 0, the maximum, weighs exactly 1).
__device__ __forceinline__ unsigned long long row_mass(float x) {
  return x == 0.0f ? (1ull << 40) : __float2ull_rn(expf(x) * kRowMassOne);
}

// Running sums over the digits of one pass from the highest down. Thread t owns digits
// bins-1 - (t*per + j), j < per (per = bins / kRowThreads); `own` is their sum, `excl` the sum
// of all higher digits, `total` the sum of all. Barriers inside: call from every thread.
struct RowScan {
  unsigned long long excl, own, total;
};

template <class V>
__device__ RowScan row_scan(const V* values, int bins, RowShared& sh) {
  const int per = bins / kRowThreads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long own = 0;
  for (int j = 0; j < per; ++j) own += values[bins - 1 - (threadIdx.x * per + j)];
  unsigned long long inc = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) sh.red[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = sh.red[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    __syncwarp();
    sh.red[lane] = w;
  }
  __syncthreads();
  RowScan s;
  s.own = own;
  s.excl = (warp > 0 ? sh.red[warp - 1] : 0) + inc - own;
  s.total = sh.red[kRowWarps - 1];
  __syncthreads();  // sh.red is reused by the next scan
  return s;
}

// The cut of one select: the largest key threshold t such that the candidates with key >= t
// weigh at least the target, the target being target_of(total weight) (0: no cut, which the
// select returns as threshold 0). `cand(i, key, mass)` says whether element i is a candidate
// and gives its key and (kMass) its fixed-point mass; with kMass the weight is the mass, else
// one per candidate. Barriers inside: call from every thread of the block.
template <bool kMass, class Cand, class TargetOf>
__device__ unsigned int row_select(int n, Cand cand, TargetOf target_of, RowShared& sh) {
  unsigned int prefix = 0;  // the digits settled so far
  unsigned long long target = 0, above = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
    const int bits = pass == 2 ? 10 : 11;
    const int bins = 1 << bits;
    for (int d = threadIdx.x; d < kRowBins; d += kRowThreads) {
      sh.count[d] = 0;
      if (kMass) sh.mass[d] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kRowThreads) {
      unsigned int key;
      unsigned long long mass = 0;
      if (!cand(i, key, mass)) continue;
      if (pass > 0 && (key >> (shift + bits)) != prefix) continue;
      const unsigned int d = (key >> shift) & unsigned(bins - 1);
      atomicAdd(&sh.count[d], 1u);
      if (kMass) atomicAdd(&sh.mass[d], mass);
    }
    __syncthreads();
    const RowScan sc = kMass ? row_scan(sh.mass, bins, sh) : row_scan(sh.count, bins, sh);
    if (pass == 0) {
      target = target_of(sc.total);
      if (target == 0) return 0;
    }
    // The digit at which the running sum from the top reaches target - above.
    const unsigned long long want = target - above;
    if (sc.excl < want && want <= sc.excl + sc.own) {
      const int per = bins / kRowThreads;
      unsigned long long acc = sc.excl;
      for (int j = 0; j < per; ++j) {
        const int d = bins - 1 - (int(threadIdx.x) * per + j);
        const unsigned long long v = kMass ? sh.mass[d] : sh.count[d];
        if (acc + v >= want) {
          sh.digit = d;
          sh.above = acc;
          break;
        }
        acc += v;
      }
    }
    __syncthreads();
    const int d = sh.digit;
    const unsigned long long in_bin_above = sh.above;
    const unsigned int cnt = sh.count[d];
    const unsigned int digits = (pass == 0 ? 0u : prefix << bits) | unsigned(d);
    // Mass: settled when the digit holds one candidate (it is the crossing one). Count: when
    // every candidate of the digit is kept (the k-th largest is the digit's last).
    const bool done = pass == 2 || (kMass ? cnt == 1 : want - in_bin_above == cnt);
    __syncthreads();  // everyone has read sh before the next pass clears it
    if (done) return digits << shift;
    above += in_bin_above;
    prefix = digits;
  }
  return 0;  // not reached
}

// Block-wide reductions (every thread gets the result); barriers inside.
__device__ __forceinline__ float row_block_max(float v, RowShared& sh) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) sh.fred[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = sh.fred[0];
  for (int w = 1; w < kRowWarps; ++w) m = fmaxf(m, sh.fred[w]);
  __syncthreads();
  return m;
}

// The sum in a fixed order (each thread's part in element order, then a fixed tree), so that
// the same row always gives the same bits.
__device__ __forceinline__ double row_block_sum(double v, RowShared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh.dred[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kRowWarps; ++w) s += sh.dred[w];
  __syncthreads();
  return s;
}

__device__ __forceinline__ bool row_better(double s, int i, double bs, int bi) {
  return s > bs || (s == bs && i < bi);
}

// The best (score, index) over the block, the lowest index on ties; every thread gets it.
__device__ __forceinline__ int row_block_best(double bs, int bi, RowShared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double os = __shfl_xor_sync(0xffffffffu, bs, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (row_better(os, oi, bs, bi)) bs = os, bi = oi;
  }
  if ((threadIdx.x & 31) == 0) sh.dred[threadIdx.x >> 5] = bs, sh.ired[threadIdx.x >> 5] = bi;
  __syncthreads();
  bs = sh.dred[0];
  bi = sh.ired[0];
  for (int w = 1; w < kRowWarps; ++w)
    if (row_better(sh.dred[w], sh.ired[w], bs, bi)) bs = sh.dred[w], bi = sh.ired[w];
  __syncthreads();
  return bi;
}

__global__ void __launch_bounds__(kRowThreads)
    sample_rows_kernel(float* __restrict__ logits, int n, const SampleRowArgs* __restrict__ args,
                       const LogitAdjust* __restrict__ adjust, const uint32_t* __restrict__ allowed,
                       int64_t mask_words, int32_t* __restrict__ out, int32_t* __restrict__ nonfinite) {
  pdl_wait();
  __shared__ RowShared sh;
  const int64_t row = blockIdx.x;
  float* x = logits + row * int64_t(n);
  const SampleRowArgs a = args[row];
  const uint32_t* mask = allowed ? allowed + row * mask_words : nullptr;
  const int64_t mask_ids = mask_words * 32;
  auto is_allowed = [&](int i) {
    return !mask || (int64_t(i) < mask_ids && ((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u));
  };

  // The model's logits are checked before the adjustments (a ban writes -inf).
  int bad = 0;
  for (int i = threadIdx.x; i < n; i += kRowThreads) bad |= !isfinite(x[i]);
  bad = __syncthreads_or(bad);
  for (int j = a.adjust_begin + int(threadIdx.x); j < a.adjust_end; j += kRowThreads) {
    const LogitAdjust e = adjust[j];
    if (e.id < 0 || e.id >= n) continue;  // the host checks ids; never write out of the row
    float l = x[e.id];
    l = e.banned ? kNegInf : l + e.bias;
    if (e.count > 0) {
      if (a.repetition_penalty != 1.0f) l = l > 0.0f ? l / a.repetition_penalty : l * a.repetition_penalty;
      l -= a.presence_penalty + float(e.count) * a.frequency_penalty;
    }
    x[e.id] = l;
  }
  __syncthreads();

  // A candidate: allowed, and above -inf (NaN is never one).
  float m = kNegInf;
  int first = INT_MAX;
  for (int i = threadIdx.x; i < n; i += kRowThreads) {
    const float v = x[i];
    if (!(v > kNegInf) || !is_allowed(i)) continue;
    if (v > m || (v == m && i < first)) m = v, first = i;
  }
  if (a.temperature <= 0.0f) {
    const int best = row_block_best(double(m), first, sh);
    if (threadIdx.x == 0) {
      out[row] = best == INT_MAX ? -1 : best;
      nonfinite[row] = bad;
    }
    return;
  }
  m = row_block_max(m, sh);
  if (!(m > kNegInf)) {
    if (threadIdx.x == 0) out[row] = -1, nonfinite[row] = bad;
    return;
  }
  const float t = a.temperature;
  auto base = [&](int i, float& v) {
    v = x[i];
    return v > kNegInf && is_allowed(i);
  };

  // top-k: the k-th largest candidate's key.
  unsigned int t_k = 0;
  if (a.top_k > 0) {
    t_k = row_select<false>(
        n,
        [&](int i, unsigned int& key, unsigned long long&) {
          float v;
          if (!base(i, v)) return false;
          key = row_key(v);
          return true;
        },
        [&](unsigned long long total) { return (unsigned long long)a.top_k >= total ? 0ull : (unsigned long long)a.top_k; },
        sh);
  }
  // top-p over the top-k set.
  unsigned int t_p = 0;
  if (a.top_p < 1.0f) {
    t_p = row_select<true>(
        n,
        [&](int i, unsigned int& key, unsigned long long& mass) {
          float v;
          if (!base(i, v)) return false;
          key = row_key(v);
          if (key < t_k) return false;
          mass = row_mass((v - m) / t);
          return true;
        },
        [&](unsigned long long total) {
          const double want = ceil(double(a.top_p) * double(total));
          return want < 1.0 ? 1ull : want >= double(total) ? total : (unsigned long long)want;
        },
        sh);
  }
  const unsigned int t_kp = max(t_k, t_p);
  const bool min_p_on = a.min_p > 0.0f;
  const double min_log = min_p_on ? double(t) * log(double(a.min_p)) : 0.0;
  auto kept_kpm = [&](int i, float& v) {
    if (!base(i, v) || row_key(v) < t_kp) return false;
    return !min_p_on || v == m || double(v) - double(m) >= min_log;
  };
  // typical-p over the set kept so far: keep |x_i - c| <= d*, c = sum(w x) / sum(w) (the
  // entropy's shift: -log q_i - H = c - x_i), x_i = (l_i - max) / T.
  bool typical_on = a.typical_p < 1.0f;
  float c = 0.0f;
  unsigned int t_typ = 0;
  if (typical_on) {
    double sw = 0, swx = 0;
    for (int i = threadIdx.x; i < n; i += kRowThreads) {
      float v;
      if (!kept_kpm(i, v)) continue;
      const float xi = (v - m) / t;
      const double w = double(expf(xi));
      sw += w;
      swx += w * double(xi);
    }
    sw = row_block_sum(sw, sh);
    swx = row_block_sum(swx, sh);
    c = sw > 0 ? float(swx / sw) : 0.0f;
    t_typ = row_select<true>(
        n,
        [&](int i, unsigned int& key, unsigned long long& mass) {
          float v;
          if (!kept_kpm(i, v)) return false;
          const float xi = (v - m) / t;
          key = ~row_key(fabsf(xi - c));  // the nearest to c ranks highest
          mass = row_mass(xi);
          return true;
        },
        [&](unsigned long long total) {
          const double want = ceil(double(a.typical_p) * double(total));
          return want < 1.0 ? 1ull : want >= double(total) ? total : (unsigned long long)want;
        },
        sh);
    typical_on = t_typ != 0;
  }
  auto kept = [&](int i, float& v) {
    if (!kept_kpm(i, v)) return false;
    return !typical_on || ~row_key(fabsf((v - m) / t - c)) >= t_typ;
  };

  // The draw: Gumbel-max over the kept set.
  float best = kNegInf;
  for (int i = threadIdx.x; i < n; i += kRowThreads) {
    float v;
    if (kept(i, v)) best = fmaxf(best, v);
  }
  best = row_block_max(best, sh);
  const float prune = kRowPruneSpan * t;
  double bs = -__builtin_huge_val();
  int bi = INT_MAX;
  for (int i = threadIdx.x; i < n; i += kRowThreads) {
    float v;
    // NOTE: the pruned logits skip the two double logarithms, the bulk of the draw's work.
    if (!kept(i, v) || best - v > prune) continue;
    const double s = double(v) / double(t) + noise_gumbel(a.seed, a.counter, uint64_t(i));
    if (row_better(s, i, bs, bi)) bs = s, bi = i;
  }
  bi = row_block_best(bs, bi, sh);
  if (threadIdx.x == 0) {
    out[row] = bi == INT_MAX ? -1 : bi;
    nonfinite[row] = bad;
  }
}

}  // namespace

void sample_rows(float* logits, int64_t rows, int64_t vocab, const SampleRowArgs* args, const LogitAdjust* adjust,
                 const uint32_t* allowed, int64_t mask_words, int32_t* out, int32_t* nonfinite, cudaStream_t s) {
  if (rows <= 0) return;
  if (vocab < 1) throw InvalidInput("sample_rows: vocab must be >= 1, got " + std::to_string(vocab));
  if (vocab > kSampleMaxVocab)
    throw Unsupported("sample_rows: vocab " + std::to_string(vocab) + " exceeds the largest supported, " +
                      std::to_string(kSampleMaxVocab));
  if (rows > 0x7fffffffLL) throw Unsupported("sample_rows: more than 2^31 - 1 rows");
  if (allowed && mask_words <= 0) throw InvalidInput("sample_rows: a token mask of no words");
  launch_kernel(sample_rows_kernel, unsigned(rows), kRowThreads, 0, s, logits, int(vocab), args, adjust, allowed,
                mask_words, out, nonfinite);
}

}  // namespace osprey::cuda
