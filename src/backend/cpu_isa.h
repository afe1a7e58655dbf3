#pragma once
// The x86-64 instruction set the CPU kernels run with, for banners and reports.

namespace osprey {

// "AVX-512 BF16", "AVX-512", "AVX2" or "scalar": the widest SIMD path of the level the CPU
// kernels run (backend/cpu_level.h: v4-bf16, v4, v3, scalar).
const char* cpu_isa_name();

}  // namespace osprey
