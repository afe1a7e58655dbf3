// Token choice for a batch of rows at once (op_list.inc's sample_rows): sample/sampler.h's
// whole chain for every row, each with its own parameters, so that a batch of sampled
// sequences costs a few launches and only token ids cross to the host.
//
// Every pass is one launch over a grid of (chunks of a row, rows): each block takes kRowChunk
// logits of one row. Passes that need a row-wide result use the last-block pattern per row:
// each block publishes its part, fences, and takes a ticket of its row; the block that takes
// the row's last ticket combines the parts and writes the outcome to the row's RowState for
// the next launch. The passes, in order (a cut's passes run only when some row uses the cut,
// and return at once for the rows that do not or whose cut is settled):
//   prep     the row's non-finite check, its adjustments (bias, penalties: each block those
//            of its own chunk, in place), the maximum of each chunk's candidates;
//   top-k    three radix passes (11, 11 and 10 bits of the order-preserving key) counting;
//   top-p    three radix passes over 2^-40 fixed-point masses, over the top-k survivors;
//   typical  the kept set's sums (its mean of x = (l - max) / T under q), then three radix
//            passes over the key of |x - mean|, nearest first, by mass;
//   draw     Gumbel-max over the kept set (greedy rows: the argmax).
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sample.h"
#include "backend/cuda/sample_common.cuh"
#include "backend/sample_noise.h"

