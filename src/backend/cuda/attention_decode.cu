// Split-K flash decoding on tensor cores (attention() with n <= kDecodeMaxRows).
//
// Grid: (split, tile of 8 query vectors) x kv head. A query vector is a (row, head of the
// group) pair, so one block serves every query head that reads its kv head and each K/V row
// of its key range is read once. The range streams through shared memory in chunks of 64 keys
// with cp.async (kStages chunks in flight, no registers held by loads; rows outside the
// visible range are zero-filled, never read). Warp w takes keys 16w..16w+15 of each chunk:
// S = Q K^T with m16n8k16 (the 8 vectors are rows 0..7 of A, rows 8..15 zero), the online
// softmax in f32 (log2 units), O += P V with P rounded to f16; K and V fragments come from
// ldmatrix / ldmatrix.trans. The four warps merge their states at the end and write either
// the output (one split) or an unnormalised partial for attention_combine. With bf16 K and V,
// q and P are rounded to bf16 and the mma is the bf16 one (attention_impl.cuh, Elem16).
#include <climits>

#include "backend/cuda/attention_impl.cuh"

namespace osprey::cuda::attn {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kVecs = 8;                 // query vectors per block (rows 0..7 of the mma)
constexpr int kStep = 16;                // keys per warp and chunk
constexpr int kChunk = kWarps * kStep;   // keys per chunk
constexpr int kStages = 3;               // chunks in flight

template <int D>
struct Cfg {
  static constexpr int kS = D + 8;  // shared row stride (f16): rows 16 bytes apart in banks
  static constexpr size_t kStage = size_t(2) * kChunk * kS * 2;  // K and V of one chunk, bytes
  static constexpr size_t kMerge = size_t(kWarps) * kVecs * (D + 1) * 4;  // aliases the stages at the end
  static constexpr size_t kSmem = std::max(kStages * kStage, kMerge);
};

template <int D, class E, bool kMapped>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 1) decode_kernel(const FastParams p) {
  pdl_wait();
  using C = Cfg<D>;
  constexpr int kS = C::kS, kNd = D / 8, kP = D + kPartialPad;
  extern __shared__ __align__(16) uint16_t smem[];  // [kStages][K, V][kChunk][kS]
  float* sm_o = reinterpret_cast<float*>(smem);     // [kWarps][kVecs][D + 1], after the loop
  __shared__ float sm_m[kWarps][kVecs], sm_l[kWarps][kVecs];

  const AttentionArgs& a = p.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x % p.n_tiles, split = blockIdx.x / p.n_tiles, hk = blockIdx.y;
  const int G = p.group;
  const int64_t nv = a.n * G, n_vec_all = a.n * a.n_heads;
  const Positions ps = positions<kMapped>(a);
  const int64_t s0 = int64_t(split) * p.split_keys, s1 = s0 + p.split_keys;
  const int64_t v_first = int64_t(tile) * kVecs, v_last = min(nv, v_first + kVecs) - 1;

  int64_t kb64, ke64, lo64, hi64;
  visible_keys(a, ps, v_first / G, s0, s1, &kb64, &hi64);
  visible_keys(a, ps, v_last / G, s0, s1, &lo64, &ke64);
  const int kb = int(kb64), ke = int(ke64);  // the host keeps key counts below 2^30
  auto out_index = [&](int64_t v) {  // (row, head) of vector v; the host keeps n * n_heads below 2^31
    const int vi = int(v);
    return int64_t(vi / G) * a.n_heads + hk * G + vi % G;
  };

  if (kb >= ke) {  // nothing of this split is visible to the tile (e.g. past the live keys)
    if (p.partial) {
      for (int64_t v = v_first + tid; v <= v_last; v += kThreads) {
        float* dst = p.partial + (int64_t(split) * n_vec_all + out_index(v)) * kP;
        dst[D] = kNegInf;
        dst[D + 1] = 0.0f;
      }
    } else {
      for (int64_t e = tid; e < (v_last - v_first + 1) * D; e += kThreads)
        a.out[out_index(v_first + e / D) * D + e % D] = 0.0f;
    }
    return;
  }

  const uint16_t* kh = a.k + hk * a.k_head_stride;
  const uint16_t* vh = a.v + hk * a.v_head_stride;
  const int n_chunks = (ke - kb + kChunk - 1) / kChunk;
  auto load_chunk = [&](int c) {
    const int t0 = kb + c * kChunk;
    uint16_t* kd = smem + (c % kStages) * (C::kStage / 2);
    uint16_t* vd = kd + kChunk * kS;
    for (int i = tid; i < kChunk * (D / 8); i += kThreads) {
      const int r = i / (D / 8), ch = i % (D / 8);
      const int key = t0 + r;
      const bool ok = key < ke;
      cp_async16(kd + r * kS + ch * 8, ok ? kh + key_row<kMapped>(a, ps, int64_t(key)) * a.k_row_stride + ch * 8 : kh,
                 ok);
      cp_async16(vd + r * kS + ch * 8, ok ? vh + key_row<kMapped>(a, ps, int64_t(key)) * a.v_row_stride + ch * 8 : vh,
                 ok);
    }
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < n_chunks) load_chunk(c);
    cp_async_commit();
  }

  // This lane's query vector (row g of the mma), its A fragments and its visible keys.
  const int64_t v = v_first + g;
  const bool v_ok = v <= v_last;
  int lo = 0, hi = 0;
  if (v_ok) {
    visible_keys(a, ps, v / G, kb, ke, &lo64, &hi64);
    lo = int(lo64), hi = int(hi64);
  }
  uint32_t qa[D / 16][2];
  {
    const float* qrow = a.q + out_index(v_ok ? v : v_first) * D + 2 * t;
    const float sc = v_ok ? p.q_scale : 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const float2 x0 = __ldg(reinterpret_cast<const float2*>(qrow + kk * 16));
      const float2 x1 = __ldg(reinterpret_cast<const float2*>(qrow + kk * 16 + 8));
      qa[kk][0] = E::pack(x0.x * sc, x0.y * sc);
      qa[kk][1] = E::pack(x1.x * sc, x1.y * sc);
    }
  }

  float o[kNd][2];
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd) o[nd][0] = o[nd][1] = 0.0f;
  float m = kNegInf, l = 0.0f;

  for (int c = 0; c < n_chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c is in; every warp is done with chunk c - 1, whose buffer is refilled next
    if (c + kStages - 1 < n_chunks) load_chunk(c + kStages - 1);
    cp_async_commit();

    const int base = kb + c * kChunk + warp * kStep;
    if (base >= ke) continue;  // warp-uniform: this warp's keys of the last chunk are all past the range
    const uint16_t* kt = smem + (c % kStages) * (C::kStage / 2) + warp * kStep * kS;
    const uint16_t* vt = kt + kChunk * kS;

    decode_chunk_step<D, kS, E>(qa, kt, vt, base, lo, hi, p.cap_in, p.cap_out, o, m, l);
  }
  decode_merge_warps<D, kWarps, kVecs>(o, m, l, sm_o, sm_m, sm_l, int(v_last - v_first + 1),
                                       [&](int vi, int d, float num, float mm, float den) {
                                         const int64_t oi = out_index(v_first + vi);
                                         if (p.partial) {
                                           float* dst = p.partial + (int64_t(split) * n_vec_all + oi) * kP;
                                           dst[d] = num;
                                           if (d == 0) dst[D] = mm, dst[D + 1] = den;
                                         } else {
                                           a.out[oi * D + d] = den > 0.0f ? num / den : 0.0f;
                                         }
                                       });
}

