// paged_attention(): one decode query per sequence against its keys in a paged pool: f16, bf16,
// or packed rows (q8_0, fp8_e4m3: kv_rows.h), keys and values each in their own format, every
// row decoded in registers as it is read (no f32 copy of it).
//
// A work item is (sequence, kv head, split of kPagedSplitKeys key positions). Its query vectors
// are the G query heads that read the kv head, pre-scaled by `scale`; each keeps a running max,
// sum and f32 accumulator (online softmax) while the item walks its visible keys in order, a
// block of up to kBlockKeys keys at a time (gathered through the block table, so a block may
// span pool blocks). Per block: the scores of every query vector of the group against every key
// of the block (each K row decoded once for up to kMaxNQ query vectors), one online-softmax
// step per query vector (vectorized over the block's keys), then P·V with the accumulators held
// in registers (each V row decoded once for up to kMaxNQ query vectors). On fp8 rows the row's
// scale is taken out of the decoding: a key's score is scaled once, a value's weight carries its
// row's scale. Items write unnormalised partials (acc, m, l); a sequence's partials are then
// merged split by split in ascending order. Nothing in an item or in the merge depends on the
// batch, the thread count or the order in which items run (a block starts where the sequence's
// own visible keys in the split do), so each sequence's output is bit for bit the one it gets
// alone.
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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kBlockKeys = 32;                       // keys per online-softmax step (a multiple of kWidth)
constexpr int kMaxNQ = kRegisters >= 32 ? 8 : 4;  // query vectors that share one decoding of a row
static_assert(kBlockKeys % kWidth == 0);

// The keys sequence i's query sees: [lo, hi) (empty when hi <= lo).
inline void visible_keys(const PagedAttentionArgs& a, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t len = a.seq_lens[i];
  *hi = len;
  *lo = a.window > 0 ? std::max<int64_t>(0, len - a.window) : 0;
}

template <class L>
constexpr bool kFp8 = std::is_same_v<L, E4M3Rows>;

// Elements [d, d + kWidth) of a row as the kernels multiply them: an fp8 row's codes (its scale
// is applied by the caller: row_scale), any other row's values.
template <class L, bool kMayNaN>
__attribute__((always_inline)) inline Vec read_vec(const typename L::T* row, int64_t d) {
  if constexpr (kFp8<L>)
    return L::template load_codes<kMayNaN>(row, d);
  else
    return load_at<L>(row, d);
}

// Whether any of the nb fp8 rows holds a NaN code (only a NaN input writes one): the blocks
// without one skip fixing the NaN lanes.
template <class L>
inline bool any_nan(const typename L::T* const* rows, int nb, int64_t head_dim) {
  if constexpr (kFp8<L>) {
    bool any = false;
    for (int u = 0; u < nb; ++u) any |= L::has_nan(rows[u], head_dim);
    return any;
  } else {
    return false;
  }
}

