// linear_q (quant_kernels.h): y = x * dequant(w)^T + bias for MLX affine-quantized w.
//
// n <= kRowsMaxN, bits 2, 4 and 8: kernels that read each word of w once and never write a
// dequantized matrix. With P = 32 / bits codes per word, a block is kWidth consecutive words of
// a row, lane l holding word l, whose codes are block * kWidth * P + l * P + s for s < P
// ("plane" s). Plane s as f32 is (words & (mask << bits * s)) converted, that is q * 2^(bits * s)
// (the top plane is words >> bits * s, so no code reaches the sign bit), and x is permuted and
// scaled once per call to match:
//   xp[block][s][l] = x[block * kWidth * P + l * P + s] * 2^-(bits * s)   (top plane: * 1),
// so that kWidth codes meet x for one and, one convert and one FMA. Per group,
//   sum_k w_k x_k = scale * sum_k q_k x_k + bias * sum_k x_k,
// with the sums of x over each group (xsum) also taken once per call. A unit is one group when a
// group spans whole blocks; when a block spans several groups, a unit is one block and lane l
// takes the scale of word l's group (spread). A row's last, partial block (bits 2 and 4 when
// in is not a whole number of blocks) is read from a zero-padded copy.
//  - n == 1 (matvec_impl): per unit and row, the planes' q * xp summed into a partial, then
//    partial * scale into the row's accumulator; kTileRows rows at a time, so that many
//    streams of w are in flight.
//  - 1 < n <= kRowsMaxN (rows_impl): k in blocks; per k block and tile of kGroupW rows, the
//    tile's q * scale is decoded once into an L1 buffer (decode_tile), then meets each group of
//    up to kGroupX rows of xp (dot_tile), as linear_rows does for dense weights.
// Bits 3 and 6, n <= kRowsMaxN (rows_generic): each row decoded to f32 (decode_row), then dotted
// with every row of x.
// n > kRowsMaxN: the blocked GEMM (gemm_panel.h) with panels decoded by decode_row.
// 4 bits with the int8 kernels: linear_q4_int8 for n == 1, n > kRowsMaxN, and every n where w
// has tiles (8 bits with tiles: linear_q8_tiles for every n).
// Scratch: xp and xsum (thread_local of the caller); converted scales and decoded tiles
// (thread_local of each worker, or on its stack); all grow once.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/gemm_panel.h"
#include "backend/cpu/quant_decode.h"
#include "backend/cpu/quant_int8.h"
#include "core/env.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_simd.h"
#include "core/error.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

using namespace simd;

// Up to this many rows of x the fused kernels run; above, the GEMM.
constexpr int64_t kRowsMaxN = 16;
// Rows of w per matvec tile: concurrent streams of w, each with a partial and an accumulator
// (plus the block's words) in registers.
constexpr int kTileRows = kRegisters >= 32 ? 8 : 4;
// NOTE: the hardware prefetcher alone leaves the matvec well short of memory bandwidth (it is
// nearly compute bound as well); each row's words are also requested this far ahead.
constexpr int64_t kPrefetchWords = 512;
// Rows of x and of w per dot_tile: kWidth accumulators, reduced together by sum_rows.
constexpr int kGroupX = kWidth >= 4 ? 4 : 1;
constexpr int kGroupW = kWidth / kGroupX;
// Groups per k block of rows_impl, at most (sizes the scales on the stack).
constexpr int64_t kMaxBlockGroups = 128;

template <int B, int G>
struct Layout {
  static constexpr int kP = 32 / B;                  // codes per word
  static constexpr int kBlockCodes = kWidth * kP;
  static constexpr bool kSpread = G < kBlockCodes;   // a block spans several groups
  static constexpr int kWordsPerGroup = G / kP;
  static constexpr int kBlocksPerUnit = kSpread ? 1 : G / kBlockCodes;
  static constexpr int kGroupsPerUnit = kSpread ? kBlockCodes / G : 1;
  static constexpr int kUnitCodes = kBlocksPerUnit * kBlockCodes;
  static constexpr int kUnitWords = kBlocksPerUnit * kWidth;
};

