// Flash attention on tensor cores (attention() with n > kDecodeMaxRows).
//
// Grid: (tile of 128 query vectors, split) x kv head, the tiles with the most keys first. A
// query vector is a (row, head of the group) pair, so a tile holds 128 / group rows of every
// query head that reads the block's kv head (each K/V tile read from L2 serves 128 vectors).
// q * scale is rounded to f16 into shared memory; warp w of 8 owns vectors 16w..16w+15 (rows
// of its m16n8k16 A fragments). K and V tiles of kN keys stream through kStages buffers with
// cp.async (rows outside the block's visible range are zero-filled, never read); per tile each
// warp computes S = Q K^T (ldmatrix), the online softmax in f32 (log2 units), and O += P V
// with P rounded to f16 and V fragments from ldmatrix.trans. Tiles no query of a warp can see
// are skipped; masks are applied only to tiles that some query of the warp sees in part.
// With bf16 K and V, q and P are rounded to bf16 and the mma is the bf16 one.
// NOTE: neither L2 traffic nor pipeline depth bounds it: 64 or 128 vectors per block and 2 or 3
// stages run alike (docs/benchmark_results/2026-12-05-cuda-kernel-tuning-notes.md).
#include <climits>

#include "backend/cuda/attention_impl.cuh"

namespace osprey::cuda::attn {
namespace {

constexpr int kWarps = 8;
constexpr int kThreadsP = 32 * kWarps;
constexpr int kM = 16 * kWarps;  // query vectors per block
constexpr int kStages = 2;       // K/V tiles in flight

template <int D>
struct Cfg {
  static constexpr int kN = D <= 128 ? 64 : 32;  // keys per tile
  static constexpr int kS = D + 8;               // shared row stride (f16): rows 16 bytes apart in banks
  static constexpr bool kQInRegs = D <= 128;     // Q fragments held in registers across tiles
  static constexpr size_t kSmem = size_t(kM + 2 * kStages * kN) * kS * 2;
};

// One fused pass (the file's head describes it): its length is the point. Splitting it into
// device functions would hand the fragment arrays, the pipeline state and the masks between
// them by reference for no reuse; the decode kernels' shared steps (attention_impl.cuh) do not
// fit its 16-row fragments and per-warp tile skipping.
template <int D, class E, bool kMapped>
__global__ void __launch_bounds__(kThreadsP, 1) prefill_kernel(const FastParams p) {
  using C = Cfg<D>;
  constexpr int kN = C::kN, kS = C::kS, kP = D + kPartialPad;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* qs = smem;             // [kM][kS]
  uint16_t* kvs = qs + kM * kS;    // [kStages][K, V][kN][kS]

  const AttentionArgs& a = p.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = p.n_tiles - 1 - int(blockIdx.x / p.n_splits), split = int(blockIdx.x % p.n_splits);
  const int hk = blockIdx.y;
  const int G = p.group;
  const int64_t nv = a.n * G, n_vec_all = a.n * a.n_heads;
  const Positions ps = positions<kMapped>(a);
  const int64_t s0 = int64_t(split) * p.split_keys, s1 = s0 + p.split_keys;
  const int64_t v_first = int64_t(tile) * kM, v_last = min(nv, v_first + kM) - 1;
  auto out_index = [&](int64_t v) {  // (row, head) of vector v; the host keeps n * n_heads below 2^31
    const int vi = int(v);
    return int64_t(vi / G) * a.n_heads + hk * G + vi % G;
  };

  int64_t kb, ke, x0, x1;
  visible_keys(a, ps, v_first / G, s0, s1, &kb, &x1);
  visible_keys(a, ps, v_last / G, s0, s1, &x0, &ke);
  if (kb >= ke) {
    if (p.partial) {
      for (int64_t v = v_first + tid; v <= v_last; v += kThreadsP) {
        float* dst = p.partial + (int64_t(split) * n_vec_all + out_index(v)) * kP;
        dst[D] = kNegInf;
        dst[D + 1] = 0.0f;
      }
    } else {
      for (int64_t e = tid; e < (v_last - v_first + 1) * D; e += kThreadsP)
        a.out[out_index(v_first + e / D) * D + e % D] = 0.0f;
    }
    return;
  }

  // Batch invariance: key tiles at multiples of kN from key 0, wherever this tile's first row
  // starts seeing keys (a sliding window), so a row meets the same tiles in any chunk; keys
  // before a row's window are masked in its scores.
  if (a.batch_invariant) kb = kb / kN * kN;
  const uint16_t* kh = a.k + hk * a.k_head_stride;
  const uint16_t* vh = a.v + hk * a.v_head_stride;
  const int64_t n_kt = (ke - kb + kN - 1) / kN;
  auto load_tile = [&](int64_t j) {
    const int64_t t0 = kb + j * kN;
    uint16_t* kd = kvs + int(j % kStages) * 2 * kN * kS;
    uint16_t* vd = kd + kN * kS;
    for (int c = tid; c < kN * (D / 8); c += kThreadsP) {
      const int r = c / (D / 8), ch = c % (D / 8);
      const int64_t key = t0 + r;
      const bool ok = key < ke;
      cp_async16(kd + r * kS + ch * 8, ok ? kh + key_row<kMapped>(a, ps, key) * a.k_row_stride + ch * 8 : kh, ok);
      cp_async16(vd + r * kS + ch * 8, ok ? vh + key_row<kMapped>(a, ps, key) * a.v_row_stride + ch * 8 : vh, ok);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < n_kt) load_tile(j);
    cp_async_commit();
  }

  for (int c = tid; c < kM * (D / 4); c += kThreadsP) {
    const int r = c / (D / 4), ch = c % (D / 4);
    const int64_t v = v_first + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (v <= v_last) x = __ldg(reinterpret_cast<const float4*>(a.q + out_index(v) * D + ch * 4));
    const float sc = p.q_scale;
    *reinterpret_cast<uint2*>(qs + r * kS + ch * 4) =
        make_uint2(E::pack(x.x * sc, x.y * sc), E::pack(x.z * sc, x.w * sc));
  }

  // This lane's rows of the warp tile (g and g + 8) and the warp's key range.
  int64_t lo[2], hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t v = v_first + warp * 16 + g + 8 * r;
    if (v <= v_last) {
      visible_keys(a, ps, v / G, kb, ke, &lo[r], &hi[r]);
    } else {
      lo[r] = hi[r] = 0;
    }
  }
  const int64_t wv0 = v_first + warp * 16, wv1 = min(v_last, wv0 + 15);
  const bool warp_on = wv0 <= v_last;
  int64_t w_lo_min = 0, w_hi_min = 0, w_lo_max = 0, w_hi_max = 0;
  if (warp_on) {
    visible_keys(a, ps, wv0 / G, kb, ke, &w_lo_min, &w_hi_min);
    visible_keys(a, ps, wv1 / G, kb, ke, &w_lo_max, &w_hi_max);
  }
  const bool warp_full = warp_on && wv1 - wv0 == 15;
  __syncthreads();

