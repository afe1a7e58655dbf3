#pragma once
// Counter-based noise for sampling: a pure function of (seed, counter, index), the same on the
// host and on the device, with no generator state to carry between steps. The device sampler
// draws with it (Gumbel-max); anything that must reproduce a device draw recomputes it here.
//
// Definition (all integer arithmetic modulo 2^64; G = 0x9e3779b97f4a7c15):
//   mix(z)                 z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
//                          z *= 0x94d049bb133111eb; return z ^ (z >> 31)   (the SplitMix64 finaliser)
//   stream(seed, counter)  = mix(seed ^ mix(counter + G))
//   bits(seed, counter, i) = mix(stream(seed, counter) + (i + 1) * G)
//                            (output i of a SplitMix64 generator whose state starts at stream())
//   u                      = (double(bits >> 12) + 0.5) * 2^-52   in [2^-53, 1 - 2^-53], exact
//   gumbel                 = -log(-log(u))                        in [-3.6038, 36.7369]
// `log` is the double-precision natural logarithm (correctly rounded to within 1 ulp on both
// sides, so host and device values agree to ~1e-16).
#include <math.h>

#include <cstdint>

#ifdef __CUDACC__
#define OSPREY_NOISE_FN __host__ __device__ inline
#else
#define OSPREY_NOISE_FN inline
#endif

namespace osprey {

constexpr uint64_t kNoiseGamma = 0x9e3779b97f4a7c15ull;
// Bounds of noise_gumbel() (its values lie strictly inside): a span below 40.35.
constexpr double kNoiseGumbelMin = -3.6038;
constexpr double kNoiseGumbelMax = 36.7369;

OSPREY_NOISE_FN uint64_t noise_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

OSPREY_NOISE_FN uint64_t noise_stream(uint64_t seed, uint64_t counter) {
  return noise_mix(seed ^ noise_mix(counter + kNoiseGamma));
}

OSPREY_NOISE_FN uint64_t noise_bits(uint64_t seed, uint64_t counter, uint64_t index) {
  return noise_mix(noise_stream(seed, counter) + (index + 1) * kNoiseGamma);
}

// Uniform on the grid (k + 0.5) * 2^-52, k in [0, 2^52): never 0 or 1.
OSPREY_NOISE_FN double noise_uniform(uint64_t seed, uint64_t counter, uint64_t index) {
  return (double(noise_bits(seed, counter, index) >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

// Standard Gumbel noise: argmax_i (logit_i / T + noise_gumbel(seed, counter, i)) is a draw
// from softmax(logit / T).
OSPREY_NOISE_FN double noise_gumbel(uint64_t seed, uint64_t counter, uint64_t index) {
  return -::log(-::log(noise_uniform(seed, counter, index)));
}

}  // namespace osprey

#undef OSPREY_NOISE_FN
