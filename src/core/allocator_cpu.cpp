#include <cstdlib>

#include "core/caching_allocator.h"

namespace osprey {
namespace {

class CpuAllocator final : public CachingAllocator {
 public:
  CpuAllocator() : CachingAllocator(Device::cpu(), 64) {}

 protected:
  void* system_alloc(size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void system_free(void* p) override { std::free(p); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: buffers may outlive statics
  return *a;
}

}  // namespace osprey
