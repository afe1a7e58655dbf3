// The caching allocator's pool: what it keeps, what it hands back to the system, and that a
// growing buffer does not leave its old sizes reserved. A fake device counts the bytes it
// holds from the system, independently of the allocator's own statistics.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "core/caching_allocator.h"

namespace osprey {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

class CountingAllocator final : public CachingAllocator {
 public:
  CountingAllocator() : CachingAllocator(Device::cpu(), 64) {}
  ~CountingAllocator() override { trim(); }

  size_t system_bytes() const { return system_bytes_; }
  size_t peak_system_bytes() const { return peak_system_bytes_; }

 protected:
  void* system_alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, bytes);
    sizes_.push_back({p, bytes});
    system_bytes_ += bytes;
    peak_system_bytes_ = std::max(peak_system_bytes_, system_bytes_);
    return p;
  }
  void system_free(void* p) override {
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
      if (it->first != p) continue;
      system_bytes_ -= it->second;
      sizes_.erase(it);
      break;
    }
    std::free(p);
  }

 private:
  std::vector<std::pair<void*, size_t>> sizes_;
  size_t system_bytes_ = 0, peak_system_bytes_ = 0;
};

// One layer of a growing cache, as kv/dense_cache.cpp grows it: each growth takes a larger
// block, copies, and lets the old one go as a size it will not ask for again; so does the
// cache's end.
struct GrowingBuffer {
  std::shared_ptr<Buffer> block;
  GrowingBuffer() = default;
  GrowingBuffer(GrowingBuffer&&) = default;
  ~GrowingBuffer() {
    if (block) block->evict_on_release();
  }
  void grow_to(Allocator& a, size_t bytes) {
    auto next = a.allocate(bytes);
    if (block) block->evict_on_release();
    block = std::move(next);
  }
};

constexpr size_t kScratch = 40000;  // a forward pass's transient block (a multiple of 64)

// n_layers caches grown to `rows` in steps of `step` rows of `row_bytes`; after each layer's
// growth, a transient block comes and goes.
void grow_sequence(Allocator& a, std::vector<GrowingBuffer>& layers, size_t row_bytes, int64_t step, int64_t rows) {
  for (int64_t cap = step; cap <= rows; cap += step) {
    for (auto& l : layers) {
      l.grow_to(a, size_t(cap) * row_bytes);
      auto scratch = a.allocate(kScratch);
    }
  }
}

TEST(CachingAllocator, SteadyRequestsAreServedFromTheCache) {
  CountingAllocator a;
  for (int i = 0; i < 100; ++i) {
    auto x = a.allocate(3 * kMiB);
    auto y = a.allocate(100);
  }
  EXPECT_EQ(a.stats().n_system_allocs, 2u);
  EXPECT_EQ(a.system_bytes(), a.stats().reserved_bytes);
}

TEST(CachingAllocator, GrowthOfSmallBlocksDoesNotStrandTheOldSizes) {
  // 16 layers of blocks below 1 MiB (a small model's KV cache) grown through 9 sizes. Kept,
  // the sizes they left behind came to about 4x the final blocks.
  CountingAllocator a;
  std::vector<GrowingBuffer> layers(16);
  const size_t row_bytes = 256;  // blocks of 64 to 576 KiB
  grow_sequence(a, layers, row_bytes, 256, 2304);
  // Live at the peak: the final blocks and the last layer's old block during its copy.
  const size_t peak_live = 16 * 2304 * row_bytes + 2048 * row_bytes;
  EXPECT_EQ(a.stats().peak_bytes, peak_live);
  // Held from the system at the peak: that, and the cached transient block.
  EXPECT_EQ(a.peak_system_bytes(), peak_live + kScratch);
  EXPECT_EQ(a.stats().peak_reserved_bytes, a.peak_system_bytes());
}

TEST(CachingAllocator, ASequenceAfterAnotherDoesNotSitOnItsLargerBlocks) {
  // The next sequence's cache starts below the sizes the last one ended at; it must not grow
  // on top of them.
  CountingAllocator a;
  const size_t row_bytes = 8 * kMiB / 1024;  // blocks of 2 to 18 MiB
  const size_t peak_live = 4 * 2304 * row_bytes + 2048 * row_bytes;
  for (int sequence = 0; sequence < 3; ++sequence) {
    std::vector<GrowingBuffer> layers(4);
    grow_sequence(a, layers, row_bytes, 256, 2304);
  }
  EXPECT_EQ(a.stats().peak_bytes, peak_live);
  EXPECT_LE(a.peak_system_bytes(), peak_live + kScratch);
}

TEST(CachingAllocator, OldSizesLeftByAGrowthServedFromTheCacheGoAtTheNextMiss) {
  CountingAllocator a;
  a.allocate(18 * kMiB);  // cached, as a size some earlier owner used
  GrowingBuffer layer;
  layer.grow_to(a, 16 * kMiB);  // a miss
  layer.grow_to(a, 18 * kMiB);  // served from the cache: no miss, the 16 MiB block is idle
  EXPECT_EQ(a.system_bytes(), 34 * kMiB);
  auto small = a.allocate(5000);  // any miss returns it before asking the system for more
  EXPECT_EQ(a.system_bytes(), 18 * kMiB + 5056);
}

TEST(CachingAllocator, AnEvictableBlockStillServesAnExactRequest) {
  CountingAllocator a;
  {
    auto b = a.allocate(3 * kMiB);
    b->evict_on_release();
  }
  auto again = a.allocate(3 * kMiB);
  EXPECT_EQ(a.stats().n_system_allocs, 1u);
}

TEST(CachingAllocator, NothingIsReleasedWhileAGraphHoldsAllocations) {
  CountingAllocator a;
  {
    auto b = a.allocate(3 * kMiB);
    b->evict_on_release();
  }
  std::vector<std::shared_ptr<Buffer>> hold;
  a.set_hold_sink(&hold);
  auto c = a.allocate(5 * kMiB);  // a miss during capture: the evictable block stays
  a.set_hold_sink(nullptr);
  EXPECT_EQ(a.system_bytes(), 8 * kMiB);
  auto d = a.allocate(7 * kMiB);  // the next miss outside a capture returns it
  EXPECT_EQ(a.system_bytes(), 12 * kMiB);
}

}  // namespace
}  // namespace osprey
