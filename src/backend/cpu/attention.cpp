// attention(): causal grouped-query attention over an f16 or bf16 cache, flash-attention style.
//
// A work item is (kv head, block of up to kRowsPerItem query rows, range of keys). Its query
// vectors are every (row, query head of the group) pair, pre-scaled by `scale`, each with a
// running max, sum and f32 accumulator (online softmax). The item walks its keys in blocks of
// kBlockKeys, and its query vectors kQBlock at a time, so that each K or V value loaded feeds
// kQBlock FMAs. Two ways to read a block:
//  - direct (at most kDirectMaxQueries query vectors: decode): scores are dot products over
//    the f16 rows (F16C conversion in registers), kWidth keys' partial sums reduced together;
//    PV reads the f16 rows of V. Memory-bound: every cached byte is read once, and the next
//    block is prefetched while this one computes.
//  - blocked (prefill): the block of K is converted once to f32 and transposed to
//    [head_dim][kBlockKeys], V to [kBlockKeys][head_dim], shared by all query vectors of the
//    item; scores are then kBlockKeys-wide vector FMAs with no horizontal sums.
// When kv heads x row blocks alone leave threads idle (decode), the keys are split into ranges
// whose partial results are merged at the end. Every kernel is templated on the stored element
// of K and of V, each its own (simd::F16, simd::BF16, or a packed format of kv_rows.h: q8_0 or
// fp8_e4m3 rows). The direct path decodes packed rows in registers as it reads them, like f16
// ones; the blocked path dequantizes a block of them once into the f32 scratch and transposes
// the keys as above. A ring of rows (a rotating cache) is read as two linear runs: blocks end
// where the ring's rows wrap.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_simd.h"
#include "backend/cpu/kv_rows.h"
#include "backend/cpu/split_merge.h"
#include "backend/kv_quant.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

using namespace simd;

constexpr int kScoreVecs = 4;
constexpr int64_t kBlockKeys = kScoreVecs * kWidth;
constexpr int kQBlock = kRegisters >= 32 ? 4 : 2;  // query vectors per pass
constexpr int64_t kRowsPerItem = 8;
constexpr int64_t kDirectMaxQueries = 8;  // items with at most this many query vectors skip the scratch
constexpr int64_t kMinKeysPerSplit = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Per-thread buffers of one work item; grown once, reused across calls.
struct Scratch {
  std::vector<float> kt;      // [head_dim][kBlockKeys]
  std::vector<float> kq;      // [kBlockKeys][head_dim]: a block of packed keys, dequantized
  std::vector<float> vf;      // [kBlockKeys][dv], dv = head_dim rounded up to kWidth, zero padded
  std::vector<float> qs;      // [nq][head_dim], query vectors times scale
  std::vector<float> acc;     // [nq][dv]
  std::vector<float> m, l;    // [nq] running max and sum
  std::vector<int64_t> lo, hi;  // [nq] visible keys [lo, hi) within the item's range

  void reserve(int64_t head_dim, int64_t dv, int64_t nq) {
    auto grow = [](auto& v, int64_t n) {
      if (int64_t(v.size()) < n) v.resize(size_t(n));
    };
    grow(kt, head_dim * kBlockKeys);
    grow(kq, kBlockKeys * head_dim);
    grow(vf, kBlockKeys * dv);
    grow(qs, nq * head_dim);
    grow(acc, nq * dv);
    grow(m, nq);
    grow(l, nq);
    grow(lo, nq);
    grow(hi, nq);
  }
};

// kt[d][j0 + t] = k[t][d] for t < kWidth, d < d_vec (rows t >= valid read as zero).
template <class L, bool kFull>
inline void convert_k_columns(const typename L::T* k, int64_t row_stride, int valid, int64_t d_vec, float* kt) {
  for (int64_t d0 = 0; d0 < d_vec; d0 += kWidth) {
    Vec r[kWidth];
#pragma GCC unroll 16
    for (int t = 0; t < kWidth; ++t) r[t] = kFull || t < valid ? L::load(k + t * row_stride + d0) : zero();
    transpose(r);
#pragma GCC unroll 16
    for (int t = 0; t < kWidth; ++t) store(kt + (d0 + t) * kBlockKeys, r[t]);
  }
}

