// Token choice on the device (the token stays there): greedy argmax, and the temperature /
// top-k / top-p / min-p draw of sample.h.
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sample.h"
#include "backend/cuda/sample_common.cuh"
#include "backend/sample_noise.h"

namespace osprey::cuda {

// Set by the last argmax or draw on this device: 1 when its logits held a NaN or an Inf (the
// token it wrote is still a valid id, so a pipelined step that reads it stays in bounds). The
// token readback copies it with the token (non_finite_flag()).
__device__ int32_t g_non_finite_logits;

namespace {

constexpr int kThreads = 1024;

// (value, index) with NaN ranked below everything and ties to the lower index.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ float key(float v) { return v != v ? kNegInf : v; }

// One block scans the row x[0, n); each thread keeps its best, then a warp / block reduction.
// Thread 0 writes the lowest index of the maximum to *idx (NaN ranking as -inf, so a row of
// NaN gives 0) and whether the row held a NaN or an Inf to *bad_out. With `allowed` (a token
// mask over ids [0, mask_ids), x[i] being id base + i), only allowed elements are candidates,
// and *idx is -1 when none is. Call from all threads of the block (barriers).
__device__ __forceinline__ void block_argmax(const float* __restrict__ x, int64_t n, int32_t* idx, int* bad_out,
                                             const uint32_t* __restrict__ allowed = nullptr, int64_t base = 0,
                                             int64_t mask_ids = 0) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float bv = kNegInf;
  int64_t bi = n;  // n: none yet (any real index wins a tie against it)
  int bad = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float raw = x[i];
    bad |= !isfinite(raw);
    if (allowed) {
      const int64_t id = base + i;
      if (id >= mask_ids || !((allowed[id >> 5] >> (id & 31)) & 1u)) continue;
    }
    const float v = key(raw);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
  bad = __syncthreads_or(bad);
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
    if (lane == 0) {
      *idx = int32_t(bi < n ? bi : allowed ? -1 : 0);
      *bad_out = bad;
    }
  }
}

__global__ void argmax_kernel(const float* __restrict__ x, int64_t n, int32_t* out) {
  pdl_wait();
  int bad = 0;
  block_argmax(x, n, out, &bad);
  if (threadIdx.x == 0) g_non_finite_logits = bad;
}

// argmax_rows in two passes, so that one row (a batch of one) still spreads over the device:
// block (part, row) takes the argmax of its slice of the row, then one warp per row merges the
// parts in order. The maximum and its lowest index do not depend on the slicing. The device's
// flag is left alone (the caller reads the per-row flags).
constexpr int kRowParts = 32;
constexpr int kRowThreads = 256;

struct RowPart {
  float value;
  int32_t index;  // the row's length when the slice is empty
  int32_t bad;
};

__global__ void argmax_row_parts_kernel(const float* __restrict__ logits, int64_t vocab,
                                        const uint32_t* __restrict__ allowed, int64_t mask_words,
                                        RowPart* __restrict__ parts) {
  pdl_wait();
  const int64_t row = blockIdx.y, part = blockIdx.x;
  const int64_t per = (vocab + kRowParts - 1) / kRowParts;
  const int64_t lo = min(vocab, part * per), hi = min(vocab, lo + per);
  int32_t idx = -1;
  int bad = 0;
  if (lo < hi)
    block_argmax(logits + row * vocab + lo, hi - lo, &idx, &bad, allowed ? allowed + row * mask_words : nullptr, lo,
                 mask_words * 32);
  if (threadIdx.x == 0) {
    RowPart& p = parts[row * kRowParts + part];
    p.value = idx >= 0 ? key(logits[row * vocab + lo + idx]) : kNegInf;
    p.index = idx >= 0 ? int32_t(lo + idx) : int32_t(vocab);
    p.bad = bad;
  }
}

__global__ void argmax_row_merge_kernel(const RowPart* __restrict__ parts, int64_t vocab, int32_t* __restrict__ out,
                                        int32_t* __restrict__ nonfinite) {
  pdl_wait();
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x;
  float bv = kNegInf;
  int64_t bi = vocab;
  int bad = 0;
  if (lane < kRowParts) {
    const RowPart p = parts[row * kRowParts + lane];
    bv = p.value, bi = p.index, bad = p.bad;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  bad = __any_sync(0xffffffffu, bad);
  if (lane == 0) {
    out[row] = int32_t(bi < vocab ? bi : -1);  // -1: the row's mask allows no id
    nonfinite[row] = bad;
  }
}
static_assert(kRowParts == 32, "one lane per part in the merge");

}  // namespace