namespace osprey::cuda {

namespace {

using namespace sampling;  // backend/cuda/sample_common.cuh

enum Cut : int { kTopK = 0, kTopP = 1, kTypical = 2 };

// Logits per thread and per block. A block's fixed work (clearing and flushing a pass's
// histogram of up to 2,048 bins, the last-block handshake) is paid once per chunk, so chunks
// are large: 16 logits a thread keeps a 128k-token row at 16 blocks, and 64 rows at 1,024
// blocks, still a few waves over the SMs. Fixed for every batch size, so that a row draws
// the same token alone and in a batch (the typical-p sums are added chunk by chunk).
constexpr int kRowPer = 16;
constexpr int kRowChunk = kDrawThreads * kRowPer;

// One row's state between launches, in scratch(); zeroed by the row's first block of prep.
struct RowState {
  unsigned int ticket;  // blocks of the running pass that are done; the last one resets it
  unsigned int done[3];    // per cut: its threshold is settled
  unsigned int prefix[3];  // per cut: the digits found so far
  unsigned int t[3];       // per cut: the kept keys are >= t (0 keeps all)
  unsigned int k_rem;      // top-k: the rank of the k-th largest under the prefix
  unsigned int pad;
  unsigned long long target[3];  // top-p, typical: the fixed-point mass to reach
  unsigned long long above[3];   // and the mass above the digits under the prefix
  double center;                 // typical: the mean of x under q
  unsigned int count[kMaxBins];
  unsigned long long mass[kMaxBins];
};
static_assert(sizeof(RowState) % 8 == 0, "RowState is zeroed by words");

struct RowBest {
  double score;
  int index;
  int pad;
};

struct RowSums {
  double w, wx;
};

struct RowsScratch {
  RowState* state;          // [rows]
  unsigned int* part_key;   // [rows, nb]: the largest candidate key of each chunk (0: none)
  int* part_bad;            // [rows, nb]: the chunk held a NaN or an Inf before the adjustments
  RowBest* part_best;       // [rows, nb]
  RowSums* part_sums;       // [rows, nb]
  int nb;
};

constexpr size_t rows_align(size_t n) { return (n + 255) / 256 * 256; }
int rows_chunks(int64_t n) { return int((n + kRowChunk - 1) / kRowChunk); }

size_t rows_scratch_bytes(int64_t rows, int64_t vocab) {
  const size_t per = size_t(rows) * size_t(rows_chunks(vocab));
  return rows_align(size_t(rows) * sizeof(RowState)) + rows_align(per * 4) + rows_align(per * 4) +
         rows_align(per * sizeof(RowBest)) + rows_align(per * sizeof(RowSums));
}

RowsScratch rows_scratch(int64_t rows, int64_t vocab) {
  char* p = static_cast<char*>(scratch(rows_scratch_bytes(rows, vocab)));
  RowsScratch s;
  s.nb = rows_chunks(vocab);
  const size_t per = size_t(rows) * size_t(s.nb);
  s.state = reinterpret_cast<RowState*>(p);
  p += rows_align(size_t(rows) * sizeof(RowState));
  s.part_key = reinterpret_cast<unsigned int*>(p);
  p += rows_align(per * 4);
  s.part_bad = reinterpret_cast<int*>(p);
  p += rows_align(per * 4);
  s.part_best = reinterpret_cast<RowBest*>(p);
  p += rows_align(per * sizeof(RowBest));
  s.part_sums = reinterpret_cast<RowSums*>(p);
  return s;
}

// The row's largest candidate logit, from prep's per-chunk keys (every lane of the calling
// warp gets it; -inf when the row has no candidate).
__device__ __forceinline__ float rows_max(const unsigned int* __restrict__ part_key, int nb) {
  unsigned int k = 0;
  for (int b = threadIdx.x & 31; b < nb; b += 32) k = max(k, part_key[b]);
  k = warp_max_u32(k);
  return k == 0 ? kNegInf : key_value(k);
}

// The chunk's logits of this block's row, NaN for an id that is not a candidate (outside the
// row, masked out, or -inf). `fresh`: the row was written in this launch (no read-only path).
__device__ __forceinline__ void rows_load(const float* __restrict__ x, int n, const uint32_t* __restrict__ mask,
                                          int64_t mask_ids, float (&v)[kRowPer], bool fresh = false) {
  const int base = blockIdx.x * kRowChunk + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int i = base + j * kDrawThreads;
    float f = __int_as_float(0x7fffffff);
    if (i < n) {
      const float raw = fresh ? __ldcg(x + i) : __ldg(x + i);
      const bool allowed = !mask || (int64_t(i) < mask_ids && ((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u));
      if (allowed && raw > kNegInf) f = raw;
    }
    v[j] = f;
  }
}

// Whether a cut runs for the row at all (a sampled row whose parameter cuts).
__device__ __forceinline__ bool rows_cut_on(const SampleRowArgs& a, int cut) {
  if (!(a.temperature > 0.0f)) return false;
  return cut == kTopK ? a.top_k > 0 : cut == kTopP ? a.top_p < 1.0f : a.typical_p < 1.0f;
}

// The row's kept-set tests, given what the earlier launches settled.
struct RowView {
  float m;          // the row's largest candidate
  float t;          // temperature
  unsigned int t_kp;  // max(top-k, top-p thresholds)
  bool min_p_on;
  double min_log;
  bool typical_on;
  float center;
  unsigned int t_y;
};

__device__ __forceinline__ RowView rows_view(const SampleRowArgs& a, const RowState* st, const unsigned int* part_key,
                                             int nb) {
  RowView r;
  r.m = rows_max(part_key, nb);
  r.t = a.temperature;
  r.t_kp = max(st->t[kTopK], st->t[kTopP]);
  r.min_p_on = a.min_p > 0.0f;
  r.min_log = r.min_p_on ? double(a.temperature) * log(double(a.min_p)) : 0.0;
  r.typical_on = rows_cut_on(a, kTypical);
  r.center = float(st->center);
  r.t_y = st->t[kTypical];
  return r;
}

// Kept by top-k, top-p and min-p (v a candidate).
__device__ __forceinline__ bool rows_kept_kpm(const RowView& r, float v) {
  if (order_key(v) < r.t_kp) return false;
  return !r.min_p_on || v == r.m || double(v) - double(r.m) >= r.min_log;
}

__device__ __forceinline__ unsigned int rows_typical_key(const RowView& r, float v) {
  return ~order_key(fabsf((v - r.m) / r.t - r.center));  // the nearest to the center ranks highest
}

__global__ void __launch_bounds__(kDrawThreads)
    rows_prep_kernel(float* __restrict__ logits, int n, const SampleRowArgs* __restrict__ args,
                     const LogitAdjust* __restrict__ adjust, const uint32_t* __restrict__ allowed, int64_t mask_words,
                     RowsScratch sc) {
  pdl_wait();
  __shared__ unsigned int s_red[kDrawWarps];
  const int row = blockIdx.y;
  float* x = logits + int64_t(row) * n;
  if (blockIdx.x == 0) {
    unsigned int* w = reinterpret_cast<unsigned int*>(sc.state + row);
    for (int i = threadIdx.x; i < int(sizeof(RowState) / 4); i += kDrawThreads) w[i] = 0;
  }
  const int lo = blockIdx.x * kRowChunk, hi = min(n, lo + kRowChunk);
  // The model's logits are checked before the adjustments (a ban writes -inf).
  int bad = 0;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int i = lo + threadIdx.x + j * kDrawThreads;
    if (i < n) bad |= !isfinite(x[i]);
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) sc.part_bad[int64_t(row) * sc.nb + blockIdx.x] = bad;
  // This chunk's adjustments (ids distinct): no other block writes them.
  const SampleRowArgs& a = args[row];
  for (int k = a.adjust_begin + int(threadIdx.x); k < a.adjust_end; k += kDrawThreads) {
    const LogitAdjust e = adjust[k];
    if (e.id < lo || e.id >= hi) continue;
    float l = x[e.id];
    l = e.banned ? kNegInf : l + e.bias;
    if (e.count > 0) {
      if (a.repetition_penalty != 1.0f) l = l > 0.0f ? l / a.repetition_penalty : l * a.repetition_penalty;
      l -= a.presence_penalty + float(e.count) * a.frequency_penalty;
    }
    x[e.id] = l;
  }
  __syncthreads();
  float v[kRowPer];
  rows_load(x, n, allowed ? allowed + int64_t(row) * mask_words : nullptr, mask_words * 32, v, true);
  unsigned int k = 0;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j)
    if (v[j] == v[j]) k = max(k, order_key(v[j]));
  k = warp_max_u32(k);
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = k;
  __syncthreads();
  if (threadIdx.x < 32) {
    k = warp_max_u32(threadIdx.x < kDrawWarps ? s_red[threadIdx.x] : 0u);
    if (threadIdx.x == 0) sc.part_key[int64_t(row) * sc.nb + blockIdx.x] = k;
  }
}

