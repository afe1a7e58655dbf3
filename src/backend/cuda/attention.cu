// attention(): dispatch between the tensor-core paths (attention_decode.cu,
// attention_prefill.cu), the merge of their key-split partials, and the CUDA-core fallback
// for other head sizes and unaligned caches.
//
// Fallback: a block owns (block of query rows, kv head, range of keys). Its query vectors are
// every (row, query head of the group) pair, pre-scaled by `scale` and kept in shared memory
// with their f32 accumulators. The block walks its keys in tiles of kTile rows: the K and V rows
// of the tile are copied to shared memory (16-byte loads, rows padded by 16 bytes so that lanes
// reading different rows hit different banks), then
//   scores:     warp w takes query vectors w, w + 4, ...; lane t scores key t of the tile, and
//               the tile's max and sum are warp reductions (online softmax state m, l per vector);
//   accumulate: each thread owns elements (vector, d) of the accumulators: acc = acc * corr +
//               sum_t p[t] v[t][d].
// Only rows inside the block's visible range [k_begin, k_end) are ever loaded (rows >= n_keys
// never are; tile slots past k_end are zero-filled). When (row blocks x kv heads) would leave
// SMs idle (decode), keys are split into ranges; each range writes unnormalised partials
// (acc, m, l) that attention_combine merges. Templated like the tensor-core paths on the
// element type and on the key mapping (attention_impl.cuh).
#include <atomic>
#include <climits>
#include <type_traits>

#include "backend/cuda/attention_impl.cuh"

namespace osprey::cuda {

namespace attn {
namespace {

// partial [n_splits, n * n_heads, D + kPartialPad] -> out, one block per (row, head):
//   pass 1: M = max_s m_s, w_s = 2^(m_s - M) (0 for an empty split), den = sum_s w_s l_s;
//   pass 2: groups of D / 4 threads (a float4 each) take splits in turn, sum w_s acc_s, and merge.
// Empty splits wrote only m = -inf and l = 0; their acc is never read.
template <int D>
__global__ void __launch_bounds__(kThreads) combine_kernel(const float* partial, int n_splits, int64_t n_vec,
                                                          float* out) {
  pdl_wait();
  constexpr int kT = D / 4, kGroups = kThreads / kT, kP = D + kPartialPad;
  extern __shared__ float sm_w[];  // [n_splits]
  __shared__ float sm_red[32];
  __shared__ float4 sm_acc[kGroups][kT];
  const int tid = threadIdx.x;
  const float* src = partial + int64_t(blockIdx.x) * kP;
  const int64_t split_stride = n_vec * kP;

  float mx = kNegInf;
  for (int sp = tid; sp < n_splits; sp += kThreads) {
    const float m = src[sp * split_stride + D];
    sm_w[sp] = m;
    mx = fmaxf(mx, m);
  }
  mx = warp_max(mx);
  if ((tid & 31) == 0) sm_red[tid >> 5] = mx;
  __syncthreads();
  mx = sm_red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) mx = fmaxf(mx, sm_red[w]);
  float den = 0.0f;
  for (int sp = tid; sp < n_splits; sp += kThreads) {
    const float m = sm_w[sp];
    const float w = m == kNegInf ? 0.0f : exp2f(m - mx);
    sm_w[sp] = w;
    if (w > 0.0f) den = fmaf(w, src[sp * split_stride + D + 1], den);
  }
  den = block_sum(den, sm_red);  // its barriers also publish sm_w

