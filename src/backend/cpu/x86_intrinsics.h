#pragma once
// <immintrin.h> (and <cpuid.h>) on x86, for the kernels that use intrinsics. Internal to
// src/backend/cpu.
#if defined(__x86_64__) || defined(__i386__)
// NOTE: GCC reports its own _mm512_undefined_* placeholders inside these intrinsics as
// uninitialised (a false positive, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
