#pragma once
// The entry points of one level's build of the kernels, as function pointers: each level's
// kernel_table.cpp fills one, and the dispatch calls the chosen level's through kernels().
// The contracts are those of cpu_kernels.h, basic_ops.h and quant_kernels.h.
#include "backend/cpu/basic_ops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_kernels.h"

namespace osprey::cpu {

// Every entry point, in one list: X(name) for each function of cpu_kernels.h, basic_ops.h
// and quant_kernels.h that the dispatch (backend/ops.cpp, quant_ops.cpp) calls. Adding a CPU
// kernel entry: its declaration in one of those headers and its name here.
#define OSPREY_CPU_KERNELS(X)                                                                    \
  X(linear) X(linear_rows) X(linear_gemm) X(linear_invariant) X(attention) X(paged_attention)    \
  X(embedding) X(rms_norm) X(layer_norm) X(add_) X(scale_) X(silu_mul) X(gelu_tanh_mul)          \
  X(gelu_tanh_mul_split) X(head_rms_norm_) X(softcap_) X(rope_) X(copy_into) X(linear_q)         \
  X(linear_q_f32) X(dequantize_rows) X(dequantize)

struct KernelTable {
#define OSPREY_CPU_KERNEL_MEMBER(name) decltype(&cpu::name) name;
  OSPREY_CPU_KERNELS(OSPREY_CPU_KERNEL_MEMBER)
#undef OSPREY_CPU_KERNEL_MEMBER
};

// The table of the level the process runs (backend/cpu_level.h: chosen at the first call from
// OSPREY_CPU_LEVEL, else the host's best). The dispatch calls kernels().linear(...) and so on.
const KernelTable& kernels();

}  // namespace osprey::cpu

// The table of each level, by a C name (the build keeps this one symbol of a level's objects
// global and makes every other one local to them; CMakeLists.txt).
extern "C" {
const osprey::cpu::KernelTable* osprey_cpu_kernels_scalar();
#if defined(__x86_64__)
const osprey::cpu::KernelTable* osprey_cpu_kernels_v3();
const osprey::cpu::KernelTable* osprey_cpu_kernels_v4();
const osprey::cpu::KernelTable* osprey_cpu_kernels_v4_bf16();
#endif
}