  const int grp = tid / kT, t = tid % kT;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int sp = grp; sp < n_splits; sp += kGroups) {
    const float w = sm_w[sp];
    if (w > 0.0f) {
      const float4 x = *reinterpret_cast<const float4*>(src + sp * split_stride + 4 * t);
      acc.x = fmaf(x.x, w, acc.x);
      acc.y = fmaf(x.y, w, acc.y);
      acc.z = fmaf(x.z, w, acc.z);
      acc.w = fmaf(x.w, w, acc.w);
    }
  }
  sm_acc[grp][t] = acc;
  __syncthreads();
  if (tid >= kT) return;
  float4 num = sm_acc[0][t];
#pragma unroll
  for (int gi = 1; gi < kGroups; ++gi) {
    const float4 x = sm_acc[gi][t];
    num.x += x.x, num.y += x.y, num.z += x.z, num.w += x.w;
  }
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  *reinterpret_cast<float4*>(out + int64_t(blockIdx.x) * D + 4 * t) =
      make_float4(num.x * inv, num.y * inv, num.z * inv, num.w * inv);
}

}  // namespace

int sm_count() {
  static const int n = multiprocessor_count();
  return n;
}

void launch_combine(const AttentionArgs& a, const float* partial, int n_splits, cudaStream_t s) {
  const int64_t n_vec = a.n * a.n_heads;
  if (n_vec > INT_MAX) throw Unsupported("attention: too many query rows to combine");
  if (n_splits > 8192) throw Unsupported("attention: more than 8192 key splits");
  const unsigned grid = unsigned(n_vec);
  const size_t smem = size_t(n_splits) * sizeof(float);
  switch (a.head_dim) {
    case 64: launch_kernel(combine_kernel<64>, grid, kThreads, smem, s, partial, n_splits, n_vec, a.out); break;
    case 128: launch_kernel(combine_kernel<128>, grid, kThreads, smem, s, partial, n_splits, n_vec, a.out); break;
    case 256: launch_kernel(combine_kernel<256>, grid, kThreads, smem, s, partial, n_splits, n_vec, a.out); break;
    default: throw Unsupported("attention: combine for head_dim " + std::to_string(a.head_dim));
  }
}

}  // namespace attn

