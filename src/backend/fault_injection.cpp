#include "backend/fault_injection.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "backend/cuda_available.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace osprey {

void fault_injection_decode_step(const Device& device) {
  const int64_t after = env_options().cuda_fault_trap_after_steps;
  if (after < 0) return;
  if (device.is_cpu())
    throw Unsupported("OSPREY_CUDA_FAULT=trap_after_steps:" + std::to_string(after) + " is set, but the model runs on " +
                      device.str() + ": it drills a CUDA device's failure only");
  static std::atomic<int64_t> steps{0};
  if (steps.fetch_add(1) != after) return;
  log_warn("OSPREY_CUDA_FAULT: decode step " + std::to_string(after + 1) + " traps on " + device.str());
  cuda_enqueue_trap();
}

}  // namespace osprey