const int32_t* non_finite_flag() {
  void* p = nullptr;
  OSPREY_CUDA_CHECK(cudaGetSymbolAddress(&p, g_non_finite_logits));
  return static_cast<const int32_t*>(p);
}

void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s) {
  if (n <= 0) throw InvalidInput("argmax: empty row");
  if (n > 0x7fffffffLL) throw Unsupported("argmax: row longer than 2^31 - 1");
  launch_kernel(argmax_kernel, 1, kThreads, 0, s, x, n, out);
}

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, const uint32_t* allowed, int64_t mask_words,
                 int32_t* out, int32_t* nonfinite, cudaStream_t s) {
  if (rows <= 0) return;
  if (vocab <= 0) throw InvalidInput("argmax_rows: empty rows (vocab " + std::to_string(vocab) + ")");
  if (vocab > 0x7fffffffLL) throw Unsupported("argmax_rows: rows longer than 2^31 - 1");
  if (rows > 0x7fffffffLL) throw Unsupported("argmax_rows: more than 2^31 - 1 rows");
  if (rows > 65535) throw Unsupported("argmax_rows: more than 65535 rows");
  auto* parts = static_cast<RowPart*>(scratch(size_t(rows) * kRowParts * sizeof(RowPart)));
  if (allowed && mask_words <= 0) throw InvalidInput("argmax_rows: a token mask of no words");
  launch_kernel(argmax_row_parts_kernel, dim3(kRowParts, unsigned(rows)), kRowThreads, 0, s, logits, vocab, allowed,
                mask_words, parts);
  launch_kernel(argmax_row_merge_kernel, unsigned(rows), 32, 0, s, parts, vocab, out, nonfinite);
}

// ---- Stochastic draws (sample.h) ----------------------------------------------------------
//
// Every pass gives each block one chunk of kChunk logits (thread t holds elements
// chunk + t + j * kDrawThreads, j < kPerThread). Passes that need a grid-wide result use the
// last-block pattern: each block publishes its part, fences, and takes a ticket; the block
// that takes the last ticket combines the parts, writes the outcome to State for the next
// kernel, and clears what it used. stats_kernel, always first, zeroes State.

namespace {

using namespace sampling;  // backend/cuda/sample_common.cuh

// Cross-block state of one sample() call, at the start of scratch().
struct State {
  unsigned int ticket;    // blocks of the running pass that are done; the last one resets it
  unsigned int k_done;    // top-k: t_k is settled
  unsigned int k_prefix;  // top-k: the digits of t_k found so far
  unsigned int k_rem;     // top-k: the rank of t_k among the logits under k_prefix
  unsigned int t_k;       // kept set: key >= t_k (0 keeps every non-NaN logit)
  unsigned int p_done;    // top-p: likewise
  unsigned int p_prefix;
  unsigned int t_p;
  unsigned long long p_target;  // top-p: the fixed-point mass the kept set must reach
  unsigned long long p_above;   // top-p: the mass of the logits above the digits under p_prefix
  unsigned int count[kMaxBins];         // the running pass's histogram: logits per digit
  unsigned long long mass[kMaxBins];    // and their fixed-point weight (top-p)
};
static_assert(sizeof(State) % 4 == 0, "State is zeroed by words");

// One block's draw: its best score and the index holding it (INT_MAX: no candidate), and
// whether its chunk held a NaN or an Inf.
struct Best {
  double score;
  int index;
  int non_finite;
};

struct DrawArgs {
  float temperature;
  float prune;       // kPruneSpan * temperature
  int min_p_on;
  double min_log;    // T * log(min_p)
  uint64_t seed;
  uint64_t counter;
  const uint64_t* counter_dev;
};

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }
int n_chunks(int64_t n) { return int((n + kChunk - 1) / kChunk); }

__device__ __forceinline__ void load_chunk(const float* __restrict__ x, int n, float (&v)[kPerThread]) {
  const int base = blockIdx.x * kChunk + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = base + j * kDrawThreads;
    v[j] = i < n ? __ldg(x + i) : __int_as_float(0x7fffffff);  // NaN: not a candidate
  }
}

