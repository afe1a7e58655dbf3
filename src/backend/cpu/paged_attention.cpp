// paged_attention(): one decode query per sequence against its keys in a paged pool: f16, bf16,
// or packed rows (q8_0, fp8_e4m3: kv_rows.h), keys and values each in their own format. A
// packed row is decoded in registers where one query vector reads it, and dequantized once
// into an f32 row (which stays in L1) where the group's several query vectors all read it.
//
// A work item is (sequence, kv head, split of kPagedSplitKeys key positions). Its query vectors
// are the G query heads that read the kv head, pre-scaled by `scale`; each keeps a running max,
// sum and f32 accumulator (online softmax) while the item walks its visible keys in order, one
// pool row at a time (each K and V row is read once for the whole group). Items write
// unnormalised partials (acc, m, l); a sequence's partials are then merged split by split in
// ascending order. Nothing in an item or in the merge depends on the batch, the thread count or
// the order in which items run, so each sequence's output is bit for bit the one it gets alone.
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
constexpr int kRowsAtOnce = 4;  // keys whose scores are computed together

// The keys sequence i's query sees: [lo, hi) (empty when hi <= lo).
inline void visible_keys(const PagedAttentionArgs& a, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t len = a.seq_lens[i];
  *hi = len;
  *lo = a.window > 0 ? std::max<int64_t>(0, len - a.window) : 0;
}

// sum_d q[d] * row[d]. NOTE: one row's dot is a chain of dependent FMAs (latency-bound); on
// packed rows the scales are taken out of it (a q8_0 block's sum is scaled once, an fp8 row's
// once), which shortens the chain and drops a multiply per vector.
template <class L>
inline float dot_row(const float* q, const typename L::T* row, int64_t head_dim) {
  const int64_t d_vec = head_dim - head_dim % kWidth;
  Vec acc = zero();
  if constexpr (std::is_same_v<L, Q8_0Rows>) {
    // head_dim is a multiple of the block (32), and of kWidth.
    for (int64_t b = 0; b < head_dim; b += kvq::kQ8Block) {
      Vec blk = zero();
      for (int64_t d = b; d < b + kvq::kQ8Block; d += kWidth) blk = fma(load(q + d), L::load_codes(row, d), blk);
      acc = fma(set1(L::block_scale(row, b)), blk, acc);
    }
    return reduce_add(acc);
  } else if constexpr (std::is_same_v<L, E4M3Rows>) {
    Vec acc2 = zero();
    int64_t d = 0;
    auto codes = [&]<bool kMayNaN>() {
      for (; d + 2 * kWidth <= d_vec; d += 2 * kWidth) {
        acc = fma(load(q + d), L::template load_codes<kMayNaN>(row, d), acc);
        acc2 = fma(load(q + d + kWidth), L::template load_codes<kMayNaN>(row, d + kWidth), acc2);
      }
      if (d < d_vec) acc = fma(load(q + d), L::template load_codes<kMayNaN>(row, d), acc);
    };
    // NOTE: a row without NaN codes (every row a finite K/V wrote) skips the NaN fixing.
    if (L::has_nan(row, head_dim))
      codes.template operator()<true>();
    else
      codes.template operator()<false>();
    float s = L::row_scale(row) * reduce_add(add(acc, acc2));
    for (d = d_vec; d < head_dim; ++d) s += q[d] * scalar_at<L>(row, d);
    return s;
  } else {
    for (int64_t d = 0; d < d_vec; d += kWidth) acc = fma(load(q + d), load_at<L>(row, d), acc);
    float s = reduce_add(acc);
    for (int64_t d = d_vec; d < head_dim; ++d) s += q[d] * scalar_at<L>(row, d);
    return s;
  }
}

// acc[d] = acc[d] * c + p * row[d]; on packed rows p carries the block's or row's scale.
template <class L>
inline void scale_add_row(float* acc, float c, float p, const typename L::T* row, int64_t head_dim) {
  const int64_t d_vec = head_dim - head_dim % kWidth;
  const Vec cv = set1(c);
  if constexpr (std::is_same_v<L, Q8_0Rows>) {
    for (int64_t b = 0; b < head_dim; b += kvq::kQ8Block) {
      const Vec pv = set1(p * L::block_scale(row, b));
      for (int64_t d = b; d < b + kvq::kQ8Block; d += kWidth)
        store(acc + d, fma(pv, L::load_codes(row, d), mul(load(acc + d), cv)));
    }
    return;
  }
  Vec pv = set1(p);
  if constexpr (std::is_same_v<L, E4M3Rows>) {
    pv = set1(p * L::row_scale(row));
    auto codes = [&]<bool kMayNaN>() {
      for (int64_t d = 0; d < d_vec; d += kWidth)
        store(acc + d, fma(pv, L::template load_codes<kMayNaN>(row, d), mul(load(acc + d), cv)));
    };
    if (L::has_nan(row, head_dim))
      codes.template operator()<true>();
    else
      codes.template operator()<false>();
  } else {
    for (int64_t d = 0; d < d_vec; d += kWidth) store(acc + d, fma(pv, load_at<L>(row, d), mul(load(acc + d), cv)));
  }
  for (int64_t d = d_vec; d < head_dim; ++d) acc[d] = acc[d] * c + p * scalar_at<L>(row, d);
}

