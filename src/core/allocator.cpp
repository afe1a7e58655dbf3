#include "core/buffer.h"
#include "core/error.h"

namespace osprey {

Allocator& cuda_allocator(int device);  // backend/cuda/runtime.cu or backend/cuda_stub.cpp

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return cuda_allocator(device.index);
}

}  // namespace osprey
