#pragma once
// The entry points of one level's build of the kernels, as function pointers: each level's
// kernel_table.cpp fills one, and backend/cpu_level.cpp calls the chosen level's through it.
// The contracts are those of cpu_kernels.h, basic_ops.h and quant_kernels.h.
#include "backend/cpu/basic_ops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_kernels.h"

namespace osprey::cpu {

struct KernelTable {
  // cpu_kernels.h
  decltype(&cpu::linear) linear;
  decltype(&cpu::linear_rows) linear_rows;
  decltype(&cpu::linear_gemm) linear_gemm;
  decltype(&cpu::linear_invariant) linear_invariant;
  decltype(&cpu::attention) attention;
  decltype(&cpu::paged_attention) paged_attention;
  // basic_ops.h
  decltype(&cpu::embedding) embedding;
  decltype(&cpu::rms_norm) rms_norm;
  decltype(&cpu::layer_norm) layer_norm;
  decltype(&cpu::add_) add_;
  decltype(&cpu::scale_) scale_;
  decltype(&cpu::silu_mul) silu_mul;
  decltype(&cpu::gelu_tanh_mul) gelu_tanh_mul;
  decltype(&cpu::gelu_tanh_mul_split) gelu_tanh_mul_split;
  decltype(&cpu::head_rms_norm_) head_rms_norm_;
  decltype(&cpu::softcap_) softcap_;
  decltype(&cpu::rope_) rope_;
  decltype(&cpu::copy_into) copy_into;
  // quant_kernels.h
  decltype(&cpu::linear_q) linear_q;
  decltype(&cpu::linear_q_f32) linear_q_f32;
  decltype(&cpu::dequantize_rows) dequantize_rows;
  decltype(&cpu::dequantize) dequantize;
};

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