// s[t][u] = sum_d q[t][d] * k_u[d] for t < NQ, u < nb (lanes past nb of each kWidth chunk are
// left undefined); q: [NQ][head_dim], s rows kBlockKeys apart; ks[u]: key u's fp8 row scale.
// Each decoded vector of a key feeds NQ FMAs; KS keys at a time give NQ * KS independent
// chains, and kWidth keys' partial sums are reduced together (sum_rows).
template <class L, int NQ, bool kMayNaN>
void block_scores(const float* q, const typename L::T* const* kr, const float* ks, int nb, int64_t head_dim,
                  float* s) {
  constexpr int KS = std::min(kWidth, NQ >= 4 ? 2 : 4);
  const int64_t d_vec = head_dim - head_dim % kWidth;
  for (int j0 = 0; j0 < nb; j0 += kWidth) {
    const int nk = std::min(kWidth, nb - j0);
    Vec dots[NQ][kWidth];
    for (int e0 = 0; e0 < nk; e0 += KS) {
      const typename L::T* rows[KS];  // keys past nk repeat the last one; their sums are dropped
#pragma GCC unroll 4
      for (int u = 0; u < KS; ++u) rows[u] = kr[j0 + std::min(e0 + u, nk - 1)];
      Vec acc[NQ][KS];
#pragma GCC unroll 8
      for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u) acc[t][u] = zero();
      for (int64_t d = 0; d < d_vec; d += kWidth) {
        Vec kf[KS];
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u) kf[u] = read_vec<L, kMayNaN>(rows[u], d);
#pragma GCC unroll 8
        for (int t = 0; t < NQ; ++t) {
          const Vec qv = load(q + t * head_dim + d);
#pragma GCC unroll 4
          for (int u = 0; u < KS; ++u) acc[t][u] = fma(qv, kf[u], acc[t][u]);
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 4
        for (int u = 0; u < KS; ++u)
          if (e0 + u < kWidth) dots[t][e0 + u] = acc[t][u];
    }
    for (int t = 0; t < NQ; ++t) {
      for (int e = nk; e < kWidth; ++e) dots[t][e] = zero();
      Vec sv = sum_rows(dots[t]);
      if constexpr (kFp8<L>) sv = mul(sv, load(ks + j0));
      store(s + t * kBlockKeys + j0, sv);
      for (int64_t d = d_vec; d < head_dim; ++d)
        for (int e = 0; e < nk; ++e) s[t * kBlockKeys + j0 + e] += q[t * head_dim + d] * scalar_at<L>(kr[j0 + e], d);
    }
  }
}

// acc[t][col0 + c * kWidth, + kWidth) += sum_{u < nb} p[t][u] * v_u[same columns] for t < NQ,
// c < NV; p rows kBlockKeys apart (on fp8 rows, p carries the row's scale: row_scale), acc rows
// ld_acc apart. The NQ x NV accumulators stay in registers over the block; each vector of a
// value row is decoded once for the NQ query vectors.
template <class L, int NQ, int NV, bool kMayNaN>
__attribute__((always_inline)) inline void pv_tile(const float* p, const typename L::T* const* vr, int nb,
                                                   int64_t col0, float* acc, int64_t ld_acc) {
  Vec a[NQ][NV];
#pragma GCC unroll 8
  for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) a[t][c] = load(acc + t * ld_acc + col0 + c * kWidth);
  for (int u = 0; u < nb; ++u) {
    Vec v[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) {
      Vec y = read_vec<L, kMayNaN>(vr[u], col0 + c * kWidth);
      pin(y);
      v[c] = y;
    }
#pragma GCC unroll 8
    for (int t = 0; t < NQ; ++t) {
      const Vec pt = set1(p[t * kBlockKeys + u]);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) a[t][c] = fma(pt, v[c], a[t][c]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NQ; ++t)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) store(acc + t * ld_acc + col0 + c * kWidth, a[t][c]);
}

// pv_tile over every column of the rows: whole vectors NV at a time (registers: NQ * NV
// accumulators and NV values), the last head_dim % kWidth columns one by one with p_plain (the
// probabilities without the fp8 row scales, as scalar_at applies them).
template <class L, int NQ, bool kMayNaN>
void block_pv(const float* p, const float* p_plain, const typename L::T* const* vr, int nb, int64_t head_dim,
              float* acc, int64_t ld_acc) {
  constexpr int NV = NQ == 1 ? std::min(8, kRegisters / 2) : NQ <= 4 ? kRegisters / 8 : kRegisters / 16;
  const int64_t n_vecs = head_dim / kWidth;
  int64_t c0 = 0;
  for (; c0 + NV <= n_vecs; c0 += NV) pv_tile<L, NQ, NV, kMayNaN>(p, vr, nb, c0 * kWidth, acc, ld_acc);
  for (; c0 < n_vecs; ++c0) pv_tile<L, NQ, 1, kMayNaN>(p, vr, nb, c0 * kWidth, acc, ld_acc);
  for (int64_t d = n_vecs * kWidth; d < head_dim; ++d)
    for (int t = 0; t < NQ; ++t)
      for (int u = 0; u < nb; ++u) acc[t * ld_acc + d] += p_plain[t * kBlockKeys + u] * scalar_at<L>(vr[u], d);
}

