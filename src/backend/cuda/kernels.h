#pragma once
// CUDA kernels behind the ops of backend/ops.h. Internal header: only src/backend/cuda and the
// ops dispatch include it. Every pointer is a device pointer; every function enqueues its work
// on `s` and returns at once (no host synchronisation). Activations are f32; weights f32, f16
// or bf16 as named by a DType. Callers (ops.cpp) check shapes and dtypes; these functions
// check only what the kernels themselves need (alignment, supported sizes) and throw
// Unsupported otherwise. Launch failures throw osprey::Error (see runtime.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/kernel_args.h"
#include "core/dtype.h"

namespace osprey::cuda {

using osprey::AttentionArgs;
using osprey::KVWriteArgs;

// table [vocab, d] (f32|f16|bf16), ids [n] i32 (each in [0, vocab), checked by the caller)
// -> out [n, d] f32, each row times `scale`.
void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t d, float scale, float* out,
               cudaStream_t s);

// x [rows, d] f32, w [d] f32 -> out [rows, d]: x / rms(x) * (w + w_offset). out may equal x.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out,
              cudaStream_t s);

// x [rows, d] f32, w [d], b [d] or nullptr -> out [rows, d] (mean-centred LayerNorm). out may equal x.
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* out,
                cudaStream_t s);

// x[i] += y[i], i < n
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);
// x[i] *= f, i < n
void scale_inplace(float* x, float f, int64_t n, cudaStream_t s);
// out[i] = silu(g[i]) * u[i], i < n (out may alias g or u)
void silu_mul(const float* g, const float* u, float* out, int64_t n, cudaStream_t s);
// out[i] = gelu_tanh(g[i]) * u[i], i < n (out may alias g or u)
void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n, cudaStream_t s);

// x [n, heads, head_dim] f32 rotated in place; positions [n] i32; inv_freq [head_dim / 2] f32.
// `interleaved`: pairs (2i, 2i+1), else (i, i + head_dim/2). cos and sin times `mscale`.
// Row i starts at x + i * row_stride (row_stride >= heads * head_dim: e.g. the q and k heads
// of a fused q/k/v row).
void rope_inplace(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
                  const float* inv_freq, bool interleaved, float mscale, cudaStream_t s);

// y[n, out] = x[n, in] w[out, in]^T + bias[out] (bias may be nullptr); x, y f32 contiguous,
// w f32|f16|bf16 row-major contiguous. n <= kGemvMaxRows: a GEMV that streams w once with
// 16-byte loads, f32 accumulation (exact products of the f32 x and the stored weights).
// Larger n: x is rounded to w's 16-bit type and multiplied by cuBLAS (f32 accumulate, f32 out;
// f32 w uses SGEMM). Uses scratch() for the rounded x.
// NOTE: with f16 weights, |x| beyond 65504 overflows in the cuBLAS path.
constexpr int64_t kGemvMaxRows = 8;
void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
            float* y, cudaStream_t s);
// The two paths of linear(), with its contract, exposed for tests and benchmarks. linear_gemv
// takes any n >= 1 (it runs in chunks of kGemvMaxRows rows); rows_per_warp 1, 2 or 4 forces
// the GEMV's output rows per warp (benchmarks), 0 picks by shape.
void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s, int rows_per_warp);
void linear_gemv(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s);
void linear_gemm(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias,
                 float* y, cudaStream_t s);

// Causal grouped-query attention (query head h reads kv head h / (n_heads / n_kv_heads)),
// online softmax in f32; a query row that sees no key gets zeros. Rows >= n_keys (and, with
// q_pos_dev, rows >= min(*q_pos_dev + n, max_keys)) are never read.
//   n <= 4 (decode): split-K flash decoding on tensor cores; one block per (kv head, key range,
//     8 query vectors (row, head of the group)), so each K/V row is read once for the group.
//   n > 4 (prefill): flash attention on tensor cores over tiles of 128 query vectors, keys
//     split across blocks only when the grid would leave most SMs idle.
//   Both round q * scale and the softmax weights to f16 for the f16 x f16 -> f32 products.
//   head_dim 64, 128 or 256 with 16-byte aligned q, out, k, v and strides take these paths;
//   other multiples of 8 up to 256 take a CUDA-core kernel (f32 q): Unsupported otherwise.
// When max_keys > 0 the key-split count follows max_keys instead of n_keys (also without
// q_pos_dev, which then gives bit-identical results to q_pos_dev at the same position).
// Split partials live in scratch(), sized by the launch shape only; a combine kernel merges them.
void attention(const AttentionArgs& a, cudaStream_t s);