// The row of the pool in format L at element (byte, when packed) offset `at` of `base`.
template <class L>
inline const typename L::T* pool_row(const uint16_t* base, int64_t at) {
  const char* bytes = reinterpret_cast<const char*>(base) + at * int64_t(sizeof(typename L::T));
  return reinterpret_cast<const typename L::T*>(bytes);
}

// A row as the group's query vectors read it: a packed one dequantized into tmp[0:head_dim]
// (read as F32), any other as it is stored.
template <class L>
using ReadAs = std::conditional_t<kPacked<L>, F32, L>;
template <class L>
inline const typename ReadAs<L>::T* read_row(const typename L::T* row, int64_t head_dim, float* tmp) {
  if constexpr (kPacked<L>) {
    dequantize_row<L>(row, head_dim, tmp);
    return tmp;
  } else {
    return row;
  }
}

// One item. partial: [G][head_dim + 2] = acc, m, l per query vector (m = -inf: nothing seen).
template <class LK, class LV>
void run_item(const PagedAttentionArgs& a, int64_t i, int64_t hk, int64_t split, std::vector<float>& qs,
              float* partial) {
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

  // qs: [G][D] scaled queries, then kRowsAtOnce dequantized key rows and as many value rows.
  if (int64_t(qs.size()) < (G + 2 * kRowsAtOnce) * D) qs.resize(size_t((G + 2 * kRowsAtOnce) * D));
  float* kf = qs.data() + G * D;
  float* vf = kf + kRowsAtOnce * D;
  for (int64_t g = 0; g < G; ++g) {
    const float* q = a.q + i * a.q_row_stride + (hk * G + g) * D;
    for (int64_t d = 0; d < D; ++d) qs[size_t(g * D + d)] = q[d] * a.scale;
  }
  const int32_t* table = a.block_tables + i * a.max_blocks;
  const int64_t bs = a.block_size, kw = row_width(a.k_elem, D), vw = row_width(a.v_elem, D);
  // nr consecutive keys' rows for every query vector of the group, read in formats RK and RV:
  // the nr scores first (independent dot products, so that their FMA chains overlap), then the
  // online-softmax steps key by key, in order, as one key at a time would take them.
  auto attend = [&]<class RK, class RV>(int nr, const typename RK::T* const* kr, const typename RV::T* const* vr) {
    for (int64_t g = 0; g < G; ++g) {
      float* part = partial + g * P;
      float sc[kRowsAtOnce];
      for (int u = 0; u < nr; ++u) sc[u] = dot_row<RK>(qs.data() + g * D, kr[u], D);
      for (int u = 0; u < nr; ++u) {
        float s = sc[u];
        if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
        const float m_old = part[D], m_new = std::max(m_old, s);
        const float c = std::exp(m_old - m_new);  // 0 when m_old is -inf
        const float p = std::exp(s - m_new);
        part[D] = m_new;
        part[D + 1] = part[D + 1] * c + p;
        scale_add_row<RV>(part, c, p, vr[u], D);
      }
    }
  };
  // NOTE: one query vector decodes packed rows in registers as it reads them; several share
  // one dequantized copy instead of each decoding the row again. The two round differently
  // (the first applies the scales to sums), both within float rounding of the stored values.
  const bool decode_once = G > 1 && (kPacked<LK> || kPacked<LV>);
  for (int64_t j0 = lo; j0 < hi; j0 += kRowsAtOnce) {
    const int nr = int(std::min<int64_t>(kRowsAtOnce, hi - j0));
    const typename LK::T* kr[kRowsAtOnce];
    const typename LV::T* vr[kRowsAtOnce];
    for (int u = 0; u < nr; ++u) {
      // Row index of (block, head, row in block); times the row width in elements (bytes).
      const int64_t j = j0 + u, r = (int64_t(table[j / bs]) * a.n_kv_heads + hk) * bs + j % bs;
      kr[u] = pool_row<LK>(a.k, r * kw);
      vr[u] = pool_row<LV>(a.v, r * vw);
    }
    if (decode_once) {
      const typename ReadAs<LK>::T* krf[kRowsAtOnce];
      const typename ReadAs<LV>::T* vrf[kRowsAtOnce];
      for (int u = 0; u < nr; ++u) {
        krf[u] = read_row<LK>(kr[u], D, kf + u * D);
        vrf[u] = read_row<LV>(vr[u], D, vf + u * D);
      }
      attend.template operator()<ReadAs<LK>, ReadAs<LV>>(nr, krf, vrf);
    } else {
      attend.template operator()<LK, LV>(nr, kr, vr);
    }
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
    thread_local std::vector<float> qs;
    for (int64_t item = next.fetch_add(1); item < n_items; item = next.fetch_add(1)) {
      const int64_t split = item % n_splits, hk = (item / n_splits) % a.n_kv_heads, i = item / (n_splits * a.n_kv_heads);
      float* partial = part_base + item * G * P;
      run_for_elems(k_elem, v_elem,
                    [&]<class LK, class LV>() { run_item<LK, LV>(a, i, hk, split, qs, partial); });
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
