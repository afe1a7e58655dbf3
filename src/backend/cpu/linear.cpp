// linear(): dispatch between the dot-product kernels (small n: linear_rows) and the blocked
// GEMM (gemm_blocked.cpp), and the dot-product kernels themselves.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_simd.h"
#include "core/error.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

using namespace simd;

// Up to this many rows of x, linear() streams w once through linear_rows; above it the GEMM
// (whose packing cost is then spread over enough rows) wins.
constexpr int64_t kRowsMaxN = 16;

// Rows of w per tile of the matvec kernel: eight concurrent streams of w keep enough misses in
// flight to reach memory bandwidth.
constexpr int kTileW = 8;
// Accumulators per row of w in the matvec kernel (independent FMA chains).
constexpr int kMatvecAcc = kRegisters >= 32 ? 2 : 1;
// NOTE: the hardware prefetcher alone leaves the matvec's row streams well short of memory
// bandwidth (a stall on every load); each row is also requested this far ahead (2 KiB), into
// L2 (locality 1), not L1: on a 2-core AVX2 EPYC guest the L1 hint decoded an fp16 1B-shape
// model at 4.4-5.3 t/s on one thread and 7.9-10.2 on two, the L2 hint at 6.2-7.7 and 9.5-14.0
// (interleaved rounds), the eight row streams no longer evicting each other's lines from L1.
template <class WF>
constexpr int64_t kPrefetchElems = 2048 / int64_t(sizeof(typename WF::T));

// y[j * ldy + r + i] = bias[r + i] + sum_k x[j * in + k] * w[r + i, k] for i < NW, j < NX.
// Each (j, i) pair has its own accumulators and its own reduction, in an order that depends on
// `in` alone: its result is the same bit for bit whatever NW and NX are (linear_invariant
// relies on it; n == 1 runs NX = 1).
template <class WF, int NW, int NX = 1>
inline void matvec_tile(const float* x, int64_t in, const typename WF::T* w, int64_t r, const float* bias,
                        float* y, int64_t ldy = 0) {
  constexpr int NA = kMatvecAcc;
  Vec acc[NX][NA][NW];
#pragma GCC unroll 4
  for (int j = 0; j < NX; ++j)
#pragma GCC unroll 2
    for (int a = 0; a < NA; ++a)
#pragma GCC unroll 16
      for (int i = 0; i < NW; ++i) acc[j][a][i] = zero();
  const typename WF::T* wr[NW];
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) wr[i] = w + (r + i) * in;
  int64_t k = 0;
  for (; k + NA * kWidth <= in; k += NA * kWidth) {
    // One request per cache line of each row that this step reads.
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i)
#pragma GCC unroll 4
      for (int64_t b = 0; b < int64_t(NA * kWidth * sizeof(typename WF::T)); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(wr[i] + k + kPrefetchElems<WF>) + b, 0, 1);
#pragma GCC unroll 2
    for (int a = 0; a < NA; ++a)
#pragma GCC unroll 4
      for (int j = 0; j < NX; ++j) {
        const Vec xv = load(x + j * in + k + a * kWidth);
#pragma GCC unroll 16
        for (int i = 0; i < NW; ++i) acc[j][a][i] = fma(WF::load(wr[i] + k + a * kWidth), xv, acc[j][a][i]);
      }
  }
  for (; k + kWidth <= in; k += kWidth)
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) {
      const Vec xv = load(x + j * in + k);
#pragma GCC unroll 16
      for (int i = 0; i < NW; ++i) acc[j][0][i] = fma(WF::load(wr[i] + k), xv, acc[j][0][i]);
    }
  if (k < in) {
    // The last in - k < kWidth columns, zero-padded to one vector and added by the same vector
    // FMA as the rest. NOTE: not a scalar loop: the compiler may vectorize or contract a
    // scalar tail differently in each (NW, NX) instance, and the rows would then differ.
    const int64_t rem = in - k;
    alignas(64) typename WF::T wt[NW][kWidth] = {};
    for (int i = 0; i < NW; ++i) std::memcpy(wt[i], wr[i] + k, size_t(rem) * sizeof(typename WF::T));
    for (int j = 0; j < NX; ++j) {
      alignas(64) float xt[kWidth] = {};
      std::memcpy(xt, x + j * in + k, size_t(rem) * sizeof(float));
      const Vec xv = load(xt);
      for (int i = 0; i < NW; ++i) acc[j][0][i] = fma(WF::load(wt[i]), xv, acc[j][0][i]);
    }
  }
  for (int j = 0; j < NX; ++j)
    for (int i = 0; i < NW; ++i) {
      Vec t = acc[j][0][i];
      for (int a = 1; a < NA; ++a) t = add(t, acc[j][a][i]);
      const float sum = reduce_add(t);
      y[j * ldy + r + i] = bias ? sum + bias[r + i] : sum;
    }
}