// One radix pass of a cut: pass 0 takes key bits [31, 21), pass 1 [21, 10), pass 2 [10, 0),
// counting only the candidates whose higher digits equal the prefix settled so far.
template <int kCut, int kPass>
__global__ void __launch_bounds__(kDrawThreads)
    rows_select_kernel(const float* __restrict__ logits, int n, const SampleRowArgs* __restrict__ args,
                       const uint32_t* __restrict__ allowed, int64_t mask_words, RowsScratch sc) {
  pdl_wait();
  constexpr bool kMass = kCut != kTopK;
  constexpr int kShift = kPass == 0 ? 21 : kPass == 1 ? 10 : 0;
  constexpr int kBits = kPass == 2 ? 10 : 11;
  constexpr int kBins = 1 << kBits;
  __shared__ unsigned int s_count[kBins];
  __shared__ unsigned long long s_mass[kMass ? kBins : 1];
  __shared__ unsigned long long s_red[32];
  __shared__ unsigned long long s_above;
  __shared__ int s_digit, s_flag;

  const int row = blockIdx.y;
  const SampleRowArgs a = args[row];
  RowState* st = sc.state + row;
  if (!rows_cut_on(a, kCut) || st->done[kCut]) return;
  float v[kRowPer];
  rows_load(logits + int64_t(row) * n, n, allowed ? allowed + int64_t(row) * mask_words : nullptr, mask_words * 32, v);
  const unsigned int* part_key = sc.part_key + int64_t(row) * sc.nb;
  const RowView r = rows_view(a, st, part_key, sc.nb);
  const unsigned int prefix = st->prefix[kCut];
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    s_count[d] = 0;
    if constexpr (kMass) s_mass[d] = 0;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    if (v[j] != v[j]) continue;
    unsigned int key;
    if constexpr (kCut == kTopK) {
      key = order_key(v[j]);
    } else if constexpr (kCut == kTopP) {
      key = order_key(v[j]);
      if (key < st->t[kTopK]) continue;
    } else {
      if (!rows_kept_kpm(r, v[j])) continue;
      key = rows_typical_key(r, v[j]);
    }
    if constexpr (kPass > 0) {
      if ((key >> (kShift + kBits)) != prefix) continue;
    }
    const unsigned int d = (key >> kShift) & (kBins - 1);
    atomicAdd(&s_count[d], 1u);
    if constexpr (kMass) atomicAdd(&s_mass[d], fixed_mass(v[j], r.m, r.t));
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    if (s_count[d] == 0) continue;
    atomicAdd(&st->count[d], s_count[d]);
    if constexpr (kMass) atomicAdd(&st->mass[d], s_mass[d]);
  }
  if (!last_block(&st->ticket, &s_flag)) return;

  // The row's last block: take the row's histogram and clear it for the next pass.
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    s_count[d] = __ldcg(&st->count[d]);
    st->count[d] = 0;
    if constexpr (kMass) {
      s_mass[d] = __ldcg(&st->mass[d]);
      st->mass[d] = 0;
    }
  }
  __syncthreads();
  unsigned long long target, above = 0;
  const TopScan scn = kMass ? scan_from_top<kBins>(s_mass, s_red) : scan_from_top<kBins>(s_count, s_red);
  if (kPass == 0) {
    if constexpr (kMass) {
      const float p = kCut == kTopP ? a.top_p : a.typical_p;
      if (scn.total == 0) {
        if (threadIdx.x == 0) st->done[kCut] = 1;
        return;
      }
      const double want = ceil(double(p) * double(scn.total));
      target = want < 1.0 ? 1ull : want >= double(scn.total) ? scn.total : (unsigned long long)want;
    } else {
      if ((unsigned long long)a.top_k >= scn.total) {  // fewer candidates than k: top-k is off
        if (threadIdx.x == 0) st->done[kCut] = 1;
        return;
      }
      target = (unsigned long long)a.top_k;
    }
  } else {
    target = kMass ? st->target[kCut] : st->k_rem;
    above = kMass ? st->above[kCut] : 0;
  }
  // The digit at which the running sum from the top first reaches target - above.
  const unsigned long long want = target - above;
  if constexpr (kMass)
    locate<kBins>(s_mass, scn, want, &s_digit, &s_above);
  else
    locate<kBins>(s_count, scn, want, &s_digit, &s_above);
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int d = s_digit;
  const unsigned int digits = (kPass == 0 ? 0u : prefix << kBits) | unsigned(d);
  if constexpr (kMass) {
    // Settled when the digit holds one candidate (it is the crossing one).
    if (kPass == 2 || s_count[d] == 1) {
      st->done[kCut] = 1;
      st->t[kCut] = digits << kShift;
    } else {
      st->prefix[kCut] = digits;
      st->target[kCut] = target;
      st->above[kCut] = above + s_above;
    }
  } else {
    // Settled when every candidate of the digit is kept (the k-th largest is its last).
    const unsigned long long rem = want - s_above;
    if (kPass == 2 || s_count[d] == rem) {
      st->done[kCut] = 1;
      st->t[kCut] = digits << kShift;
    } else {
      st->prefix[kCut] = digits;
      st->k_rem = unsigned(rem);
    }
  }
}