// kt[d][j] = k[j][d] for j < nb (rows of k at stride row_stride); lanes j >= nb are left as
// they are and must be masked by the caller.
template <class L>
void convert_k_block(const typename L::T* k, int64_t row_stride, int64_t nb, int64_t head_dim, float* kt) {
  const int64_t d_vec = head_dim - head_dim % kWidth;
  for (int64_t j0 = 0; j0 < nb; j0 += kWidth) {
    const int valid = int(std::min<int64_t>(kWidth, nb - j0));
    if (valid == kWidth)
      convert_k_columns<L, true>(k + j0 * row_stride, row_stride, valid, d_vec, kt + j0);
    else
      convert_k_columns<L, false>(k + j0 * row_stride, row_stride, valid, d_vec, kt + j0);
    for (int64_t d = d_vec; d < head_dim; ++d)
      for (int t = 0; t < valid; ++t) kt[d * kBlockKeys + j0 + t] = L::scalar(k[(j0 + t) * row_stride + d]);
  }
}

// vf[j][d] = v[j][d] for j < nb, d < head_dim; vf[j][head_dim..dv) = 0.
template <class L>
void convert_v_block(const uint16_t* v, int64_t row_stride, int64_t nb, int64_t head_dim, int64_t dv, float* vf) {
  const int64_t d_vec = head_dim - head_dim % kWidth;
  for (int64_t j = 0; j < nb; ++j) {
    const uint16_t* src = v + j * row_stride;
    float* dst = vf + j * dv;
    for (int64_t d = 0; d < d_vec; d += kWidth) store(dst + d, L::load(src + d));
    for (int64_t d = d_vec; d < dv; ++d) dst[d] = d < head_dim ? L::scalar(src[d]) : 0.0f;
  }
}

// A register tile of NQ x NC vectors: tile[t][c] holds kWidth consecutive columns of row t.
template <int NQ, int NC>
using Tile = Vec[NQ][NC];

// tile[t][c] = m[t * ld + c * kWidth .. + kWidth) for t < NQ, c < NC.
template <int NQ, int NC>
__attribute__((always_inline)) inline void load_tile(Tile<NQ, NC>& tile, const float* m, int64_t ld) {
#pragma GCC unroll 4
  for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) tile[t][c] = load(m + t * ld + c * kWidth);
}

template <int NQ, int NC>
__attribute__((always_inline)) inline void store_tile(const Tile<NQ, NC>& tile, float* m, int64_t ld) {
#pragma GCC unroll 4
  for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) store(m + t * ld + c * kWidth, tile[t][c]);
}

// tile[t][c] += sum_{r in [r0, r1)} x[t * ldx + r] * row r's elements [col0 + c * kWidth, + kWidth)
// for t < NQ, c < NC, rows in the element format L at stride ld_rows: each row's NC vectors are
// loaded once and used by all NQ scalars.
template <class L, int NQ, int NC>
__attribute__((always_inline)) inline void tile_fma(Tile<NQ, NC>& tile, const float* x, int64_t ldx,
                                                    const typename L::T* rows, int64_t ld_rows, int64_t col0,
                                                    int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const typename L::T* row = rows + r * ld_rows;
    Vec v[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) {
      Vec y = load_at<L>(row, col0 + c * kWidth);
      pin(y);
      v[c] = y;
    }
#pragma GCC unroll 4
    for (int t = 0; t < NQ; ++t) {
      const Vec xt = set1(x[t * ldx + r]);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) tile[t][c] = fma(xt, v[c], tile[t][c]);
    }
  }
}

// s[t][j] = sum_d q[t][d] * kt[d][j] for t < NQ, j < kBlockKeys. q: [NQ][head_dim];
// s: [NQ][kBlockKeys].
template <int NQ>
inline void block_scores(const float* q, const float* kt, int64_t head_dim, float* s) {
  Tile<NQ, kScoreVecs> acc;
#pragma GCC unroll 4
  for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
    for (int c = 0; c < kScoreVecs; ++c) acc[t][c] = zero();
  tile_fma<F32, NQ, kScoreVecs>(acc, q, head_dim, kt, kBlockKeys, 0, 0, head_dim);
  store_tile<NQ, kScoreVecs>(acc, s, kBlockKeys);
}

