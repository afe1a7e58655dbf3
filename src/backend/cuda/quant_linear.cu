// linear_q's dispatch and its many-rows path, embedding_q and dequantize.
//
// Many rows of x (prefill): w is dequantized to 16 bits into scratch() a chunk at a time and
// multiplied by cuBLAS. Tall matrices (out >= in, e.g. an output head) are cut into row
// chunks, each writing its own columns of y; wide ones (a down projection) into column
// chunks of the input dimension, accumulated into y (beta = 1), so that every GEMM keeps the
// full output dimension and the tensor cores stay busy.
//
// Dequantization: one thread per 32-element unit (the `bits` words that hold it, inside one
// group), codes extracted with compile-time shifts, s * q + b in f32, 16-byte stores.
#include <climits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_common.cuh"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_linear.h"
#include "core/env.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;
// Scratch for the rounded x plus one dequantized chunk; a chunk gets at least kMinChunkBytes
// even when x alone fills kScratchBytes.
constexpr size_t kScratchBytes = size_t(64) << 20;
constexpr size_t kMinChunkBytes = size_t(16) << 20;

enum class Out { f32, f16, bf16 };

struct DequantParams {
  const uint32_t* packed;  // [rows of w, words_per_row]
  const uint16_t* scales;  // [rows of w, groups_per_row]
  const uint16_t* biases;
  const int32_t* ids;      // GATHER: [rows] row of w for output row i; else output row i is row i of w
  int64_t rows;            // output rows
  int64_t words_per_row, groups_per_row;
  int64_t unit0, n_units;  // 32-column units decoded per row, from unit0
  int group_shift;
  float scale;             // GATHER: multiplies every value
  void* dst;               // [rows, ld] of Out
  int64_t ld;
  bool vec;                // dst rows 16-byte aligned
};

template <Out O>
__device__ __forceinline__ void store_unit(void* dst, int64_t off, const float (&v)[32], bool vec) {
  if constexpr (O == Out::f32) {
    float* d = static_cast<float*>(dst) + off;
    if (vec) {
#pragma unroll
      for (int q = 0; q < 8; ++q)
        reinterpret_cast<float4*>(d)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    } else {
#pragma unroll
      for (int k = 0; k < 32; ++k) d[k] = v[k];
    }
  } else {
    uint32_t h[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const uint32_t lo = O == Out::bf16 ? f32_to_bf16_bits(v[2 * k]) : f32_to_f16_bits(v[2 * k]);
      const uint32_t hi = O == Out::bf16 ? f32_to_bf16_bits(v[2 * k + 1]) : f32_to_f16_bits(v[2 * k + 1]);
      h[k] = lo | (hi << 16);
    }
    uint16_t* d = static_cast<uint16_t*>(dst) + off;
    if (vec) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        reinterpret_cast<uint4*>(d)[q] = make_uint4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) d[2 * k] = uint16_t(h[k] & 0xffffu), d[2 * k + 1] = uint16_t(h[k] >> 16);
    }
  }
}

// dst[i, 32 t .. 32 t + 32) = dequant(w)[row(i), 32 (unit0 + t) ..) (times scale when GATHER).
template <int B, bool BF16, Out O, bool GATHER>
__global__ void dequant_kernel(const DequantParams p) {
  const int64_t total = p.rows * p.n_units;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t i = idx / p.n_units, t = idx - i * p.n_units, u = p.unit0 + t;
    const int64_t r = GATHER ? int64_t(p.ids[i]) : i;
    uint32_t w[B];
    load_unit<B>(p.packed + r * p.words_per_row, u, w);
    const int64_t g = (u * 32) >> p.group_shift;
    const float s = load_param<BF16>(p.scales + r * p.groups_per_row + g);
    const float b = load_param<BF16>(p.biases + r * p.groups_per_row + g);
    float v[32];
    if (p.group_shift == 4) {  // two groups of 16 in the unit
      dequant_unit<B>(w, s, b, load_param<BF16>(p.scales + r * p.groups_per_row + g + 1),
                      load_param<BF16>(p.biases + r * p.groups_per_row + g + 1), v);
    } else {
      dequant_unit<B>(w, s, b, v);
    }
    if constexpr (GATHER) {
#pragma unroll
      for (int k = 0; k < 32; ++k) v[k] *= p.scale;
    }
    store_unit<O>(p.dst, i * p.ld + t * 32, v, p.vec);
  }
}