// typical-p: the kept set's sums of w and w x (x = (l - max) / T) per chunk, then the row's
// last block adds them in chunk order (the same bits every time) into the center.
__global__ void __launch_bounds__(kDrawThreads)
    rows_typical_sums_kernel(const float* __restrict__ logits, int n, const SampleRowArgs* __restrict__ args,
                             const uint32_t* __restrict__ allowed, int64_t mask_words, RowsScratch sc) {
  pdl_wait();
  __shared__ double s_w[kDrawWarps], s_wx[kDrawWarps];
  __shared__ int s_flag;
  const int row = blockIdx.y;
  const SampleRowArgs a = args[row];
  RowState* st = sc.state + row;
  if (!rows_cut_on(a, kTypical)) return;
  float v[kRowPer];
  rows_load(logits + int64_t(row) * n, n, allowed ? allowed + int64_t(row) * mask_words : nullptr, mask_words * 32, v);
  const RowView r = rows_view(a, st, sc.part_key + int64_t(row) * sc.nb, sc.nb);
  double w = 0, wx = 0;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    if (v[j] != v[j] || !rows_kept_kpm(r, v[j])) continue;
    const float xi = (v[j] - r.m) / r.t;
    const double wi = double(expf(xi));
    w += wi;
    wx += wi * double(xi);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    w += __shfl_xor_sync(0xffffffffu, w, o);
    wx += __shfl_xor_sync(0xffffffffu, wx, o);
  }
  if ((threadIdx.x & 31) == 0) s_w[threadIdx.x >> 5] = w, s_wx[threadIdx.x >> 5] = wx;
  __syncthreads();
  RowSums* parts = sc.part_sums + int64_t(row) * sc.nb;
  if (threadIdx.x == 0) {
    RowSums p{0, 0};
    for (int k = 0; k < kDrawWarps; ++k) p.w += s_w[k], p.wx += s_wx[k];
    parts[blockIdx.x] = p;
  }
  if (!last_block(&st->ticket, &s_flag)) return;
  if (threadIdx.x == 0) {
    double tw = 0, twx = 0;
    for (int b = 0; b < sc.nb; ++b) tw += __ldcg(&parts[b].w), twx += __ldcg(&parts[b].wx);
    st->center = tw > 0 ? twx / tw : 0.0;
  }
}

