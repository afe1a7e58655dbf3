// linear_gemm: y[n, out] = x[n, in] * w[out, in]^T + bias, as a blocked GEMM.
//
// Rows of x are taken in balanced chunks of up to kMC rows (w is converted once per chunk).
// For each chunk, two parallel steps:
//  1. pack the chunk of x, all of k, into tiles of kMR rows: [tile][in][kMR] (so that the
//     micro-kernel broadcasts from one stream, with no 4 KiB aliasing between rows);
//  2. work items (a group of panels of kNR outputs, optionally a range of tiles) go to the
//     threads through an atomic counter. An item walks k in blocks of kKC: it converts its
//     panels' [kNR, kKC] slices of w to f32 in [kKC][kNR] order (a transpose, done kWidth x
//     kWidth in registers) and runs the micro-kernel for every (tile, panel): kMR x kNR
//     accumulators, per k one vector load of the panel per kWidth outputs and one broadcast per
//     row. A tile's k block (kMR * kKC floats) stays in L1 while it meets the item's panels;
//     the packed panels (at most kMaxPanelsPerItem * kKC * kNR floats) stay in L2.
// Scratch: the packed chunk of x (thread_local of the caller, at most kMaxPackedX floats) and
// each thread's packed panels; both grow once and are reused.
// gemm_with_packer (gemm_panel.h) runs the same loop with the caller's panel packer in place
// of the conversion from f32 / f16 / bf16 rows.
#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_panel.h"
#include "backend/cpu/gemm_simd.h"
#include "core/error.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

using namespace simd;

// kMR x kNV accumulators plus kNV loads and a broadcast fit the register file.
constexpr int kMR = kWidth == 16 ? 8 : kWidth == 8 ? 6 : 4;
constexpr int kNV = kWidth == 16 ? 3 : kWidth == 8 ? 2 : 4;
constexpr int kNR = kNV * kWidth;     // outputs per panel
constexpr int64_t kKC = kGemmKBlock;  // k per block
static_assert(kNR == kGemmPanelWidth, "gemm_panel.h names the panel width");
constexpr int64_t kMC = 512;       // rows of x per chunk, at most
constexpr int64_t kMaxPackedX = int64_t(4) << 20;  // floats of packed x per chunk, at most
constexpr int64_t kMaxPanelsPerItem = 8;