  uint32_t qa[C::kQInRegs ? D / 16 : 1][4];
  const uint16_t* q_warp = qs + (warp * 16 + (lane & 15)) * kS + (lane >> 4) * 8;
  if constexpr (C::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qa[kk], q_warp + kk * 16);
  }

  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};

  for (int64_t j = 0; j < n_kt; ++j) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile j is in; every warp is done with tile j - 1, whose buffer is refilled next
    if (j + kStages - 1 < n_kt) load_tile(j + kStages - 1);
    cp_async_commit();
    const int64_t t0 = kb + j * kN;
    if (warp_on && t0 < w_hi_max && t0 + kN > w_lo_min) {
      const uint16_t* kt = kvs + int(j % kStages) * 2 * kN * kS;
      const uint16_t* vt = kt + kN * kS;
      float s[kN / 8][4];
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[4];
        if constexpr (C::kQInRegs) {
          af[0] = qa[kk][0], af[1] = qa[kk][1], af[2] = qa[kk][2], af[3] = qa[kk][3];
        } else {
          ldmatrix_x4(af, q_warp + kk * 16);
        }
#pragma unroll
        for (int nb = 0; nb < kN / 8; nb += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, kt + (nb * 8 + (lane >> 4) * 8 + (lane & 7)) * kS + kk * 16 + ((lane >> 3) & 1) * 8);
          E::mma(s[nb], af, b[0], b[1]);
          E::mma(s[nb + 1], af, b[2], b[3]);
        }
      }

      const bool full = warp_full && t0 >= w_lo_max && t0 + kN <= w_hi_min;
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[nb][e];
          if (p.cap_out > 0.0f) x = p.cap_out * tanh_exp2(x * p.cap_in);
          if (!full) {
            const int64_t key = t0 + nb * 8 + 2 * t + (e & 1);
            x = key >= lo[e >> 1] && key < hi[e >> 1] ? x : kNegInf;
          }
          s[nb][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      float mu[2], corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r]);
        mu[r] = m_new == kNegInf ? 0.0f : m_new;
        corr[r] = exp2f(m[r] - mu[r]);
        m[r] = m_new;
      }
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e >> 1] += (s[nb][e] = exp2f(s[nb][e] - mu[e >> 1]));
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][0] *= corr[0], o[nd][1] *= corr[0];
        o[nd][2] *= corr[1], o[nd][3] *= corr[1];
      }