// NOTE: the kernels' helpers are forced inline: called out of line, their accumulator arrays
// go through memory on every FMA.
#define OSPREY_INLINE inline __attribute__((always_inline))

// Calls f(std::integral_constant<int, S>{}) for S = 0 .. P - 1.
template <class F, int... S>
OSPREY_INLINE void for_each_plane(F& f, std::integer_sequence<int, S...>) {
  (f(std::integral_constant<int, S>{}), ...);
}
template <int P, class F>
OSPREY_INLINE void for_planes(F&& f) {
  for_each_plane(f, std::make_integer_sequence<int, P>{});
}

// Plane S of a block of words: q * 2^(B * S) per lane (q for the top plane).
template <int B, int S>
OSPREY_INLINE Vec plane(IVec words) {
  constexpr int kP = 32 / B;
  constexpr uint32_t kMask = (1u << B) - 1u;
  if constexpr (S == kP - 1)
    return to_float(shift_right<B * S>(words));
  else
    return to_float(and_bits<(kMask << (B * S))>(words));
}

// The scale of every lane of unit u, from the row's scales as f32 (sc, padded by kWidth).
template <int B, int G>
OSPREY_INLINE Vec unit_scale(const float* sc, int64_t u) {
  using L = Layout<B, G>;
  if constexpr (L::kSpread)
    return spread<L::kWordsPerGroup>(sc + u * L::kGroupsPerUnit);
  else
    return set1(sc[u]);
}

template <class SF>
inline void halves_to_f32(const uint16_t* h, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + kWidth <= n; k += kWidth) store(dst + k, SF::load(h + k));
  for (; k < n; ++k) dst[k] = load_scalar<SF>(h + k);
}

template <class SF>
inline float dot_halves(const uint16_t* h, const float* v, int64_t n) {
  Vec acc = zero();
  int64_t k = 0;
  for (; k + kWidth <= n; k += kWidth) acc = fma(SF::load(h + k), load(v + k), acc);
  float sum = reduce_add(acc);
  for (; k < n; ++k) sum += load_scalar<SF>(h + k) * v[k];
  return sum;
}

// x [n, in] -> xp [n, xp_stride] in plane order (zero past in), xsum [n, xsum_stride] (zero
// past the last group).
template <int B>
void prepare_x(const float* x, int64_t n, int64_t in, int64_t g_size, float* xp, int64_t xp_stride, float* xsum,
               int64_t xsum_stride) {
  constexpr int kP = 32 / B;
  constexpr int64_t kBlockCodes = int64_t(kWidth) * kP;
  const int64_t n_groups = in / g_size, full = in / kBlockCodes * kBlockCodes;
  Vec factor[kP];
  IVec index[kP];
  for (int s = 0; s < kP; ++s) {
    factor[s] = set1(s == kP - 1 ? 1.0f : std::ldexp(1.0f, -B * s));
    index[s] = lane_index(kP, s);
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* xr = x + j * in;
    float* d = xp + j * xp_stride;
    int64_t b0 = 0;
    for (; b0 < full; b0 += kBlockCodes)
      for (int s = 0; s < kP; ++s) store(d + b0 + int64_t(s) * kWidth, mul(gather(xr + b0, index[s]), factor[s]));
    // The tail block (bits 2 and 4, when in is not a whole number of blocks) and the padding.
    for (; b0 < xp_stride; b0 += kBlockCodes)
      for (int s = 0; s < kP; ++s) {
        const float f = s == kP - 1 ? 1.0f : std::ldexp(1.0f, -B * s);
        for (int l = 0; l < kWidth; ++l) {
          const int64_t c = b0 + int64_t(l) * kP + s;
          d[b0 + int64_t(s) * kWidth + l] = c < in ? xr[c] * f : 0.0f;
        }
      }
    float* xs = xsum + j * xsum_stride;
    for (int64_t g = 0; g < n_groups; ++g) {
      Vec acc = zero();
      for (int64_t k = g * g_size; k < (g + 1) * g_size; k += kWidth) acc = add(acc, load(xr + k));
      xs[g] = reduce_add(acc);
    }
    std::fill(xs + n_groups, xs + xsum_stride, 0.0f);
  }
}

