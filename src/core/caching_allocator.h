#pragma once
// The caching allocator shared by every device: freed blocks are kept by size class and
// handed out again, so a steady decode loop allocates nothing from the system. A device
// supplies only how to get and return system memory. Thread-safe.
//
// The pool never holds memory it cannot use while it asks the system for more: on a miss it
// first returns the blocks that no later request will take (those freed with
// Buffer::evict_on_release, and large blocks of smaller size classes), so its peak reserved
// memory stays at the peak of live memory plus the cached blocks that are still reused.
//
// NOTE: a freed block is reused at once. That is safe on a device whose work runs on one
// in-order stream (CUDA here) or synchronously (the CPU): later work is ordered after every
// use of the block.
#include <map>
#include <mutex>
#include <vector>

#include "core/buffer.h"

namespace osprey {

class CachingAllocator : public Allocator {
 public:
  CachingAllocator(Device device, size_t alignment) : device_(device), alignment_(alignment) {}

  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void trim() override;
  void set_hold_sink(std::vector<std::shared_ptr<Buffer>>* sink) override;

 protected:
  // nullptr when the system is out of memory.
  virtual void* system_alloc(size_t bytes) = 0;
  virtual void system_free(void* p) = 0;
  // Called before cached blocks go back to the system (the CUDA device drains its stream).
  virtual void before_trim() {}
  // The device whose memory this is (called on each allocation; may select the device).
  virtual Device device() { return device_; }

 private:
  size_t round_size(size_t bytes) const;
  void release(void* p, size_t size, bool evict);
  // Before a miss of `size` goes to the system: returns the evictable blocks, and the large
  // cached blocks of smaller classes, which a growing buffer never asks for again.
  void release_unused(size_t size);

  static constexpr size_t kReleaseMin = size_t(1) << 20;

  Device device_;
  size_t alignment_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;       // cached blocks, by size
  std::multimap<size_t, void*> evictable_;  // cached blocks freed with evict_on_release
  std::vector<std::shared_ptr<Buffer>>* hold_ = nullptr;
  AllocatorStats stats_;
};

}  // namespace osprey