// The key of the largest non-NaN logit, from stats_kernel's per-block parts; every lane of the
// calling warp gets it (0 when every logit is NaN).
__device__ __forceinline__ unsigned int max_key(const unsigned int* __restrict__ part_key, int n_parts) {
  unsigned int k = 0;
  for (int b = threadIdx.x & 31; b < n_parts; b += 32) k = max(k, __ldg(part_key + b));
  return warp_max_u32(k);
}

// The maximum key of each chunk into part_key (0: only NaN). Block 0 also zeroes State.
__global__ void __launch_bounds__(kDrawThreads) stats_kernel(const float* __restrict__ x, int n, State* st,
                                                             unsigned int* __restrict__ part_key) {
  pdl_wait();
  __shared__ unsigned int s_red[kDrawWarps];
  if (blockIdx.x == 0) {
    unsigned int* w = reinterpret_cast<unsigned int*>(st);
    for (int i = threadIdx.x; i < int(sizeof(State) / 4); i += kDrawThreads) w[i] = 0;
  }
  float v[kPerThread];
  load_chunk(x, n, v);
  unsigned int k = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    if (v[j] == v[j]) k = max(k, order_key(v[j]));
  k = warp_max_u32(k);
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = k;
  __syncthreads();
  if (threadIdx.x < 32) {
    k = warp_max_u32(threadIdx.x < kDrawWarps ? s_red[threadIdx.x] : 0u);
    if (threadIdx.x == 0) part_key[blockIdx.x] = k;
  }
}

// One radix pass of a cut: pass 0 takes key bits [31, 21), pass 1 [21, 10), pass 2 [10, 0),
// counting only the logits whose higher digits equal the prefix settled so far. top-k finds
// the k-th largest key by count; top-p (kTopP) the largest key whose mass from the top reaches
// the target, over the keys >= t_k.
template <bool kTopP, int kPass>
__global__ void __launch_bounds__(kDrawThreads)
    select_kernel(const float* __restrict__ x, int n, float temperature, int top_k, float top_p, State* st,
                  const unsigned int* __restrict__ part_key, int n_parts) {
  pdl_wait();
  constexpr int kShift = kPass == 0 ? 21 : kPass == 1 ? 10 : 0;
  constexpr int kBits = kPass == 2 ? 10 : 11;
  constexpr int kBins = 1 << kBits;
  __shared__ unsigned int s_count[kBins];
  __shared__ unsigned long long s_mass[kTopP ? kBins : 1];
  __shared__ unsigned long long s_red[32];
  __shared__ unsigned long long s_above;
  __shared__ int s_digit, s_flag;

  float v[kPerThread];
  load_chunk(x, n, v);  // issued before the state is read: the two loads overlap
  if (kTopP ? st->p_done : st->k_done) return;
  const unsigned int prefix = kTopP ? st->p_prefix : st->k_prefix;
  const unsigned int t_k = kTopP ? st->t_k : 0u;
  const float m = kTopP ? key_value(max_key(part_key, n_parts)) : 0.0f;
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    s_count[d] = 0;
    if constexpr (kTopP) s_mass[d] = 0;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (v[j] != v[j]) continue;
    const unsigned int key = order_key(v[j]);
    if constexpr (kTopP) {
      if (key < t_k) continue;
    }
    if constexpr (kPass > 0) {
      if ((key >> (kShift + kBits)) != prefix) continue;
    }
    const unsigned int d = (key >> kShift) & (kBins - 1);
    atomicAdd(&s_count[d], 1u);
    if constexpr (kTopP) atomicAdd(&s_mass[d], fixed_mass(v[j], m, temperature));
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    if (s_count[d] == 0) continue;
    atomicAdd(&st->count[d], s_count[d]);
    if constexpr (kTopP) atomicAdd(&st->mass[d], s_mass[d]);
  }
  if (!last_block(&st->ticket, &s_flag)) return;

  // The last block: take the grid's histogram and clear it for the next pass.
  for (int d = threadIdx.x; d < kBins; d += kDrawThreads) {
    s_count[d] = __ldcg(&st->count[d]);
    st->count[d] = 0;
    if constexpr (kTopP) {
      s_mass[d] = __ldcg(&st->mass[d]);
      st->mass[d] = 0;
    }
  }
  __syncthreads();
  unsigned long long target, above = 0;
  if constexpr (kTopP) {
    const TopScan sc = scan_from_top<kBins>(s_mass, s_red);
    if (kPass == 0) {
      if (sc.total == 0) {  // every logit is NaN: nothing to cut
        if (threadIdx.x == 0) st->p_done = 1;
        return;
      }
      const double want = ceil(double(top_p) * double(sc.total));
      target = want < 1.0 ? 1ull : want >= double(sc.total) ? sc.total : (unsigned long long)want;
    } else {
      target = st->p_target;
      above = st->p_above;
    }
    locate<kBins>(s_mass, sc, target - above, &s_digit, &s_above);
  } else {
    const TopScan sc = scan_from_top<kBins>(s_count, s_red);
    if (kPass == 0) {
      if ((unsigned long long)top_k >= sc.total) {  // fewer non-NaN logits than k: top-k is off
        if (threadIdx.x == 0) st->k_done = 1;
        return;
      }
      target = (unsigned long long)top_k;
    } else {
      target = st->k_rem;
    }
    locate<kBins>(s_count, sc, target, &s_digit, &s_above);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int d = s_digit;
  const unsigned int digits = (kPass == 0 ? 0u : prefix << kBits) | unsigned(d);
  if constexpr (kTopP) {
    // Done when the digit is a single logit (then every key in the bin ranks as it does).
    if (kPass == 2 || s_count[d] == 1) {
      st->p_done = 1;
      st->t_p = digits << kShift;
    } else {
      st->p_prefix = digits;
      st->p_target = target;
      st->p_above = above + s_above;
    }
  } else {
    // Done when every logit of the digit is kept.
    const unsigned long long rem = target - s_above;
    if (kPass == 2 || s_count[d] == rem) {
      st->k_done = 1;
      st->t_k = digits << kShift;
    } else {
      st->k_prefix = digits;
      st->k_rem = unsigned(rem);
    }
  }
}

