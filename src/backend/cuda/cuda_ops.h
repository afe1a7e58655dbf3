#pragma once
// The CUDA backend as the op dispatch (backend/ops.cpp, quant_ops.cpp, readback.cpp) calls it:
// each function enqueues its work on the current device's stream (kernels.h, quant_kernels.h,
// sample.h give the contracts) unless it says it waits. No CUDA headers, so the dispatch
// files include it in every build. Implemented in cuda_ops.cpp with the backend; a build
// without it links backend/cuda_stub.cpp instead, whose functions throw Unsupported (no array
// can live on a CUDA device there, so the dispatch never reaches them).
#include <cstddef>
#include <cstdint>

#include "backend/kernel_args.h"
#include "backend/quant_args.h"
#include "core/dtype.h"

namespace osprey::cuda_ops {

void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t d, float scale, float* out);
void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out);
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* out);
// batch_invariant: every n through the GEMV kernels, whose result for a row of x does not
// depend on the other rows (ops::set_batch_invariant).
void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias, float* y,
            bool batch_invariant = false);
void add_inplace(float* x, const float* y, int64_t n);
void scale_inplace(float* x, float f, int64_t n);
void add_rms_norm(float* x, const float* y, const float* w, int64_t rows, int64_t d, float eps, float w_offset,
                  float* out);
void silu_mul_split(const float* gu, int64_t n, int64_t f, float* out);
void gelu_tanh_mul_split(const float* gu, int64_t n, int64_t f, float* out);
void head_rms_norm(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const float* w, float eps,
                   float w_offset);
void softcap_inplace(float* x, float cap, int64_t n);
void silu_mul(const float* g, const float* u, float* out, int64_t n);
void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n);
void rope_inplace(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
                  const float* inv_freq, bool interleaved, float mscale);
void kv_write(const KVWriteArgs& a);
void attention(const AttentionArgs& a);
void paged_attention(const PagedAttentionArgs& a);
void kv_write_paged(const PagedKVWriteArgs& a);
void gather_kv_blocks(const PagedGatherArgs& a);
void copy_strided(void* dst, DType ddt, const int64_t dst_strides[4], const void* src, DType sdt,
                  const int64_t src_strides[4], const int64_t shape[4]);
void fill_i32(int32_t* p, int32_t value, int64_t n);
void argmax(const float* x, int64_t n, int32_t* out);
void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, int32_t* nonfinite);
void sample(const float* logits, int64_t vocab, const SampleArgs& a, int32_t* out_token);

void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, bool batch_invariant = false);
void embedding_q(const QuantArgs& w, const int32_t* ids, int64_t n, float scale, float* out);
void dequantize(const QuantArgs& w, DType out_dtype, void* out);

// Plain copies of `bytes` in the stream's order. A copy to the host waits for the stream
// (the host reads the result next); an upload from pageable memory returns once the source
// is staged, so its source may be reused at once.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
// Waits for the stream.
void synchronize();

// Pinned host slots with an event each, for reading single tokens back without draining the
// stream (backend/readback.h).
struct TokenSlots;
TokenSlots* create_token_slots(int device, int n_slots);
void destroy_token_slots(TokenSlots* slots);
// Enqueues the copy of *token (device memory) into `slot`, with the device sampler's
// non-finite flag (which it then clears).
void enqueue_token(TokenSlots* slots, int slot, const int32_t* token);
// Waits for the slot's copy and returns the token, or -1 when the flag said that the logits
// the token was chosen from held a NaN or an Inf.
int32_t wait_token(TokenSlots* slots, int slot);

}  // namespace osprey::cuda_ops
