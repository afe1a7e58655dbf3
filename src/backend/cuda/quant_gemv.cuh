#pragma once
// linear_q for few rows of x: a fused dequantize-GEMV that streams the packed words once.
// Internal to quant_gemv*.cu: the kernels are instantiated in quant_gemv_{fast,generic}_{f16,bf16}.cu
// and dispatched from quant_gemv.cu.
//
// A block of 128 threads owns R consecutive output rows and splits their input dimension:
// thread t takes chunks t, t + 128, ... of every row, each chunk a run of packed words that
// lies inside one group (one scale, one bias). Per chunk it loads the words of all R rows at
// once (R * U chunks in flight per thread), then for every row i and x row j
//   y[j, i] += s * sum(q x) + b * sum(x),
// where sum(x) over the chunk is shared by the R rows and x is re-read through L1 only once
// per R rows. Partial sums leave the threads through a transposing warp reduction (about
// R * NX shuffles instead of 5 R NX) and one shared-memory step across the four warps.
//
// Fast path (bits 4 and 8, 16-byte aligned words and x): a chunk is one 16-byte load (32
// four-bit or 16 eight-bit codes). A code becomes a float without a conversion instruction:
// placed at the top of the mantissa of 1.0 it reads v = 1 + q / 2^bits, so
// sum(q x) = 2^bits (sum(v x) - sum(x)), which folds into
//   y += (2^bits s) sum(v x) + (b - 2^bits s) sum(x)
// at 1.5 (4-bit: shifts, masks and a byte permute) or 2 (8-bit: a shift and a mask) integer
// ops and one FMA per weight. Generic path (every bit width, any 4-byte alignment): a chunk is
// a 32-code unit of `bits` words, codes extracted with funnel shifts into exact floats.
//
// Batch invariance (ops::set_batch_invariant runs every n through linear_q_gemv): a row of x
// gets the same bits whatever NX, R, U and its place in the chunk. Per (w row, x row) pair,
// dq and sx take the chunk's codes in the order sb, e (both loop nests), acc takes thread t's
// chunks t, t + 128, ... in increasing order (whatever U), the warp reduction always pairs
// lanes 16, 8, 4, 2, 1 apart (warp_fold then the xor steps; IEEE addition commutes, so which
// lane keeps which half does not matter), and the four warps are summed in order. Keep it so.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/quant_common.cuh"

namespace osprey::cuda::qgemv {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// A chunk policy: Raw holds one chunk of one row; dequant8 turns codes 8 sb .. 8 sb + 7 of it
// into v with q = kMul * (v - kOff). `orc` is kOr (the constant bits or-ed into every code)
// as a register value (see GemvParams::zero).
struct Fast4 {
  static constexpr int kBits = 4, kElems = 32;
  static constexpr float kMul = 16.0f, kOff = 1.0f;
  static constexpr uint32_t kOr = 0x80808080u;
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const uint32_t* __restrict__ row, int c) {
    return __ldcs(reinterpret_cast<const uint4*>(row) + c);
  }
  static __device__ __forceinline__ void dequant8(const Raw& r, int sb, uint32_t orc, float (&v)[8]) {
    const uint32_t w = word_of(r, sb);
    // Byte b of lo (hi) is 1qqqq000 for the low (high) nibble of byte b of w, i.e. code 2b
    // (2b + 1); one byte permute then builds 0x3F800000 | q << 19 from it: 1.5 ops a code.
    const uint32_t lo = ((w << 3) & 0x78787878u) | orc;
    const uint32_t hi = ((w >> 1) & 0x78787878u) | orc;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      v[2 * b] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u | (b << 8)));
      v[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u | (b << 8)));
    }
  }
};

struct Fast8 {
  static constexpr int kBits = 8, kElems = 16;
  static constexpr float kMul = 256.0f, kOff = 1.0f;
  static constexpr uint32_t kOr = 0x3F800000u;
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const uint32_t* __restrict__ row, int c) {
    return __ldcs(reinterpret_cast<const uint4*>(row) + c);
  }
  static __device__ __forceinline__ void dequant8(const Raw& r, int sb, uint32_t orc, float (&v)[8]) {
    // Byte k moves to mantissa bits 15..22.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = word_of(r, 2 * sb + h);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t t = k <= 1 ? w << (15 - 8 * k) : w >> (8 * k - 15);
        v[4 * h + k] = __uint_as_float((t & 0x007F8000u) | orc);
      }
    }
  }
};

