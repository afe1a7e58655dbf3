#pragma once
// CPU implementations of the element-wise and normalisation ops (see backend/ops.h for the
// contracts). Arguments are checked by ops.cpp before these run.
#include "backend/cpu/level.h"
#include "core/array.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

void embedding(const Array& table, const Array& ids, float scale, Array& out);
void rms_norm(const Array& x, const Array& weight, float eps, bool unit_offset, Array& out);
void layer_norm(const Array& x, const Array& weight, const Array& bias, float eps, Array& out);
void add_(Array& x, const Array& y);
void scale_(Array& x, float s);
void silu_mul(const Array& gate, const Array& up, Array& out);
void gelu_tanh_mul(const Array& gate, const Array& up, Array& out);
void gelu_tanh_mul_split(const Array& gu, Array& out);
void head_rms_norm_(Array& x, const Array& weight, float eps, bool unit_offset);
void softcap_(Array& x, float cap);
void rope_(Array& x, const Array& positions, const Array& inv_freq, bool interleaved, float mscale);
void copy_into(const Array& dst, const Array& src);

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
