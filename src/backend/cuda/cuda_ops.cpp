#include "backend/cuda/cuda_ops.h"

#include <memory>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_linear.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/sample.h"

namespace osprey::cuda_ops {

void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t d, float scale, float* out) {
  cuda::embedding(table, dt, ids, n, d, scale, out, cuda::stream());
}
void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out) {
  cuda::rms_norm(x, w, rows, d, eps, w_offset, out, cuda::stream());
}
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* out) {
  cuda::layer_norm(x, w, b, rows, d, eps, out, cuda::stream());
}
void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias, float* y,
            bool batch_invariant) {
  // NOTE: the GEMV gives each row of x its own accumulators, summed in an order fixed by `in`
  // alone (linear.cu); cuBLAS (n > 8 otherwise) rounds x to 16 bits and picks its reduction by
  // shape, so a row's result would change with the batch.
  if (batch_invariant)
    cuda::linear_gemv(x, n, in, w, wdt, out, bias, y, cuda::stream());
  else
    cuda::linear(x, n, in, w, wdt, out, bias, y, cuda::stream());
}
void add_inplace(float* x, const float* y, int64_t n) { cuda::add_inplace(x, y, n, cuda::stream()); }
void scale_inplace(float* x, float f, int64_t n) { cuda::scale_inplace(x, f, n, cuda::stream()); }
void add_rms_norm(float* x, const float* y, const float* w, int64_t rows, int64_t d, float eps, float w_offset,
                  float* out) {
  cuda::add_rms_norm(x, y, w, rows, d, eps, w_offset, out, cuda::stream());
}
void silu_mul_split(const float* gu, int64_t n, int64_t f, float* out) {
  cuda::silu_mul_split(gu, n, f, out, cuda::stream());
}
void gelu_tanh_mul_split(const float* gu, int64_t n, int64_t f, float* out) {
  cuda::gelu_tanh_mul_split(gu, n, f, out, cuda::stream());
}
void head_rms_norm(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const float* w, float eps,
                   float w_offset) {
  cuda::head_rms_norm(x, n, heads, head_dim, row_stride, w, eps, w_offset, cuda::stream());
}
void softcap_inplace(float* x, float cap, int64_t n) { cuda::softcap_inplace(x, cap, n, cuda::stream()); }
void silu_mul(const float* g, const float* u, float* out, int64_t n) { cuda::silu_mul(g, u, out, n, cuda::stream()); }
void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n) {
  cuda::gelu_tanh_mul(g, u, out, n, cuda::stream());
}
void rope_inplace(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
                  const float* inv_freq, bool interleaved, float mscale) {
  cuda::rope_inplace(x, n, heads, head_dim, row_stride, positions, inv_freq, interleaved, mscale, cuda::stream());
}
void kv_write(const KVWriteArgs& a) { cuda::kv_write(a, cuda::stream()); }
void attention(const AttentionArgs& a) { cuda::attention(a, cuda::stream()); }
void paged_attention(const PagedAttentionArgs& a) { cuda::paged_attention(a, cuda::stream()); }
void kv_write_paged(const PagedKVWriteArgs& a) { cuda::kv_write_paged(a, cuda::stream()); }
void gather_kv_blocks(const PagedGatherArgs& a) { cuda::gather_kv_blocks(a, cuda::stream()); }
void copy_strided(void* dst, DType ddt, const int64_t dst_strides[4], const void* src, DType sdt,
                  const int64_t src_strides[4], const int64_t shape[4]) {
  cuda::copy_strided(dst, ddt, dst_strides, src, sdt, src_strides, shape, cuda::stream());
}
void fill_i32(int32_t* p, int32_t value, int64_t n) { cuda::fill_i32(p, value, n, cuda::stream()); }
void argmax(const float* x, int64_t n, int32_t* out) { cuda::argmax(x, n, out, cuda::stream()); }
void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, int32_t* nonfinite) {
  cuda::argmax_rows(logits, n, vocab, out, nonfinite, cuda::stream());
}
void sample(const float* logits, int64_t vocab, const SampleArgs& a, int32_t* out_token) {
  cuda::sample(logits, vocab, a, out_token, cuda::stream());
}

void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, bool batch_invariant) {
  // NOTE: as for linear: the fused GEMV's per-row arithmetic is independent of the chunk of x
  // rows it runs in (quant_gemv.cuh), the dequantize-then-cuBLAS path's is not.
  if (batch_invariant)
    cuda::linear_q_gemv(x, n, w, bias, y, cuda::stream());
  else
    cuda::linear_q(x, n, w, bias, y, cuda::stream());
}
void embedding_q(const QuantArgs& w, const int32_t* ids, int64_t n, float scale, float* out) {
  cuda::embedding_q(w, ids, n, scale, out, cuda::stream());
}
void dequantize(const QuantArgs& w, DType out_dtype, void* out) { cuda::dequantize(w, out_dtype, out, cuda::stream()); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  OSPREY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::stream()));
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  OSPREY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()));
  cuda::synchronize();
}
void copy_on_device(void* dst, const void* src, size_t bytes) {
  OSPREY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
}
void synchronize() { cuda::synchronize(); }

struct TokenSlots {
  int32_t* host = nullptr;  // pinned [2, n_slots]: the tokens, then their non-finite flags
  int n_slots = 0;
  int32_t* flag = nullptr;  // the device's non-finite flag (cuda::non_finite_flag)
  std::vector<cudaEvent_t> events;

  ~TokenSlots() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (host) cudaFreeHost(host);
  }
};

TokenSlots* create_token_slots(int device, int n_slots) {
  cuda::select_device(device);
  auto slots = std::make_unique<TokenSlots>();
  OSPREY_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&slots->host), 2 * size_t(n_slots) * sizeof(int32_t), cudaHostAllocDefault));
  slots->n_slots = n_slots;
  slots->flag = const_cast<int32_t*>(cuda::non_finite_flag());
  for (int i = 0; i < n_slots; ++i) {
    cudaEvent_t e;
    OSPREY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    slots->events.push_back(e);
  }
  return slots.release();
}

void destroy_token_slots(TokenSlots* slots) { delete slots; }

void enqueue_token(TokenSlots* slots, int slot, const int32_t* token) {
  OSPREY_CUDA_CHECK(
      cudaMemcpyAsync(slots->host + slot, token, sizeof(int32_t), cudaMemcpyDeviceToHost, cuda::stream()));
  OSPREY_CUDA_CHECK(cudaMemcpyAsync(slots->host + slots->n_slots + slot, slots->flag, sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, cuda::stream()));
  OSPREY_CUDA_CHECK(cudaMemsetAsync(slots->flag, 0, sizeof(int32_t), cuda::stream()));
  OSPREY_CUDA_CHECK(cudaEventRecord(slots->events[size_t(slot)], cuda::stream()));
}

int32_t wait_token(TokenSlots* slots, int slot) {
  OSPREY_CUDA_CHECK(cudaEventSynchronize(slots->events[size_t(slot)]));
  return slots->host[slots->n_slots + slot] != 0 ? -1 : slots->host[slot];
}

}  // namespace osprey::cuda_ops