template <int B, bool BF16, Out O, bool GATHER>
void launch_dequant(const DequantParams& p, cudaStream_t s) {
  dequant_kernel<B, BF16, O, GATHER><<<grid_for(p.rows * p.n_units, kThreads), kThreads, 0, s>>>(p);
  OSPREY_CUDA_CHECK_LAUNCH();
}

template <bool BF16, Out O, bool GATHER>
void launch_dequant_bits(int bits, const DequantParams& p, cudaStream_t s) {
  switch (bits) {
    case 2: return launch_dequant<2, BF16, O, GATHER>(p, s);
    case 3: return launch_dequant<3, BF16, O, GATHER>(p, s);
    case 4: return launch_dequant<4, BF16, O, GATHER>(p, s);
    case 6: return launch_dequant<6, BF16, O, GATHER>(p, s);
    default: return launch_dequant<8, BF16, O, GATHER>(p, s);
  }
}

template <Out O, bool GATHER>
void launch_dequant_any(const QuantArgs& w, const DequantParams& p, cudaStream_t s) {
  if (w.scale_dtype == DType::bf16)
    launch_dequant_bits<true, O, GATHER>(w.bits, p, s);
  else
    launch_dequant_bits<false, O, GATHER>(w.bits, p, s);
}

DequantParams dequant_params(const QuantArgs& w) {
  DequantParams p{};
  p.packed = w.packed;
  p.scales = static_cast<const uint16_t*>(w.scales);
  p.biases = static_cast<const uint16_t*>(w.biases);
  p.words_per_row = w.in * w.bits / 32;
  p.groups_per_row = w.in / w.group_size;
  p.group_shift = group_shift(w.group_size);
  return p;
}

size_t dtype_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

}  // namespace

void check_quant_args(const char* op, const QuantArgs& w) {
  const std::string name(op);
  if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 6 && w.bits != 8)
    throw Unsupported(name + ": " + std::to_string(w.bits) + "-bit quantization is not supported on CUDA (2, 3, 4, 6, 8)");
  if (!supported_quant_group(w.bits, w.group_size))
    throw Unsupported(name + ": group size " + std::to_string(w.group_size) + " with " + std::to_string(w.bits) +
                      "-bit codes is not supported on CUDA (32, 64, 128; 16 for 8-bit codes)");
  if (w.scale_dtype != DType::f16 && w.scale_dtype != DType::bf16)
    throw Unsupported(unsupported_dtype((name + " (scales)").c_str(), w.scale_dtype));
  if (w.in <= 0 || w.in % w.group_size != 0)
    throw Unsupported(name + ": the group size " + std::to_string(w.group_size) + " does not divide the " +
                      std::to_string(w.in) + " inputs");
  if (w.out > INT_MAX || w.in > INT_MAX)
    throw Unsupported(name + ": a dimension is 2^31 or more (out=" + std::to_string(w.out) +
                      ", in=" + std::to_string(w.in) + ")");
}

void dequantize_block(const QuantArgs& w, int64_t k0, int64_t kc, DType out_dtype, void* dst, int64_t ld,
                      cudaStream_t s) {
  if (w.out <= 0 || kc <= 0) return;
  check_quant_args("dequantize", w);
  if (k0 % 32 != 0 || kc % 32 != 0 || k0 < 0 || k0 + kc > w.in)
    throw Unsupported("dequantize: columns [" + std::to_string(k0) + ", " + std::to_string(k0 + kc) +
                      ") are not whole 32-column units of the " + std::to_string(w.in) + " inputs");
  DequantParams p = dequant_params(w);
  p.rows = w.out;
  p.unit0 = k0 / 32;
  p.n_units = kc / 32;
  p.dst = dst;
  p.ld = ld;
  p.vec = aligned16(dst) && (ld * int64_t(dtype_bytes(out_dtype))) % 16 == 0;
  switch (out_dtype) {
    case DType::f32: return launch_dequant_any<Out::f32, false>(w, p, s);
    case DType::f16: return launch_dequant_any<Out::f16, false>(w, p, s);
    case DType::bf16: return launch_dequant_any<Out::bf16, false>(w, p, s);
    default: throw Unsupported(unsupported_dtype("dequantize (output)", out_dtype));
  }
}

void dequantize(const QuantArgs& w, DType out_dtype, void* out, cudaStream_t s) {
  dequantize_block(w, 0, w.in, out_dtype, out, w.in, s);
}

