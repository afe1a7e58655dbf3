#pragma once
// Row decoding shared by the quantized kernels. Internal to src/backend/cpu.
#include <cstdint>

#include "backend/cpu/level_only.h"
#include "backend/quant_args.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// dst[c] = fma(scale, q, bias) of w[row, k0 + c] in f32, for c < kc; k0 and kc multiples of 32.
// SIMD for every bits where the build allows (3 and 6 need AVX2 or AVX-512BW byte shuffles).
void decode_row(const QuantArgs& w, int64_t row, int64_t k0, int64_t kc, float* dst);

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