template <int D, class E, bool kMapped>
void launch(const AttentionArgs& a, int64_t key_bound, cudaStream_t s) {
  using C = Cfg<D>;
  static const int blocks_per_sm = [] {
    OSPREY_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<D, E, kMapped>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(C::kSmem)));
    int n = 0;
    OSPREY_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<D, E, kMapped>, kThreads, C::kSmem));
    return std::max(n, 1);
  }();
  FastParams p = fast_params(a, kVecs);
  const int64_t base = int64_t(p.n_tiles) * a.n_kv_heads;
  // One wave of blocks over the SMs, each with whole chunks of keys.
  const int64_t want = std::max<int64_t>(1, int64_t(blocks_per_sm) * sm_count() / base);
  int64_t split_keys = (key_bound + want - 1) / want;
  split_keys = std::max<int64_t>(kChunk, (split_keys + kChunk - 1) / kChunk * kChunk);
  const dim3 grid = set_splits(p, split_keys, key_bound, "decode");
  launch_kernel(decode_kernel<D, E, kMapped>, grid, kThreads, C::kSmem, s, p);
  if (p.n_splits > 1) launch_combine(a, p.partial, p.n_splits, s);
}

}  // namespace

void launch_decode(const AttentionArgs& a, int64_t key_bound, bool mapped, cudaStream_t s) {
  dispatch_fast(a, mapped, "decode", [&](auto d, auto e, auto m) {
    launch<decltype(d)::value, decltype(e), decltype(m)::value>(a, key_bound, s);
  });
}

}  // namespace osprey::cuda::attn
