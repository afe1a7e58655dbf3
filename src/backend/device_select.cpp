#include "backend/device_select.h"

#include "backend/cuda_available.h"
#include "core/error.h"

namespace osprey {

Device select_device(const std::string& name) {
  if (name.empty()) return cuda_available() ? Device::cuda(0) : Device::cpu();
  if (name == "cpu") return Device::cpu();
  if (name.rfind("cuda", 0) != 0)
    throw InvalidInput("device \"" + name + "\": expected cpu, cuda or cuda:N");
  int index = 0;
  if (name.size() > 4) {
    if (name[4] != ':' || name.size() == 5 || name.find_first_not_of("0123456789", 5) != std::string::npos)
      throw InvalidInput("device \"" + name + "\": expected cpu, cuda or cuda:N");
    index = std::stoi(name.substr(5));
  }
  if (!cuda_built())
    throw Unsupported("device " + name + " requested, but this build has no CUDA backend (configure with -DOSPREY_CUDA=ON)");
  if (!cuda_available()) throw Unsupported("device " + name + " requested, but no CUDA device is present");
  if (index >= cuda_device_count())
    throw InvalidInput("device " + name + " does not exist (" + std::to_string(cuda_device_count()) + " CUDA device(s))");
  return Device::cuda(index);
}

}  // namespace osprey