// acc[t][0:NV*kWidth] += sum_{j in [j0, j1)} p[t][j] * v[j][col0:col0 + NV*kWidth] for t < NQ,
// rows of v in the element format L (row stride ld_v). p: [NQ][kBlockKeys]; acc row stride
// ld_acc.
template <class L, int NQ, int NV>
inline void accumulate_pv(const float* p, const typename L::T* v, int64_t ld_v, int64_t col0, int64_t j0, int64_t j1,
                          float* acc, int64_t ld_acc) {
  Tile<NQ, NV> a;
  load_tile<NQ, NV>(a, acc, ld_acc);
  tile_fma<L, NQ, NV>(a, p, kBlockKeys, v, ld_v, col0, j0, j1);
  store_tile<NQ, NV>(a, acc, ld_acc);
}

// accumulate_pv over the first n_vecs vectors of each row, four at a time; acc row stride dv.
template <class L, int NQ>
void accumulate_pv_vecs(const float* p, const typename L::T* v, int64_t ld_v, int64_t j0, int64_t j1, int64_t n_vecs,
                        float* acc, int64_t dv) {
  int64_t c0 = 0;
  for (; c0 + 4 <= n_vecs; c0 += 4) accumulate_pv<L, NQ, 4>(p, v, ld_v, c0 * kWidth, j0, j1, acc + c0 * kWidth, dv);
  const int64_t col0 = c0 * kWidth;
  float* ar = acc + col0;
  switch (n_vecs - c0) {
    case 1: accumulate_pv<L, NQ, 1>(p, v, ld_v, col0, j0, j1, ar, dv); break;
    case 2: accumulate_pv<L, NQ, 2>(p, v, ld_v, col0, j0, j1, ar, dv); break;
    case 3: accumulate_pv<L, NQ, 3>(p, v, ld_v, col0, j0, j1, ar, dv); break;
    default: break;
  }
}

// The converted block vf ([kBlockKeys][dv], zero padded): every vector of its rows.
template <int NQ>
void accumulate_pv_all(const float* p, const float* vf, int64_t dv, int64_t j0, int64_t j1, float* acc) {
  accumulate_pv_vecs<F32, NQ>(p, vf, dv, j0, j1, dv / kWidth, acc, dv);
}

// s = softcap * tanh(s / softcap), through tanh(y) = 1 - 2 / (exp(2y) + 1).
inline Vec soft_cap(Vec s, float softcap) {
  const Vec e = exp(mul(s, set1(2.0f / softcap)));
  const Vec one = set1(1.0f);
  const Vec t = sub(one, div(set1(2.0f), add(e, one)));
  return mul(t, set1(softcap));
}

struct Plan {
  int64_t group;          // query heads per kv head
  int64_t dv;             // head_dim rounded up to kWidth
  int64_t rows_per_item;  // query rows per item
  int64_t n_row_blocks;
  int64_t n_splits;       // key ranges per (kv head, row block)
  int64_t split_keys;     // keys per range (a multiple of kBlockKeys)
  int64_t n_items;
};

// The keys row i can see: [lo, hi).
inline void visible_keys(const AttentionArgs& a, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t p = a.q_pos0 + i;
  *hi = std::min(p + 1, a.n_keys);
  *lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
}

Plan make_plan(const AttentionArgs& a, int n_threads) {
  Plan pl;
  pl.group = a.n_heads / a.n_kv_heads;
  pl.dv = round_up(a.head_dim, kWidth);
  pl.rows_per_item = std::min<int64_t>(kRowsPerItem, a.n);
  // Batch invariance: one query row per item and no key splits, so a row's blocks start where
  // its own visible keys do and it always takes the same path (direct or blocked: nq is the
  // group) whatever the other rows of the call are.
  const int64_t want = a.batch_invariant ? 0 : n_threads > 1 ? 3 * int64_t(n_threads) : 1;
  if (a.batch_invariant) pl.rows_per_item = 1;
  while (pl.rows_per_item > 1 && a.n_kv_heads * ((a.n + pl.rows_per_item - 1) / pl.rows_per_item) < want)
    pl.rows_per_item = (pl.rows_per_item + 1) / 2;
  pl.n_row_blocks = (a.n + pl.rows_per_item - 1) / pl.rows_per_item;
  pl.n_splits = 1;
  pl.split_keys = round_up(std::max<int64_t>(a.n_keys, 1), kBlockKeys);
  const int64_t base = a.n_kv_heads * pl.n_row_blocks;
  if (base < want && a.n_keys >= 2 * kMinKeysPerSplit) {
    const int64_t splits = std::min((want + base - 1) / base, a.n_keys / kMinKeysPerSplit);
    pl.split_keys = round_up((a.n_keys + splits - 1) / splits, kBlockKeys);
    pl.n_splits = (a.n_keys + pl.split_keys - 1) / pl.split_keys;
  }
  pl.n_items = base * pl.n_splits;
  return pl;
}

