#pragma once
// Internals of attention() shared by attention.cu (dispatch, CUDA-core fallback, combine),
// attention_decode.cu and attention_prefill.cu: the device-side position lookup, the
// tensor-core fragment helpers (mma.sync m16n8k16 f16 x f16 or bf16 x bf16 -> f32, ldmatrix,
// cp.async) and the launchers of the tensor-core paths.
//
// Every kernel is templated on the element type of K and V (Elem16: F16 or BF16; q and P are
// rounded to the same type for the mma) and on kMapped: false reads key j at row j (the dense
// cache, the code of the plain f16 path unchanged); true maps key j to its row through
// key_row() (a rotating cache's ring, or a linear view whose keys start past position 0).
//
// Fragment layout of mma.m16n8k16 (g = lane / 4, t = lane % 4; a 32-bit register holds two
// f16, the lower index in the low half):
//   A (16 x 16, row major): a[0] = (row g, cols 2t..2t+1), a[1] = (row g + 8, cols 2t..),
//                           a[2] = (row g, cols 2t+8..), a[3] = (row g + 8, cols 2t+8..)
//   B (16 x 8):             b[0] = (rows 2t..2t+1, col g), b[1] = (rows 2t+8..2t+9, col g)
//   C (16 x 8, f32):        c[0..1] = (row g, cols 2t..2t+1), c[2..3] = (row g + 8, cols 2t..)
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 128;  // decode and combine kernels: four warps

// The first query's key index and the key count of one call: from *q_pos_dev when set (keys
// clamped to max_keys), else from the arguments. Mapped: a ring holds the last
// min(p + n, ring_rows) positions up to the last query's, key 0 the oldest at row ring_base;
// a linear view's key 0 sits at position key_pos0.
struct Positions {
  int64_t q_pos0, n_keys;
  int64_t ring_base;  // mapped rings only
};
template <bool kMapped = false>
__device__ __forceinline__ Positions positions(const AttentionArgs& a) {
  if constexpr (!kMapped) {
    if (a.q_pos_dev) {
      const int64_t p = *a.q_pos_dev;
      return {p, min(p + a.n, a.max_keys), 0};
    }
    return {a.q_pos0, a.n_keys, 0};
  } else {
    if (!a.q_pos_dev) return {a.q_pos0, a.n_keys, a.ring_base};
    const int64_t p = *a.q_pos_dev;
    if (a.ring_rows > 0) {
      const int64_t n_keys = min(p + a.n, a.ring_rows), key_lo = p + a.n - n_keys;
      return {p - key_lo, n_keys, key_lo % a.ring_rows};
    }
    const int64_t q = p - a.key_pos0;
    return {q, min(q + a.n, a.max_keys), 0};
  }
}

// The row of key j (0 <= j < n_keys).
template <bool kMapped>
__device__ __forceinline__ int64_t key_row(const AttentionArgs& a, const Positions& ps, int64_t j) {
  if constexpr (!kMapped) {
    return j;
  } else {
    if (a.ring_rows == 0) return j;
    const int64_t r = ps.ring_base + j;
    return r >= a.ring_rows ? r - a.ring_rows : r;
  }
}

// Keys visible to query row i, intersected with [s0, s1); empty ranges come out as lo >= hi.
__device__ __forceinline__ void visible_keys(const AttentionArgs& a, const Positions& ps, int64_t i, int64_t s0,
                                             int64_t s1, int64_t* lo, int64_t* hi) {
  const int64_t p = ps.q_pos0 + i;
  *hi = min(min(p + 1, ps.n_keys), s1);
  *lo = max(a.window > 0 ? max(int64_t(0), p - int64_t(a.window) + 1) : int64_t(0), s0);
}

