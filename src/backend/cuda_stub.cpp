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

void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t d, float scale, float* out) { no_backend(); }
void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out) { no_backend(); }
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* out) { no_backend(); }
void linear(const float* x, int64_t n, int64_t in, const void* w, DType wdt, int64_t out, const float* bias, float* y, bool batch_invariant) { no_backend(); }
void add_inplace(float* x, const float* y, int64_t n) { no_backend(); }
void scale_inplace(float* x, float f, int64_t n) { no_backend(); }
void add_rms_norm(float* x, const float* y, const float* w, int64_t rows, int64_t d, float eps, float w_offset, float* out) { no_backend(); }
void silu_mul_split(const float* gu, int64_t n, int64_t f, float* out) { no_backend(); }
void gelu_tanh_mul_split(const float* gu, int64_t n, int64_t f, float* out) { no_backend(); }
void head_rms_norm(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const float* w, float eps, float w_offset) { no_backend(); }
void softcap_inplace(float* x, float cap, int64_t n) { no_backend(); }
void silu_mul(const float* g, const float* u, float* out, int64_t n) { no_backend(); }
void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n) { no_backend(); }
void rope_inplace(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t row_stride, const int32_t* positions, const float* inv_freq, bool interleaved, float mscale) { no_backend(); }
void kv_write(const KVWriteArgs& a) { no_backend(); }
void attention(const AttentionArgs& a) { no_backend(); }
void paged_attention(const PagedAttentionArgs& a) { no_backend(); }
void kv_write_paged(const PagedKVWriteArgs& a) { no_backend(); }
void gather_kv_blocks(const PagedGatherArgs& a) { no_backend(); }
void copy_strided(void* dst, DType ddt, const int64_t dst_strides[4], const void* src, DType sdt, const int64_t src_strides[4], const int64_t shape[4]) { no_backend(); }
void fill_i32(int32_t* p, int32_t value, int64_t n) { no_backend(); }
void argmax(const float* x, int64_t n, int32_t* out) { no_backend(); }
void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, int32_t* nonfinite) { no_backend(); }
void sample(const float* logits, int64_t vocab, const SampleArgs& a, int32_t* out_token) { no_backend(); }
void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, bool batch_invariant) { no_backend(); }
void embedding_q(const QuantArgs& w, const int32_t* ids, int64_t n, float scale, float* out) { no_backend(); }
void dequantize(const QuantArgs& w, DType out_dtype, void* out) { no_backend(); }
void copy_to_device(void* dst, const void* src, size_t bytes) { no_backend(); }
void copy_to_host(void* dst, const void* src, size_t bytes) { no_backend(); }
void copy_on_device(void* dst, const void* src, size_t bytes) { no_backend(); }
void synchronize() { no_backend(); }
struct TokenSlots {};
TokenSlots* create_token_slots(int device, int n_slots) { no_backend(); }
void destroy_token_slots(TokenSlots*) {}
void enqueue_token(TokenSlots* slots, int slot, const int32_t* token) { no_backend(); }
int32_t wait_token(TokenSlots* slots, int slot) { no_backend(); }

}  // namespace cuda_ops
}  // namespace osprey
