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
#define OSPREY_CPU_KERNEL_ENTRY(name) .name = &name,
  static constexpr KernelTable table{OSPREY_CPU_KERNELS(OSPREY_CPU_KERNEL_ENTRY)};
#undef OSPREY_CPU_KERNEL_ENTRY
  return &table;
}