// Calls fn.template operator()<NQ>(g0) over the G query vectors in chunks of NQ in {8, 4, 2, 1}
// (at most kMaxNQ), largest first.
template <class Fn>
inline void over_chunks(int64_t G, Fn&& fn) {
  for (int64_t g0 = 0; g0 < G;) {
    const int64_t n = G - g0;
    if (kMaxNQ >= 8 && n >= 8) {
      if constexpr (kMaxNQ >= 8) fn.template operator()<8>(g0);
      g0 += 8;
    } else if (n >= 4) {
      fn.template operator()<4>(g0);
      g0 += 4;
    } else if (n >= 2) {
      fn.template operator()<2>(g0);
      g0 += 2;
    } else {
      fn.template operator()<1>(g0);
      g0 += 1;
    }
  }
}

// s = softcap * tanh(s / softcap), through tanh(y) = 1 - 2 / (exp(2y) + 1).
inline Vec soft_cap(Vec s, float softcap) {
  const Vec e = exp(mul(s, set1(2.0f / softcap)));
  const Vec one = set1(1.0f);
  const Vec t = sub(one, div(set1(2.0f), add(e, one)));
  return mul(t, set1(softcap));
}

// The online-softmax step of one query vector over a block: its scores st[0:nb) (lanes past nb
// are garbage) become the probabilities relative to the new running max (lanes past nb: 0);
// part = (acc[D], m, l) is rescaled when the max grows.
inline void softmax_step(float* st, int nb, float softcap, float* part, int64_t D) {
  const int n_chunks = (nb + kWidth - 1) / kWidth;
  if (softcap > 0.0f)
    for (int c = 0; c < n_chunks; ++c) store(st + c * kWidth, soft_cap(load(st + c * kWidth), softcap));
  // Lanes past nb may hold garbage (even NaN): overwrite, never compute with them.
  for (int j = nb; j < n_chunks * kWidth; ++j) st[j] = kNegInf;
  Vec vmax = set1(kNegInf);
  for (int c = 0; c < n_chunks; ++c) vmax = max(vmax, load(st + c * kWidth));
  const float m_old = part[D], m_new = std::max(m_old, reduce_max(vmax));
  if (m_new == kNegInf) {  // nothing visible (cannot happen with nb >= 1 and finite scores)
    for (int c = 0; c < n_chunks; ++c) store(st + c * kWidth, zero());
    return;
  }
  const Vec mv = set1(m_new);
  Vec vsum = zero();
  for (int c = 0; c < n_chunks; ++c) {
    const Vec p = exp(sub(load(st + c * kWidth), mv));
    store(st + c * kWidth, p);
    vsum = add(vsum, p);
  }
  if (m_new > m_old) {
    const float corr = std::exp(m_old - m_new);  // 0 when m_old is -inf
    part[D + 1] *= corr;
    const int64_t d_vec = D - D % kWidth;
    const Vec cv = set1(corr);
    for (int64_t d = 0; d < d_vec; d += kWidth) store(part + d, mul(load(part + d), cv));
    for (int64_t d = d_vec; d < D; ++d) part[d] *= corr;
    part[D] = m_new;
  }
  part[D + 1] += reduce_add(vsum);
}

// The row of the pool in format L at element (byte, when packed) offset `at` of `base`.
template <class L>
inline const typename L::T* pool_row(const uint16_t* base, int64_t at) {
  const char* bytes = reinterpret_cast<const char*>(base) + at * int64_t(sizeof(typename L::T));
  return reinterpret_cast<const typename L::T*>(bytes);
}