// Partial dot products over k in [k0, k1) of NW rows of w (from row r; rows at or past r_end
// read row r_end - 1 and are not stored) with NX rows of x (row stride in; rows at or past
// x_rows read row x_rows - 1 and are not stored): y[j, r + i] gets them added, or, when
// `first`, bias (or 0) plus them. The NW * NX = kWidth accumulators are reduced together by
// one sum_rows.
template <class WF, int NW, int NX>
inline void dot_block(const float* x, int64_t in, int x_rows, const typename WF::T* w, int64_t r, int64_t r_end,
                      int64_t k0, int64_t k1, const float* bias, float* y, int64_t out, bool first, bool prefetch) {
  static_assert(NW * NX == kWidth, "one sum_rows per tile");
  Vec acc[NX * NW];
#pragma GCC unroll 16
  for (int e = 0; e < NX * NW; ++e) acc[e] = zero();
  const typename WF::T* wr[NW];
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) wr[i] = w + std::min(r + i, r_end - 1) * in;
  const float* xr[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) xr[j] = x + std::min(j, x_rows - 1) * in;
  // NOTE: the rows of w are read in short pieces (k blocks) that the hardware prefetcher does
  // not follow; the next tile's pieces are requested while this one computes.
  const typename WF::T* wn[NW];
#pragma GCC unroll 16
  for (int i = 0; i < NW; ++i) wn[i] = w + std::min(r + NW + i, r_end - 1) * in;
  constexpr int64_t kLine = 64 / sizeof(typename WF::T);
  const int64_t k_vec = k0 + (k1 - k0) / kWidth * kWidth;
  for (int64_t k = k0; k < k_vec; k += kWidth) {
    if (prefetch && (k - k0) % kLine == 0)
#pragma GCC unroll 16
      for (int i = 0; i < NW; ++i) __builtin_prefetch(wn[i] + k, 0, 3);
    Vec xv[NX];
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      Vec v = load(xr[j] + k);
      pin(v);
      xv[j] = v;
    }
#pragma GCC unroll 16
    for (int i = 0; i < NW; ++i) {
      const Vec wv = WF::load(wr[i] + k);
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) acc[j * NW + i] = fma(wv, xv[j], acc[j * NW + i]);
    }
  }
  alignas(64) float sums[kWidth];
  store(sums, sum_rows(acc));
  for (int64_t k = k_vec; k < k1; ++k)
    for (int j = 0; j < NX; ++j)
      for (int i = 0; i < NW; ++i) sums[j * NW + i] += xr[j][k] * WF::scalar(wr[i][k]);
  for (int j = 0; j < std::min(NX, x_rows); ++j)
    for (int i = 0; i < NW && r + i < r_end; ++i) {
      float& dst = y[j * out + r + i];
      dst = (first ? (bias ? bias[r + i] : 0.0f) : dst) + sums[j * NW + i];
    }
}

// n == 1: each row of w read start to end (long sequential streams).
template <class WF>
void matvec_impl(const float* x, int64_t in, const typename WF::T* w, int64_t out, const float* bias, float* y,
                 ThreadPool& pool) {
  const int64_t n_groups = (out + kTileW - 1) / kTileW;
  // NOTE: contiguous ranges of rows per thread keep each thread's reads of w sequential.
  const auto body = [&](int64_t g0, int64_t g1, int) {
    const int64_t r_end = std::min(out, g1 * kTileW);
    int64_t r = g0 * kTileW;
    for (; r + kTileW <= r_end; r += kTileW) matvec_tile<WF, kTileW>(x, in, w, r, bias, y);
    for (; r < r_end; ++r) matvec_tile<WF, 1>(x, in, w, r, bias, y);
  };
  // NOTE: passed through std::ref so that std::function does not allocate (decode path).
  pool.parallel_for(n_groups, 16, std::ref(body));
}

// Batch-invariant mode, any n: every row of x gets exactly matvec_impl's arithmetic (matvec_tile
// with the same accumulators and reduction order), while a tile of kInvTileW rows of w is read
// from memory once for all rows of x (kInvGroupX at a time, from cache after the first group).
constexpr int kInvTileW = 2;
constexpr int kInvGroupX = 4;