// Scores of NQ query vectors against keys [0, nb) of a block, straight from the stored rows
// (16-bit or packed, decoded in registers): s[t][j] = sum_d q[t][d] * k[j][d]. Lanes j >= nb
// of s are left undefined.
// q: [NQ][head_dim]; s: [NQ][kBlockKeys].
template <class L, int NQ>
void direct_scores(const float* q, const typename L::T* k, int64_t row_stride, int64_t nb, int64_t head_dim, float* s) {
  // Keys per step: enough independent accumulator chains (NQ * KS) to cover FMA latency.
  constexpr int KS = std::min(kWidth, NQ >= 4 ? 2 : 4);
  const int64_t d_vec = head_dim - head_dim % kWidth;
  for (int64_t j0 = 0; j0 < nb; j0 += kWidth) {
    const int nk = int(std::min<int64_t>(kWidth, nb - j0));
    Vec dots[NQ][kWidth];  // per query vector, one partial-sum vector per key
    for (int e0 = 0; e0 < nk; e0 += KS) {
      const typename L::T* kr[KS];  // keys past nk repeat the last one; their sums are dropped
#pragma GCC unroll 4
      for (int u = 0; u < KS; ++u) kr[u] = k + (j0 + std::min(e0 + u, nk - 1)) * row_stride;
      Vec acc[NQ][KS];
#pragma GCC unroll 4
      for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u) acc[t][u] = zero();
      for (int64_t d = 0; d < d_vec; d += kWidth) {
        Vec kf[KS];
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u) kf[u] = load_at<L>(kr[u], d);
#pragma GCC unroll 4
        for (int t = 0; t < NQ; ++t) {
          const Vec qv = load(q + t * head_dim + d);
#pragma GCC unroll 4
          for (int u = 0; u < KS; ++u) acc[t][u] = fma(qv, kf[u], acc[t][u]);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u)
          if (e0 + u < kWidth) dots[t][e0 + u] = acc[t][u];
    }
    for (int t = 0; t < NQ; ++t) {
      for (int e = nk; e < kWidth; ++e) dots[t][e] = zero();
      store(s + t * kBlockKeys + j0, sum_rows(dots[t]));
      for (int64_t d = d_vec; d < head_dim; ++d)
        for (int e = 0; e < nk; ++e)
          s[t * kBlockKeys + j0 + e] += q[t * head_dim + d] * scalar_at<L>(k + (j0 + e) * row_stride, d);
    }
  }
}

// accumulate_pv_all straight from the stored rows of v (row stride row_stride; 16-bit or
// packed): whole vectors through the tiles, the last head_dim % kWidth columns one by one.
template <class L, int NQ>
void direct_pv_all(const float* p, const typename L::T* v, int64_t row_stride, int64_t j0, int64_t j1,
                   int64_t head_dim, float* acc, int64_t dv) {
  const int64_t n_vecs = head_dim / kWidth;
  accumulate_pv_vecs<L, NQ>(p, v, row_stride, j0, j1, n_vecs, acc, dv);
  for (int64_t d = n_vecs * kWidth; d < head_dim; ++d)
    for (int t = 0; t < NQ; ++t)
      for (int64_t j = j0; j < j1; ++j) acc[t * dv + d] += p[t * kBlockKeys + j] * scalar_at<L>(v + j * row_stride, d);
}

// Dispatches fn.template operator()<NQ>() for NQ = nqb in [1, kQBlock].
template <class Fn>
inline void with_nq(int nqb, Fn&& fn) {
  switch (nqb) {
    case 1: fn.template operator()<1>(); break;
    case 2: fn.template operator()<2>(); break;
    case 3: if constexpr (kQBlock >= 3) fn.template operator()<3>(); break;
    default: if constexpr (kQBlock >= 4) fn.template operator()<4>(); break;
  }
}