// Gumbel-max over the kept set: each block's best candidate into parts; the last block picks
// the grid's best and writes the token.
__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(const float* __restrict__ x, int n, DrawArgs a, const State* st,
                const unsigned int* __restrict__ part_key, int n_parts, Best* parts, unsigned int* ticket,
                int32_t* out) {
  pdl_wait();
  __shared__ float s_max[kDrawWarps];
  __shared__ double s_score[kDrawWarps];
  __shared__ int s_index[kDrawWarps];
  __shared__ int s_flag;
  const unsigned int t = max(st->t_k, st->t_p);
  float v[kPerThread];
  load_chunk(x, n, v);
  int bad = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) bad |= blockIdx.x * kChunk + threadIdx.x + j * kDrawThreads < n && !isfinite(v[j]);
  bad = __syncthreads_or(bad);
  const float m = a.min_p_on ? key_value(max_key(part_key, n_parts)) : 0.0f;
  const uint64_t counter = a.counter_dev ? *a.counter_dev : a.counter;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  bool cand[kPerThread];
  float best = kNegInf;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    cand[j] = v[j] == v[j] && order_key(v[j]) >= t &&
              (!a.min_p_on || v[j] == m || double(v[j]) - double(m) >= a.min_log);
    if (cand[j]) best = fmaxf(best, v[j]);
  }
  best = warp_max(best);
  if (lane == 0) s_max[warp] = best;
  __syncthreads();
  best = kNegInf;
