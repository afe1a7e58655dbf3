#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "backend/cuda/runtime.h"
#include "backend/cuda_available.h"
#include "core/caching_allocator.h"
#include "core/env.h"
#include "core/log.h"

namespace osprey {
namespace cuda {

namespace {

// The errors after which the CUDA context is unusable until the process ends ("sticky" in the
// runtime's documentation): every later call returns them again.
bool context_lost(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

}  // namespace

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaErrorMemoryAllocation)
    throw OutOfMemory(std::string(file) + ":" + std::to_string(line) + ": CUDA out of memory in " + expr);
  if (context_lost(e))
    throw DeviceLost(std::string(file) + ":" + std::to_string(line) + ": the CUDA device failed and cannot be used "
                     "again in this process: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + expr);
  throw Error(std::string(file) + ":" + std::to_string(line) + ": CUDA error " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ") in " + expr);
}

void throw_cublas_error(cublasStatus_t e, const char* expr, const char* file, int line) {
  // A cuBLAS call is often the first to meet a context that an earlier kernel poisoned: that is
  // DeviceLost, as from any other call.
  if (const cudaError_t sticky = cudaPeekAtLastError(); context_lost(sticky)) throw_cuda_error(sticky, expr, file, line);
  throw Error(std::string(file) + ":" + std::to_string(line) + ": cuBLAS error " + cublasGetStatusString(e) + " in " +
              expr);
}

namespace {

// Every .cu file of the backend is built for the same architectures, so one kernel that has
// an image for this device stands for all of them.
__global__ void kernel_image_probe() {}

// Throws Unsupported naming the GPU, its architecture and the build's when this build has no
// kernel image (nor PTX it can compile) for the device, instead of a "no kernel image" error
// at the first launch. Returns the architecture the device's kernels were compiled for (10 *
// major + minor): lower than the device's when it runs an older architecture's PTX.
int require_kernel_image(int device, int major, int minor) {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, kernel_image_probe);
  if (e == cudaSuccess) return attr.binaryVersion;
  (void)cudaGetLastError();
  cudaDeviceProp prop{};
  const std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "this GPU";
  const std::string arch = std::to_string(major) + std::to_string(minor);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
      e == cudaErrorUnsupportedPtxVersion)
    throw Unsupported("cuda:" + std::to_string(device) + " (" + name + ", sm_" + arch +
                      ") has no kernels in this build, which was made for CUDA architectures " +
                      OSPREY_CUDA_ARCHITECTURES_BUILT + ": rebuild with OSPREY_CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=" +
                      arch + " bash scripts/setup.sh (or 'native' on the machine with the GPU), or run with --device cpu");
  throw_cuda_error(e, "cudaFuncGetAttributes(kernel_image_probe)", __FILE__, __LINE__);
}

struct Runtime {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  uint64_t scratch_generation = 0;  // bumped whenever a scratch buffer moves
  bool pdl = false;                 // programmatic dependent launch (compute capability 9.0+)
  std::mutex mu;
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // never destroyed: buffers may outlive statics
  return *r;
}

Runtime& ready() {
  Runtime& r = rt();
  if (r.device < 0) select_device(0);
  return r;
}

}  // namespace

void select_device(int device) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.device == device) return;
  if (r.device >= 0)
    throw Unsupported("cuda:" + std::to_string(device) + " requested after cuda:" + std::to_string(r.device) +
                      " was chosen: one CUDA device per process");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw Unsupported("device cuda:" + std::to_string(device) + " requested, but no CUDA device is present");
  if (device < 0 || device >= n)
    throw InvalidInput("device cuda:" + std::to_string(device) + " does not exist (" + std::to_string(n) +
                       " CUDA device(s))");
  OSPREY_CUDA_CHECK(cudaSetDevice(device));
  OSPREY_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  OSPREY_CUBLAS_CHECK(cublasCreate(&r.cublas));
  OSPREY_CUBLAS_CHECK(cublasSetStream(r.cublas, r.stream));
  int major = 0, minor = 0;
  OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int kernel_arch = require_kernel_image(device, major, minor);
  // NOTE: kernels compiled for an architecture before 9.0 (an older architecture's PTX that the
  // driver compiled for this GPU) have no pdl_wait(): they must not be launched for PDL.
  r.pdl = major >= 9 && kernel_arch >= 90 && env_options().cuda_pdl;
  r.device = device;
}

