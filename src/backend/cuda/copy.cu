// Strided cast-copy between 4-D arrays of equal shape.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

struct Dims4 {
  int64_t d[4];
};

enum class Kind : int { f32, f16, bf16, i32 };

__device__ __forceinline__ float read_f32(const char* base, Kind k, int64_t off) {
  switch (k) {
    case Kind::f32: return reinterpret_cast<const float*>(base)[off];
    case Kind::f16: return f16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[off]);
    case Kind::bf16: return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[off]);
    default: return float(reinterpret_cast<const int32_t*>(base)[off]);
  }
}

__device__ __forceinline__ void write_f32(char* base, Kind k, int64_t off, float v) {
  switch (k) {
    case Kind::f32: reinterpret_cast<float*>(base)[off] = v; break;
    case Kind::f16: reinterpret_cast<uint16_t*>(base)[off] = f32_to_f16_bits(v); break;
    case Kind::bf16: reinterpret_cast<uint16_t*>(base)[off] = f32_to_bf16_bits(v); break;
    default: reinterpret_cast<int32_t*>(base)[off] = int32_t(v); break;
  }
}

// One thread per element (grid-stride); the flat index runs over `shape` in row-major order so
// that consecutive threads touch consecutive innermost elements.
// ELEM: 0 = cast through f32; 2 / 4 = same dtype, copy that many bytes exactly.
template <int ELEM>
__global__ void copy_kernel(char* dst, Kind dk, Dims4 ds, const char* src, Kind sk, Dims4 ss, Dims4 shape,
                            int64_t total) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; f < total; f += stride) {
    int64_t r = f;
    const int64_t i3 = r % shape.d[3];
    r /= shape.d[3];
    const int64_t i2 = r % shape.d[2];
    r /= shape.d[2];
    const int64_t i1 = r % shape.d[1];
    const int64_t i0 = r / shape.d[1];
    const int64_t so = i0 * ss.d[0] + i1 * ss.d[1] + i2 * ss.d[2] + i3 * ss.d[3];
    const int64_t dof = i0 * ds.d[0] + i1 * ds.d[1] + i2 * ds.d[2] + i3 * ds.d[3];
    if constexpr (ELEM == 2)
      reinterpret_cast<uint16_t*>(dst)[dof] = reinterpret_cast<const uint16_t*>(src)[so];
    else if constexpr (ELEM == 4)
      reinterpret_cast<uint32_t*>(dst)[dof] = reinterpret_cast<const uint32_t*>(src)[so];
    else
      write_f32(dst, dk, dof, read_f32(src, sk, so));
  }
}

Kind kind_of(DType dt, const char* what) {
  switch (dt) {
    case DType::f32: return Kind::f32;
    case DType::f16: return Kind::f16;
    case DType::bf16: return Kind::bf16;
    case DType::i32: return Kind::i32;
    default: throw Unsupported(unsupported_dtype(what, dt));
  }
}

}  // namespace

void copy_strided(void* dst, DType ddt, const int64_t dst_strides[4], const void* src, DType sdt,
                  const int64_t src_strides[4], const int64_t shape[4], cudaStream_t s) {
  const Kind dk = kind_of(ddt, "copy (destination)"), sk = kind_of(sdt, "copy (source)");
  Dims4 ds, ss, sh;
  int64_t total = 1;
  for (int i = 0; i < 4; ++i) {
    ds.d[i] = dst_strides[i];
    ss.d[i] = src_strides[i];
    sh.d[i] = shape[i];
    total *= shape[i];
  }
  if (total <= 0) return;
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(total, kThreads);
  auto* d = static_cast<char*>(dst);
  auto* sp = static_cast<const char*>(src);
  if (ddt == sdt && dtype_size(ddt) == 2)
    launch_kernel(copy_kernel<2>, grid, kThreads, 0, s, d, dk, ds, sp, sk, ss, sh, total);
  else if (ddt == sdt)
    launch_kernel(copy_kernel<4>, grid, kThreads, 0, s, d, dk, ds, sp, sk, ss, sh, total);
  else
    launch_kernel(copy_kernel<0>, grid, kThreads, 0, s, d, dk, ds, sp, sk, ss, sh, total);
}

}  // namespace osprey::cuda