// Per-thread buffers of one item; grown once, reused across calls.
struct Scratch {
  std::vector<float> qs;  // [G][D] scaled queries
  std::vector<float> s;   // [G][kBlockKeys] scores, then probabilities
  std::vector<float> pv;  // [G][kBlockKeys] probabilities times the value rows' fp8 scales
};

// One item. partial: [G][head_dim + 2] = acc, m, l per query vector (m = -inf: nothing seen).
template <class LK, class LV>
void run_item(const PagedAttentionArgs& a, int64_t i, int64_t hk, int64_t split, Scratch& sc, float* partial) {
  const int64_t D = a.head_dim, G = a.n_heads / a.n_kv_heads, P = D + 2;
  int64_t lo, hi;
  visible_keys(a, i, &lo, &hi);
  lo = std::max(lo, split * a.split_keys);
  hi = std::min(hi, (split + 1) * a.split_keys);
  for (int64_t g = 0; g < G; ++g) {
    float* part = partial + g * P;
    std::fill_n(part, D, 0.0f);
    part[D] = kNegInf;
    part[D + 1] = 0.0f;
  }
  if (lo >= hi) return;

  auto grow = [](std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
  };
  grow(sc.qs, G * D);
  grow(sc.s, G * kBlockKeys);
  grow(sc.pv, G * kBlockKeys);
  for (int64_t g = 0; g < G; ++g) {
    const float* q = a.q + i * a.q_row_stride + (hk * G + g) * D;
    for (int64_t d = 0; d < D; ++d) sc.qs[size_t(g * D + d)] = q[d] * a.scale;
  }
  const int32_t* table = a.block_tables + i * a.max_blocks;
  const int64_t bs = a.block_size, kw = row_width(a.k_elem, D), vw = row_width(a.v_elem, D);
  constexpr int64_t kes = sizeof(typename LK::T), ves = sizeof(typename LV::T);
  const int64_t k_row_bytes = kw * kes, v_row_bytes = vw * ves;
  auto row_index = [&](int64_t j) { return (int64_t(table[j / bs]) * a.n_kv_heads + hk) * bs + j % bs; };
  float* s = sc.s.data();
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockKeys) {
    const int nb = int(std::min<int64_t>(kBlockKeys, hi - j0));
    const typename LK::T* kr[kBlockKeys];
    const typename LV::T* vr[kBlockKeys];
    alignas(64) float ks[kBlockKeys], vs[kBlockKeys];
    for (int u = 0; u < nb; ++u) {
      const int64_t r = row_index(j0 + u);
      kr[u] = pool_row<LK>(a.k, r * kw);
      vr[u] = pool_row<LV>(a.v, r * vw);
      if constexpr (kFp8<LK>) ks[u] = LK::row_scale(kr[u]);
      if constexpr (kFp8<LV>) vs[u] = LV::row_scale(vr[u]);
    }
    for (int u = nb; u < kBlockKeys; ++u) ks[u] = vs[u] = 0.0f;
    // NOTE: the next block's rows are requested now, so that memory streams while this block
    // computes (a pool block's rows are contiguous, but the blocks are scattered).
    const int64_t nb_next = std::min<int64_t>(kBlockKeys, hi - j0 - nb);
    for (int64_t u = 0; u < nb_next; ++u) {
      const int64_t r = row_index(j0 + nb + u);
      const char* kp = reinterpret_cast<const char*>(a.k) + r * k_row_bytes;
      const char* vp = reinterpret_cast<const char*>(a.v) + r * v_row_bytes;
      for (int64_t byte = 0; byte < k_row_bytes; byte += 64) __builtin_prefetch(kp + byte, 0, 2);
      for (int64_t byte = 0; byte < v_row_bytes; byte += 64) __builtin_prefetch(vp + byte, 0, 2);
    }

    const bool k_nan = any_nan<LK>(kr, nb, D);
    over_chunks(G, [&]<int NQ>(int64_t g0) {
      if (k_nan)
        block_scores<LK, NQ, true>(sc.qs.data() + g0 * D, kr, ks, nb, D, s + g0 * kBlockKeys);
      else
        block_scores<LK, NQ, false>(sc.qs.data() + g0 * D, kr, ks, nb, D, s + g0 * kBlockKeys);
    });
    for (int64_t g = 0; g < G; ++g) softmax_step(s + g * kBlockKeys, nb, a.softcap, partial + g * P, D);
    // fp8 values: each key's weight carries its row's scale (the codes are decoded unscaled).
    const float* pw = s;
    if constexpr (kFp8<LV>) {
      for (int64_t g = 0; g < G; ++g)
        for (int c = 0; c < kBlockKeys; c += kWidth)
          store(sc.pv.data() + g * kBlockKeys + c, mul(load(s + g * kBlockKeys + c), load(vs + c)));
      pw = sc.pv.data();
    }
    const bool v_nan = any_nan<LV>(vr, nb, D);
    over_chunks(G, [&]<int NQ>(int64_t g0) {
      if (v_nan)
        block_pv<LV, NQ, true>(pw + g0 * kBlockKeys, s + g0 * kBlockKeys, vr, nb, D, partial + g0 * P, P);
      else
        block_pv<LV, NQ, false>(pw + g0 * kBlockKeys, s + g0 * kBlockKeys, vr, nb, D, partial + g0 * P, P);
    });
  }
}

}  // namespace