#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        const uint32_t pa[4] = {E::pack(s[2 * kk][0], s[2 * kk][1]), E::pack(s[2 * kk][2], s[2 * kk][3]),
                                E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int nd = 0; nd < D / 8; nd += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vt + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kS + nd * 8 + (lane >> 4) * 8);
          E::mma(o[nd], pa, b[0], b[1]);
          E::mma(o[nd + 1], pa, b[2], b[3]);
        }
      }
    }
  }

  if (!warp_on) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t v = wv0 + g + 8 * r;
    if (v > v_last) continue;
    const int64_t oi = out_index(v);
    if (p.partial) {
      float* dst = p.partial + (int64_t(split) * n_vec_all + oi) * kP;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
        *reinterpret_cast<float2*>(dst + nd * 8 + 2 * t) = make_float2(o[nd][2 * r], o[nd][2 * r + 1]);
      if (t == 0) dst[D] = m[r], dst[D + 1] = l[r];
    } else {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      float* dst = a.out + oi * D;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
        *reinterpret_cast<float2*>(dst + nd * 8 + 2 * t) = make_float2(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
    }
  }
}

template <int D, class E, bool kMapped>
void launch(const AttentionArgs& a, int64_t key_bound, cudaStream_t s) {
  using C = Cfg<D>;
  FastParams p = fast_params(a, kM);
  const int64_t base = int64_t(p.n_tiles) * a.n_kv_heads;
  const int64_t sms = sm_count();
  int64_t split_keys = key_bound;
  if (!a.batch_invariant && 2 * base <= sms && key_bound >= 4 * C::kN) {
    // Fewer blocks than half the SMs (short chunks after a long cache): about one block per SM,
    // each split at least two key tiles long.
    const int64_t want = (sms + base - 1) / base;
    split_keys = (key_bound + want - 1) / want;
    split_keys = std::max<int64_t>(2 * C::kN, (split_keys + C::kN - 1) / C::kN * C::kN);
  }
  const dim3 grid = set_splits(p, split_keys, key_bound, "prefill");
  static const bool smem_set = [] {
    OSPREY_CUDA_CHECK(
        cudaFuncSetAttribute(prefill_kernel<D, E, kMapped>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmem)));
    return true;
  }();
  (void)smem_set;
  prefill_kernel<D, E, kMapped><<<grid, kThreadsP, C::kSmem, s>>>(p);
  OSPREY_CUDA_CHECK_LAUNCH();
  if (p.n_splits > 1) launch_combine(a, p.partial, p.n_splits, s);
}

}  // namespace

void launch_prefill(const AttentionArgs& a, int64_t key_bound, bool mapped, cudaStream_t s) {
  dispatch_fast(a, mapped, "prefill", [&](auto d, auto e, auto m) {
    launch<decltype(d)::value, decltype(e), decltype(m)::value>(a, key_bound, s);
  });
}

}  // namespace osprey::cuda::attn
