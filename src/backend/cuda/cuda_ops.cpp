#include "backend/cuda/cuda_ops.h"

#include <memory>
#include <vector>

#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_linear.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/sample.h"
#include "core/env.h"

namespace osprey::cuda_ops {

#define OSPREY_CUDA_OP(name, params, args) \
  void name params { cuda::name(OSPREY_UNPAREN args, cuda::stream()); }
#define OSPREY_CUDA_ENTRY(ret, name, params)
#include "backend/cuda/op_list.inc"
#undef OSPREY_CUDA_OP
#undef OSPREY_CUDA_ENTRY

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
void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, bool batch_invariant) {
  // NOTE: as for linear: the fused GEMV's per-row arithmetic is independent of the chunk of x
  // rows it runs in (quant_gemv.cuh), the dequantize-then-cuBLAS path's is not.
  if (batch_invariant)
    cuda::linear_q_gemv(x, n, w, bias, y, cuda::stream());
  else
    cuda::linear_q(x, n, w, bias, y, cuda::stream());
}
void linear_fp8(const float* x, int64_t n, const Fp8Args& w, const float* bias, float* y, bool batch_invariant) {
  // NOTE: as for linear: the GEMV's per-row arithmetic is independent of the other rows; shapes
  // it does not take (fp8_linear.h) go through cuBLAS even so.
  if (batch_invariant && cuda::linear_fp8_gemv_takes(x, w))
    cuda::linear_fp8_gemv(x, n, w, bias, y, cuda::stream());
  else
    cuda::linear_fp8(x, n, w, bias, y, cuda::stream());
}

bool fp8_tensor_cores() { return env_options().cuda_fp8_mma && cuda::fp8_mma_device(); }

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