void paged_attention(const PagedAttentionArgs& a, ThreadPool& pool) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  const int64_t D = a.head_dim, G = a.n_heads / a.n_kv_heads, P = D + 2;
  // Splits past the longest sequence hold nothing: the host reads the lengths, so the items
  // and partials cover only the live key range (a split's bounds stay multiples of
  // split_keys, so a sequence's result does not depend on the others).
  int64_t max_len = 1;
  for (int64_t i = 0; i < a.n; ++i) max_len = std::max<int64_t>(max_len, a.seq_lens[i]);
  max_len = std::min(max_len, a.max_blocks * a.block_size);
  const int64_t n_splits = std::max<int64_t>(1, (max_len + a.split_keys - 1) / a.split_keys);
  const int64_t n_items = a.n * a.n_kv_heads * n_splits;
  // NOTE: thread_local of the calling thread; workers reach it through `part_base` only.
  thread_local std::vector<float> partials;
  if (int64_t(partials.size()) < n_items * G * P) partials.resize(size_t(n_items * G * P));
  float* part_base = partials.data();

  // Items of splits past a sequence's length return at once; a sequence's items are adjacent,
  // so threads take the live ones of all sequences in turn.
  // `bf16` alone means both sides (kernel_args.h).
  const KVElem k_elem = a.bf16 && a.k_elem == KVElem::f16 ? KVElem::bf16 : a.k_elem;
  const KVElem v_elem = a.bf16 && a.v_elem == KVElem::f16 ? KVElem::bf16 : a.v_elem;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t, int) {
    thread_local Scratch sc;
    for (int64_t item = next.fetch_add(1); item < n_items; item = next.fetch_add(1)) {
      const int64_t split = item % n_splits, hk = (item / n_splits) % a.n_kv_heads, i = item / (n_splits * a.n_kv_heads);
      float* partial = part_base + item * G * P;
      run_for_elems(k_elem, v_elem,
                    [&]<class LK, class LV>() { run_item<LK, LV>(a, i, hk, split, sc, partial); });
    }
  };
  // NOTE: passed through std::ref so that std::function does not allocate (decode path).
  pool.parallel_for(std::min<int64_t>(pool.n_threads(), n_items), 1, std::ref(work));

  // Merge each (sequence, head) over its splits in ascending order:
  // out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
  for (int64_t i = 0; i < a.n; ++i)
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const int64_t hk = h / G, g = h % G;
      // No visible key (an empty sequence): zeros.
      merge_splits(part_base + ((i * a.n_kv_heads + hk) * n_splits) * G * P + g * P, G * P, n_splits, D, D,
                   a.out + (i * a.n_heads + h) * D);
    }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