int current_device() { return ready().device; }
cudaStream_t stream() { return ready().stream; }
cublasHandle_t cublas() { return ready().cublas; }
bool pdl_enabled() { return ready().pdl; }

void* scratch(size_t bytes) {
  Runtime& r = ready();
  if (bytes > r.scratch_bytes) {
    if (r.scratch) OSPREY_CUDA_CHECK(cudaFreeAsync(r.scratch, r.stream));
    size_t n = std::max(bytes, r.scratch_bytes * 2);
    OSPREY_CUDA_CHECK(cudaMallocAsync(&r.scratch, n, r.stream));
    r.scratch_bytes = n;
    ++r.scratch_generation;
  }
  return r.scratch;
}

uint64_t scratch_generation() { return ready().scratch_generation; }

void synchronize() { OSPREY_CUDA_CHECK(cudaStreamSynchronize(ready().stream)); }

namespace {

class CudaAllocator final : public CachingAllocator {
 public:
  CudaAllocator() : CachingAllocator(Device::cuda(0), 256) {}

 protected:
  void* system_alloc(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (e != cudaSuccess) throw_cuda_error(e, "cudaMalloc", __FILE__, __LINE__);
    return p;
  }
  void system_free(void* p) override { OSPREY_CUDA_CHECK(cudaFree(p)); }
  void before_trim() override { synchronize(); }
  Device device() override { return Device::cuda(ready().device); }
};

}  // namespace
}  // namespace cuda

namespace {
cuda::CudaAllocator& the_allocator() {
  static cuda::CudaAllocator* a = new cuda::CudaAllocator();  // never destroyed, as the runtime
  return *a;
}
}  // namespace

Allocator& cuda_allocator(int device) {
  cuda::select_device(device);
  return the_allocator();
}

void release_cuda_device() noexcept {
  cuda::Runtime& r = cuda::rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.device < 0) return;
  // A device in an error state cannot be drained: leave it to the process's end.
  if (cudaStreamSynchronize(r.stream) != cudaSuccess) return;
  try {
    the_allocator().trim();
  } catch (const std::exception&) {
    return;
  }
  if (r.scratch) {
    (void)cudaFreeAsync(r.scratch, r.stream);
    r.scratch = nullptr;
    r.scratch_bytes = 0;
    ++r.scratch_generation;
  }
  (void)cudaStreamSynchronize(r.stream);
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, r.device) == cudaSuccess) (void)cudaMemPoolTrimTo(pool, 0);
  (void)cublasDestroy(r.cublas);
  (void)cudaStreamDestroy(r.stream);
  r.cublas = nullptr;
  r.stream = nullptr;
  r.device = -1;
  const AllocatorStats left = the_allocator().stats();
  if (left.live_bytes > 0)
    log_debug("cuda: " + std::to_string(left.live_bytes) + " bytes of device memory still held by live buffers at exit");
}

namespace {
__global__ void fault_trap() { __trap(); }
}  // namespace

void cuda_enqueue_trap() {
  fault_trap<<<1, 1, 0, cuda::stream()>>>();
  OSPREY_CUDA_CHECK(cudaGetLastError());
}

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

size_t cuda_free_memory(int device) {
  cuda::select_device(device);
  size_t free = 0, total = 0;
  OSPREY_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

std::string cuda_description(int device) {
  int n = cuda_device_count();
  if (n == 0) return "no CUDA device is present";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "cuda:" + std::to_string(device) + " unreadable";
  int drv = 0, rtv = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rtv);
  return std::string(p.name) + ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB, driver CUDA " +
         std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10) + ", runtime " + std::to_string(rtv / 1000) +
         "." + std::to_string(rtv % 1000 / 10);
}

}  // namespace osprey