// Two f32 to an f16 pair (x in the low half).
__device__ __forceinline__ uint32_t pack_half2(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// tanh(y) from one exp2: absolute error ~1e-6 (softcap logits), far cheaper than tanhf.
__device__ __forceinline__ float tanh_exp2(float y) {
  return 1.0f - __fdividef(2.0f, exp2f(y * (2.0f * kLog2e)) + 1.0f);
}

// Two f32 to a bf16 pair (x in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf162(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// m16n8k16 with f32 accumulators on `ty` (f16 or bf16) operands: the top half (A's rows 8..15 zero,
// only c[0..1] kept) and the whole tile.
#define MMA_TOP_PTX(ty)                                                                             \
  "{\n.reg .f32 z0, z1;\nmma.sync.aligned.m16n8k16.row.col.f32." ty "." ty                               \
  ".f32 {%0,%1,z0,z1}, {%2,%6,%3,%6}, {%4,%5}, {%0,%1,%7,%7};\n}\n"
#define MMA_PTX(ty) \
  "mma.sync.aligned.m16n8k16.row.col.f32." ty "." ty ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"

template <bool kBf16>
struct MmaOps {
  // d += A B with A's rows 8..15 zero (a[1] = a[3] = 0): only c[0..1] are kept.
  static __device__ __forceinline__ void mma_top(float& d0, float& d1, uint32_t a0, uint32_t a2, uint32_t b0,
                                                 uint32_t b1) {
    if constexpr (kBf16)
      asm(MMA_TOP_PTX("bf16") : "+f"(d0), "+f"(d1) : "r"(a0), "r"(a2), "r"(b0), "r"(b1), "r"(0u), "f"(0.0f));
    else
      asm(MMA_TOP_PTX("f16") : "+f"(d0), "+f"(d1) : "r"(a0), "r"(a2), "r"(b0), "r"(b1), "r"(0u), "f"(0.0f));
  }
  // d += A B, all 16 rows.
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (kBf16)
      asm(MMA_PTX("bf16") : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
      asm(MMA_PTX("f16") : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
#undef MMA_TOP_PTX
#undef MMA_PTX

// The 16-bit element types of the tensor-core paths: pack() rounds two f32 into one operand
// register; mma_top() / mma() as MmaOps.
struct F16 : MmaOps<false> {
  using Tag = TagF16;
  static __device__ __forceinline__ uint32_t pack(float x, float y) { return pack_half2(x, y); }
};
struct BF16 : MmaOps<true> {
  using Tag = TagBF16;
  static __device__ __forceinline__ uint32_t pack(float x, float y) { return pack_bf162(x, y); }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 f16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16 bytes global -> shared, or 16 zero bytes when !pred (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Partial results of a key split, one row per (split, query row, query head):
// [n_splits, n * n_heads, head_dim + kPartialPad] f32 = acc[head_dim], m (log2 units), l, pad.
constexpr int kPartialPad = 4;

// Shared by both tensor-core kernels.
struct FastParams {
  AttentionArgs a;
  int64_t split_keys;  // keys per split (the last one may be short)
  int n_splits, n_tiles, group;
  float q_scale;            // q is multiplied by this before rounding to f16
  float cap_in, cap_out;    // softcap: s = cap_out * tanh(s * cap_in); cap_out = 0: none
  float* partial;           // [n_splits, n * n_heads, head_dim + kPartialPad] or nullptr (n_splits == 1)
};

// Fills the scale and softcap fields: scores come out in log2 units (exp2 in the softmax).
inline void set_score_scale(FastParams& p) {
  if (p.a.softcap > 0.0f) {
    p.q_scale = p.a.scale;
    p.cap_in = 1.0f / p.a.softcap;
    p.cap_out = p.a.softcap * kLog2e;
  } else {
    p.q_scale = p.a.scale * kLog2e;
    p.cap_in = p.cap_out = 0.0f;
  }
}

int sm_count();  // multiprocessors of the current device (cached)

// FastParams for a with the score scale set and n_tiles tiles of tile_rows query vectors
// (n query rows times the group of query heads that share a K/V head).
inline FastParams fast_params(const AttentionArgs& a, int tile_rows) {
  FastParams p{};
  p.a = a;
  p.group = int(a.n_heads / a.n_kv_heads);
  set_score_scale(p);
  p.n_tiles = int((a.n * p.group + tile_rows - 1) / tile_rows);
  return p;
}

// Key tiles of split_keys keys over key_bound keys: sets split_keys, n_splits and, past one split,
// the partial buffer (scratch()), and returns the grid. `kernel` names the kernel in the Unsupported
// message when the tiles times the splits overflow the grid.
inline dim3 set_splits(FastParams& p, int64_t split_keys, int64_t key_bound, const char* kernel) {
  const int64_t n_splits = (key_bound + split_keys - 1) / split_keys;
  if (int64_t(p.n_tiles) * n_splits > INT_MAX)
    throw Unsupported(std::string("attention: too many query rows for the ") + kernel + " kernel");
  p.split_keys = split_keys;
  p.n_splits = int(n_splits);
  p.partial = nullptr;
  if (n_splits > 1)
    p.partial = static_cast<float*>(
        scratch(size_t(n_splits * p.a.n * p.a.n_heads * (p.a.head_dim + kPartialPad)) * sizeof(float)));
  return dim3(unsigned(int64_t(p.n_tiles) * n_splits), unsigned(p.a.n_kv_heads));
}

// Split-K flash decoding on tensor cores (attention_decode.cu, paged_attention.cu): kWarps warps
// of a kThreads block; row g (= lane / 4) of the mma's A is query vector g of the block's tile.
//
// One warp's step over its 16 keys of a chunk in shared memory (kt, vt: its K and V rows, row
// stride kS elements; key index base + j for row j): S = Q K^T from the A fragments qa, the
// softcap (cap_out > 0), keys outside [lo, hi) masked, the online softmax state (m, l; log2
// units) updated, and O += P V with P rounded to E.
template <int D, int kS, class E>
__device__ __forceinline__ void decode_chunk_step(const uint32_t (&qa)[D / 16][2], const uint16_t* kt,
                                                  const uint16_t* vt, int base, int lo, int hi, float cap_in,
                                                  float cap_out, float (&o)[D / 8][2], float& m, float& l) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t b[4];
    ldmatrix_x4(b, kt + ((lane >> 4) * 8 + (lane & 7)) * kS + kk * 16 + ((lane >> 3) & 1) * 8);
    E::mma_top(s[0][0], s[0][1], qa[kk][0], qa[kk][1], b[0], b[1]);
    E::mma_top(s[1][0], s[1][1], qa[kk][0], qa[kk][1], b[2], b[3]);
  }
  float mx = kNegInf;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float x = s[nb][e];
      if (cap_out > 0.0f) x = cap_out * tanh_exp2(x * cap_in);
      const int key = base + nb * 8 + 2 * t + e;
      x = key >= lo && key < hi ? x : kNegInf;
      s[nb][e] = x;
      mx = fmaxf(mx, x);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == kNegInf ? 0.0f : m_new;
  const float corr = exp2f(m - m_use);
  float sum = 0.0f;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int e = 0; e < 2; ++e) sum += (s[nb][e] = exp2f(s[nb][e] - m_use));
  l = l * corr + sum;
  m = m_new;

  const uint32_t a0 = E::pack(s[0][0], s[0][1]), a2 = E::pack(s[1][0], s[1][1]);
#pragma unroll
  for (int nd = 0; nd < D / 8; nd += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, vt + (((lane >> 3) & 1) * 8 + (lane & 7)) * kS + nd * 8 + (lane >> 4) * 8);
    o[nd][0] *= corr, o[nd][1] *= corr, o[nd + 1][0] *= corr, o[nd + 1][1] *= corr;
    E::mma_top(o[nd][0], o[nd][1], a0, a2, b[0], b[1]);
    E::mma_top(o[nd + 1][0], o[nd + 1][1], a0, a2, b[2], b[3]);
  }
}

// The end of a decode block: waits for the outstanding cp.async groups (sm_o aliases the stage
// buffers), merges the warps' states in ascending warp order through shared memory, and calls
// emit(vi, d, num, m, l) for each vector vi < n_vecs and d < D, where m is the largest warp
// max, num = sum_w o_w[d] 2^(m_w - m) and l = sum_w l_w 2^(m_w - m).
template <int D, int kWarps, int kVecs, class Emit>
__device__ __forceinline__ void decode_merge_warps(const float (&o)[D / 8][2], float m, float l, float* sm_o,
                                                   float (&sm_m)[kWarps][kVecs], float (&sm_l)[kWarps][kVecs],
                                                   int n_vecs, Emit&& emit) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  cp_async_wait<0>();
  __syncthreads();  // the stage buffers become sm_o

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) sm_m[warp][g] = m, sm_l[warp][g] = l;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 2; ++e) sm_o[(warp * kVecs + g) * (D + 1) + nd * 8 + 2 * t + e] = o[nd][e];
  __syncthreads();

  for (int e = tid; e < kVecs * D; e += kThreads) {
    const int vi = e / D, d = e % D;
    if (vi >= n_vecs) break;
    float mm = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sm_m[w][vi]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm_m[w][vi];
      if (mw == kNegInf) continue;
      const float f = exp2f(mw - mm);
      num = fmaf(sm_o[(w * kVecs + vi) * (D + 1) + d], f, num);
      den = fmaf(sm_l[w][vi], f, den);
    }
    emit(vi, d, num, mm, den);
  }
}