// acc[i] += scale * sum over the unit's blocks and planes of q * xp, for NW rows of w (wp: the
// rows' words at the unit's first block; xpu: xp at the unit's first code).
template <int B, int G, int NW>
OSPREY_INLINE void unit_matvec(const uint32_t* const* wp, const float* xpu, const Vec* scale, Vec* acc) {
  using L = Layout<B, G>;
  Vec part[NW];
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) part[i] = zero();
#pragma GCC unroll 8
  for (int bk = 0; bk < L::kBlocksPerUnit; ++bk) {
    IVec words[NW];
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i) words[i] = load_words(wp[i] + bk * kWidth);
    for_planes<L::kP>([&](auto s) __attribute__((always_inline)) {
      const Vec xv = load(xpu + (bk * L::kP + decltype(s)::value) * kWidth);
#pragma GCC unroll 16
      for (int i = 0; i < NW; ++i) part[i] = fma(plane<B, decltype(s)::value>(words[i]), xv, part[i]);
    });
  }
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) acc[i] = fma(part[i], scale[i], acc[i]);
}

struct Prepared {
  const float* xp;    // [n, xp_stride]
  int64_t xp_stride;
  const float* xsum;  // [n, xsum_stride]
  int64_t xsum_stride;
};

// Rows of the matrix as the kernels see them.
template <class SF, int B, int G>
struct Rows {
  using L = Layout<B, G>;
  const QuantArgs& w;
  int64_t words_per_row = w.in * B / 32;
  int64_t n_groups = w.in / G;
  int64_t n_full_units = words_per_row / L::kUnitWords;
  int tail_words = int(words_per_row % L::kUnitWords);  // nonzero only when spread
  int64_t n_units = n_full_units + (tail_words > 0);

  const uint32_t* words(int64_t r) const { return w.packed + r * words_per_row; }
  const uint16_t* scales(int64_t r) const { return static_cast<const uint16_t*>(w.scales) + r * n_groups; }
  const uint16_t* biases(int64_t r) const { return static_cast<const uint16_t*>(w.biases) + r * n_groups; }
};

// y[r + i] for i < NW: one pass over NW whole rows. sc: scratch of NW * sc_stride floats.
template <class SF, int B, int G, int NW>
void matvec_tile(const Rows<SF, B, G>& rows, const Prepared& px, int64_t r, const float* bias, float* y, float* sc,
                 int64_t sc_stride) {
  using L = Layout<B, G>;
  float bias_term[NW];
  const uint32_t* wp[NW];
  for (int i = 0; i < NW; ++i) {
    float* s = sc + i * sc_stride;
    halves_to_f32<SF>(rows.scales(r + i), rows.n_groups, s);
    std::fill(s + rows.n_groups, s + sc_stride, 0.0f);
    bias_term[i] = dot_halves<SF>(rows.biases(r + i), px.xsum, rows.n_groups);
    wp[i] = rows.words(r + i);
  }
  Vec acc[NW], scale[NW];
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) acc[i] = zero();
  const float* xpu = px.xp;
  for (int64_t u = 0; u < rows.n_full_units; ++u) {
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i) {
      for (int q = 0; q < L::kUnitWords; q += 16) __builtin_prefetch(wp[i] + kPrefetchWords + q, 0, 3);
      scale[i] = unit_scale<B, G>(sc + i * sc_stride, u);
    }
    unit_matvec<B, G, NW>(wp, xpu, scale, acc);
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i) wp[i] += L::kUnitWords;
    xpu += L::kUnitCodes;
  }
  if (rows.tail_words > 0) {
    alignas(64) uint32_t tail[NW][L::kUnitWords] = {};
    const uint32_t* tp[NW];
    for (int i = 0; i < NW; ++i) {
      std::copy(wp[i], wp[i] + rows.tail_words, tail[i]);
      tp[i] = tail[i];
      scale[i] = unit_scale<B, G>(sc + i * sc_stride, rows.n_full_units);
    }
    unit_matvec<B, G, NW>(tp, xpu, scale, acc);
  }
  for (int i = 0; i < NW; ++i) {
    const float sum = reduce_add(acc[i]) + bias_term[i];
    y[r + i] = bias ? sum + bias[r + i] : sum;
  }
}

