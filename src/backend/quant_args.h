#pragma once
// One MLX affine-quantized [out, in] matrix as raw pointers, for the CPU and CUDA kernels
// (host pointers for src/backend/cpu, device pointers for src/backend/cuda). The layout is
// QuantizedMatrix's (src/backend/quant.h): row r's codes are the little-endian bit stream of
// packed[r * (in * bits / 32) ...]; w[r, c] = scales[r, c / group_size] * q[r, c] + biases[r, c / group_size].
#include <cstdint>

#include "core/dtype.h"

namespace osprey {

struct QuantArgs {
  const uint32_t* packed = nullptr;  // [out, in * bits / 32]
  const void* scales = nullptr;      // [out, in / group_size] f16 | bf16
  const void* biases = nullptr;      // [out, in / group_size], scale_dtype
  DType scale_dtype = DType::f16;
  int bits = 4;                      // 2, 3, 4, 6 or 8
  int group_size = 64;               // 32, 64 or 128 (16 for 8 bits: supported_quant_group); divides in
  int64_t out = 0, in = 0;
  // CPU, 4 or 8 bits: the decode kernel's copy of the matrix in 16-row tiles (cpu/quant_int8.h,
  // repack_q4_tiles / repack_q8_tiles), or null. Read instead of packed, scales and biases by
  // the n <= 8 kernel.
  const void* tiles = nullptr;
  // 0: the tiles hold each group's scale and bias. z > 0: every group's bias is exactly -z
  // times its scale (in f32), and the tiles hold the scales alone (quant_int8.h).
  int tiles_zero = 0;
};

// The group sizes the kernels take: 32, 64 and 128 for every width, and 16 for 8-bit codes
// (GGUF's Q6_K, whose scales are per 16 values, is held so: docs/gguf.md). The quantizer and
// `osprey convert` write 32, 64 or 128 only (backend/quant.h's supported_group_size).
inline bool supported_quant_group(int bits, int g) { return g == 32 || g == 64 || g == 128 || (bits == 8 && g == 16); }

// One FP8 [out, in] matrix (backend/quant.h's Fp8Matrix) as device pointers.
struct Fp8Args {
  const uint8_t* codes = nullptr;  // [out, in] float8_e4m3fn
  const float* scales = nullptr;   // [out, n_groups]
  int64_t out = 0, in = 0;
  int64_t n_groups = 1;            // divides in
  // W8A8 (x quantized to e4m3 per token) allowed: the checkpoint declares FP8 activations, or
  // OSPREY_CUDA_FP8_ACTIVATIONS asks for them on a weights-only checkpoint.
  bool fp8_activations = true;
};

}  // namespace osprey
