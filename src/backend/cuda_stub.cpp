// The CUDA entry points of a build without the CUDA backend.
#ifndef OSPREY_WITH_CUDA
#include "backend/cuda_available.h"
#include "backend/graph.h"
#include "core/buffer.h"
#include "core/error.h"

namespace osprey {

bool cuda_built() { return false; }
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_description(int) { return "this build has no CUDA backend (configure with -DOSPREY_CUDA=ON)"; }

Allocator& cuda_allocator(int device) {
  throw Unsupported("device cuda:" + std::to_string(device) +
                    " requested, but this build has no CUDA backend (configure with -DOSPREY_CUDA=ON)");
}

struct CapturedGraph::Impl {};
CapturedGraph::CapturedGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedGraph::~CapturedGraph() = default;
std::unique_ptr<CapturedGraph> CapturedGraph::capture(Device device, const std::function<void()>&) {
  throw Unsupported("graph capture on " + device.str() + " needs the CUDA backend");
}
void CapturedGraph::replay() {}
uint64_t CapturedGraph::memory_generation(Device) { return 0; }

}  // namespace osprey
#endif
