#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "backend/cuda/runtime.h"
#include "backend/cuda_available.h"
#include "core/buffer.h"

namespace osprey {
namespace cuda {

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaErrorMemoryAllocation)
    throw OutOfMemory(std::string(file) + ":" + std::to_string(line) + ": CUDA out of memory in " + expr);
  throw Error(std::string(file) + ":" + std::to_string(line) + ": CUDA error " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ") in " + expr);
}

void throw_cublas_error(cublasStatus_t e, const char* expr, const char* file, int line) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": cuBLAS error " + cublasGetStatusString(e) + " in " +
              expr);
}

namespace {

struct Runtime {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
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
  r.device = device;
}

int current_device() { return ready().device; }
cudaStream_t stream() { return ready().stream; }
cublasHandle_t cublas() { return ready().cublas; }

void* scratch(size_t bytes) {
  Runtime& r = ready();
  if (bytes > r.scratch_bytes) {
    if (r.scratch) OSPREY_CUDA_CHECK(cudaFreeAsync(r.scratch, r.stream));
    size_t n = std::max(bytes, r.scratch_bytes * 2);
    OSPREY_CUDA_CHECK(cudaMallocAsync(&r.scratch, n, r.stream));
    r.scratch_bytes = n;
  }
  return r.scratch;
}

void synchronize() { OSPREY_CUDA_CHECK(cudaStreamSynchronize(ready().stream)); }

namespace {

size_t round_size(size_t bytes) {
  constexpr size_t kAlign = 256;
  if (bytes == 0) bytes = kAlign;
  if (bytes < (size_t(1) << 20)) return (bytes + kAlign - 1) & ~(kAlign - 1);
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

// Caching device allocator. All device work runs on the one stream, so a freed block can be
// handed to later work at once: that work is ordered after every kernel that used it.
class CudaAllocator final : public Allocator {
 public:
  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    ready();
    size_t size = round_size(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
    }
    if (!p) {
      cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        trim();
        e = cudaMalloc(&p, size);
      }
      if (e != cudaSuccess) throw_cuda_error(e, "cudaMalloc", __FILE__, __LINE__);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.n_system_allocs;
      stats_.reserved_bytes += size;
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.live_bytes += size;
      stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
    }
    return std::make_shared<Buffer>(p, size, Device::cuda(rt().device), [this](void* d, size_t n) { release(d, n); });
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.live_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

  void trim() override {
    synchronize();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) {
      cudaFree(p);
      stats_.reserved_bytes -= size;
    }
    free_.clear();
  }

 private:
  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.live_bytes -= size;
    free_.emplace(size, p);
  }

  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  AllocatorStats stats_;
};

}  // namespace
}  // namespace cuda

Allocator& cuda_allocator(int device) {
  cuda::select_device(device);
  static cuda::CudaAllocator* a = new cuda::CudaAllocator();
  return *a;
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
