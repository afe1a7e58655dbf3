// linear_q_mma: 4-bit weights against any number of rows of x on the tensor cores
// (quant_linear.h states the contract). The packed words are read once per tile of x rows
// and dequantized in registers straight into the A fragments of mma.sync m16n8k16; no
// dequantized weight is ever stored.
//
// Block: KW warps on one tile of 16 output rows (one m16 tile) and 8 NT rows of x (NT n8
// tiles); the warps split the input dimension in blocks of 128 (warp w takes blocks w,
// w + KW, ...) and their partial sums meet in shared memory, added in warp order. Grid:
// x-row tiles fastest, so the tiles that read the same words run together and share them
// through L2.
//
// Fragments. Lane l = 4 g + t (g < 8, t < 4) loads, for each of its two rows (g and g + 8 of
// the tile), the 16 bytes holding codes 32 t .. 32 t + 31 of the 128-code block: words
// u = 0..3 of 8 codes each, all in one group (group sizes are multiples of 32). Nibble p of
// word u, masked in place with its neighbour p + 4 and or-ed with the exponent of 1024 (f16)
// or 128 (bf16), is the 16-bit pair (M + q_p, M + q_{p+4}) in one LOP3: no conversion
// instruction. One FMA pair removes M, one applies the group's scale and bias (f16 or bf16
// arithmetic, as the 16-bit GEMM path rounds its dequantized weights). The MMA's k order is a
// permutation of the block's codes, the same for A and B: step (h, p), h < 2, p < 4, puts
// codes 32 t + 16 h + p (+ 4) in k slots 2t (2t + 1) and codes 32 t + 16 h + 8 + p (+ 4) in
// slots 2t + 8 (2t + 9), so lane l reads x row g's 32 values 32 t .. 32 t + 31 as 16-byte
// loads and pairs them with one conversion each. x is rounded to the MMA's 16-bit type and
// the products are accumulated in f32.
//
// Pipelining: the next block's words, scales and biases (and, for one x-row tile, its x
// values) are loaded before this block's arithmetic, two register stages used in turn.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_common.cuh"
#include "backend/cuda/quant_linear.h"

