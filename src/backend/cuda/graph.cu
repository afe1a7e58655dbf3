#include "backend/graph.h"

#include <vector>

#include "backend/cuda/runtime.h"
#include "core/buffer.h"
#include "core/error.h"

namespace osprey {

struct CapturedGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<std::shared_ptr<Buffer>> held;  // allocations made during the capture

  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    // NOTE: the held buffers return to the caching allocator; work replayed earlier is
    // ordered before any later use of them on the one stream.
  }
};

CapturedGraph::CapturedGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedGraph::~CapturedGraph() = default;

std::unique_ptr<CapturedGraph> CapturedGraph::capture(Device device, const std::function<void()>& fn) {
  if (device.is_cpu()) throw Unsupported("graph capture needs a CUDA device");
  auto impl = std::make_unique<Impl>();
  Allocator& alloc = allocator_for(device);
  cudaStream_t s = cuda::stream();
  // Relaxed: allocations from the system (cudaMalloc) may happen during the capture.
  OSPREY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  alloc.set_hold_sink(&impl->held);
  try {
    fn();
  } catch (...) {
    alloc.set_hold_sink(nullptr);
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  alloc.set_hold_sink(nullptr);
  OSPREY_CUDA_CHECK(cudaStreamEndCapture(s, &impl->graph));
  OSPREY_CUDA_CHECK(cudaGraphInstantiate(&impl->exec, impl->graph, 0));
  return std::unique_ptr<CapturedGraph>(new CapturedGraph(std::move(impl)));
}

uint64_t CapturedGraph::memory_generation(Device device) {
  return device.is_cpu() ? 0 : cuda::scratch_generation();
}

void CapturedGraph::replay() { OSPREY_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::stream())); }

}  // namespace osprey
