// ggml's reference quantizers as the GGUF writer runs them, decoded by formats/gguf_blocks.h
// (itself checked bit for bit against gguf-py's dequantization in gguf_blocks_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/gguf_blocks.h"
#include "formats/gguf_writer.h"

namespace osprey {
namespace {

std::vector<float> gaussian(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / double(a.size()));
}

std::vector<float> round_trip(GgufType t, const std::vector<float>& x) {
  const GgufBlock b = *gguf_block(uint32_t(t));
  std::vector<uint8_t> q(x.size() / size_t(b.elements) * size_t(b.bytes));
  if (t == GgufType::Q8_0) gguf_quantize_q8_0(x.data(), int64_t(x.size()), q.data());
  if (t == GgufType::Q4_0) gguf_quantize_q4_0(x.data(), int64_t(x.size()), q.data());
  if (t == GgufType::Q4_K) gguf_quantize_q4_k(x.data(), int64_t(x.size()), q.data());
  std::vector<float> y(x.size());
  gguf_dequantize(t, q.data(), int64_t(x.size()), y.data());
  return y;
}

}  // namespace

// Each value within half a step of its block's grid (Q8_0: d = max|x| / 127), plus the
// rounding of d to float16 (up to 2^-11 of d, times a code of up to 127).
TEST(GgufWriter, Q8_0ErrorIsWithinHalfAStep) {
  const auto x = gaussian(4096, 1);
  const auto y = round_trip(GgufType::Q8_0, x);
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    for (size_t j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[b + j] - y[b + j]), amax / 127 * 0.565f) << b + j;
  }
}

// Q4_K's per-32 scale and minimum, searched by make_qkx2_quants, fit better than Q4_0's one
// symmetric scale: its error is lower on the same data, and small against the values.
TEST(GgufWriter, Q4_KFitsBetterThanQ4_0) {
  const auto x = gaussian(256 * 64, 2);
  const double k = rmse(x, round_trip(GgufType::Q4_K, x)), o = rmse(x, round_trip(GgufType::Q4_0, x));
  EXPECT_LT(k, o);
  EXPECT_LT(k, 0.02 * 0.12);
  EXPECT_LT(o, 0.02 * 0.15);
}

// A block of one repeated value (max == min) and a block of zeros decode to themselves.
TEST(GgufWriter, Q4_KConstantAndZeroBlocks) {
  std::vector<float> x(512, 0.0f);
  for (size_t i = 256; i < 512; ++i) x[i] = -0.5f;
  const auto y = round_trip(GgufType::Q4_K, x);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.0f);
  for (size_t i = 256; i < 512; ++i) EXPECT_NEAR(y[i], -0.5f, 0.5f / 63);
}

TEST(GgufWriter, OutTypeNames) {
  EXPECT_EQ(parse_gguf_outtype("q4_k"), GgufOutType::q4_k);
  EXPECT_EQ(parse_gguf_outtype("bf16"), GgufOutType::bf16);
  EXPECT_FALSE(parse_gguf_outtype("Q4_K_M").has_value());
}

}  // namespace osprey