namespace osprey::cuda {
namespace qmma {

constexpr int kTileRows = 16;   // output rows per block
constexpr int kBlockCodes = 128;  // codes per warp per step of the k loop

struct Params {
  const uint32_t* packed;  // [out, in / 8]
  const uint16_t* scales;  // [out, in / group_size]
  const uint16_t* biases;
  const float* x;          // [n, in]
  const float* bias;       // [out] or nullptr
  float* y;                // [n, out]
  int in, out, n;
  int group_shift;
  int kblocks;  // ceil(in / 128)
};

// 16-bit pair arithmetic on raw registers (f16x2 or bf16x2).
template <bool BF16>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  if constexpr (BF16)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  else
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// (lo, hi) rounded to the pair type; lo in the low half.
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t d;
  if constexpr (BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

template <bool BF16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The pair (M + q, M + q) exponent pattern, 1.0 and -M, as 16-bit pairs.
template <bool BF16>
struct Consts {
  static constexpr uint32_t kMagic = BF16 ? 0x43004300u : 0x64006400u;   // 128 : 1024
  static constexpr uint32_t kOne = BF16 ? 0x3F803F80u : 0x3C003C00u;
  static constexpr uint32_t kNegM = BF16 ? 0xC300C300u : 0xE400E400u;    // -128 : -1024
};

// Nibbles q and q + 4 of w as the 16-bit pair of their values. f16: nibbles 1, 3 (5, 7) are
// masked in place at 16 times their value (1024 + 16 c, one FMA by 1/16 and -64 brings them
// down), so a word costs one shift and four masks; bf16's 7-bit mantissa has no room for
// that, so each pair is shifted to the bottom.
template <bool BF16>
__device__ __forceinline__ uint32_t codes(uint32_t w, int q) {
  using C = Consts<BF16>;
  if constexpr (!BF16) {
    const uint32_t src = q < 2 ? w : w >> 8;
    if (q % 2 == 1) return fma2<false>((src & 0x00F000F0u) | C::kMagic, 0x2C002C00u, 0xD400D400u);  // 1/16, -64
    return fma2<false>((src & 0x000F000Fu) | C::kMagic, C::kOne, C::kNegM);
  }
  return fma2<BF16>(((w >> (4 * q)) & 0x000F000Fu) | C::kMagic, C::kOne, C::kNegM);
}

// What one warp holds for one 128-code block: rows g and g + 8's words and group parameters,
// and (XPF) x row g's 32 values for a single x-row tile.
template <bool XPF>
struct Stage {
  uint4 w[2];
  uint32_t s[2], b[2];
  float4 x[XPF ? 8 : 1];
};

__device__ __forceinline__ uint32_t word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// V float4 of x row `col` from value 32 t + 4 i0 of block kb (zeros past n or past in).
template <int V>
__device__ __forceinline__ void load_x(const Params& p, int col, int kb, int t, int i0, float4 (&v)[V]) {
  const int k = kb * kBlockCodes + 32 * t;
  if (col < p.n && k < p.in) {
    const float4* src = reinterpret_cast<const float4*>(p.x + int64_t(col) * p.in + k) + i0;
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = __ldg(src + i);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <bool XPF>
__device__ __forceinline__ void load_w(const Params& p, int64_t row0, int kb, int g, int t, Stage<XPF>& st) {
  const int k = kb * kBlockCodes + 32 * t;
  const int64_t words = p.in / 8, groups = p.in >> p.group_shift;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t want = row0 + g + 8 * r, row = want < p.out ? want : p.out - 1;
    if (k < p.in) {
      st.w[r] = __ldcs(reinterpret_cast<const uint4*>(p.packed + row * words + k / 8));
      st.s[r] = __ldg(p.scales + row * groups + (k >> p.group_shift));
      st.b[r] = __ldg(p.biases + row * groups + (k >> p.group_shift));
    } else {
      st.w[r] = make_uint4(0u, 0u, 0u, 0u), st.s[r] = 0u, st.b[r] = 0u;
    }
  }
}

__device__ __forceinline__ float comp(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// B fragments of half h from its 16 x values f (values 16 h .. 16 h + 15 of the lane's 32):
// b0[q] pairs values q and q + 4, b1[q] values 8 + q and 12 + q.
template <bool BF16>
__device__ __forceinline__ void x_frags(const float4* f, uint32_t (&b0)[4], uint32_t (&b1)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    b0[q] = pack2<BF16>(comp(f[0], q), comp(f[1], q));
    b1[q] = pack2<BF16>(comp(f[2], q), comp(f[3], q));
  }
}

// y[c, r] for 16 rows r of blockIdx.y and 8 NT rows c of x from blockIdx.x. Its length is the
// fused pipeline (loads, dequantization, MMA) and the reduction across warps.
template <bool BF16, int NT, int KW>
__global__ void __launch_bounds__(32 * KW) qmma_kernel(const Params p) {
  constexpr bool XPF = NT == 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.y) * kTileRows;
  const int col0 = blockIdx.x * 8 * NT;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  auto compute = [&](const Stage<XPF>& st, int kb) {
    uint32_t s2[2], b2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) s2[r] = st.s[r] * 0x10001u, b2[r] = st.b[r] * 0x10001u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t xb0[NT][4], xb1[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if constexpr (XPF) {
          x_frags<BF16>(st.x + 4 * h, xb0[j], xb1[j]);
        } else {
          float4 f[4];
          load_x(p, col0 + 8 * j + g, kb, t, 4 * h, f);
          x_frags<BF16>(f, xb0[j], xb1[j]);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            a[2 * e + r] = fma2<BF16>(codes<BF16>(word_of(st.w[r], 2 * h + e), q), s2[r], b2[r]);
          }
#pragma unroll
        for (int j = 0; j < NT; ++j) mma<BF16>(acc[j], a, xb0[j][q], xb1[j][q]);
      }
    }
  };

  // Two stages in turn; the weights of the first are loaded before pdl_wait (no kernel of the
  // step writes them), x after it.
  Stage<XPF> s0, s1;
  int kb = warp;
  if (kb < p.kblocks) load_w(p, row0, kb, g, t, s0);
  pdl_wait();
  if constexpr (XPF)
    if (kb < p.kblocks) load_x(p, col0 + g, kb, t, 0, s0.x);
  while (kb < p.kblocks) {
    if (kb + KW < p.kblocks) {
      load_w(p, row0, kb + KW, g, t, s1);
      if constexpr (XPF) load_x(p, col0 + g, kb + KW, t, 0, s1.x);
    }
    compute(s0, kb);
    kb += KW;
    if (kb >= p.kblocks) break;
    if (kb + KW < p.kblocks) {
      load_w(p, row0, kb + KW, g, t, s0);
      if constexpr (XPF) load_x(p, col0 + g, kb + KW, t, 0, s0.x);
    }
    compute(s1, kb);
    kb += KW;
  }
  pdl_launch_dependents();

