#include "backend/readback.h"

#include <vector>

#include "core/error.h"

#ifdef OSPREY_WITH_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace osprey {

struct TokenReadback::Impl {
  Device device;
  std::vector<int32_t> cpu_values;  // CPU device: the slots
#ifdef OSPREY_WITH_CUDA
  int32_t* host = nullptr;  // pinned [n_slots]
  std::vector<cudaEvent_t> events;

  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (host) cudaFreeHost(host);
  }
#endif
};

TokenReadback::TokenReadback(Device device, int n_slots) : impl_(std::make_unique<Impl>()) {
  if (n_slots <= 0) throw InvalidInput("TokenReadback needs at least one slot");
  impl_->device = device;
  impl_->cpu_values.assign(size_t(n_slots), 0);
  if (device.is_cpu()) return;
#ifdef OSPREY_WITH_CUDA
  cuda::select_device(device.index);
  OSPREY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl_->host), size_t(n_slots) * sizeof(int32_t),
                                  cudaHostAllocDefault));
  for (int i = 0; i < n_slots; ++i) {
    cudaEvent_t e;
    OSPREY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    impl_->events.push_back(e);
  }
#else
  throw Unsupported("token readback on " + device.str() + " needs the CUDA backend");
#endif
}

TokenReadback::~TokenReadback() = default;

void TokenReadback::enqueue(const Array& token, int slot) {
  if (token.dtype() != DType::i32 || token.numel() < 1 || !(token.device() == impl_->device))
    throw InvalidInput("TokenReadback: token must be int32 on " + impl_->device.str() + ", got " + describe(token));
  if (slot < 0 || size_t(slot) >= impl_->cpu_values.size()) throw InvalidInput("TokenReadback: no slot " + std::to_string(slot));
  if (impl_->device.is_cpu()) {
    impl_->cpu_values[size_t(slot)] = token.data<int32_t>()[0];
    return;
  }
#ifdef OSPREY_WITH_CUDA
  OSPREY_CUDA_CHECK(cudaMemcpyAsync(impl_->host + slot, token.raw(), sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    cuda::stream()));
  OSPREY_CUDA_CHECK(cudaEventRecord(impl_->events[size_t(slot)], cuda::stream()));
#endif
}

int32_t TokenReadback::wait(int slot) {
  if (slot < 0 || size_t(slot) >= impl_->cpu_values.size()) throw InvalidInput("TokenReadback: no slot " + std::to_string(slot));
  if (impl_->device.is_cpu()) return impl_->cpu_values[size_t(slot)];
#ifdef OSPREY_WITH_CUDA
  OSPREY_CUDA_CHECK(cudaEventSynchronize(impl_->events[size_t(slot)]));
  return impl_->host[slot];
#else
  return 0;
#endif
}

}  // namespace osprey