// Online-softmax step for query vector t over one block: turns its scores st[0:kBlockKeys]
// (lanes outside [jlo, jhi) are garbage) into probabilities relative to the new running max,
// rescaling the running sum and accumulator when the max grows.
inline void softmax_step(const AttentionArgs& a, Scratch& sc, int64_t t, int64_t dv, int64_t jlo, int64_t jhi,
                         float* st) {
  if (a.softcap > 0.0f)
    for (int c = 0; c < kScoreVecs; ++c) store(st + c * kWidth, soft_cap(load(st + c * kWidth), a.softcap));
  // Lanes outside [jlo, jhi) may hold garbage (even NaN): overwrite, never compute with them;
  // their p is then exactly 0.
  for (int64_t j = 0; j < std::min<int64_t>(jlo, kBlockKeys); ++j) st[j] = kNegInf;
  for (int64_t j = std::max<int64_t>(jhi, 0); j < kBlockKeys; ++j) st[j] = kNegInf;
  Vec vmax = set1(kNegInf);
  for (int c = 0; c < kScoreVecs; ++c) vmax = max(vmax, load(st + c * kWidth));
  const float m_old = sc.m[t];
  const float m_new = std::max(m_old, reduce_max(vmax));
  if (m_new == kNegInf) {  // nothing visible yet
    for (int c = 0; c < kScoreVecs; ++c) store(st + c * kWidth, zero());
    return;
  }
  const Vec mv = set1(m_new);
  Vec vsum = zero();
  for (int c = 0; c < kScoreVecs; ++c) {
    const Vec p = exp(sub(load(st + c * kWidth), mv));
    store(st + c * kWidth, p);
    vsum = add(vsum, p);
  }
  if (m_new > m_old) {
    const float corr = std::exp(m_old - m_new);  // 0 when m_old is -inf
    sc.l[t] *= corr;
    float* acc = sc.acc.data() + t * dv;
    const Vec cv = set1(corr);
    for (int64_t d = 0; d < dv; d += kWidth) store(acc + d, mul(load(acc + d), cv));
    sc.m[t] = m_new;
  }
  sc.l[t] += reduce_add(vsum);
}

// An item's query vectors (rows [i0, i1) of kv head hk, the group's G heads each) into the
// scratch, pre-scaled, with their visible keys within the split [s0, s1) and an empty running
// softmax; [k_begin, k_end) widened to the union of the visible ranges.
inline void init_queries(const AttentionArgs& a, const Plan& pl, int64_t hk, int64_t i0, int64_t i1, int64_t s0,
                         int64_t s1, Scratch& sc, int64_t* k_begin, int64_t* k_end) {
  const int64_t D = a.head_dim, dv = pl.dv, G = pl.group;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t lo, hi;
    visible_keys(a, i, &lo, &hi);
    lo = std::max(lo, s0);
    hi = std::min(hi, s1);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t t = (i - i0) * G + g;
      sc.lo[t] = lo;
      sc.hi[t] = hi;
      const float* q = a.q + (i * a.n_heads + hk * G + g) * D;
      for (int64_t d = 0; d < D; ++d) sc.qs[t * D + d] = q[d] * a.scale;
      sc.m[t] = kNegInf;
      sc.l[t] = 0.0f;
      std::fill_n(sc.acc.data() + t * dv, dv, 0.0f);
    }
    if (lo < hi) {
      *k_begin = std::min(*k_begin, lo);
      *k_end = std::max(*k_end, hi);
    }
  }
}

// An item's nq query vectors out: normalised rows to a.out, or with `partial` the unnormalised
// (acc[dv], m, l) of each.
inline void write_item(const AttentionArgs& a, const Plan& pl, int64_t hk, int64_t i0, int64_t nq, const Scratch& sc,
                       float* partial) {
  const int64_t D = a.head_dim, dv = pl.dv, G = pl.group;
  for (int64_t t = 0; t < nq; ++t) {
    const int64_t i = i0 + t / G, h = hk * G + t % G;
    const float* acc = sc.acc.data() + t * dv;
    if (partial) {
      float* dst = partial + t * (dv + 2);
      std::copy_n(acc, dv, dst);
      dst[dv] = sc.m[t];
      dst[dv + 1] = sc.l[t];
    } else {
      float* dst = a.out + (i * a.n_heads + h) * D;
      const float inv = sc.l[t] > 0.0f ? 1.0f / sc.l[t] : 0.0f;
      for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * inv;
    }
  }
}

