#include "core/caching_allocator.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace osprey {

size_t CachingAllocator::round_size(size_t bytes) const {
  // Size classes: alignment granularity below 1 MiB, then 1/8 steps of the power of two.
  if (bytes == 0) bytes = alignment_;
  if (bytes < (size_t(1) << 20)) return (bytes + alignment_ - 1) / alignment_ * alignment_;
  const size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  const size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<Buffer> CachingAllocator::allocate(size_t bytes) {
  const Device dev = device();
  const size_t size = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* pool : {&free_, &evictable_}) {
      auto it = pool->find(size);
      if (it == pool->end()) continue;
      p = it->second;
      pool->erase(it);
      break;
    }
  }
  if (!p) {
    release_unused(size);
    p = system_alloc(size);
    if (!p) {  // give the cache back and try once more
      trim();
      p = system_alloc(size);
    }
    if (!p) throw OutOfMemory(dev.str() + ": cannot allocate " + std::to_string(size) + " bytes");
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
  auto buffer = std::make_shared<Buffer>(p, size, dev,
                                         [this](void* data, size_t n, bool evict) { release(data, n, evict); });
  std::lock_guard<std::mutex> lock(mu_);
  if (hold_) hold_->push_back(buffer);
  return buffer;
}

void CachingAllocator::release_unused(size_t size) {
  // NOTE: a KV cache that grows frees its old buffers into a size class it never asks for
  // again, and a new sequence's cache starts below the classes the last one left; kept, they
  // would add a cache's worth of reserved memory per growth. Other small blocks stay: they
  // are the transient buffers of the next forward pass. Not while a graph capture holds
  // allocations (freeing memory is not allowed then).
  std::vector<std::pair<size_t, void*>> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (hold_) return;
    victims.assign(evictable_.begin(), evictable_.end());
    evictable_.clear();
    if (size >= kReleaseMin) {
      for (auto it = free_.lower_bound(kReleaseMin); it != free_.end() && it->first < size;) {
        victims.emplace_back(it->first, it->second);
        it = free_.erase(it);
      }
    }
  }
  if (victims.empty()) return;
  before_trim();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [n, p] : victims) {
    system_free(p);
    stats_.reserved_bytes -= n;
  }
}

void CachingAllocator::set_hold_sink(std::vector<std::shared_ptr<Buffer>>* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_ = sink;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::trim() {
  before_trim();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto* pool : {&free_, &evictable_}) {
    for (auto& [size, p] : *pool) {
      system_free(p);
      stats_.reserved_bytes -= size;
    }
    pool->clear();
  }
}

void CachingAllocator::release(void* p, size_t size, bool evict) {
  // Returned to the system on the next miss rather than here: a release may run inside any
  // destructor, where a device synchronisation (before_trim) must not throw.
  std::lock_guard<std::mutex> lock(mu_);
  stats_.live_bytes -= size;
  (evict ? evictable_ : free_).emplace(size, p);
}

}  // namespace osprey
