#pragma once
// The merge of split-K attention partials, shared by the dense (attention.cpp) and paged
// (paged_attention.cpp) CPU kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cpu/level_only.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// dst[0, D) = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the n_splits partials of one
// query vector, in ascending order. Partial s starts at first + s * stride and holds its
// unnormalised accumulator in [0, D), its running max at [m_at] and its sum at [m_at + 1]; a
// max of -inf means the split saw no key. With no key seen at all, dst is zeros.
inline void merge_splits(const float* first, int64_t stride, int64_t n_splits, int64_t D, int64_t m_at, float* dst) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf;
  for (int64_t sp = 0; sp < n_splits; ++sp) m = std::max(m, first[sp * stride + m_at]);
  std::fill_n(dst, D, 0.0f);
  if (m == kNegInf) return;
  float l = 0.0f;
  for (int64_t sp = 0; sp < n_splits; ++sp) {
    const float* part = first + sp * stride;
    if (part[m_at] == kNegInf) continue;
    const float w = std::exp(part[m_at] - m);
    l += part[m_at + 1] * w;
    for (int64_t d = 0; d < D; ++d) dst[d] += part[d] * w;
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
