#include <cstdlib>
#include <map>
#include <mutex>

#include "core/buffer.h"
#include "core/error.h"

namespace osprey {
namespace {

constexpr size_t kAlign = 64;

size_t round_size(size_t bytes) {
  // Size classes: 64-byte granularity below 1 MiB, then 1/8 steps of the power of two.
  if (bytes == 0) bytes = kAlign;
  if (bytes < (1u << 20)) return (bytes + kAlign - 1) & ~(kAlign - 1);
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override { trim(); }

  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    size_t size = round_size(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
      if (!p) {
        p = std::aligned_alloc(kAlign, size);
        if (!p) throw OutOfMemory("cpu allocator: cannot allocate " + std::to_string(size) + " bytes");
        ++stats_.n_system_allocs;
        stats_.reserved_bytes += size;
        if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
      }
      stats_.live_bytes += size;
      if (stats_.live_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.live_bytes;
    }
    return std::make_shared<Buffer>(p, size, Device::cpu(), [this](void* data, size_t n) { release(data, n); });
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
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) {
      std::free(p);
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

Allocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: buffers may outlive statics
  return *a;
}

}  // namespace osprey
