#pragma once
// Numeric helpers shared by the op and kernel tests, and the CUDA skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda_available.h"

// Skips the current test when no CUDA device is present.
#define SKIP_WITHOUT_CUDA() \
  if (!osprey::cuda_available()) GTEST_SKIP() << "no CUDA device"

namespace osprey::testing {

// ||got - ref|| / ||ref|| (||got - ref|| when ref is zero); infinity when any element is NaN
// or the sizes differ.
inline double rel_error(const std::vector<float>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// f32 -> bf16 bits from the definition: keep the top 16 bits; the dropped 16 bits decide,
// above half an ulp up, below it down, exactly half to the even neighbour. (Finite inputs.)
inline uint16_t bf16_nearest_even(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t upper = u >> 16, dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (upper & 1u))) return uint16_t(upper + 1);
  return uint16_t(upper);
}

// n floats drawn uniformly from [lo, hi).
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The index of the first largest of a row of n values.
inline int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// The fastest of five rounds, in seconds per call of fn(r) for r in [0, reps), after one
// warm-up call; for the throughput tests.
inline double best_seconds(int reps, const std::function<void(int)>& fn) {
  fn(0);
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) fn(r);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = std::min(best, s);
  }
  return best;
}

}  // namespace osprey::testing
