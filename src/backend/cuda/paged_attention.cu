// The paged KV pool's kernels: decode attention over a paged pool, the paged K/V row write and
// the gather of one sequence's blocks (kernels.h; argument structs in backend/kernel_args.h).
//
// Attention is split-K flash decoding on tensor cores, the scheme of attention_decode.cu with
// keys fetched through a block table. Grid: (split x tile of 8 query heads, kv head, sequence).
// Split s covers the key positions [s * split_keys, (s + 1) * split_keys) of its
// sequence, fixed positions that no batch size or device count moves. A block reads its
// sequence's length and block table from device memory (so a captured graph replays while
// they change), clips its split to the keys the query sees, and returns at once when nothing
// is left (splits past the length, or before a sliding window). Otherwise its key range streams
// through shared memory in chunks of 64 keys with cp.async (kStages chunks in flight; rows of
// an absent key or of a block id outside the pool are zero-filled, never read). Warp w takes
// keys 16w..16w+15 of each chunk: S = Q K^T with m16n8k16 (the up to 8 query heads are rows
// 0..7 of A), online softmax in f32 (log2 units), O += P V with P rounded to the pool's type.
// The four warps merge in a fixed order and write an unnormalised partial (acc, m, l); the
// combine kernel then merges each (sequence, head)'s live splits in ascending order. Every
// step depends only on the sequence's own data, so its output is the same bit for bit in any
// batch.
#include <climits>

#include "backend/cuda/attention_impl.cuh"

namespace osprey::cuda {
namespace paged {
namespace {

using attn::kThreads;
using attn::kPartialPad;

constexpr int kWarps = kThreads / 32;
constexpr int kVecs = 8;                // query heads per block (rows 0..7 of the mma)
constexpr int kStep = 16;               // keys per warp and chunk
constexpr int kChunk = kWarps * kStep;  // keys per chunk
constexpr int kStages = 3;              // chunks in flight
static_assert(kPagedSplitKeys % kChunk == 0, "a split is whole chunks");

template <int D>
struct Cfg {
  static constexpr int kS = D + 8;  // shared row stride (16-bit elements): rows 16 bytes apart in banks
  static constexpr size_t kStage = size_t(2) * kChunk * kS * 2;            // K and V of one chunk, bytes
  static constexpr size_t kMerge = size_t(kWarps) * kVecs * (D + 1) * 4;  // aliases the stages at the end
  static constexpr size_t kSmem = std::max(kStages * kStage, kMerge);
};

struct Params {
  PagedAttentionArgs a;
  int n_splits, n_tiles, group;
  float q_scale;          // q is multiplied by this before rounding to the pool's type
  float cap_in, cap_out;  // softcap: s = cap_out * tanh(s * cap_in); cap_out = 0: none
  float* partial;         // [n, n_heads, n_splits, head_dim + kPartialPad]: acc, m (log2 units), l
};

// The keys sequence `seq`'s query sees, [lo, hi): its length read on the device, clamped to the
// table's capacity (the host keeps it below 2^30).
struct Range {
  int lo, hi;
};
__device__ __forceinline__ Range seq_range(const PagedAttentionArgs& a, int seq) {
  const int64_t cap = a.max_blocks * a.block_size;
  const int64_t len = min(max(int64_t(a.seq_lens[seq]), int64_t(0)), cap);
  const int64_t lo = a.window > 0 ? max(int64_t(0), len - int64_t(a.window)) : int64_t(0);
  return {int(lo), int(len)};
}

template <int D, class E>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 1) paged_decode_kernel(const Params p) {
  pdl_wait();
  using C = Cfg<D>;
  constexpr int kS = C::kS, kNd = D / 8, kP = D + kPartialPad;
  extern __shared__ __align__(16) uint16_t smem[];  // [kStages][K, V][kChunk][kS]
  float* sm_o = reinterpret_cast<float*>(smem);     // [kWarps][kVecs][D + 1], after the loop
  __shared__ float sm_m[kWarps][kVecs], sm_l[kWarps][kVecs];

  const PagedAttentionArgs& a = p.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x % p.n_tiles, split = blockIdx.x / p.n_tiles, hk = blockIdx.y, seq = blockIdx.z;
  const int G = p.group;
  const Range r = seq_range(a, seq);
  const int split_keys = int(a.split_keys);
  const int kb = max(r.lo, split * split_keys), ke = min(r.hi, (split + 1) * split_keys);
  if (kb >= ke) return;  // nothing of this split is visible: the combine skips it
  const int v_first = tile * kVecs, n_vecs = min(G - v_first, kVecs);

  const int32_t* table = a.block_tables + int64_t(seq) * a.max_blocks;
  const int bs = int(a.block_size);
  const int64_t block_elems = a.n_kv_heads * a.block_size * D;
  const uint16_t* kh = a.k + int64_t(hk) * a.block_size * D;  // head hk of block 0
  const uint16_t* vh = a.v + int64_t(hk) * a.block_size * D;
  const int n_chunks = (ke - kb + kChunk - 1) / kChunk;
  auto load_chunk = [&](int c) {
    const int t0 = kb + c * kChunk;
    uint16_t* kd = smem + (c % kStages) * (C::kStage / 2);
    uint16_t* vd = kd + kChunk * kS;
    for (int i = tid; i < kChunk * (D / 8); i += kThreads) {
      const int row = i / (D / 8), ch = i % (D / 8);
      const int key = t0 + row;
      bool ok = key < ke;
      int64_t off = 0;
      if (ok) {
        const int blk = __ldg(table + key / bs);
        ok = blk >= 0 && blk < a.n_blocks;
        off = int64_t(blk) * block_elems + int64_t(key % bs) * D + ch * 8;
      }
      attn::cp_async16(kd + row * kS + ch * 8, ok ? kh + off : kh, ok);
      attn::cp_async16(vd + row * kS + ch * 8, ok ? vh + off : vh, ok);
    }
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < n_chunks) load_chunk(c);
    attn::cp_async_commit();
  }