// Calls f(std::integral_constant<int, D>, E, std::bool_constant<kMapped>) for a's head_dim (64,
// 128 or 256; `kernel` names the kernel in the Unsupported message for others), element type
// and mapping.
template <class E, bool kMapped, class F>
void dispatch_head_dim(const AttentionArgs& a, const char* kernel, F&& f) {
  switch (a.head_dim) {
    case 64: return f(std::integral_constant<int, 64>{}, E{}, std::bool_constant<kMapped>{});
    case 128: return f(std::integral_constant<int, 128>{}, E{}, std::bool_constant<kMapped>{});
    case 256: return f(std::integral_constant<int, 256>{}, E{}, std::bool_constant<kMapped>{});
    default:
      throw Unsupported(std::string("attention: ") + kernel + " kernel for head_dim " + std::to_string(a.head_dim));
  }
}
template <class F>
void dispatch_fast(const AttentionArgs& a, bool mapped, const char* kernel, F&& f) {
  if (a.bf16) return mapped ? dispatch_head_dim<BF16, true>(a, kernel, f) : dispatch_head_dim<BF16, false>(a, kernel, f);
  return mapped ? dispatch_head_dim<F16, true>(a, kernel, f) : dispatch_head_dim<F16, false>(a, kernel, f);
}

// The tensor-core paths; head_dim 64, 128 or 256, every pointer and stride 16-byte aligned.
// key_bound: max_keys when set, else n_keys (>= 1): it alone decides the split count.
// mapped: keys through key_row() (a ring, or a linear view past position 0).
void launch_decode(const AttentionArgs& a, int64_t key_bound, bool mapped, cudaStream_t s);
void launch_prefill(const AttentionArgs& a, int64_t key_bound, bool mapped, cudaStream_t s);
// out = merge of the n_splits partials (see kPartialPad) for every (row, head).
void launch_combine(const AttentionArgs& a, const float* partial, int n_splits, cudaStream_t s);

}  // namespace osprey::cuda::attn