template <class SF, int B, int G>
void matvec_impl(const Rows<SF, B, G>& rows, const Prepared& px, const float* bias, float* y, ThreadPool& pool) {
  const int64_t out = rows.w.out;
  const int64_t n_tiles = (out + kTileRows - 1) / kTileRows;
  const int64_t sc_stride = rows.n_units * Layout<B, G>::kGroupsPerUnit + kWidth;
  // NOTE: contiguous ranges of rows per thread keep each thread's reads of w sequential.
  const auto body = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> scratch;  // [kTileRows, sc_stride]
    if (int64_t(scratch.size()) < kTileRows * sc_stride) scratch.resize(size_t(kTileRows * sc_stride));
    const int64_t r_end = std::min(out, t1 * kTileRows);
    int64_t r = t0 * kTileRows;
    for (; r + kTileRows <= r_end; r += kTileRows)
      matvec_tile<SF, B, G, kTileRows>(rows, px, r, bias, y, scratch.data(), sc_stride);
    for (; r < r_end; ++r) matvec_tile<SF, B, G, 1>(rows, px, r, bias, y, scratch.data(), sc_stride);
  };
  // NOTE: passed through std::ref so that std::function does not allocate (decode path).
  pool.parallel_for(n_tiles, 16, std::ref(body));
}

// wq[pos][i][0:kWidth] = q * scale for units [u0, u1) of NW rows of w (from row r; rows at or
// past r_end read row r_end - 1), pos running over the units' codes in plane order, kWidth at a
// time (the order of xp). sc: the rows' scales of units [u0, u1) as f32 (row stride sc_stride);
// tail: the rows' padded words of the tail unit.
template <class SF, int B, int G, int NW>
void decode_tile(const Rows<SF, B, G>& rows, int64_t r, int64_t r_end, int64_t u0, int64_t u1, const float* sc,
                 int64_t sc_stride, const uint32_t* tail, float* wq) {
  using L = Layout<B, G>;
  const uint32_t* wp[NW];
  const uint32_t* wn[NW];
  for (int i = 0; i < NW; ++i) {
    wp[i] = rows.words(std::min(r + i, r_end - 1)) + u0 * L::kUnitWords;
    wn[i] = rows.words(std::min(r + NW + i, r_end - 1)) + u0 * L::kUnitWords;
  }
  for (int64_t u = u0; u < u1; ++u) {
    const bool full = u < rows.n_full_units;
    for (int i = 0; i < NW; ++i) {
      const uint32_t* src = full ? wp[i] + (u - u0) * L::kUnitWords : tail + i * L::kUnitWords;
      // NOTE: the rows of w are read in short pieces (k blocks) that the hardware prefetcher
      // does not follow; the next tile's pieces are requested while this one is decoded.
      for (int q = 0; q < L::kUnitWords; q += 16) __builtin_prefetch(wn[i] + (u - u0) * L::kUnitWords + q, 0, 3);
      const Vec scale = unit_scale<B, G>(sc + i * sc_stride, u - u0);
#pragma GCC unroll 8
      for (int bk = 0; bk < L::kBlocksPerUnit; ++bk) {
        const IVec words = load_words(src + bk * kWidth);
        float* dst = wq + (((u - u0) * L::kBlocksPerUnit + bk) * L::kP * NW + i) * kWidth;
        for_planes<L::kP>([&](auto s) __attribute__((always_inline)) {
          store(dst + decltype(s)::value * NW * kWidth, mul(plane<B, decltype(s)::value>(words), scale));
        });
      }
    }
  }
}