  // This lane's query head (row g of the mma) and its A fragments; rows past the group are zero.
  const bool v_ok = g < n_vecs;
  uint32_t qa[D / 16][2];
  {
    const float* qrow = a.q + int64_t(seq) * a.q_row_stride + int64_t(hk * G + v_first + (v_ok ? g : 0)) * D + 2 * t;
    const float sc = v_ok ? p.q_scale : 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const float* x = qrow + kk * 16;
      qa[kk][0] = E::pack(__ldg(x) * sc, __ldg(x + 1) * sc);
      qa[kk][1] = E::pack(__ldg(x + 8) * sc, __ldg(x + 9) * sc);
    }
  }

  float o[kNd][2];
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd) o[nd][0] = o[nd][1] = 0.0f;
  float m = kNegInf, l = 0.0f;

  for (int c = 0; c < n_chunks; ++c) {
    attn::cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c is in; every warp is done with chunk c - 1, whose buffer is refilled next
    if (c + kStages - 1 < n_chunks) load_chunk(c + kStages - 1);
    attn::cp_async_commit();

    const int base = kb + c * kChunk + warp * kStep;
    if (base >= ke) continue;  // warp-uniform: this warp's keys of the last chunk are all past the range
    const uint16_t* kt = smem + (c % kStages) * (C::kStage / 2) + warp * kStep * kS;
    const uint16_t* vt = kt + kChunk * kS;

    // Every key of a chunk is at least kb: only the end of the range masks.
    attn::decode_chunk_step<D, kS, E>(qa, kt, vt, base, kb, ke, p.cap_in, p.cap_out, o, m, l);
  }
  const int64_t h0 = int64_t(hk) * G + v_first;  // the tile's first query head
  attn::decode_merge_warps<D, kWarps, kVecs>(o, m, l, sm_o, sm_m, sm_l, n_vecs,
                                             [&](int vi, int d, float num, float mm, float den) {
                                               const int64_t row = int64_t(seq) * a.n_heads + h0 + vi;
                                               float* dst = p.partial + (row * p.n_splits + split) * kP;
                                               dst[d] = num;
                                               if (d == 0) dst[D] = mm, dst[D + 1] = den;
                                             });
}