void embedding_q(const QuantArgs& w, const int32_t* ids, int64_t n, float scale, float* out, cudaStream_t s) {
  if (n <= 0) return;
  check_quant_args("embedding", w);
  DequantParams p = dequant_params(w);
  p.ids = ids;
  p.rows = n;
  p.unit0 = 0;
  p.n_units = w.in / 32;
  p.scale = scale;
  p.dst = out;
  p.ld = w.in;
  p.vec = aligned16(out);  // rows stay aligned: in is a multiple of 32
  launch_dequant_any<Out::f32, true>(w, p, s);
}

void linear_q_gemm(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s) {
  if (n <= 0 || w.out <= 0) return;
  check_quant_args("linear_q", w);
  if (n > INT_MAX) throw Unsupported("linear_q: " + std::to_string(n) + " rows of x are 2^31 or more");
  const bool bf16 = w.scale_dtype == DType::bf16;
  const DType wdt = bf16 ? DType::bf16 : DType::f16;
  const int64_t in = w.in, out = w.out;

  // Chunk shape: whole rows when out >= in (or when a column chunk of 256 would not fit).
  const int64_t x_bytes = round_up(n * in * 2, 256);
  const int64_t budget =
      std::max<int64_t>(int64_t(kScratchBytes) - x_bytes, int64_t(kMinChunkBytes));
  const int64_t max_cols = budget / (out * 2) / 256 * 256;
  const bool by_rows = out >= in || max_cols < 256;
  int64_t rows = out, cols = in;
  if (by_rows) {
    const int64_t max_rows = std::max<int64_t>(128, budget / (in * 2) / 128 * 128);
    if (max_rows < out) rows = std::min(max_rows, round_up(ceil_div(out, ceil_div(out, max_rows)), 128));
  } else if (max_cols < in) {
    cols = std::min(max_cols, round_up(ceil_div(in, ceil_div(in, max_cols)), 256));
  }
  auto* buf = static_cast<char*>(scratch(size_t(x_bytes) + size_t(rows) * size_t(cols) * 2));
  auto* xr = reinterpret_cast<uint16_t*>(buf);  // [n, in] x rounded to wdt
  void* wc = buf + x_bytes;                     // [rows, cols] one dequantized chunk

  round_to_16bit(x, xr, n * in, bf16, s);

  cublasHandle_t h = cublas();
  cudaStream_t cur = nullptr;
  OSPREY_CUBLAS_CHECK(cublasGetStream(h, &cur));
  if (cur != s) OSPREY_CUBLAS_CHECK(cublasSetStream(h, s));
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[n, out] = x[n, in] w[out, in]^T is column-major y^T = w^T' x^T (see linear_gemm).
  if (by_rows) {
    const int64_t words_per_row = in * w.bits / 32, groups_per_row = in / w.group_size;
    for (int64_t r0 = 0; r0 < out; r0 += rows) {
      const int64_t rc = std::min(rows, out - r0);
      QuantArgs part = w;
      part.packed = w.packed + r0 * words_per_row;
      part.scales = static_cast<const uint16_t*>(w.scales) + r0 * groups_per_row;
      part.biases = static_cast<const uint16_t*>(w.biases) + r0 * groups_per_row;
      part.out = rc;
      dequantize_block(part, 0, in, wdt, wc, in, s);
      OSPREY_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rc), int(n), int(in), &one, wc, t, int(in),
                                       xr, t, int(in), &zero, y + r0, CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
    }
  } else {
    for (int64_t k0 = 0; k0 < in; k0 += cols) {
      const int64_t kc = std::min(cols, in - k0);
      dequantize_block(w, k0, kc, wdt, wc, kc, s);
      OSPREY_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(n), int(kc), &one, wc, t, int(kc),
                                       xr + k0, t, int(in), k0 == 0 ? &zero : &one, y, CUDA_R_32F, int(out),
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  if (bias) add_bias_rows(y, bias, n, out, s);
}

// Measured on an H100 (docs/benchmark_results/2026-12-05-h200-quant-kernels.md): the tensor-core
// kernel beats the fused GEMV from 4 rows and dequantize + cuBLAS up to 16 rows, for every 8B
// layer shape; outside [kQuantMmaMinRows, 16] the older paths are faster.
int64_t linear_q_mma_max_rows(const QuantArgs&) { return env_options().cuda_quant_mma ? 16 : 0; }

void linear_q(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s) {
  if (n >= kQuantMmaMinRows && n <= linear_q_mma_max_rows(w) && linear_q_mma_supported(x, w))
    linear_q_mma(x, n, w, bias, y, s);
  else if (n <= kGemvMaxRows)
    linear_q_gemv(x, n, w, bias, y, s);
  else
    linear_q_gemm(x, n, w, bias, y, s);
}

}  // namespace osprey::cuda