// sums[j * NW + i] = sum over pos < n_pos of wq[pos][i] . xp[j][pos] for NW rows of wq and NX
// rows of xp (row stride xs); sums past NX rows are zero.
template <int NW, int NX>
inline void dot_tile(const float* wq, int64_t n_pos, const float* xp, int64_t xs, float* sums) {
  static_assert(NW * NX <= kWidth, "one sum_rows per tile");
  Vec acc[kWidth];
#pragma GCC unroll 16
  for (int e = 0; e < kWidth; ++e) acc[e] = zero();
  for (int64_t pos = 0; pos < n_pos; ++pos) {
    Vec xv[NX];
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      Vec v = load(xp + j * xs + pos * kWidth);
      pin(v);
      xv[j] = v;
    }
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i) {
      // NOTE: pinned, or GCC folds the load into each FMA and the loop runs at the load ports' pace.
      Vec wv = load(wq + (pos * NW + i) * kWidth);
      pin(wv);
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) acc[j * NW + i] = fma(wv, xv[j], acc[j * NW + i]);
    }
  }
  store(sums, sum_rows(acc));
}

template <int NW>
void dot_tile_rows(int x_rows, const float* wq, int64_t n_pos, const float* xp, int64_t xs, float* sums) {
  static_assert(kGroupX <= 4, "x_rows cases");
  switch (x_rows) {
    case 1: dot_tile<NW, 1>(wq, n_pos, xp, xs, sums); break;
    case 2: if constexpr (kGroupX >= 2) dot_tile<NW, 2>(wq, n_pos, xp, xs, sums); break;
    case 3: if constexpr (kGroupX >= 3) dot_tile<NW, 3>(wq, n_pos, xp, xs, sums); break;
    default: dot_tile<NW, kGroupX>(wq, n_pos, xp, xs, sums); break;
  }
}

// 1 < n <= kRowsMaxN. Per k block (units [u0, u1)) and tile of kGroupW rows, the tile's codes
// are decoded once into wq (q * scale, in L1) and meet every group of kGroupX rows of xp.
template <class SF, int B, int G>
void rows_impl(const Rows<SF, B, G>& rows, const Prepared& px, int64_t n, const float* bias, float* y,
               ThreadPool& pool) {
  using L = Layout<B, G>;
  constexpr int NX = kGroupX, NW = kGroupW;
  const int64_t out = rows.w.out;
  const int64_t n_pad = (n + NX - 1) / NX * NX;
  // About 40 KiB of wq and xp per k block, at least 256 codes, at most kMaxBlockGroups groups.
  const int64_t kb_codes = std::max<int64_t>(256, int64_t(10240) / (n_pad + NW));
  const int64_t kb_units = std::clamp<int64_t>(kb_codes / L::kUnitCodes, 1, kMaxBlockGroups / L::kGroupsPerUnit);
  const int64_t n_tiles = (out + NW - 1) / NW;
  const auto body = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> wq_buf;  // [kb_units * kUnitCodes / kWidth, NW, kWidth]
    if (int64_t(wq_buf.size()) < kb_units * L::kUnitCodes * NW) wq_buf.resize(size_t(kb_units * L::kUnitCodes * NW));
    float* wq = wq_buf.data();
    const int64_t r_begin = t0 * NW, r_end = std::min(out, t1 * NW);
    constexpr int64_t sc_stride = kMaxBlockGroups + kWidth;
    alignas(64) float sc[NW][sc_stride];
    alignas(64) uint32_t tail[NW][L::kUnitWords] = {};
    alignas(64) float sums[kWidth];
    for (int64_t u0 = 0; u0 < rows.n_units; u0 += kb_units) {
      const int64_t u1 = std::min(rows.n_units, u0 + kb_units);
      const int64_t g0 = u0 * L::kGroupsPerUnit, g1 = std::min(rows.n_groups, u1 * L::kGroupsPerUnit);
      const int64_t n_pos = (u1 - u0) * L::kUnitCodes / kWidth;
      for (int64_t r = r_begin; r < r_end; r += NW) {
        for (int i = 0; i < NW; ++i) {
          const int64_t ri = std::min(r + i, r_end - 1);
          halves_to_f32<SF>(rows.scales(ri) + g0, g1 - g0, sc[i]);
          // Spread scales read at most kWidth - 1 past the block's last group.
          store(sc[i] + (g1 - g0), zero());
          if (u1 > rows.n_full_units)
            std::copy(rows.words(ri) + rows.n_full_units * L::kUnitWords, rows.words(ri) + rows.words_per_row,
                      tail[i]);
        }
        decode_tile<SF, B, G, NW>(rows, r, r_end, u0, u1, sc[0], sc_stride, tail[0], wq);
        for (int64_t j = 0; j < n; j += NX) {
          const int x_rows = int(std::min<int64_t>(NX, n - j));
          dot_tile_rows<NW>(x_rows, wq, n_pos, px.xp + j * px.xp_stride + u0 * L::kUnitCodes, px.xp_stride, sums);
          for (int jj = 0; jj < x_rows; ++jj)
            for (int i = 0; i < NW && r + i < r_end; ++i) {
              float& dst = y[(j + jj) * out + r + i];
              if (u0 == 0) {
                const float* xsum = px.xsum + (j + jj) * px.xsum_stride;
                dst = (bias ? bias[r + i] : 0.0f) + dot_halves<SF>(rows.biases(r + i), xsum, rows.n_groups) +
                      sums[jj * NW + i];
              } else {
                dst += sums[jj * NW + i];
              }
            }
        }
      }
    }
  };
  pool.parallel_for(n_tiles, 8, std::ref(body));
}