template <int B>
struct Generic {
  static constexpr int kBits = B, kElems = 32;
  static constexpr float kMul = 1.0f, kOff = 0.0f;
  static constexpr uint32_t kOr = 0x4B000000u;  // 2^23: the code is the mantissa (code_to_float)
  struct Raw {
    uint32_t w[B];
  };
  static __device__ __forceinline__ Raw load(const uint32_t* __restrict__ row, int c) {
    Raw r;
#pragma unroll
    for (int t = 0; t < B; ++t) r.w[t] = __ldcs(row + c * B + t);
    return r;
  }
  static __device__ __forceinline__ void dequant8(const Raw& r, int sb, uint32_t orc, float (&v)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __uint_as_float(unit_code<B>(r.w, 8 * sb + e) | orc) - 8388608.0f;
  }
};

struct GemvParams {
  const uint32_t* packed;  // [out, in * bits / 32]
  const uint16_t* scales;  // [out, in / group_size]
  const uint16_t* biases;  // [out, in / group_size]
  const float* x;          // [n, in]
  const float* bias;       // [out] or nullptr
  float* y;                // [n, out]
  int64_t in, out;
  int n;            // rows of x and y, 1 <= n <= NX
  int group_shift;  // log2(group_size)
  // Always 0, but opaque to the compiler. NOTE: the scale and bias of a chunk are needed only
  // after its dot products, so ptxas issues their loads late, just before that use, and every
  // warp then waits a second full memory latency. Or-ing (scale | bias) & zero into the
  // constant of the chunk's first dequantisation makes it issue them with the weight loads.
  uint32_t zero;
};

// x[0 .. 8) through L1; XV: p is 16-byte aligned.
template <bool XV>
__device__ __forceinline__ void load_x8(const float* __restrict__ p, float (&v)[8]) {
  if constexpr (XV) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __ldg(p + e);
  }
}

