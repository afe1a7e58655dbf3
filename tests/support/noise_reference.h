#pragma once
// The samplers' documented noise (backend/sample_noise.h), written again from its definition
// for the sampler tests' references: the Gumbel noise of draw `counter`, token `index`.
#include <cmath>
#include <cstdint>

namespace osprey::testing {

inline double reference_gumbel(uint64_t seed, uint64_t counter, uint64_t index) {
  auto mix = [](uint64_t z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t g = 0x9e3779b97f4a7c15ull;
  const uint64_t bits = mix(mix(seed ^ mix(counter + g)) + (index + 1) * g);
  const double u = (double(bits >> 12) + 0.5) / 4503599627370496.0;  // 2^52
  return -std::log(-std::log(u));
}

}  // namespace osprey::testing
