#pragma once
// Reading single tokens back from the device without draining its stream: an asynchronous
// copy into pinned host memory plus an event per slot (docs/design.md, "Pipelined decode").
// On the CPU the copy is immediate.
#include <cstdint>
#include <memory>

#include "core/array.h"

namespace osprey {

// What wait() returns when the device sampler found a NaN or an Inf among the logits the
// token was chosen from (the token on the device is still a valid id).
inline constexpr int32_t kNonFiniteLogits = -1;

class TokenReadback {
 public:
  TokenReadback(Device device, int n_slots);
  ~TokenReadback();
  TokenReadback(const TokenReadback&) = delete;
  TokenReadback& operator=(const TokenReadback&) = delete;

  // Enqueues the copy of token[0] (i32, on `device`) into `slot` (0 <= slot < n_slots);
  // the slot must not be pending.
  void enqueue(const Array& token, int slot);
  // Waits for the slot's copy and returns the token, or kNonFiniteLogits.
  int32_t wait(int slot);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