// c[i, 0:kNR] (=|+=) sum_k a[k][i] * bp[k][0:kNR] for i < MR. a: packed tile [kc][kMR];
// bp: packed panel [kc][kNR]; c row stride ldc.
template <int MR>
void micro_kernel(const float* a, const float* bp, int64_t kc, float* c, int64_t ldc, bool accumulate) {
  if (accumulate)
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < kNR; v += 16) __builtin_prefetch(c + i * ldc + v, 0, 3);
  Vec acc[MR][kNV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < kNV; ++v) acc[i][v] = zero();
  for (int64_t k = 0; k < kc; ++k) {
    Vec b[kNV];
#pragma GCC unroll 8
    for (int v = 0; v < kNV; ++v) b[v] = load(bp + k * kNR + v * kWidth);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const Vec ai = set1(a[k * kMR + i]);
#pragma GCC unroll 8
      for (int v = 0; v < kNV; ++v) acc[i][v] = fma(ai, b[v], acc[i][v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < kNV; ++v) {
      float* cp = c + i * ldc + v * kWidth;
      store(cp, accumulate ? add(load(cp), acc[i][v]) : acc[i][v]);
    }
}

using MicroKernel = void (*)(const float*, const float*, int64_t, float*, int64_t, bool);
template <size_t... I>
constexpr std::array<MicroKernel, sizeof...(I)> make_kernels(std::index_sequence<I...>) {
  return {&micro_kernel<int(I) + 1>...};
}
// kKernels[r - 1] handles a tile of r rows.
constexpr std::array<MicroKernel, kMR> kKernels = make_kernels(std::make_index_sequence<kMR>{});

// Floats per packed tile of x: [in][kMR], plus room for the spill of pack_tile's last store.
int64_t tile_stride(int64_t in) { return in * kMR + kWidth; }

// ap[k][i] = x[i, k] for k < in, i < mr (x row stride ld); rows i >= mr are left undefined
// (their results are never stored).
void pack_tile(const float* x, int64_t ld, int mr, int64_t in, float* ap) {
  int64_t k = 0;
  if constexpr (kMR <= kWidth) {
    // Transpose kWidth x kWidth blocks (rows past mr read as zero), then store each k's kWidth
    // values at stride kMR in increasing k: each store's spill past kMR is overwritten by the
    // next one, the last one's lands in the tile's slack.
    for (; k + kWidth <= in; k += kWidth) {
      Vec r[kWidth];
      for (int t = 0; t < kWidth; ++t) r[t] = t < mr ? load(x + t * ld + k) : zero();
      transpose(r);
#pragma GCC unroll 16
      for (int t = 0; t < kWidth; ++t) store(ap + (k + t) * kMR, r[t]);
    }
  }
  for (; k < in; ++k)
    for (int i = 0; i < mr; ++i) ap[k * kMR + i] = x[i * ld + k];
}

// dst[k * kNR + t] = src[t * in + k] as f32 for k < kc, t < kWidth (rows t >= valid read as
// zero): one column block of a packed panel.
template <class WF, bool kFull>
inline void pack_columns(const typename WF::T* src, int64_t in, int valid, int64_t kc, float* dst) {
  int64_t k = 0;
  if constexpr (std::is_same_v<WF, BF16>) {
    // bf16 -> f32 is a shift: transpose pairs of k as 32-bit lanes (half the shuffles of
    // transposing converted values), then split each pair.
    for (; k + 2 * kWidth <= kc; k += 2 * kWidth) {
      Vec r[kWidth];
#pragma GCC unroll 16
      for (int t = 0; t < kWidth; ++t) r[t] = kFull || t < valid ? load_pairs(src + t * in + k) : zero();
      transpose(r);
#pragma GCC unroll 16
      for (int p = 0; p < kWidth; ++p) {
        store(dst + (k + 2 * p) * kNR, bf16_even(r[p]));
        store(dst + (k + 2 * p + 1) * kNR, bf16_odd(r[p]));
      }
    }
  }
  for (; k + kWidth <= kc; k += kWidth) {
    Vec r[kWidth];
#pragma GCC unroll 16
    for (int t = 0; t < kWidth; ++t) r[t] = kFull || t < valid ? WF::load(src + t * in + k) : zero();
    transpose(r);
#pragma GCC unroll 16
    for (int t = 0; t < kWidth; ++t) store(dst + (k + t) * kNR, r[t]);
  }
  for (; k < kc; ++k)
    for (int t = 0; t < kWidth; ++t) dst[k * kNR + t] = kFull || t < valid ? WF::scalar(src[t * in + k]) : 0.0f;
}

// bp[k][j] = w[j0 + j, k0 + k] as f32 for k < kc, j < kNR; zero where j0 + j >= out.
template <class WF>
void pack_panel(const typename WF::T* w, int64_t in, int64_t out, int64_t j0, int64_t k0, int64_t kc, float* bp) {
  for (int jb = 0; jb < kNV; ++jb) {
    const int64_t jr = j0 + jb * kWidth;  // first output of this column block
    const int valid = int(std::clamp<int64_t>(out - jr, 0, kWidth));
    float* dst = bp + jb * kWidth;
    if (valid == kWidth) {
      pack_columns<WF, true>(w + jr * in + k0, in, valid, kc, dst);
    } else if (valid > 0) {
      pack_columns<WF, false>(w + jr * in + k0, in, valid, kc, dst);
    } else {
      for (int64_t k = 0; k < kc; ++k) store(dst + k * kNR, zero());
    }
  }
}

// pack(j0, k0, kc, bp) fills panel bp with w's [j0, j0 + kNR) x [k0, k0 + kc) as pack_panel does.
template <class Packer>
void gemm_impl(const float* x, int64_t n, int64_t in, int64_t out, const Packer& pack, const float* bias, float* y,
               ThreadPool& pool) {
  const int64_t n_panels = (out + kNR - 1) / kNR;
  const int n_threads = pool.n_threads();
  const int64_t want_items = n_threads > 1 ? 3 * int64_t(n_threads) : 1;
  // Rows per chunk: a multiple of kMR, at most kMC, small enough that the packed chunk stays
  // within kMaxPackedX floats, and balanced (each chunk converts all of w once more, so a
  // small last chunk would cost as much as a full one).
  const int64_t max_tiles = std::clamp<int64_t>(kMaxPackedX / tile_stride(in), 1, kMC / kMR);
  const int64_t n_tiles_all = (n + kMR - 1) / kMR;
  const int64_t n_chunks = (n_tiles_all + max_tiles - 1) / max_tiles;
  const int64_t chunk = (n_tiles_all + n_chunks - 1) / n_chunks * kMR;

  // NOTE: thread_local of the calling thread; workers reach it through `xp` only.
  thread_local std::vector<float> x_packed;
  const int64_t stride = tile_stride(in);
  if (int64_t(x_packed.size()) < chunk / kMR * stride) x_packed.resize(size_t(chunk / kMR * stride));
  float* xp = x_packed.data();

  for (int64_t m0 = 0; m0 < n; m0 += chunk) {
    const int64_t rows = std::min(chunk, n - m0);
    const int64_t n_tiles = (rows + kMR - 1) / kMR;
    const auto pack_x = [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t)
        pack_tile(x + (m0 + t * kMR) * in, in, int(std::min<int64_t>(kMR, rows - t * kMR)), in, xp + t * stride);
    };
    // NOTE: passed through std::ref so that std::function does not allocate.
    pool.parallel_for(n_tiles, 2, std::ref(pack_x));

    // Items: groups of pc panels, times ranges of tiles when panels alone are too few.
    const int64_t pc = std::clamp<int64_t>(n_panels / want_items, 1, kMaxPanelsPerItem);
    const int64_t n_groups = (n_panels + pc - 1) / pc;
    const int64_t t_splits = std::clamp<int64_t>((want_items + n_groups - 1) / n_groups, 1, n_tiles);
    const int64_t tiles_per_split = (n_tiles + t_splits - 1) / t_splits;
    const int64_t n_items = n_groups * t_splits;
    std::atomic<int64_t> next{0};
    const auto run_items = [&](int64_t, int64_t, int) {
      thread_local std::vector<float> b_buf;
      if (int64_t(b_buf.size()) < kMaxPanelsPerItem * kKC * kNR) b_buf.resize(size_t(kMaxPanelsPerItem * kKC * kNR));
      float* bp = b_buf.data();
      alignas(64) float tile[kMR * kNR];
      for (int64_t item = next.fetch_add(1); item < n_items; item = next.fetch_add(1)) {
        const int64_t p_begin = (item / t_splits) * pc, p_end = std::min(n_panels, p_begin + pc);
        const int64_t t_begin = (item % t_splits) * tiles_per_split;
        const int64_t t_end = std::min(n_tiles, t_begin + tiles_per_split);
        for (int64_t k0 = 0; k0 < in; k0 += kKC) {
          const int64_t kc = std::min(kKC, in - k0);
          const bool accumulate = k0 > 0;
          for (int64_t p = p_begin; p < p_end; ++p)
            pack(p * kNR, k0, kc, bp + (p - p_begin) * kKC * kNR);
          for (int64_t t = t_begin; t < t_end; ++t) {
            const int mr = int(std::min<int64_t>(kMR, rows - t * kMR));
            const MicroKernel kernel = kKernels[mr - 1];
            const float* ap = xp + t * stride + k0 * kMR;
            for (int64_t p = p_begin; p < p_end; ++p) {
              const int64_t j0 = p * kNR;
              const int n_valid = int(std::min<int64_t>(kNR, out - j0));
              float* c = y + (m0 + t * kMR) * out + j0;
              const float* b = bp + (p - p_begin) * kKC * kNR;
              if (n_valid == kNR) {
                kernel(ap, b, kc, c, out, accumulate);
              } else {
                kernel(ap, b, kc, tile, kNR, false);
                for (int r = 0; r < mr; ++r)
                  for (int j = 0; j < n_valid; ++j)
                    c[r * out + j] = (accumulate ? c[r * out + j] : 0.0f) + tile[r * kNR + j];
              }
            }
          }
        }
        const int64_t j_begin = p_begin * kNR, j_end = std::min(out, p_end * kNR);
        const int64_t i_end = std::min(rows, t_end * kMR);
        for (int64_t i = t_begin * kMR; i < i_end; ++i) {
          float* row = y + (m0 + i) * out;
          if (in == 0) std::fill(row + j_begin, row + j_end, 0.0f);
          if (bias)
            for (int64_t j = j_begin; j < j_end; ++j) row[j] += bias[j];
        }
      }
    };
    pool.parallel_for(n_threads, 1, std::ref(run_items));
  }
}