__device__ __forceinline__ float sum8(const float (&v)[8]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

constexpr int log2_int(int v) { return v <= 1 ? 0 : 1 + log2_int(v / 2); }

// Step STEP of warp_sum_many: lanes 16 >> STEP apart swap halves of the V >> STEP values
// each holds and add, so each keeps half as many. Bit masks rather than ?: on v, which the
// compiler may turn into an indexed local array.
template <int V, int STEP>
__device__ __forceinline__ void warp_fold(float (&v)[V], int lane) {
  if constexpr ((V >> STEP) > 1) {
    constexpr int h = V >> (STEP + 1), off = 16 >> STEP;
    const uint32_t up = (lane & off) != 0 ? 0xffffffffu : 0u;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const uint32_t lo = __float_as_uint(v[i]), hi = __float_as_uint(v[i + h]);
      const float send = __uint_as_float((lo & up) | (hi & ~up));
      const float keep = __uint_as_float((hi & up) | (lo & ~up));
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
    warp_fold<V, STEP + 1>(v, lane);
  }
}

// Sums v[i] over the warp for V (a power of two <= 32) values at once. Afterwards v[0] of
// lane l holds the total of value index l >> (5 - log2 V).
template <int V>
__device__ __forceinline__ void warp_sum_many(float (&v)[V]) {
  warp_fold<V, 0>(v, int(threadIdx.x & 31));
#pragma unroll
  for (int off = 16 >> log2_int(V); off >= 1; off /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
}

// Blocks per SM the single-row-of-x kernels are compiled for (registers <= 65536 / (128 b)).
template <int NX, int R>
constexpr int kMinBlocks = NX > 1 ? 1 : R == 8 ? 4 : 5;

// y[j, r] = x[j] . dequant(w)[r] + bias[r] for the R rows of this block and j < n.
// One fused pass of loads, dequantization and dot products: its length is the point (the
// loads are issued before pdl_wait and interleaved with the arithmetic of earlier words).
template <class P, bool BF16, int NX, int R, int U, bool XV>
__global__ void __launch_bounds__(kThreads, kMinBlocks<NX, R>) qgemv_kernel(const GemvParams p) {
  constexpr int E = P::kElems;
  const uint32_t words_per_row = uint32_t(p.in * P::kBits / 32);
  const int n_chunks = int(p.in / E);  // in < 2^31
  const uint32_t groups_per_row = uint32_t(p.in >> p.group_shift);
  // The last block re-reads rows of the block before it instead of reading past the end;
  // only rows >= row0 are written. With fewer than R rows in all, rows past the end repeat
  // the last one (never written).
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int64_t first = row0 + R <= p.out ? row0 : p.out >= R ? p.out - R : 0;
  const int last = p.out - first >= R ? R - 1 : int(p.out - first - 1);
  const uint32_t* wbase = p.packed + first * words_per_row;
  const uint16_t* sbase = p.scales + first * groups_per_row;
  const uint16_t* bbase = p.biases + first * groups_per_row;
  const float* xr[NX];
#pragma unroll
  for (int j = 0; j < NX; ++j) xr[j] = p.x + int64_t(min(j, p.n - 1)) * p.in;  // likewise for x rows

  float acc[R][NX];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NX; ++j) acc[i][j] = 0.0f;

  using Raw = typename P::Raw;
  // Codes, scales and biases of chunks c0, c0 + kThreads, ... (U of them).
  auto load_chunks = [&](int c0, Raw (&rw)[U][R], uint32_t (&sr)[U][R], uint32_t (&br)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kThreads;
      if (c < n_chunks) {
        const uint32_t g = uint32_t(c * E) >> p.group_shift;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const uint32_t ri = uint32_t(min(i, last));
          rw[u][i] = P::load(wbase + ri * words_per_row, c);
          sr[u][i] = __ldg(sbase + ri * groups_per_row + g);
          br[u][i] = __ldg(bbase + ri * groups_per_row + g);
        }
      } else {
#pragma unroll
        for (int i = 0; i < R; ++i) rw[u][i] = {}, sr[u][i] = 0u, br[u][i] = 0u;
      }
    }
  };
  // The first words are loaded before pdl_wait(): they stream in while the kernel before this
  // one finishes (weights are never written by a kernel of the step).
  // NOTE: no second buffer for the next iteration's words: its registers cost a block per SM,
  // which costs more than the overlap gains (docs/benchmark_results/, 2026-12-05 notes).
  Raw raw[U][R];
  uint32_t sraw[U][R], braw[U][R];
  if (int(threadIdx.x) < n_chunks) load_chunks(threadIdx.x, raw, sraw, braw);
  pdl_wait();
  for (int c0 = threadIdx.x; c0 < n_chunks; c0 += kThreads * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kThreads;
      if (c >= n_chunks) break;
      uint32_t orc[R];
#pragma unroll
      for (int i = 0; i < R; ++i) orc[i] = P::kOr | ((sraw[u][i] | braw[u][i]) & p.zero);
      float dq[R][NX], sx[NX];
#pragma unroll
      for (int j = 0; j < NX; ++j) {
        sx[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < R; ++i) dq[i][j] = 0.0f;
      }
#pragma unroll
      for (int sb = 0; sb < E / 8; ++sb) {
        // Whichever of the x values (8 NX) and the dequantised codes (8 R) is fewer stays in
        // registers while the other is streamed.
        if constexpr (NX <= 2) {
          float xv[NX][8];
#pragma unroll
          for (int j = 0; j < NX; ++j) {
            load_x8<XV>(xr[j] + c * E + 8 * sb, xv[j]);
            sx[j] += sum8(xv[j]);
          }
#pragma unroll
          for (int i = 0; i < R; ++i) {
            float v[8];
            P::dequant8(raw[u][i], sb, orc[i], v);
#pragma unroll
            for (int j = 0; j < NX; ++j)
#pragma unroll
              for (int e = 0; e < 8; ++e) dq[i][j] = fmaf(v[e], xv[j][e], dq[i][j]);
          }
        } else {
          float v[R][8];
#pragma unroll
          for (int i = 0; i < R; ++i) P::dequant8(raw[u][i], sb, orc[i], v[i]);
#pragma unroll
          for (int j = 0; j < NX; ++j) {
            float xv[8];
            load_x8<XV>(xr[j] + c * E + 8 * sb, xv);
            sx[j] += sum8(xv);
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
              for (int e = 0; e < 8; ++e) dq[i][j] = fmaf(v[i][e], xv[e], dq[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float s = BF16 ? bf16_bits_to_f32(uint16_t(sraw[u][i])) : f16_bits_to_f32(uint16_t(sraw[u][i]));
        const float b = BF16 ? bf16_bits_to_f32(uint16_t(braw[u][i])) : f16_bits_to_f32(uint16_t(braw[u][i]));
        const float sm = P::kMul * s;
        const float bm = b - P::kOff * sm;
#pragma unroll
        for (int j = 0; j < NX; ++j) acc[i][j] = fmaf(sm, dq[i][j], fmaf(bm, sx[j], acc[i][j]));
      }
    }
    if (c0 + kThreads * U < n_chunks) load_chunks(c0 + kThreads * U, raw, sraw, braw);
  }

  // The weights are read: the next kernel may start (and prefetch its own) during the tail.
  pdl_launch_dependents();
  constexpr int V = R * NX, L = log2_int(V);
  static_assert((1 << L) == V && V <= 32, "R * NX must be a power of two <= 32");
  float v[V];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NX; ++j) v[i * NX + j] = acc[i][j];
  warp_sum_many<V>(v);
  __shared__ float red[kWarps][V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if ((lane & ((32 >> L) - 1)) == 0) red[warp][lane >> (5 - L)] = v[0];
  __syncthreads();
  if (threadIdx.x < V) {
    const int t = threadIdx.x, i = t / NX, j = t % NX;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w][t];
    const int64_t r = first + i;
    if (i <= last && r >= row0 && j < p.n) p.y[int64_t(j) * p.out + r] = p.bias ? sum + p.bias[r] : sum;
  }
}

template <class P, bool BF16, int NX, int R, int U, bool XV>
void launch(const GemvParams& p, cudaStream_t s) {
  const int64_t blocks = (p.out + R - 1) / R;
  launch_kernel(qgemv_kernel<P, BF16, NX, R, U, XV>, unsigned(blocks), kThreads, 0, s, p);
}

// x rows per launch rounded up to a power of two (the kernel reuses row n - 1 for the rest).
inline int nx_for(int n) { return n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8; }

// rows: 8, 4 or 1 output rows per block (8 only for NX <= 4).
template <class P, bool BF16, int NX>
void launch_fast_nx(const GemvParams& p, int rows, cudaStream_t s) {
  if constexpr (NX == 8) {
    launch<P, BF16, 8, 4, 1, true>(p, s);
  } else {
    if (rows == 8) return launch<P, BF16, NX, 8, 1, true>(p, s);
    if (rows == 4) return launch<P, BF16, NX, 4, 2, true>(p, s);
    launch<P, BF16, NX, 1, 8, true>(p, s);
  }
}

// The fast kernel: bits 4 or 8, packed words and x 16-byte aligned.
template <bool BF16>
void launch_fast(const GemvParams& p, int bits, int rows, cudaStream_t s) {
  auto go = [&](auto policy) {
    using P = decltype(policy);
    switch (nx_for(p.n)) {
      case 1: return launch_fast_nx<P, BF16, 1>(p, rows, s);
      case 2: return launch_fast_nx<P, BF16, 2>(p, rows, s);
      case 4: return launch_fast_nx<P, BF16, 4>(p, rows, s);
      default: return launch_fast_nx<P, BF16, 8>(p, rows, s);
    }
  };
  if (bits == 4)
    go(Fast4{});
  else
    go(Fast8{});
}

template <int B, bool BF16, bool XV>
void launch_generic_bits(const GemvParams& p, cudaStream_t s) {
  switch (nx_for(p.n)) {
    case 1: return launch<Generic<B>, BF16, 1, 4, 1, XV>(p, s);
    case 2: return launch<Generic<B>, BF16, 2, 4, 1, XV>(p, s);
    case 4: return launch<Generic<B>, BF16, 4, 4, 1, XV>(p, s);
    default: return launch<Generic<B>, BF16, 8, 2, 1, XV>(p, s);
  }
}

// The generic kernel: any bits, packed words 4-byte aligned; xv: x 16-byte aligned.
template <bool BF16>
void launch_generic(const GemvParams& p, int bits, bool xv, cudaStream_t s) {
  auto go = [&](auto xv_tag) {
    constexpr bool XV = decltype(xv_tag)::value;
    switch (bits) {
      case 2: return launch_generic_bits<2, BF16, XV>(p, s);
      case 3: return launch_generic_bits<3, BF16, XV>(p, s);
      case 4: return launch_generic_bits<4, BF16, XV>(p, s);
      case 6: return launch_generic_bits<6, BF16, XV>(p, s);
      default: return launch_generic_bits<8, BF16, XV>(p, s);
    }
  };
  if (xv)
    go(std::true_type{});
  else
    go(std::false_type{});
}

extern template void launch_fast<false>(const GemvParams&, int, int, cudaStream_t);
extern template void launch_fast<true>(const GemvParams&, int, int, cudaStream_t);
extern template void launch_generic<false>(const GemvParams&, int, bool, cudaStream_t);
extern template void launch_generic<true>(const GemvParams&, int, bool, cudaStream_t);

}  // namespace osprey::cuda::qgemv