template <class WF, int NW>
inline void matvec_tile_rows(const float* x, int64_t n, int64_t in, const typename WF::T* w, int64_t r,
                             const float* bias, float* y, int64_t out) {
  int64_t j = 0;
  for (; j + kInvGroupX <= n; j += kInvGroupX)
    matvec_tile<WF, NW, kInvGroupX>(x + j * in, in, w, r, bias, y + j * out, out);
  switch (n - j) {
    case 1: matvec_tile<WF, NW, 1>(x + j * in, in, w, r, bias, y + j * out, out); break;
    case 2: matvec_tile<WF, NW, 2>(x + j * in, in, w, r, bias, y + j * out, out); break;
    case 3: matvec_tile<WF, NW, 3>(x + j * in, in, w, r, bias, y + j * out, out); break;
    default: break;
  }
  static_assert(kInvGroupX == 4, "the switch covers remainders up to 3");
}

template <class WF>
void invariant_impl(const float* x, int64_t n, int64_t in, const typename WF::T* w, int64_t out, const float* bias,
                    float* y, ThreadPool& pool) {
  if (n == 1) return matvec_impl<WF>(x, in, w, out, bias, y, pool);
  const int64_t n_groups = (out + kInvTileW - 1) / kInvTileW;
  const auto body = [&](int64_t g0, int64_t g1, int) {
    const int64_t r_end = std::min(out, g1 * kInvTileW);
    int64_t r = g0 * kInvTileW;
    for (; r + kInvTileW <= r_end; r += kInvTileW) matvec_tile_rows<WF, kInvTileW>(x, n, in, w, r, bias, y, out);
    for (; r < r_end; ++r) matvec_tile_rows<WF, 1>(x, n, in, w, r, bias, y, out);
  };
  pool.parallel_for(n_groups, 16, std::ref(body));
}

// n > 1: k in blocks small enough that the block of every row of x stays in L1 while the
// rows of w stream past; rows of x in groups of kGroupX (the last group padded by repeating
// its last row, results discarded).
template <class WF>
void rows_impl(const float* x, int64_t n, int64_t in, const typename WF::T* w, int64_t out, const float* bias,
               float* y, ThreadPool& pool) {
  if (n == 1) return matvec_impl<WF>(x, in, w, out, bias, y, pool);
  constexpr int kGroupX = kWidth >= 4 ? 4 : 1;
  constexpr int kGroupW = kWidth / kGroupX;
  const int64_t n_xgroups = (n + kGroupX - 1) / kGroupX;
  // About 32 KiB of x per k block, at least 256 values of k per row.
  const int64_t kb = std::max<int64_t>(256, (int64_t(8192) / (n_xgroups * kGroupX)) / 64 * 64);
  const int64_t n_tiles = (out + kGroupW - 1) / kGroupW;
  const auto body = [&](int64_t t0, int64_t t1, int) {
    const int64_t r_begin = t0 * kGroupW, r_end = std::min(out, t1 * kGroupW);
    for (int64_t k0 = 0; k0 < std::max<int64_t>(in, 1); k0 += kb) {
      const int64_t k1 = std::min(in, k0 + kb);
      for (int64_t r = r_begin; r < r_end; r += kGroupW)
        for (int64_t j = 0; j < n; j += kGroupX)
          dot_block<WF, kGroupW, kGroupX>(x + j * in, in, int(std::min<int64_t>(kGroupX, n - j)), w, r, r_end, k0,
                                           k1, bias, y + j * out, out, k0 == 0, j == 0);
    }
  };
  pool.parallel_for(n_tiles, 8, std::ref(body));
}

}  // namespace

void linear_rows(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                 const float* bias, float* y, ThreadPool& pool) {
  if (n <= 0 || out <= 0) return;
  switch (w_dtype) {
    case DType::f32: rows_impl<F32>(x, n, in, static_cast<const float*>(w), out, bias, y, pool); break;
    case DType::f16: rows_impl<F16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    case DType::bf16: rows_impl<BF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    default: throw Unsupported(std::string("linear: weight dtype ") + dtype_name(w_dtype) + " (want f32, f16 or bf16)");
  }
}

void linear_invariant(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                      const float* bias, float* y, ThreadPool& pool) {
  if (n <= 0 || out <= 0) return;
  switch (w_dtype) {
    case DType::f32: invariant_impl<F32>(x, n, in, static_cast<const float*>(w), out, bias, y, pool); break;
    case DType::f16: invariant_impl<F16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    case DType::bf16: invariant_impl<BF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    default: throw Unsupported(std::string("linear: weight dtype ") + dtype_name(w_dtype) + " (want f32, f16 or bf16)");
  }
}

void linear(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
            const float* bias, float* y, ThreadPool& pool) {
  if (n <= kRowsMaxN)
    linear_rows(x, n, in, w, w_dtype, out, bias, y, pool);
  else
    linear_gemm(x, n, in, w, w_dtype, out, bias, y, pool);
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
