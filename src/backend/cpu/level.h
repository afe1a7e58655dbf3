#pragma once
// The kernels of this folder (all but quant_int8.cpp, which picks its own instruction sets) are
// compiled once per instruction-set level of backend/cpu_level.h (CMakeLists.txt), each time
// with that level's -march flags and OSPREY_CPU_LEVEL naming it (scalar, v3, v4 or v4_bf16).
// Their declarations and definitions sit between OSPREY_CPU_LEVEL_BEGIN and _END, that is in
// the inline namespace osprey::cpu::<level>, so that each level's copy has names of its own.
// Outside a level's build the macros are empty: the headers then declare the entry points of
// osprey::cpu, which backend/cpu_level.cpp forwards to the chosen level.
#include "backend/cpu_level.h"

#if defined(OSPREY_CPU_LEVEL)
#define OSPREY_CPU_LEVEL_BEGIN inline namespace OSPREY_CPU_LEVEL {
#define OSPREY_CPU_LEVEL_END }
#else
#define OSPREY_CPU_LEVEL_BEGIN
#define OSPREY_CPU_LEVEL_END
#endif

#if defined(OSPREY_CPU_LEVEL)
namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
// The level this copy of the kernels is built for.
inline constexpr CpuLevel kLevel = CpuLevel::OSPREY_CPU_LEVEL;
OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
#endif
