#pragma once
// The CUDA runtime of one process: the current device, its compute stream, the cuBLAS
// handle bound to it, a scratch buffer, and status checks that throw. Internal header
// (includes CUDA headers): only src/backend/cuda and ops dispatch include it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace osprey::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t e, const char* expr, const char* file, int line);

// Makes `device` current for this process (once; a second, different device throws
// Unsupported for now).
void select_device(int device);
int current_device();
cudaStream_t stream();
cublasHandle_t cublas();
// Whether kernels launched through launch_kernel() (common.cuh) may start while the kernel before
// them finishes: compute capability 9.0 or later, and OSPREY_CUDA_PDL not 0.
bool pdl_enabled();
// A device buffer of at least `bytes`, valid until the next scratch() call. Growing it frees
// the old one only after the stream has drained (stream-ordered free).
void* scratch(size_t bytes);
// Changes whenever scratch memory moves (a captured graph that used it must be recaptured).
uint64_t scratch_generation();
void synchronize();

}  // namespace osprey::cuda

#define OSPREY_CUDA_CHECK(expr)                                                            \
  do {                                                                                     \
    cudaError_t osprey_err_ = (expr);                                                      \
    if (osprey_err_ != cudaSuccess) ::osprey::cuda::throw_cuda_error(osprey_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define OSPREY_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                     \
    cublasStatus_t osprey_st_ = (expr);                                                    \
    if (osprey_st_ != CUBLAS_STATUS_SUCCESS) ::osprey::cuda::throw_cublas_error(osprey_st_, #expr, __FILE__, __LINE__); \
  } while (0)