// Runs one item; writes normalised rows to a.out when the keys are not split, else the
// unnormalised partial (acc[dv], m, l per query vector) to `partial`.
template <class LK, class LV>
void run_item(const AttentionArgs& a, const Plan& pl, int64_t hk, int64_t rb, int64_t split, Scratch& sc,
              float* partial) {
  const int64_t D = a.head_dim, dv = pl.dv, G = pl.group;
  const int64_t i0 = rb * pl.rows_per_item, i1 = std::min(a.n, i0 + pl.rows_per_item);
  const int64_t nq = (i1 - i0) * G;
  const int64_t s0 = split * pl.split_keys, s1 = std::min(a.n_keys, s0 + pl.split_keys);
  sc.reserve(D, dv, nq);

  int64_t k_begin = s1, k_end = s0;
  init_queries(a, pl, hk, i0, i1, s0, s1, sc, &k_begin, &k_end);

  // Few query vectors (decode): read K and V straight from the cache. Many: convert each block
  // once into f32 scratch (K transposed) shared by all of them.
  const bool direct = nq <= kDirectMaxQueries;
  // Element sizes: strides count elements (bytes for packed rows).
  constexpr int64_t kes = sizeof(typename LK::T), ves = sizeof(typename LV::T);
  const char* kh = reinterpret_cast<const char*>(a.k) + hk * a.k_head_stride * kes;
  const char* vh = reinterpret_cast<const char*>(a.v) + hk * a.v_head_stride * ves;
  const int64_t k_row_bytes = row_width(a.k_elem, D) * kes, v_row_bytes = row_width(a.v_elem, D) * ves;
  // Key j sits at row(j); in a ring, keys [0, wrap) are rows [ring_base, ring_rows) and keys
  // [wrap, ..) rows [0, ..), so no block crosses `wrap`.
  const int64_t R = a.ring_rows, wrap = R > 0 ? R - a.ring_base : k_end;
  auto row = [&](int64_t j) { return R > 0 ? (j < wrap ? j + a.ring_base : j - wrap) : j; };
  auto block_keys = [&](int64_t b) { return std::min(kBlockKeys, (b < wrap ? std::min(wrap, k_end) : k_end) - b); };
  alignas(64) float s[kQBlock * kBlockKeys];  // scores, then probabilities
  for (int64_t b0 = k_begin, nb = 0; b0 < k_end; b0 += nb) {
    nb = block_keys(b0);
    // NOTE: the next block's rows are requested now, so that memory streams while this block
    // computes (decode reads each cached row exactly once).
    const int64_t nb_next = b0 + nb < k_end ? block_keys(b0 + nb) : 0;
    const int64_t next_row = row(b0 + nb);
    for (int64_t j = 0; j < nb_next; ++j) {
      const char* kr = kh + (next_row + j) * a.k_row_stride * kes;
      const char* vr = vh + (next_row + j) * a.v_row_stride * ves;
      for (int64_t byte = 0; byte < k_row_bytes; byte += 64) __builtin_prefetch(kr + byte, 0, 2);
      for (int64_t byte = 0; byte < v_row_bytes; byte += 64) __builtin_prefetch(vr + byte, 0, 2);
    }
    const auto* kb = reinterpret_cast<const typename LK::T*>(kh + row(b0) * a.k_row_stride * kes);
    const auto* vb = reinterpret_cast<const typename LV::T*>(vh + row(b0) * a.v_row_stride * ves);
    if (!direct) {
      if constexpr (kPacked<LK>) {
        for (int64_t j = 0; j < nb; ++j) dequantize_row<LK>(kb + j * a.k_row_stride, D, sc.kq.data() + j * D);
        convert_k_block<F32>(sc.kq.data(), D, nb, D, sc.kt.data());
      } else {
        convert_k_block<LK>(kb, a.k_row_stride, nb, D, sc.kt.data());
      }
      if constexpr (kPacked<LV>) {
        for (int64_t j = 0; j < nb; ++j) {
          float* dst = sc.vf.data() + j * dv;
          dequantize_row<LV>(vb + j * a.v_row_stride, D, dst);
          std::fill(dst + D, dst + dv, 0.0f);
        }
      } else {
        convert_v_block<LV>(vb, a.v_row_stride, nb, D, dv, sc.vf.data());
      }
    }
    for (int64_t t0 = 0; t0 < nq; t0 += kQBlock) {
      const int nqb = int(std::min<int64_t>(kQBlock, nq - t0));
      int64_t ulo = nb, uhi = 0;  // union of the visible ranges in this block
      for (int u = 0; u < nqb; ++u) {
        ulo = std::min(ulo, std::max<int64_t>(sc.lo[t0 + u] - b0, 0));
        uhi = std::max(uhi, std::min<int64_t>(sc.hi[t0 + u] - b0, nb));
      }
      if (ulo >= uhi) continue;
      const float* q = sc.qs.data() + t0 * D;
      float* acc = sc.acc.data() + t0 * dv;
      with_nq(nqb, [&]<int NQ>() {
        if (direct)
          direct_scores<LK, NQ>(q, kb, a.k_row_stride, nb, D, s);
        else
          block_scores<NQ>(q, sc.kt.data(), D, s);
      });
      for (int u = 0; u < nqb; ++u)
        softmax_step(a, sc, t0 + u, dv, sc.lo[t0 + u] - b0, std::min(sc.hi[t0 + u] - b0, nb), s + u * kBlockKeys);
      with_nq(nqb, [&]<int NQ>() {
        if (direct)
          direct_pv_all<LV, NQ>(s, vb, a.v_row_stride, ulo, uhi, D, acc, dv);
        else
          accumulate_pv_all<NQ>(s, sc.vf.data(), dv, ulo, uhi, acc);
      });
    }
  }

  write_item(a, pl, hk, i0, nq, sc, partial);
}

}  // namespace

