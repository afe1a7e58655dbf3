#pragma once
// A fault drill for tests and operators (OSPREY_CUDA_FAULT=trap_after_steps:N,
// docs/environment-variables.md): after N decode steps of a model on CUDA, the next step
// first enqueues a kernel that traps, so the device fails as a real fault would and the
// runtime's own error check turns it into DeviceLost.
#include "core/device.h"

namespace osprey {

// Called at the start of every decode step of a model on `device`. Does nothing when
// OSPREY_CUDA_FAULT is unset; with it set, counts the step (process-wide) and enqueues the
// trap on the step after the Nth. Throws Unsupported naming the variable when it is set and
// the model is not on a CUDA device.
void fault_injection_decode_step(const Device& device);

}  // namespace osprey