// Gumbel-max over the kept set (greedy rows: the largest candidate), each block's best into
// its part; the row's last block picks the row's best and writes the token and the flag.
__global__ void __launch_bounds__(kDrawThreads)
    rows_draw_kernel(const float* __restrict__ logits, int n, const SampleRowArgs* __restrict__ args,
                     const uint32_t* __restrict__ allowed, int64_t mask_words, RowsScratch sc,
                     int32_t* __restrict__ out, int32_t* __restrict__ nonfinite) {
  pdl_wait();
  __shared__ float s_max[kDrawWarps];
  __shared__ double s_score[kDrawWarps];
  __shared__ int s_index[kDrawWarps];
  __shared__ int s_flag;
  const int row = blockIdx.y;
  const SampleRowArgs a = args[row];
  RowState* st = sc.state + row;
  float v[kRowPer];
  rows_load(logits + int64_t(row) * n, n, allowed ? allowed + int64_t(row) * mask_words : nullptr, mask_words * 32, v);
  const bool greedy = !(a.temperature > 0.0f);
  const RowView r = rows_view(a, st, sc.part_key + int64_t(row) * sc.nb, sc.nb);
  bool kept[kRowPer];
  float best = kNegInf;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    kept[j] = v[j] == v[j];
    if (kept[j] && !greedy) {
      kept[j] = rows_kept_kpm(r, v[j]) && (!r.typical_on || rows_typical_key(r, v[j]) >= r.t_y);
    }
    if (kept[j]) best = fmaxf(best, v[j]);
  }
  best = warp_max(best);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s_max[warp] = best;
  __syncthreads();
  best = kNegInf;