template <class SF, int B, int G>
void fused_impl(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  using L = Layout<B, G>;
  const Rows<SF, B, G> rows{w};
  const int64_t xp_stride = rows.n_units * L::kUnitCodes;
  const int64_t xsum_stride = (rows.n_groups + kWidth - 1) / kWidth * kWidth + kWidth;
  // NOTE: thread_local of the calling thread; workers reach it through `px` only.
  thread_local std::vector<float> xp_buf, xsum_buf;
  if (int64_t(xp_buf.size()) < n * xp_stride) xp_buf.resize(size_t(n * xp_stride));
  if (int64_t(xsum_buf.size()) < n * xsum_stride) xsum_buf.resize(size_t(n * xsum_stride));
  prepare_x<B>(x, n, w.in, G, xp_buf.data(), xp_stride, xsum_buf.data(), xsum_stride);
  const Prepared px{xp_buf.data(), xp_stride, xsum_buf.data(), xsum_stride};
  if (n == 1)
    matvec_impl<SF, B, G>(rows, px, bias, y, pool);
  else
    rows_impl<SF, B, G>(rows, px, n, bias, y, pool);
}

template <class SF, int B>
void fused_group(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  switch (w.group_size) {
    case 16:
      if constexpr (B == 8) return fused_impl<SF, B, 16>(x, n, w, bias, y, pool);
      throw Unsupported("linear_q: group size 16 takes 8-bit codes only");
    case 32: fused_impl<SF, B, 32>(x, n, w, bias, y, pool); break;
    case 64: fused_impl<SF, B, 64>(x, n, w, bias, y, pool); break;
    default: fused_impl<SF, B, 128>(x, n, w, bias, y, pool); break;
  }
}