namespace {

constexpr int kTile = 32;  // keys per tile (one per lane in the score step)
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMinSplitKeys = 128;
constexpr int64_t kDecodeMaxRows = 4;  // query rows up to which the split-K decode kernel runs

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Byte offsets into the dynamic shared memory of one block.
struct Layout {
  size_t kt, vt;    // uint16 [kTile][head_dim + 8]
  size_t qs, acc;   // float [nq][head_dim]
  size_t ps;        // float [nq][kTile]
  size_t ms, ls, corr;  // float [nq]
  size_t lo, hi;    // int64 [nq]
  size_t total;
};

Layout make_layout(int64_t head_dim, int64_t nq) {
  Layout l;
  const size_t tile = size_t(kTile) * size_t(head_dim + 8) * 2;
  size_t at = 0;
  l.kt = at, at += tile;
  l.vt = at, at += tile;
  l.qs = at, at += size_t(nq * head_dim) * 4;
  l.acc = at, at += size_t(nq * head_dim) * 4;
  l.ps = at, at += size_t(nq * kTile) * 4;
  l.ms = at, at += size_t(nq) * 4;
  l.ls = at, at += size_t(nq) * 4;
  l.corr = at, at += size_t(nq) * 4;
  at = align_up(at, 8);
  l.lo = at, at += size_t(nq) * 8;
  l.hi = at, at += size_t(nq) * 8;
  l.total = align_up(at, 16);
  return l;
}

struct Params {
  AttentionArgs a;
  Layout lay;
  int64_t group;           // query heads per kv head
  int64_t rows_per_block;  // query rows per block
  int64_t nq;              // rows_per_block * group: query vectors per block
  int64_t n_splits, split_keys;
  bool vec;        // k, v rows may be read with 16-byte loads
  float* partial;  // [n_row_blocks, n_kv_heads, n_splits, nq, head_dim + 2], or nullptr
};

// Eight f16 of a row to a uint4, with 16-byte or scalar loads.
__device__ __forceinline__ uint4 load8(const uint16_t* p, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = uint32_t(__ldg(p + 2 * i)) | (uint32_t(__ldg(p + 2 * i + 1)) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The CUDA-core path in one fused pass over shared-memory tiles (scores, online softmax,
// accumulation): its length is the point, each phase reading the shared layout the previous
// one wrote.
template <class Tag, bool kMapped>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Params p) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = p.a;
  const int64_t D = a.head_dim, G = p.group, nq = p.nq;
  const int KS = int(D) + 8;
  uint16_t* kt = reinterpret_cast<uint16_t*>(smem + p.lay.kt);
  uint16_t* vt = reinterpret_cast<uint16_t*>(smem + p.lay.vt);
  float* qs = reinterpret_cast<float*>(smem + p.lay.qs);
  float* acc = reinterpret_cast<float*>(smem + p.lay.acc);
  float* ps = reinterpret_cast<float*>(smem + p.lay.ps);
  float* ms = reinterpret_cast<float*>(smem + p.lay.ms);
  float* ls = reinterpret_cast<float*>(smem + p.lay.ls);
  float* corr = reinterpret_cast<float*>(smem + p.lay.corr);
  int64_t* los = reinterpret_cast<int64_t*>(smem + p.lay.lo);
  int64_t* his = reinterpret_cast<int64_t*>(smem + p.lay.hi);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t rb = blockIdx.x / p.n_splits, split = blockIdx.x % p.n_splits, hk = blockIdx.y;
  const int64_t i0 = rb * p.rows_per_block;
  const int64_t n_rows = min(p.rows_per_block, a.n - i0);
  const int64_t nq_used = n_rows * G;
  const attn::Positions pos = attn::positions<kMapped>(a);
  const int64_t s0 = split * p.split_keys, s1 = min(pos.n_keys, s0 + p.split_keys);

  const int Di = int(D), nqi = int(nq), nq_used_i = int(nq_used);
  for (int e = tid; e < nqi * Di; e += kThreads) {
    const int qv = e / Di, d = e % Di;
    float v = 0.0f;
    if (qv < nq_used) v = a.q[((i0 + qv / G) * a.n_heads + hk * G + qv % G) * D + d] * a.scale;
    qs[e] = v;
    acc[e] = 0.0f;
  }
  for (int qv = tid; qv < nqi; qv += kThreads) {
    int64_t lo = 0, hi = 0;
    if (qv < nq_used) {
      attn::visible_keys(a, pos, i0 + qv / G, s0, s1, &lo, &hi);
    }
    los[qv] = lo;
    his[qv] = hi;
    ms[qv] = kNegInf;
    ls[qv] = 0.0f;
  }
  // The union of the rows' visible ranges within this split (every thread computes it).
  int64_t k_begin = s1, k_end = s0;
  for (int64_t r = 0; r < n_rows; ++r) {
    int64_t lo, hi;
    attn::visible_keys(a, pos, i0 + r, s0, s1, &lo, &hi);
    if (lo < hi) k_begin = min(k_begin, lo), k_end = max(k_end, hi);
  }
  // Batch invariance: tiles at multiples of kTile from key 0 (see the prefill kernel).
  if (a.batch_invariant && k_begin < k_end) k_begin = k_begin / kTile * kTile;
  __syncthreads();

  const uint16_t* kh = a.k + hk * a.k_head_stride;
  const uint16_t* vh = a.v + hk * a.v_head_stride;
  const int n_chunks = Di / 8;
  for (int64_t t0 = k_begin; t0 < k_end; t0 += kTile) {
    const int nt = int(min(int64_t(kTile), k_end - t0));
    for (int c = tid; c < kTile * n_chunks; c += kThreads) {
      const int t = c / n_chunks, ch = c % n_chunks;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (t < nt) {
        kv = load8(kh + attn::key_row<kMapped>(a, pos, t0 + t) * a.k_row_stride + ch * 8, p.vec);
        vv = load8(vh + attn::key_row<kMapped>(a, pos, t0 + t) * a.v_row_stride + ch * 8, p.vec);
      }
      *reinterpret_cast<uint4*>(kt + t * KS + ch * 8) = kv;
      *reinterpret_cast<uint4*>(vt + t * KS + ch * 8) = vv;
    }
    __syncthreads();

    for (int qv = warp; qv < nq_used_i; qv += kWarps) {
      const float m_old = ms[qv], l_old = ls[qv];
      const int64_t j = t0 + lane;
      float s = kNegInf;
      if (lane < nt) {
        const uint16_t* krow = kt + lane * KS;
        const float* q = qs + qv * D;
        float dot = 0.0f;
        for (int ch = 0; ch < n_chunks; ++ch) {
          float kf[8];
          if constexpr (std::is_same_v<Tag, TagBF16>)
            unpack8_bf16(*reinterpret_cast<const uint4*>(krow + ch * 8), kf);
          else
            unpack8_f16(*reinterpret_cast<const uint4*>(krow + ch * 8), kf);
          const float4 qa = *reinterpret_cast<const float4*>(q + ch * 8);
          const float4 qb = *reinterpret_cast<const float4*>(q + ch * 8 + 4);
          dot = fmaf(qa.x, kf[0], dot);
          dot = fmaf(qa.y, kf[1], dot);
          dot = fmaf(qa.z, kf[2], dot);
          dot = fmaf(qa.w, kf[3], dot);
          dot = fmaf(qb.x, kf[4], dot);
          dot = fmaf(qb.y, kf[5], dot);
          dot = fmaf(qb.z, kf[6], dot);
          dot = fmaf(qb.w, kf[7], dot);
        }
        if (a.softcap > 0.0f) dot = a.softcap * tanhf(dot / a.softcap);
        if (j >= los[qv] && j < his[qv]) s = dot;
      }
      const float m_new = fmaxf(m_old, warp_max(s));
      const float pj = m_new == kNegInf ? 0.0f : expf(s - m_new);
      const float c = m_new == kNegInf ? 1.0f : expf(m_old - m_new);
      const float sum = warp_sum(pj);
      ps[qv * kTile + lane] = pj;
      __syncwarp();
      if (lane == 0) {
        ms[qv] = m_new;
        ls[qv] = l_old * c + sum;
        corr[qv] = c;
      }
    }
    __syncthreads();

    for (int e = tid; e < nq_used_i * Di; e += kThreads) {
      const int qv = e / Di, d = e % Di;
      const float* pq = ps + qv * kTile;
      float v = acc[e] * corr[qv];
      for (int t = 0; t < nt; ++t) v = fmaf(pq[t], Tag::load(vt + t * KS + d), v);
      acc[e] = v;
    }
    __syncthreads();
  }

  for (int e = tid; e < nq_used_i * Di; e += kThreads) {
    const int qv = e / Di, d = e % Di;
    if (p.partial) {
      float* dst = p.partial + (((rb * a.n_kv_heads + hk) * p.n_splits + split) * nq + qv) * (D + 2);
      dst[d] = acc[e];
      if (d == 0) dst[D] = ms[qv], dst[D + 1] = ls[qv];
    } else {
      const float l = ls[qv];
      a.out[((i0 + qv / G) * a.n_heads + hk * G + qv % G) * D + d] = l > 0.0f ? acc[e] / l : 0.0f;
    }
  }
}

// One block per (row block, kv head, query vector): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void attention_combine_kernel(const Params p) {
  pdl_wait();
  const AttentionArgs& a = p.a;
  const int64_t D = a.head_dim, G = p.group, nq = p.nq;
  const int64_t qv = blockIdx.x % nq, rb = blockIdx.x / nq, hk = blockIdx.y;
  const int64_t i = rb * p.rows_per_block + qv / G;
  if (i >= a.n) return;
  const float* part = p.partial + ((rb * a.n_kv_heads + hk) * p.n_splits * nq + qv) * (D + 2);
  const int64_t split_stride = nq * (D + 2);
  float m = kNegInf;
  for (int64_t sp = 0; sp < p.n_splits; ++sp) m = fmaxf(m, part[sp * split_stride + D]);
  float* dst = a.out + (i * a.n_heads + hk * G + qv % G) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (m != kNegInf) {
      for (int64_t sp = 0; sp < p.n_splits; ++sp) {
        const float* ps = part + sp * split_stride;
        const float ms = ps[D];
        if (ms == kNegInf) continue;
        const float w = expf(ms - m);
        num = fmaf(ps[d], w, num);
        den = fmaf(ps[D + 1], w, den);
      }
    }
    dst[d] = den > 0.0f ? num / den : 0.0f;
  }
}

