// The entry points of the CUDA backend in a build without it (CMake compiles this file only
// then). Nothing can live on a CUDA device in such a build, so the op dispatch never reaches
// the cuda_ops functions; they throw all the same.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda_available.h"
#include "backend/graph.h"
#include "core/buffer.h"
#include "core/error.h"

namespace osprey {

namespace {
constexpr const char* kNoBackend = "this build has no CUDA backend (configure with -DOSPREY_CUDA=ON)";
}  // namespace

bool cuda_built() { return false; }
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_description(int) { return kNoBackend; }
size_t cuda_free_memory(int) { throw Unsupported(kNoBackend); }
void release_cuda_device() noexcept {}
void cuda_enqueue_trap() { throw Unsupported(kNoBackend); }

Allocator& cuda_allocator(int device) {
  throw Unsupported("device cuda:" + std::to_string(device) + " requested, but " + kNoBackend);
}

struct CapturedGraph::Impl {};
CapturedGraph::CapturedGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedGraph::~CapturedGraph() = default;
std::unique_ptr<CapturedGraph> CapturedGraph::capture(Device device, const std::function<void()>&) {
  throw Unsupported("graph capture on " + device.str() + " needs the CUDA backend");
}
void CapturedGraph::replay() {}
uint64_t CapturedGraph::memory_generation(Device) { return 0; }

namespace cuda_ops {

[[noreturn]] static void no_backend() { throw Unsupported(std::string("CUDA op: ") + kNoBackend); }

struct TokenSlots {};

#define OSPREY_CUDA_OP(name, params, args) \
  void name params { no_backend(); }
#define OSPREY_CUDA_ENTRY(ret, name, params) \
  ret name params { no_backend(); }
#include "backend/cuda/op_list.inc"
#undef OSPREY_CUDA_OP
#undef OSPREY_CUDA_ENTRY

}  // namespace cuda_ops
}  // namespace osprey
