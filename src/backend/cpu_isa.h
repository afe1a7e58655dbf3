#pragma once
// The x86-64 instruction set the CPU kernels run with, for banners and reports.

namespace osprey {

// "AVX-512", "AVX2" or "scalar": the widest SIMD path the CPU kernels were compiled for
// (src/backend/cpu/gemm_simd.h and quant_simd.h pick theirs from the same compiler flags).
const char* cpu_isa_name();

}  // namespace osprey
