#pragma once
// Device helpers shared by the kernels of src/backend/cuda: 16-bit float loads, warp and
// block reductions, launch checks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"

namespace osprey::cuda {

// Throws osprey::Error for a failed launch (bad configuration, too much shared memory).
#define OSPREY_CUDA_CHECK_LAUNCH() OSPREY_CUDA_CHECK(cudaGetLastError())

constexpr float kNegInf = -__builtin_huge_valf();

// Programmatic dependent launch (compute capability 9.0+). A kernel started by
// launch_kernel() may begin while the kernel before it in the stream is still running, once
// every block of that kernel has called pdl_launch_dependents() or exited. Such a kernel must
// call pdl_wait(), in every block and before its first access to memory that an earlier
// kernel writes or reads: pdl_wait() returns when the whole previous grid has completed and
// its writes are visible, and the previous grid completes only after its own pdl_wait()
// returned, so the whole chain before it is complete too. Work before pdl_wait() may only read
// what no kernel of the step writes (weights). Both are no-ops on older devices and for a
// plain launch.
// NOTE: the GEMVs signal after their last weight load, so that the next kernel's launch and
// weight prefetch overlap their tail; other kernels signal by exiting. A signal at a kernel's
// start lets chains of short kernels become resident at once, holding registers and shared
// memory while they wait (measured slower).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), launched so that it may overlap the tail of the
// kernel before it (pdl_enabled()): only for kernels that follow the pdl_wait() rule above.
// Checks the launch itself (no OSPREY_CUDA_CHECK_LAUNCH needed after it).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  OSPREY_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// One head of a K/V row, f32 to f16 or bf16 (round to nearest even), the block's threads
// striding over its head_dim elements: the dense and the paged K/V writes share it.
template <bool kBF16>
__device__ __forceinline__ void store_kv_head(uint16_t* kd, uint16_t* vd, const float* ks, const float* vs,
                                              int64_t head_dim) {
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    if constexpr (kBF16) {
      kd[d] = f32_to_bf16_bits(ks[d]);
      vd[d] = f32_to_bf16_bits(vs[d]);
    } else {
      kd[d] = f32_to_f16_bits(ks[d]);
      vd[d] = f32_to_f16_bits(vs[d]);
    }
  }
}

// Element type tags: T is the stored type, load() converts one element to f32.
struct TagF32 {
  using T = float;
  static constexpr int kVec = 4;  // elements per 16 bytes
  static __device__ __forceinline__ float load(const T* p) { return *p; }
};
struct TagF16 {
  using T = uint16_t;
  static constexpr int kVec = 8;
  static __device__ __forceinline__ float load(const T* p) { return f16_bits_to_f32(*p); }
};
struct TagBF16 {
  using T = uint16_t;
  static constexpr int kVec = 8;
  static __device__ __forceinline__ float load(const T* p) { return bf16_bits_to_f32(*p); }
};

// Eight f16 / bf16 values packed in a uint4 (16 bytes) to f32.
__device__ __forceinline__ void unpack8_f16(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __half2float(__ushort_as_half(uint16_t(w[i] & 0xffffu)));
    f[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(w[i] >> 16)));
  }
}
__device__ __forceinline__ void unpack8_bf16(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(kC * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `red` is __shared__ float[32]. Contains barriers: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `red` may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? red[lane] : 0.0f;
  return warp_sum(t);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks for a grid-stride loop over `n` items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(std::max<int64_t>(1, std::min(b, max_blocks)));
}

inline int multiprocessor_count() {
  int dev = 0, n = 0;
  OSPREY_CUDA_CHECK(cudaGetDevice(&dev));
  OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// dst[i] = x[i] rounded to bf16 (bf16) or f16, i < n: the x operand of a 16-bit cuBLAS GEMM.
void round_to_16bit(const float* x, uint16_t* dst, int64_t n, bool bf16, cudaStream_t s);
// y[r, c] += bias[c] for r < n, c < out.
void add_bias_rows(float* y, const float* bias, int64_t n, int64_t out, cudaStream_t s);

inline std::string unsupported_dtype(const char* op, DType dt) {
  return std::string(op) + ": dtype " + dtype_name(dt) + " is not supported on CUDA";
}

}  // namespace osprey::cuda