// One block per (sequence, head): out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M) over the
// splits that the attention kernel wrote (those that hold a visible key), in ascending order.
// A sequence with no visible key gets zeros.
template <int D>
__global__ void __launch_bounds__(kThreads) paged_combine_kernel(const Params p) {
  pdl_wait();
  constexpr int kP = D + kPartialPad;
  const PagedAttentionArgs& a = p.a;
  const int64_t vec = blockIdx.x;  // seq * n_heads + head
  const int seq = int(vec / a.n_heads);
  float* dst = a.out + vec * D;
  const Range r = seq_range(a, seq);
  if (r.lo >= r.hi) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = 0.0f;
    return;
  }
  const int s_first = r.lo / int(a.split_keys), s_last = (r.hi - 1) / int(a.split_keys);
  const float* src = p.partial + vec * p.n_splits * kP;
  float mx = kNegInf;
  for (int sp = s_first; sp <= s_last; ++sp) mx = fmaxf(mx, src[sp * kP + D]);
  float den = 0.0f;
  for (int sp = s_first; sp <= s_last; ++sp) {
    const float m = src[sp * kP + D];
    if (m != kNegInf) den = fmaf(src[sp * kP + D + 1], exp2f(m - mx), den);
  }
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    for (int sp = s_first; sp <= s_last; ++sp) {
      const float m = src[sp * kP + D];
      if (m != kNegInf) num = fmaf(src[sp * kP + d], exp2f(m - mx), num);
    }
    dst[d] = num * inv;
  }
}

template <int D, class E>
void launch(const PagedAttentionArgs& a, cudaStream_t s) {
  using C = Cfg<D>;
  static const bool configured = [] {
    OSPREY_CUDA_CHECK(cudaFuncSetAttribute(paged_decode_kernel<D, E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(C::kSmem)));
    return true;
  }();
  (void)configured;
  Params p{};
  p.a = a;
  p.group = int(a.n_heads / a.n_kv_heads);
  if (a.softcap > 0.0f) {  // scores come out in log2 units (exp2 in the softmax)
    p.q_scale = a.scale;
    p.cap_in = 1.0f / a.softcap;
    p.cap_out = a.softcap * attn::kLog2e;
  } else {
    p.q_scale = a.scale * attn::kLog2e;
    p.cap_in = p.cap_out = 0.0f;
  }
  if (a.split_keys < kChunk || a.split_keys % kChunk != 0 || a.split_keys > (int64_t(1) << 24))
    throw InvalidInput("attention (paged): split_keys " + std::to_string(a.split_keys) + " must be a positive multiple of " +
                       std::to_string(kChunk));
  const int64_t max_keys = a.max_blocks * a.block_size;
  const int64_t n_splits = (max_keys + a.split_keys - 1) / a.split_keys;
  const int64_t n_tiles = (p.group + kVecs - 1) / kVecs;
  if (n_splits * n_tiles > INT_MAX) throw Unsupported("attention (paged): too many key splits");
  p.n_splits = int(n_splits);
  p.n_tiles = int(n_tiles);
  // NOTE: sized by the launch shape only, so a captured graph keeps its scratch while the
  // lengths change.
  p.partial = static_cast<float*>(scratch(size_t(a.n * a.n_heads * n_splits * (D + kPartialPad)) * sizeof(float)));
  const dim3 grid(unsigned(n_splits * n_tiles), unsigned(a.n_kv_heads), unsigned(a.n));
  launch_kernel(paged_decode_kernel<D, E>, grid, kThreads, C::kSmem, s, p);
  launch_kernel(paged_combine_kernel<D>, unsigned(a.n * a.n_heads), kThreads, 0, s, p);
}

template <class E>
void launch_for(const PagedAttentionArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 16: return launch<16, E>(a, s);
    case 32: return launch<32, E>(a, s);
    case 64: return launch<64, E>(a, s);
    case 128: return launch<128, E>(a, s);
    case 256: return launch<256, E>(a, s);
    default:
      throw Unsupported("attention (paged): head_dim " + std::to_string(a.head_dim) +
                        " on CUDA (16, 32, 64, 128 or 256)");
  }
}

