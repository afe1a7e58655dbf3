#pragma once
// The blocked GEMM of gemm_blocked.cpp with the weight side supplied by the caller as f32
// panels, for weights that are not stored as plain f32 / f16 / bf16 rows (quantized ones).
// Internal to src/backend/cpu.
#include <cstdint>

#include "backend/cpu/gemm_simd.h"
#include "core/thread_pool.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// Outputs per packed panel (the micro-kernel's width) and the k extent of one panel, at most.
inline constexpr int kGemmPanelWidth = simd::kWidth == 16 ? 48 : simd::kWidth == 8 ? 16 : 4;
inline constexpr int64_t kGemmKBlock = 256;

// Fills bp[k * kGemmPanelWidth + j] = w[j0 + j, k0 + k] as f32 for k < kc, j < kGemmPanelWidth,
// with zeros where j0 + j >= out. k0 is a multiple of kGemmKBlock and kc <= kGemmKBlock. Called
// concurrently from the pool's threads with distinct bp.
using PanelPacker = void (*)(const void* ctx, int64_t j0, int64_t k0, int64_t kc, float* bp);

// y[n, out] = x[n, in] * w[out, in]^T + bias[out] (bias may be nullptr), w given by `pack`.
void gemm_with_packer(const float* x, int64_t n, int64_t in, int64_t out, PanelPacker pack, const void* ctx,
                      const float* bias, float* y, ThreadPool& pool);

// bp[k * kGemmPanelWidth + j] = src[j * ld + k] for k < kc, j < rows; zero for rows <= j <
// kGemmPanelWidth (rows <= kGemmPanelWidth): the f32 packer over rows already in memory.
void pack_panel_f32(const float* src, int64_t ld, int rows, int64_t kc, float* bp);

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