using osprey::PagedAttentionArgs;
using osprey::PagedGatherArgs;
using osprey::PagedKVWriteArgs;

// Paged decode attention (PagedAttentionArgs, paged_attention.cu): split-K flash decoding on
// tensor cores, one block per (split of kPagedSplitKeys keys, tile of 8 query heads of a kv
// head, kv head, sequence), then a merge of each sequence's splits in ascending order. Block
// tables and lengths are read on the device; the launch shape (and the scratch() size of the
// partials) depends on n, n_heads, n_kv_heads, head_dim, max_blocks and block_size only.
// head_dim 32, 64, 128 or 256, pool 16-byte aligned; Unsupported otherwise.
void paged_attention(const PagedAttentionArgs& a, cudaStream_t s);
// Writes paged K/V rows (PagedKVWriteArgs); slots read on the device.
void kv_write_paged(const PagedKVWriteArgs& a, cudaStream_t s);
// One sequence's rows of a paged pool made contiguous (PagedGatherArgs), one launch.
void gather_kv_blocks(const PagedGatherArgs& a, cudaStream_t s);

// dst[i0, i1, i2, i3] = cast(src[i0, i1, i2, i3]) over `shape`; strides in elements (may be 0
// or any sign-free layout); dtypes f32, f16, bf16, i32 (same dtypes copy bits exactly;
// float -> i32 truncates toward zero).
void copy_strided(void* dst, DType ddt, const int64_t dst_strides[4], const void* src, DType sdt,
                  const int64_t src_strides[4], const int64_t shape[4], cudaStream_t s);

// x[rows, d] += y, then out = x / rms(x) * (w + w_offset) (the residual add fused with the
// next norm). out must not alias x or y.
void add_rms_norm(float* x, const float* y, const float* w, int64_t rows, int64_t d, float eps, float w_offset,
                  float* out, cudaStream_t s);
// gu [n, 2f] f32 -> out [n, f] = silu(gu[:, :f]) * gu[:, f:] (a fused gate/up projection).
void silu_mul_split(const float* gu, int64_t n, int64_t f, float* out, cudaStream_t s);

// gu [n, 2f] f32 -> out [n, f] = gelu_tanh(gu[:, :f]) * gu[:, f:] (GeGLU of a fused gate/up
// projection).
void gelu_tanh_mul_split(const float* gu, int64_t n, int64_t f, float* out, cudaStream_t s);

// x [n, heads, head_dim] f32, each head normalised in place: x / rms(x) * (w + w_offset), w
// [head_dim] f32. Row i starts at x + i * row_stride (row_stride >= heads * head_dim: e.g. the
// q or the k heads of a fused q/k/v row).
void head_rms_norm(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const float* w,
                   float eps, float w_offset, cudaStream_t s);

// x[i] = cap * tanh(x[i] / cap), i < n
void softcap_inplace(float* x, float cap, int64_t n, cudaStream_t s);

// Writes n rows of K and V into cache buffers (KVWriteArgs, backend/kernel_args.h).
void kv_write(const KVWriteArgs& a, cudaStream_t s);

// p[i] = value, i < n (the value is a launch argument).
void fill_i32(int32_t* p, int32_t value, int64_t n, cudaStream_t s);

// out[0] = index of the maximum of x[0, n) (the lowest index on ties; NaN ranks as -inf).
// n >= 1. Sets the device's non-finite flag when x holds a NaN or an Inf, as sample() does.
void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s);
// argmax() of each row of logits [rows, vocab] (one block a row): out[i] the lowest index of
// the row's maximum (NaN ranks as -inf), nonfinite[i] 1 when the row holds a NaN or an Inf,
// else 0. The device's non-finite flag is left alone. vocab >= 1.
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, int32_t* nonfinite, cudaStream_t s);

// The current device's non-finite flag (device memory, int32): 1 when the logits of the last
// argmax() or sample() on the device held a NaN or an Inf, else 0. The token readback copies
// it with each token and clears it.
const int32_t* non_finite_flag();

}  // namespace osprey::cuda
