#pragma once
// Device buffers for the CUDA kernel tests: host vectors copied to the device and back on the
// runtime's stream. CUDA builds only.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "backend/cuda/runtime.h"

namespace osprey::testing {

inline cudaStream_t st() { return cuda::stream(); }
inline void sync() { OSPREY_CUDA_CHECK(cudaStreamSynchronize(st())); }

// A device copy of a host vector, `pad` elements after the start of the allocation (to make
// misaligned pointers); freed with the object.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& host, size_t pad = 0) : n_(host.size()), pad_(pad) {
    OSPREY_CUDA_CHECK(cudaMalloc(&base_, (std::max<size_t>(n_, 1) + pad_) * sizeof(T)));
    upload(host);
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(base_); }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::logic_error("DeviceVec::upload: size changed");
    if (n_ > 0) OSPREY_CUDA_CHECK(cudaMemcpyAsync(get(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, st()));
    sync();
  }
  std::vector<T> download() const {
    sync();
    std::vector<T> host(n_);
    if (n_ > 0) OSPREY_CUDA_CHECK(cudaMemcpyAsync(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost, st()));
    sync();
    return host;
  }
  T* get() const { return base_ + pad_; }

 private:
  T* base_ = nullptr;
  size_t n_, pad_;
};

}  // namespace osprey::testing
