#include "backend/readback.h"

#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace osprey {

struct TokenReadback::Impl {
  Device device;
  std::vector<int32_t> cpu_values;     // CPU device: the slots
  cuda_ops::TokenSlots* cuda = nullptr;  // CUDA device: pinned slots with events

  ~Impl() {
    if (cuda) cuda_ops::destroy_token_slots(cuda);
  }
};

TokenReadback::TokenReadback(Device device, int n_slots) : impl_(std::make_unique<Impl>()) {
  if (n_slots <= 0) throw InvalidInput("TokenReadback needs at least one slot");
  impl_->device = device;
  impl_->cpu_values.assign(size_t(n_slots), 0);
  if (!device.is_cpu()) impl_->cuda = cuda_ops::create_token_slots(device.index, n_slots);
}

TokenReadback::~TokenReadback() = default;

void TokenReadback::enqueue(const Array& token, int slot) {
  if (token.dtype() != DType::i32 || token.numel() < 1 || !(token.device() == impl_->device))
    throw InvalidInput("TokenReadback: token must be int32 on " + impl_->device.str() + ", got " + describe(token));
  if (slot < 0 || size_t(slot) >= impl_->cpu_values.size()) throw InvalidInput("TokenReadback: no slot " + std::to_string(slot));
  if (impl_->device.is_cpu())
    impl_->cpu_values[size_t(slot)] = token.data<int32_t>()[0];
  else
    cuda_ops::enqueue_token(impl_->cuda, slot, token.data<int32_t>());
}

int32_t TokenReadback::wait(int slot) {
  if (slot < 0 || size_t(slot) >= impl_->cpu_values.size()) throw InvalidInput("TokenReadback: no slot " + std::to_string(slot));
  if (impl_->device.is_cpu()) return impl_->cpu_values[size_t(slot)];
  return cuda_ops::wait_token(impl_->cuda, slot);
}

}  // namespace osprey