template <class WF>
void dense_gemm(const float* x, int64_t n, int64_t in, const typename WF::T* w, int64_t out, const float* bias,
                float* y, ThreadPool& pool) {
  const auto pack = [w, in, out](int64_t j0, int64_t k0, int64_t kc, float* bp) {
    pack_panel<WF>(w, in, out, j0, k0, kc, bp);
  };
  gemm_impl(x, n, in, out, pack, bias, y, pool);
}

}  // namespace

void gemm_with_packer(const float* x, int64_t n, int64_t in, int64_t out, PanelPacker pack, const void* ctx,
                      const float* bias, float* y, ThreadPool& pool) {
  if (n <= 0 || out <= 0) return;
  const auto packer = [pack, ctx](int64_t j0, int64_t k0, int64_t kc, float* bp) { pack(ctx, j0, k0, kc, bp); };
  gemm_impl(x, n, in, out, packer, bias, y, pool);
}

void pack_panel_f32(const float* src, int64_t ld, int rows, int64_t kc, float* bp) {
  pack_panel<F32>(src, ld, rows, 0, 0, kc, bp);
}

void linear_gemm(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                 const float* bias, float* y, ThreadPool& pool) {
  if (n <= 0 || out <= 0) return;
  switch (w_dtype) {
    case DType::f32: dense_gemm<F32>(x, n, in, static_cast<const float*>(w), out, bias, y, pool); break;
    case DType::f16: dense_gemm<F16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    case DType::bf16: dense_gemm<BF16>(x, n, in, static_cast<const uint16_t*>(w), out, bias, y, pool); break;
    default: throw Unsupported(std::string("linear: weight dtype ") + dtype_name(w_dtype) + " (want f32, f16 or bf16)");
  }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