#pragma unroll
  for (int w = 0; w < kDrawWarps; ++w) best = fmaxf(best, s_max[w]);

  double bs = -__builtin_huge_val();
  int bi = INT_MAX;
  const int base = blockIdx.x * kRowChunk + threadIdx.x;
  const float prune = kPruneSpan * a.temperature;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    if (!kept[j]) continue;
    const int i = base + j * kDrawThreads;
    double s;
    if (greedy) {
      s = double(v[j]);
    } else {
      // NOTE: the pruned logits skip the two double logarithms, the bulk of the draw's work.
      if (best - v[j] > prune) continue;
      s = double(v[j]) / double(a.temperature) + noise_gumbel(a.seed, a.counter, uint64_t(i));
    }
    if (better_score(s, i, bs, bi)) bs = s, bi = i;
  }
  block_best(bs, bi, s_score, s_index);
  RowBest* parts = sc.part_best + int64_t(row) * sc.nb;
  if (threadIdx.x == 0) parts[blockIdx.x] = RowBest{bs, bi, 0};
  if (!last_block(&st->ticket, &s_flag)) return;

  bs = -__builtin_huge_val();
  bi = INT_MAX;
  int bad = 0;
  const int* part_bad = sc.part_bad + int64_t(row) * sc.nb;
  for (int b = threadIdx.x; b < sc.nb; b += kDrawThreads) {
    const double s = __ldcg(&parts[b].score);
    const int i = __ldcg(&parts[b].index);
    bad |= __ldcg(part_bad + b);
    if (better_score(s, i, bs, bi)) bs = s, bi = i;
  }
  bad = __syncthreads_or(bad);
  block_best(bs, bi, s_score, s_index);
  if (threadIdx.x == 0) {
    out[row] = bi == INT_MAX ? -1 : int32_t(bi);
    nonfinite[row] = bad;
  }
}

}  // namespace

void sample_rows(float* logits, int64_t rows, int64_t vocab, const SampleRowArgs* args, const LogitAdjust* adjust,
                 const uint32_t* allowed, int64_t mask_words, int cuts, int32_t* out, int32_t* nonfinite,
                 cudaStream_t s) {
  if (rows <= 0) return;
  if (vocab < 1) throw InvalidInput("sample_rows: vocab must be >= 1, got " + std::to_string(vocab));
  if (vocab > kSampleMaxVocab)
    throw Unsupported("sample_rows: vocab " + std::to_string(vocab) + " exceeds the largest supported, " +
                      std::to_string(kSampleMaxVocab));
  if (rows > 65535) throw Unsupported("sample_rows: more than 65535 rows");
  if (allowed && mask_words <= 0) throw InvalidInput("sample_rows: a token mask of no words");
  const int n = int(vocab);
  const RowsScratch sc = rows_scratch(rows, vocab);
  const dim3 grid(unsigned(sc.nb), unsigned(rows));
  launch_kernel(rows_prep_kernel, grid, kDrawThreads, 0, s, logits, n, args, adjust, allowed, mask_words, sc);
  const float* l = logits;
  if (cuts & kSampleCutTopK) {
    launch_kernel(rows_select_kernel<kTopK, 0>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTopK, 1>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTopK, 2>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
  }
  if (cuts & kSampleCutTopP) {
    launch_kernel(rows_select_kernel<kTopP, 0>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTopP, 1>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTopP, 2>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
  }
  if (cuts & kSampleCutTypical) {
    launch_kernel(rows_typical_sums_kernel, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTypical, 0>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTypical, 1>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
    launch_kernel(rows_select_kernel<kTypical, 2>, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc);
  }
  launch_kernel(rows_draw_kernel, grid, kDrawThreads, 0, s, l, n, args, allowed, mask_words, sc, out, nonfinite);
}

}  // namespace osprey::cuda
