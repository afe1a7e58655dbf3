#include "core/buffer.h"
#include "core/error.h"

namespace osprey {

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  throw Unsupported("device " + device.str() + " is not available in this build");
}

}  // namespace osprey
