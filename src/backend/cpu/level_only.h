#pragma once
// What a header of the kernels' per-level build includes first: level.h, and a compile error
// anywhere else (OSPREY_CPU_LEVEL unset).
#include "backend/cpu/level.h"

#if !defined(OSPREY_CPU_LEVEL)
#error "an internal header of the kernels' per-level build (backend/cpu/level.h)"
#endif