template <class SF>
void fused_bits(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  switch (w.bits) {
    case 2: fused_group<SF, 2>(x, n, w, bias, y, pool); break;
    case 4: fused_group<SF, 4>(x, n, w, bias, y, pool); break;
    default: fused_group<SF, 8>(x, n, w, bias, y, pool); break;
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc[4] = {zero(), zero(), zero(), zero()};
  int64_t k = 0;
  for (; k + 4 * kWidth <= n; k += 4 * kWidth)
#pragma GCC unroll 4
    for (int a4 = 0; a4 < 4; ++a4) acc[a4] = fma(load(a + k + a4 * kWidth), load(b + k + a4 * kWidth), acc[a4]);
  for (; k + kWidth <= n; k += kWidth) acc[0] = fma(load(a + k), load(b + k), acc[0]);
  float sum = reduce_add(add(add(acc[0], acc[1]), add(acc[2], acc[3])));
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

// Any bits: each row of w decoded to f32 once, then dotted with every row of x.
void rows_generic(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  const auto body = [&](int64_t r0, int64_t r1, int) {
    thread_local std::vector<float> row;  // [in]
    if (int64_t(row.size()) < w.in) row.resize(size_t(w.in));
    for (int64_t r = r0; r < r1; ++r) {
      decode_row(w, r, 0, w.in, row.data());
      for (int64_t j = 0; j < n; ++j) {
        const float sum = dot(row.data(), x + j * w.in, w.in);
        y[j * w.out + r] = bias ? sum + bias[r] : sum;
      }
    }
  };
  pool.parallel_for(w.out, 16, std::ref(body));
}

// PanelPacker over decode_row; ctx is the QuantArgs.
void pack_quant_panel(const void* ctx, int64_t j0, int64_t k0, int64_t kc, float* bp) {
  const QuantArgs& w = *static_cast<const QuantArgs*>(ctx);
  thread_local std::vector<float> buf;  // [kGemmPanelWidth, kc]
  if (int64_t(buf.size()) < kGemmPanelWidth * kGemmKBlock) buf.resize(size_t(kGemmPanelWidth * kGemmKBlock));
  const int rows = int(std::clamp<int64_t>(w.out - j0, 0, kGemmPanelWidth));
  for (int r = 0; r < rows; ++r) decode_row(w, j0 + r, k0, kc, buf.data() + r * kc);
  pack_panel_f32(buf.data(), kc, rows, kc, bp);
}

}  // namespace

#undef OSPREY_INLINE

void linear_q_f32(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  if (!(w.bits == 2 || w.bits == 3 || w.bits == 4 || w.bits == 6 || w.bits == 8))
    throw Unsupported("linear_q: bits " + std::to_string(w.bits) + " (want 2, 3, 4, 6 or 8)");
  if (!supported_quant_group(w.bits, w.group_size))
    throw Unsupported("linear_q: group_size " + std::to_string(w.group_size) + " (want 32, 64 or 128; 16 for 8 bits)");
  if (w.scale_dtype != DType::f16 && w.scale_dtype != DType::bf16)
    throw Unsupported(std::string("linear_q: scales dtype ") + dtype_name(w.scale_dtype) + " (want f16 or bf16)");
  if (n <= 0 || w.out <= 0) return;
  if (n > kRowsMaxN) {
    gemm_with_packer(x, n, w.in, w.out, &pack_quant_panel, &w, bias, y, pool);
  } else if (w.bits == 3 || w.bits == 6) {
    rows_generic(x, n, w, bias, y, pool);
  } else if (w.scale_dtype == DType::bf16) {
    fused_bits<BF16>(x, n, w, bias, y, pool);
  } else {
    fused_bits<F16>(x, n, w, bias, y, pool);
  }
}

void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool) {
  Int8Isa isa;
  // NOTE: for 1 < n <= kRowsMaxN without tiles the f32 kernels win: the integer GEMM unpacks
  // all of w per call. With tiles (made at load) the tile kernel takes every n: prefill
  // through them matched the GEMM for 4 bits (pp128/pp512 of a 1B shape, AVX-512 VNNI) and
  // ran 1.7x the f32 path for 8 bits, and w's packed words are never read after load.
  const bool tiles = w.tiles != nullptr;
  if (tiles && w.bits == 8 && int8_isa_best(kLevel, &isa) && int8_isa_exact_u8(isa))
    linear_q8_tiles(x, n, w, bias, y, pool, isa);
  else if ((n == 1 || n > kRowsMaxN || tiles) && int8_path_takes(w) && int8_isa_best(kLevel, &isa))
    linear_q4_int8(x, n, w, bias, y, pool, isa,
                   env_options().cpu_q4_int8_activations ? Int8Activations::int8 : Int8Activations::split16);
  else if (w.packed == nullptr)
    throw Unsupported("linear_q: a tiles-only weight (its packed words dropped at load) needs the tile kernels, "
                      "which this CPU level does not run for its " + std::to_string(w.bits) + " bits");
  else
    linear_q_f32(x, n, w, bias, y, pool);
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