  // red[w][j][i][lane]: warp w's acc[j][i]; summed over w in order.
  __shared__ float red[KW][NT][4][32];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][j][i][lane] = acc[j][i];
  __syncthreads();
  for (int v = threadIdx.x; v < NT * 4 * 32; v += 32 * KW) {
    const int j = v / 128, i = (v / 32) & 3, l = v & 31;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < KW; ++w) sum += red[w][j][i][l];
    const int64_t row = row0 + (l >> 2) + 8 * (i >> 1);
    const int col = col0 + 8 * j + 2 * (l & 3) + (i & 1);
    if (row < p.out && col < p.n) p.y[int64_t(col) * p.out + row] = p.bias ? sum + p.bias[row] : sum;
  }
}

template <bool BF16, int NT, int KW>
void launch(const Params& p, cudaStream_t s) {
  const dim3 grid(unsigned((p.n + 8 * NT - 1) / (8 * NT)), unsigned((p.out + kTileRows - 1) / kTileRows));
  launch_kernel(qmma_kernel<BF16, NT, KW>, grid, dim3(32 * KW), 0, s, p);
}

template <bool BF16, int KW>
void launch_nt(const Params& p, int nt, cudaStream_t s) {
  switch (nt) {
    case 1: return launch<BF16, 1, KW>(p, s);
    case 2: return launch<BF16, 2, KW>(p, s);
    default: return launch<BF16, 4, KW>(p, s);
  }
}

}  // namespace qmma

bool linear_q_mma_supported(const float* x, const QuantArgs& w) {
  return w.bits == 4 && aligned16(x) && aligned16(w.packed) && w.in % 32 == 0;
}

void linear_q_mma(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s,
                  int x_tiles, int warps) {
  if (n <= 0 || w.out <= 0) return;
  check_quant_args("linear_q", w);
  if (!linear_q_mma_supported(x, w))
    throw Unsupported("linear_q: the tensor-core kernel takes 4-bit weights with 16-byte aligned words and x (bits=" +
                      std::to_string(w.bits) + ")");
  if (x_tiles != 0 && x_tiles != 1 && x_tiles != 2 && x_tiles != 4)
    throw Unsupported("linear_q_mma: x_tiles " + std::to_string(x_tiles) + " is not 0, 1, 2 or 4");
  if (warps != 0 && warps != 4 && warps != 8)
    throw Unsupported("linear_q_mma: warps " + std::to_string(warps) + " is not 0, 4 or 8");
  if ((w.out + qmma::kTileRows - 1) / qmma::kTileRows > 65535)
    throw Unsupported("linear_q: " + std::to_string(w.out) + " output rows are too many for the tensor-core kernel");
  qmma::Params p{};
  p.packed = w.packed;
  p.scales = static_cast<const uint16_t*>(w.scales);
  p.biases = static_cast<const uint16_t*>(w.biases);
  p.bias = bias;
  p.in = int(w.in);
  p.out = int(w.out);
  p.group_shift = group_shift(w.group_size);
  p.kblocks = int((w.in + qmma::kBlockCodes - 1) / qmma::kBlockCodes);
  const int nt = x_tiles != 0 ? x_tiles : n <= 8 ? 1 : n <= 16 ? 2 : 4;
  const int kw = warps != 0 ? warps : 8;
  const bool bf16 = w.scale_dtype == DType::bf16;
  // x rows in launches of at most 65535 tiles.
  const int64_t per_launch = int64_t(65535) * 8 * nt;
  for (int64_t j0 = 0; j0 < n; j0 += per_launch) {
    p.n = int(std::min(per_launch, n - j0));
    p.x = x + j0 * w.in;
    p.y = y + j0 * w.out;
    if (bf16)
      kw == 8 ? qmma::launch_nt<true, 8>(p, nt, s) : qmma::launch_nt<true, 4>(p, nt, s);
    else
      kw == 8 ? qmma::launch_nt<false, 8>(p, nt, s) : qmma::launch_nt<false, 4>(p, nt, s);
  }
}

}  // namespace osprey::cuda
