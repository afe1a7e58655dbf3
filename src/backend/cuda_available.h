#pragma once
// Whether this build has the CUDA backend and the machine has a device for it. No CUDA
// headers here: callers anywhere may include it.
#include <cstddef>
#include <string>

namespace osprey {

bool cuda_built();
bool cuda_available();  // built with CUDA and at least one device is present
int cuda_device_count();
// "NVIDIA H200, driver 580.x, CUDA 13.0" or a reason it is unavailable.
std::string cuda_description(int device = 0);
// Bytes of device memory free now (cudaMemGetInfo; memory the allocator caches counts as used).
// Throws Unsupported without the backend.
size_t cuda_free_memory(int device = 0);
// At a clean exit, after every model, cache and buffer is gone: waits for the device, then
// returns the allocator's cached blocks, the scratch area, the cuBLAS handle and the stream to
// the driver, so that no device allocation outlives the process's work. Does nothing when the
// device was never used or is in an error state; never throws. Device work after it starts the
// runtime afresh.
void release_cuda_device() noexcept;
// Enqueues a kernel that executes __trap() on the current device's stream: the next checked
// CUDA call reports the sticky error and throws DeviceLost, as a real fault does. For
// OSPREY_CUDA_FAULT (backend/fault_injection.h) only. Throws Unsupported without the backend.
void cuda_enqueue_trap();

}  // namespace osprey
