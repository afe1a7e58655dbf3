// Element-wise kernels: embedding gather, add, scale, softcap, gated activations.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

// One block per token row: out[i, :] = table[ids[i], :] * scale.
template <class Tag>
__global__ void embedding_kernel(const typename Tag::T* __restrict__ table, const int32_t* __restrict__ ids, int64_t d,
                                 float scale, float* __restrict__ out) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const typename Tag::T* row = table + int64_t(ids[i]) * d;
  float* o = out + i * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = Tag::load(row + j) * scale;
}

struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct SiluMulOp {
  __device__ __forceinline__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};
struct GeluTanhMulOp {
  __device__ __forceinline__ float operator()(float g, float u) const { return gelu_tanh(g) * u; }
};

// out[i] = op(a[i], b[i]); VEC: a, b, out 16-byte aligned, n4 = n / 4 float4 groups first.
template <class Op, bool VEC>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, Op op) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 x = a4[i], y = b4[i];
      o4[i] = make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) out[i] = op(a[i], b[i]);
}

struct ScaleOp {
  float f;
  __device__ __forceinline__ float operator()(float x) const { return x * f; }
};
struct SoftcapOp {
  float cap;
  __device__ __forceinline__ float operator()(float x) const { return cap * tanhf(x / cap); }
};

// x[i] = op(x[i]); VEC: x 16-byte aligned, n4 = n / 4 float4 groups first.
template <class Op, bool VEC>
__global__ void unary_inplace_kernel(float* x, int64_t n, Op op) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    float4* x4 = reinterpret_cast<float4*>(x);
    for (int64_t i = start; i < n4; i += stride) {
      float4 v = x4[i];
      v.x = op(v.x), v.y = op(v.y), v.z = op(v.z), v.w = op(v.w);
      x4[i] = v;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) x[i] = op(x[i]);
}

template <class Op>
void launch_unary_inplace(float* x, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned16(x);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  if (vec)
    launch_kernel(unary_inplace_kernel<Op, true>, grid, kThreads, 0, s, x, n, op);
  else
    launch_kernel(unary_inplace_kernel<Op, false>, grid, kThreads, 0, s, x, n, op);
}

template <class Op>
void launch_binary(const float* a, const float* b, float* out, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned16(a) && aligned16(b) && aligned16(out);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  if (vec)
    launch_kernel(binary_kernel<Op, true>, grid, kThreads, 0, s, a, b, out, n, op);
  else
    launch_kernel(binary_kernel<Op, false>, grid, kThreads, 0, s, a, b, out, n, op);
}

}  // namespace

void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t d, float scale, float* out,
               cudaStream_t s) {
  if (n <= 0 || d <= 0) return;
  if (n > 0x7fffffffLL) throw Unsupported("embedding: more than 2^31 - 1 tokens");
  const int threads = int(std::min<int64_t>(kThreads, (d + 31) / 32 * 32));
  switch (dt) {
    case DType::f32:
      launch_kernel(embedding_kernel<TagF32>, unsigned(n), threads, 0, s, static_cast<const float*>(table), ids, d, scale, out);
      break;
    case DType::f16:
      launch_kernel(embedding_kernel<TagF16>, unsigned(n), threads, 0, s, static_cast<const uint16_t*>(table), ids, d, scale, out);
      break;
    case DType::bf16:
      launch_kernel(embedding_kernel<TagBF16>, unsigned(n), threads, 0, s, static_cast<const uint16_t*>(table), ids, d, scale,
                                                                out);
      break;
    default: throw Unsupported(unsupported_dtype("embedding", dt));
  }
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) { launch_binary(x, y, x, n, AddOp{}, s); }

void scale_inplace(float* x, float f, int64_t n, cudaStream_t s) { launch_unary_inplace(x, n, ScaleOp{f}, s); }

void softcap_inplace(float* x, float cap, int64_t n, cudaStream_t s) { launch_unary_inplace(x, n, SoftcapOp{cap}, s); }

void silu_mul(const float* g, const float* u, float* out, int64_t n, cudaStream_t s) {
  launch_binary(g, u, out, n, SiluMulOp{}, s);
}

void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n, cudaStream_t s) {
  launch_binary(g, u, out, n, GeluTanhMulOp{}, s);
}

namespace {

template <bool BF16>
__global__ void round_kernel(const float* __restrict__ x, uint16_t* __restrict__ dst, int64_t n) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = BF16 ? f32_to_bf16_bits(x[i]) : f32_to_f16_bits(x[i]);
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t out) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * out; i += stride) y[i] += bias[i % out];
}

}  // namespace

void round_to_16bit(const float* x, uint16_t* dst, int64_t n, bool bf16, cudaStream_t s) {
  if (bf16)
    launch_kernel(round_kernel<true>, grid_for(n, 256), 256, 0, s, x, dst, n);
  else
    launch_kernel(round_kernel<false>, grid_for(n, 256), 256, 0, s, x, dst, n);
}

void add_bias_rows(float* y, const float* bias, int64_t n, int64_t out, cudaStream_t s) {
  launch_kernel(add_bias_kernel, grid_for(n * out, 256), 256, 0, s, y, bias, n, out);
}

}  // namespace osprey::cuda
