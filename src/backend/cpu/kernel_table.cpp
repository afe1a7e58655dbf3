// This level's KernelTable (kernel_table.h).
#include "backend/cpu/kernel_table.h"

#if !defined(OSPREY_CPU_LEVEL)
#error "compiled once per level with OSPREY_CPU_LEVEL set (CMakeLists.txt)"
#endif

#define OSPREY_CPU_CONCAT2(a, b) a##b
#define OSPREY_CPU_CONCAT(a, b) OSPREY_CPU_CONCAT2(a, b)

extern "C" const osprey::cpu::KernelTable* OSPREY_CPU_CONCAT(osprey_cpu_kernels_, OSPREY_CPU_LEVEL)() {
  using namespace osprey::cpu;
  // constexpr: no dynamic initialisation, so that nothing of a level runs before it is chosen.
  static constexpr KernelTable table{
      .linear = &linear,
      .linear_rows = &linear_rows,
      .linear_gemm = &linear_gemm,
      .linear_invariant = &linear_invariant,
      .attention = &attention,
      .paged_attention = &paged_attention,
      .embedding = &embedding,
      .rms_norm = &rms_norm,
      .layer_norm = &layer_norm,
      .add_ = &add_,
      .scale_ = &scale_,
      .silu_mul = &silu_mul,
      .gelu_tanh_mul = &gelu_tanh_mul,
      .gelu_tanh_mul_split = &gelu_tanh_mul_split,
      .head_rms_norm_ = &head_rms_norm_,
      .softcap_ = &softcap_,
      .rope_ = &rope_,
      .copy_into = &copy_into,
      .linear_q = &linear_q,
      .linear_q_f32 = &linear_q_f32,
      .dequantize_rows = &dequantize_rows,
      .dequantize = &dequantize,
  };
  return &table;
}