// Raises the kernel's dynamic shared-memory limit to `bytes` once (one device per process).
template <class Tag, bool kMapped>
void allow_shared(size_t bytes) {
  static std::atomic<size_t> allowed{48 * 1024};
  if (bytes <= allowed.load()) return;
  OSPREY_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<Tag, kMapped>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(bytes)));
  size_t cur = allowed.load();
  while (cur < bytes && !allowed.compare_exchange_weak(cur, bytes)) {
  }
}

// The CUDA-core kernel for any head_dim (multiple of 8 up to 256) and any 2-byte aligned cache.
template <class Tag, bool kMapped>
void attention_fallback(const AttentionArgs& a, int64_t key_bound, cudaStream_t s) {
  const int64_t D = a.head_dim;
  Params p{};
  p.a = a;
  p.group = a.n_heads / a.n_kv_heads;
  p.vec = aligned16(a.k) && aligned16(a.v) && a.k_head_stride % 8 == 0 && a.k_row_stride % 8 == 0 &&
          a.v_head_stride % 8 == 0 && a.v_row_stride % 8 == 0;

  int dev = 0, smem_max = 0;
  OSPREY_CUDA_CHECK(cudaGetDevice(&dev));
  OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int64_t cap = D <= 128 ? 64 : 32;  // query vectors per block to aim for
  p.rows_per_block = std::min<int64_t>(a.n, std::max<int64_t>(1, cap / p.group));
  p.lay = make_layout(D, p.rows_per_block * p.group);
  while (p.lay.total > size_t(smem_max) && p.rows_per_block > 1) {
    p.rows_per_block = (p.rows_per_block + 1) / 2;
    p.lay = make_layout(D, p.rows_per_block * p.group);
  }
  if (p.lay.total > size_t(smem_max))
    throw Unsupported("attention: " + std::to_string(p.group) + " query heads per kv head at head_dim " +
                      std::to_string(D) + " exceed shared memory");
  p.nq = p.rows_per_block * p.group;

  const int64_t n_row_blocks = (a.n + p.rows_per_block - 1) / p.rows_per_block;
  const int64_t base = n_row_blocks * a.n_kv_heads;
  const int64_t want = 2 * int64_t(attn::sm_count());
  p.n_splits = 1;
  p.split_keys = key_bound;
  if (!a.batch_invariant && base < want && key_bound >= 2 * kMinSplitKeys) {
    const int64_t splits = std::min((want + base - 1) / base, key_bound / kMinSplitKeys);
    p.split_keys = (key_bound + splits - 1) / splits;
    p.split_keys = (p.split_keys + kTile - 1) / kTile * kTile;
    p.n_splits = (key_bound + p.split_keys - 1) / p.split_keys;
  }
  if (n_row_blocks * p.n_splits > INT_MAX) throw Unsupported("attention: too many query rows");

  p.partial = nullptr;
  if (p.n_splits > 1)
    p.partial = static_cast<float*>(
        scratch(size_t(n_row_blocks * a.n_kv_heads * p.n_splits * p.nq * (D + 2)) * sizeof(float)));

  allow_shared<Tag, kMapped>(p.lay.total);
  const dim3 grid(unsigned(n_row_blocks * p.n_splits), unsigned(a.n_kv_heads));
  launch_kernel(attention_kernel<Tag, kMapped>, grid, kThreads, p.lay.total, s, p);
  if (p.n_splits > 1) {
    if (n_row_blocks * p.nq > INT_MAX) throw Unsupported("attention: too many query rows");
    const dim3 cgrid(unsigned(n_row_blocks * p.nq), unsigned(a.n_kv_heads));
    const int threads = int(std::min<int64_t>(256, (D + 31) / 32 * 32));
    launch_kernel(attention_combine_kernel, cgrid, threads, 0, s, p);
  }
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  const int64_t D = a.head_dim;
  if (D % 8 != 0 || D < 8 || D > 256)
    throw Unsupported("attention: head_dim " + std::to_string(D) + " (CUDA wants a multiple of 8 up to 256)");
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    throw InvalidInput("attention: " + std::to_string(a.n_heads) + " query heads over " +
                       std::to_string(a.n_kv_heads) + " kv heads");
  if (a.n_kv_heads > 65535) throw Unsupported("attention: more than 65535 kv heads");
  if (a.n * a.n_heads > INT_MAX) throw Unsupported("attention: more than 2^31 query vectors");
  if (a.q_pos_dev && a.max_keys <= 0) throw InvalidInput("attention: max_keys must be > 0 with q_pos_dev");
  if (!a.q_pos_dev && a.max_keys > 0 && a.n_keys > a.max_keys)
    throw InvalidInput("attention: n_keys " + std::to_string(a.n_keys) + " exceeds max_keys " +
                       std::to_string(a.max_keys));
  const int64_t key_bound = std::max<int64_t>(1, a.max_keys > 0 ? a.max_keys : a.n_keys);
  if (key_bound > INT_MAX / 2) throw Unsupported("attention: " + std::to_string(key_bound) + " keys (at most 2^30)");

  const bool tensor_cores = (D == 64 || D == 128 || D == 256) && aligned16(a.q) && aligned16(a.out) &&
                            aligned16(a.k) && aligned16(a.v) && a.k_head_stride % 8 == 0 &&
                            a.k_row_stride % 8 == 0 && a.v_head_stride % 8 == 0 && a.v_row_stride % 8 == 0;
  if (a.ring_rows < 0 || (a.ring_rows > 0 && (a.ring_base < 0 || a.ring_base >= a.ring_rows || a.key_pos0 != 0)))
    throw InvalidInput("attention: ring_rows " + std::to_string(a.ring_rows) + " with ring_base " +
                       std::to_string(a.ring_base) + " and key_pos0 " + std::to_string(a.key_pos0));
  if (a.ring_rows > 0 && a.q_pos_dev && a.max_keys < a.ring_rows)
    throw InvalidInput("attention: max_keys " + std::to_string(a.max_keys) + " below the ring's " +
                       std::to_string(a.ring_rows) + " rows");
  const bool mapped = a.ring_rows > 0 || a.key_pos0 != 0;
  if (!tensor_cores) {
    if (a.bf16)
      return mapped ? attention_fallback<TagBF16, true>(a, key_bound, s)
                    : attention_fallback<TagBF16, false>(a, key_bound, s);
    return mapped ? attention_fallback<TagF16, true>(a, key_bound, s)
                  : attention_fallback<TagF16, false>(a, key_bound, s);
  }
  // Batch invariance: the prefill kernel (without key splits) for any number of rows, so that a
  // row computes the same whether its chunk holds one row or many.
  if (a.n <= kDecodeMaxRows && !a.batch_invariant) return attn::launch_decode(a, key_bound, mapped, s);
  attn::launch_prefill(a, key_bound, mapped, s);
}

}  // namespace osprey::cuda