#pragma unroll
  for (int w = 0; w < kDrawWarps; ++w) best = fmaxf(best, s_max[w]);

  double bs = -__builtin_huge_val();
  int bi = INT_MAX;
  const int base = blockIdx.x * kChunk + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    // NOTE: the pruned logits skip the two double logarithms, the bulk of the draw's work.
    if (!cand[j] || best - v[j] > a.prune) continue;
    const int i = base + j * kDrawThreads;
    const double s = double(v[j]) / double(a.temperature) + noise_gumbel(a.seed, counter, uint64_t(i));
    if (better_score(s, i, bs, bi)) bs = s, bi = i;
  }
  block_best(bs, bi, s_score, s_index);
  if (threadIdx.x == 0) {
    parts[blockIdx.x].score = bs;
    parts[blockIdx.x].index = bi;
    parts[blockIdx.x].non_finite = bad;
  }
  if (!last_block(ticket, &s_flag)) return;

  bs = -__builtin_huge_val();
  bi = INT_MAX;
  bad = 0;
  for (int b = threadIdx.x; b < int(gridDim.x); b += kDrawThreads) {
    const double s = __ldcg(&parts[b].score);
    const int i = __ldcg(&parts[b].index);
    bad |= __ldcg(&parts[b].non_finite);
    if (better_score(s, i, bs, bi)) bs = s, bi = i;
  }
  bad = __syncthreads_or(bad);
  block_best(bs, bi, s_score, s_index);
  if (threadIdx.x == 0) {
    out[0] = bi == INT_MAX ? 0 : int32_t(bi);
    g_non_finite_logits = bad;
  }
}

void check_sample_args(int64_t vocab, const SampleArgs& a) {
  auto bad = [](const std::string& what) { throw InvalidInput("sample: " + what); };
  if (vocab < 1) bad("vocab must be >= 1, got " + std::to_string(vocab));
  if (!(a.temperature > 0.0f) || !std::isfinite(a.temperature))
    bad("temperature must be > 0 and finite (greedy decoding uses argmax), got " + std::to_string(a.temperature));
  if (a.top_k < 0) bad("top_k must be >= 0, got " + std::to_string(a.top_k));
  if (!(a.top_p > 0.0f && a.top_p <= 1.0f)) bad("top_p must be in (0, 1], got " + std::to_string(a.top_p));
  if (!(a.min_p >= 0.0f && a.min_p < 1.0f)) bad("min_p must be in [0, 1), got " + std::to_string(a.min_p));
  if (vocab > kSampleMaxVocab)
    throw Unsupported("sample: vocab " + std::to_string(vocab) + " exceeds the largest supported, " +
                      std::to_string(kSampleMaxVocab));
}

// Scratch layout: State | part_key [n_chunks] u32 | parts [n_chunks] Best.
size_t part_key_offset() { return align256(sizeof(State)); }
size_t parts_offset(int64_t vocab) { return part_key_offset() + align256(size_t(n_chunks(vocab)) * 4); }

}  // namespace

size_t sample_scratch_bytes(int64_t vocab) {
  if (vocab < 1 || vocab > kSampleMaxVocab) return 0;
  return parts_offset(vocab) + align256(size_t(n_chunks(vocab)) * sizeof(Best));
}

void sample(const float* logits, int64_t vocab, const SampleArgs& a, int32_t* out_token, cudaStream_t s) {
  check_sample_args(vocab, a);
  const int n = int(vocab);
  const int nb = n_chunks(vocab);
  char* base = static_cast<char*>(scratch(sample_scratch_bytes(vocab)));
  State* st = reinterpret_cast<State*>(base);
  unsigned int* part_key = reinterpret_cast<unsigned int*>(base + part_key_offset());
  Best* parts = reinterpret_cast<Best*>(base + parts_offset(vocab));

  launch_kernel(stats_kernel, nb, kDrawThreads, 0, s, logits, n, st, part_key);
  const float t = a.temperature;
  if (a.top_k > 0 && a.top_k < vocab) {
    launch_kernel(select_kernel<false, 0>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
    launch_kernel(select_kernel<false, 1>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
    launch_kernel(select_kernel<false, 2>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
  }
  if (a.top_p < 1.0f) {
    launch_kernel(select_kernel<true, 0>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
    launch_kernel(select_kernel<true, 1>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
    launch_kernel(select_kernel<true, 2>, nb, kDrawThreads, 0, s, logits, n, t, a.top_k, a.top_p, st, part_key, nb);
  }
  DrawArgs d;
  d.temperature = t;
  d.prune = kPruneSpan * t;
  d.min_p_on = a.min_p > 0.0f;
  d.min_log = d.min_p_on ? double(t) * std::log(double(a.min_p)) : 0.0;
  d.seed = a.seed;
  d.counter = a.counter;
  d.counter_dev = a.counter_dev;
  launch_kernel(draw_kernel, nb, kDrawThreads, 0, s, logits, n, d, st, part_key, nb, parts, &st->ticket, out_token);
}

}  // namespace osprey::cuda
