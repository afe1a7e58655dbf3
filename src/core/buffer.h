#pragma once
// Device buffers: owning, move-only RAII objects. Arrays share them through shared_ptr;
// when the last array goes, the memory returns to the allocator it came from.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/device.h"

namespace osprey {

class Buffer {
 public:
  // `evict`: whether evict_on_release() was called.
  using Release = std::function<void(void* data, size_t size, bool evict)>;

  Buffer(void* data, size_t size, Device device, Release release)
      : data_(data), size_(size), device_(device), release_(std::move(release)) {}
  ~Buffer() {
    if (release_) release_(data_, size_, evict_.load(std::memory_order_relaxed));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

  // Tells the allocator that a block of this size may not be asked for again (a KV cache's
  // buffers once it replaces them: after a growth nothing asks for the old size). Once the
  // last holder lets go, the block still serves a request of exactly its size, but it is the
  // first to go back to the system when the allocator must ask the system for more. Safe to
  // call while others hold the buffer.
  void evict_on_release() { evict_.store(true, std::memory_order_relaxed); }

 private:
  void* data_;
  size_t size_;
  Device device_;
  Release release_;
  std::atomic<bool> evict_{false};
};

// Memory statistics of one allocator. `peak_bytes` is the high-water mark of bytes handed
// out (not counting the cache of freed blocks); `reserved_bytes` includes that cache.
struct AllocatorStats {
  size_t live_bytes = 0;
  size_t peak_bytes = 0;
  size_t reserved_bytes = 0;
  size_t peak_reserved_bytes = 0;
  uint64_t n_system_allocs = 0;
};

// A caching allocator: freed blocks are kept by size and handed out again, so a steady
// decode loop allocates nothing from the system. Thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused blocks to the system.
  virtual void trim() = 0;
  // While `sink` is set, every buffer handed out is also appended to it, so it stays
  // allocated as long as the sink holds it (memory a captured CUDA graph keeps using).
  // nullptr stops it. One sink at a time.
  virtual void set_hold_sink(std::vector<std::shared_ptr<Buffer>>* sink) = 0;
};

Allocator& cpu_allocator();
Allocator& allocator_for(Device device);

}  // namespace osprey
