// The ops that the Gemma 3 and Cohere2 layers add (GeGLU of a fused gate/up row, per-head
// RMSNorm over strided rows, final-logit softcapping), through backend/ops.h on every device,
// against plain double-precision loops written from the definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "support/device_test.h"
#include "support/numeric.h"

namespace osprey {
namespace {

using testing::random_floats;
using testing::rel_error;

class FamilyOps : public testing::DeviceTest {};

double gelu_tanh_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

TEST_P(FamilyOps, GeluTanhMulSplitGatesTheUpHalf) {
  std::mt19937 rng(11);
  for (int64_t f : {1, 5, 160, 1027}) {
    const int64_t n = 3;
    // Gates past |x| = 5, where the tanh saturates, and up values past float16's range.
    std::vector<float> gu = random_floats(size_t(n * 2 * f), rng, -6.0f, 6.0f);
    for (int64_t i = 0; i < n; ++i) gu[size_t(i * 2 * f + f)] = 9.0e4f;
    Array out = ops::gelu_tanh_mul_split(on_device(gu, {n, 2 * f}));
    ASSERT_EQ(out.shape(), Shape({n, f}));
    std::vector<double> ref(size_t(n * f));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < f; ++j)
        ref[size_t(i * f + j)] = gelu_tanh_ref(gu[size_t(i * 2 * f + j)]) * gu[size_t(i * 2 * f + f + j)];
    EXPECT_LT(rel_error(host(out), ref), 1e-6) << "f=" << f;
  }
}

TEST_P(FamilyOps, GeluTanhMulSplitRefusesAnOddWidth) {
  EXPECT_THROW(ops::gelu_tanh_mul_split(on_device(std::vector<float>(6), {2, 3})), InvalidInput);
}

// The q and k heads of a fused q/k/v row [n, (nh + 2 nkv) hd], each normed with its weights.
TEST_P(FamilyOps, HeadRmsNormNormsEachHeadOfStridedRows) {
  std::mt19937 rng(12);
  for (int64_t hd : {16, 64, 256}) {
    for (bool unit_offset : {false, true}) {
      const int64_t n = 5, nh = 4, nkv = 2, row = (nh + 2 * nkv) * hd;
      std::vector<float> x = random_floats(size_t(n * row), rng, -3.0f, 3.0f);
      x[0] = 7.0e4f;  // past float16's range: the norm must not care
      const std::vector<float> wq = random_floats(size_t(hd), rng), wk = random_floats(size_t(hd), rng);
      Array xa = on_device(x, {n, row});
      Array q = Array::strided(xa.buffer(), xa.byte_offset(), {n, nh, hd}, {row, hd, 1}, DType::f32);
      Array k = Array::strided(xa.buffer(), xa.byte_offset() + size_t(nh * hd) * 4, {n, nkv, hd}, {row, hd, 1},
                               DType::f32);
      ops::head_rms_norm_(q, on_device(wq, {hd}), 1e-6f, unit_offset);
      ops::head_rms_norm_(k, on_device(wk, {hd}), 1e-6f, unit_offset);
      std::vector<double> ref(x.begin(), x.end());
      const double off = unit_offset ? 1.0 : 0.0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t hh = 0; hh < nh + nkv; ++hh) {
          const std::vector<float>& w = hh < nh ? wq : wk;
          const size_t base = size_t(i * row + hh * hd);
          double ss = 0;
          for (int64_t j = 0; j < hd; ++j) ss += double(x[base + size_t(j)]) * x[base + size_t(j)];
          const double inv = 1.0 / std::sqrt(ss / double(hd) + 1e-6);
          for (int64_t j = 0; j < hd; ++j) ref[base + size_t(j)] = x[base + size_t(j)] * inv * (w[size_t(j)] + off);
        }
      // The v heads are untouched.
      EXPECT_LT(rel_error(host(xa), ref), 1e-6) << "hd=" << hd << " unit_offset=" << unit_offset;
    }
  }
}

TEST_P(FamilyOps, HeadRmsNormOfOneRow) {
  std::mt19937 rng(13);
  const int64_t heads = 3, hd = 32;
  const std::vector<float> x = random_floats(size_t(heads * hd), rng), w = random_floats(size_t(hd), rng);
  Array xa = on_device(x, {1, heads, hd});
  ops::head_rms_norm_(xa, on_device(w, {hd}), 1e-5f, false);
  std::vector<double> ref(x.size());
  for (int64_t hh = 0; hh < heads; ++hh) {
    double ss = 0;
    for (int64_t j = 0; j < hd; ++j) ss += double(x[size_t(hh * hd + j)]) * x[size_t(hh * hd + j)];
    const double inv = 1.0 / std::sqrt(ss / double(hd) + 1e-5);
    for (int64_t j = 0; j < hd; ++j) ref[size_t(hh * hd + j)] = x[size_t(hh * hd + j)] * inv * w[size_t(j)];
  }
  EXPECT_LT(rel_error(host(xa), ref), 1e-6);
}

TEST_P(FamilyOps, HeadRmsNormChecksTheWeight) {
  Array x = on_device(std::vector<float>(2 * 3 * 8), {2, 3, 8});
  EXPECT_THROW(ops::head_rms_norm_(x, on_device(std::vector<float>(7), {7}), 1e-6f), InvalidInput);
}

TEST_P(FamilyOps, SoftcapBoundsLogits) {
  std::mt19937 rng(14);
  for (int64_t n : {1, 7, 4099}) {
    std::vector<float> x = random_floats(size_t(n), rng, -200.0f, 200.0f);
    Array xa = on_device(x, {n});
    ops::softcap_(xa, 30.0f);
    std::vector<double> ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) ref[i] = 30.0 * std::tanh(double(x[i]) / 30.0);
    const std::vector<float> got = host(xa);
    EXPECT_LT(rel_error(got, ref), 1e-6) << "n=" << n;
    for (float v : got) EXPECT_LE(std::fabs(v), 30.0f);
  }
}

TEST_P(FamilyOps, SoftcapRefusesANonPositiveCap) {
  Array x = on_device({1.0f, 2.0f}, {2});
  EXPECT_THROW(ops::softcap_(x, 0.0f), InvalidInput);
  EXPECT_THROW(ops::softcap_(x, -1.0f), InvalidInput);
  EXPECT_THROW(ops::softcap_(x, std::numeric_limits<float>::infinity()), InvalidInput);
}

INSTANTIATE_TEST_SUITE_P(Devices, FamilyOps, OSPREY_DEVICE_LEVELS);

}  // namespace
}  // namespace osprey