void attention(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  const Plan pl = make_plan(a, pool.n_threads());
  // `bf16` alone means both sides (kernel_args.h).
  const KVElem k_elem = a.bf16 && a.k_elem == KVElem::f16 ? KVElem::bf16 : a.k_elem;
  const KVElem v_elem = a.bf16 && a.v_elem == KVElem::f16 ? KVElem::bf16 : a.v_elem;
  const int64_t per_item = pl.rows_per_item * pl.group * (pl.dv + 2);
  // NOTE: thread_local of the calling thread; workers reach it through `part_base` only.
  thread_local std::vector<float> partials;
  if (pl.n_splits > 1 && int64_t(partials.size()) < pl.n_items * per_item)
    partials.resize(size_t(pl.n_items * per_item));
  float* part_base = partials.data();

  // Heaviest items (last row blocks under the causal mask) first.
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t, int) {
    thread_local Scratch sc;
    for (int64_t item = next.fetch_add(1); item < pl.n_items; item = next.fetch_add(1)) {
      const int64_t split = item % pl.n_splits;
      const int64_t hk = (item / pl.n_splits) % a.n_kv_heads;
      const int64_t rb = pl.n_row_blocks - 1 - item / (pl.n_splits * a.n_kv_heads);
      float* partial = pl.n_splits > 1 ? part_base + item * per_item : nullptr;
      run_for_elems(k_elem, v_elem, [&]<class LK, class LV>() { run_item<LK, LV>(a, pl, hk, rb, split, sc, partial); });
    }
  };
  // NOTE: passed through std::ref so that std::function does not allocate (decode path).
  pool.parallel_for(std::min<int64_t>(pool.n_threads(), pl.n_items), 1, std::ref(work));
  if (pl.n_splits == 1) return;

  // Merge the key ranges: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
  const int64_t D = a.head_dim, dv = pl.dv, G = pl.group;
  for (int64_t rb = 0; rb < pl.n_row_blocks; ++rb) {
    const int64_t i0 = rb * pl.rows_per_item, i1 = std::min(a.n, i0 + pl.rows_per_item);
    for (int64_t hk = 0; hk < a.n_kv_heads; ++hk) {
      const int64_t first = ((pl.n_row_blocks - 1 - rb) * a.n_kv_heads + hk) * pl.n_splits;
      for (int64_t t = 0; t < (i1 - i0) * G; ++t)
        merge_splits(part_base + first * per_item + t * (dv + 2), per_item, pl.n_splits, D, dv,
                     a.out + ((i0 + t / G) * a.n_heads + hk * G + t % G) * D);
    }
  }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