// Grid (n, n_kv_heads): one head's K and V row of source row i, rounded to f16 or bf16
// (kBF16), to its slot; a slot below 0 or past the pool writes nothing.
template <bool kBF16>
__global__ void kv_write_paged_kernel(const PagedKVWriteArgs a) {
  pdl_wait();
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const int64_t slot = a.slots[i];
  if (slot < 0 || slot >= a.n_blocks * a.block_size) return;
  const int64_t row = ((slot / a.block_size) * a.n_kv_heads + h) * a.block_size + slot % a.block_size;
  const float* ks = a.k + i * a.k_row_stride + h * a.head_dim;
  const float* vs = a.v + i * a.v_row_stride + h * a.head_dim;
  uint16_t* kd = a.kpool + row * a.head_dim;
  uint16_t* vd = a.vpool + row * a.head_dim;
  store_kv_head<kBF16>(kd, vd, ks, vs, a.head_dim);
}

// out [n_kv_heads, n_rows, head_dim], element by element (grid-stride); an id outside the pool
// gives zeros.
__global__ void gather_kv_blocks_kernel(const PagedGatherArgs a) {
  const int64_t D = a.head_dim, total = a.n_kv_heads * a.n_rows * D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, j = (e / D) % a.n_rows, h = e / (D * a.n_rows);
    const int64_t blk = a.block_ids[j / a.block_size];
    a.out[e] = blk >= 0 && blk < a.n_blocks
                   ? a.pool[((blk * a.n_kv_heads + h) * a.block_size + j % a.block_size) * D + d]
                   : uint16_t(0);
  }
}

}  // namespace
}  // namespace paged

void paged_attention(const PagedAttentionArgs& a, cudaStream_t s) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    throw InvalidInput("attention (paged): " + std::to_string(a.n_heads) + " query heads over " +
                       std::to_string(a.n_kv_heads) + " kv heads");
  if (a.block_size <= 0 || a.max_blocks <= 0)
    throw InvalidInput("attention (paged): block_size " + std::to_string(a.block_size) + " and max_blocks " +
                       std::to_string(a.max_blocks) + " must be > 0");
  if (a.n > 65535) throw Unsupported("attention (paged): more than 65535 sequences in one call");
  if (a.n_kv_heads > 65535) throw Unsupported("attention (paged): more than 65535 kv heads");
  if (a.n * a.n_heads > INT_MAX) throw Unsupported("attention (paged): more than 2^31 query vectors");
  if (a.max_blocks * a.block_size > INT_MAX / 2)
    throw Unsupported("attention (paged): block tables of " + std::to_string(a.max_blocks * a.block_size) +
                      " keys (at most 2^30)");
  if (!aligned16(a.k) || !aligned16(a.v))
    throw Unsupported("attention (paged): the k and v pools must be 16-byte aligned");
  if (a.bf16) return paged::launch_for<attn::BF16>(a, s);
  paged::launch_for<attn::F16>(a, s);
}

void kv_write_paged(const PagedKVWriteArgs& a, cudaStream_t s) {
  if (a.n <= 0) return;
  if (a.n > 0x7fffffffLL || a.n_kv_heads > 65535) throw Unsupported("write_kv_paged: too many rows or heads");
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (a.head_dim + 31) / 32 * 32)));
  const dim3 grid(unsigned(a.n), unsigned(a.n_kv_heads));
  if (a.bf16)
    launch_kernel(paged::kv_write_paged_kernel<true>, grid, threads, 0, s, a);
  else
    launch_kernel(paged::kv_write_paged_kernel<false>, grid, threads, 0, s, a);
}

void gather_kv_blocks(const PagedGatherArgs& a, cudaStream_t s) {
  const int64_t total = a.n_kv_heads * a.n_rows * a.head_dim;
  if (total <= 0) return;
  constexpr int kGatherThreads = 256;
  paged::gather_kv_blocks_kernel<<<grid_for(total, kGatherThreads), kGatherThreads, 0, s>>>(a);
  OSPREY_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
