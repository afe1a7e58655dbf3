// The CPU affine quantizer (formats/quantize.h) against an independent torch implementation of
// MLX's algorithm (tools/mlx_quant_reference.py -> tests/fixtures/quant/quantizer.safetensors),
// and the dequantized round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "backend/quant.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/quantize.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

const SafeTensors& fixture() {
  static const SafeTensors st =
      SafeTensors::open_file(testing::source_dir() / "tests/fixtures/quant/quantizer.safetensors");
  return st;
}

const char* short_name(DType dt) { return dt == DType::f16 ? "f16" : "bf16"; }

float storage_to_f32(uint16_t h, DType dt) { return dt == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h); }

// The code of input c of row r, read with the test's own arithmetic from the bit stream.
uint32_t code_at(const Array& packed, int bits, int64_t r, int64_t c) {
  const auto* row = packed.data<uint32_t>() + r * packed.dim(1);
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = c * bits + b;
    q |= ((row[bit / 32] >> (bit % 32)) & 1u) << b;
  }
  return q;
}

// Packed words equal bit for bit (so every code is), scales and biases equal up to one unit
// in the last place of the storage dtype: both implementations run the same float32
// operations in the same order and are expected to agree exactly (the count of differing
// values is reported), but the tolerance leaves room for a compiler that reorders or fuses
// float32 arithmetic. The 16-bit patterns are compared as integers of one sign.
void expect_matches(const QuantizedMatrix& q, const std::string& key) {
  const Array packed = fixture().get(key + ".packed");
  const Array scales = fixture().get(key + ".scales");
  const Array biases = fixture().get(key + ".biases");
  ASSERT_EQ(q.packed.shape(), packed.shape()) << key;
  ASSERT_EQ(q.scales.shape(), scales.shape()) << key;
  ASSERT_EQ(q.scales.dtype(), scales.dtype()) << key;
  int64_t code_mismatches = 0;
  for (int64_t r = 0; r < packed.dim(0); ++r)
    for (int64_t c = 0; c < q.in_features(); ++c)
      if (code_at(q.packed, q.bits, r, c) != code_at(packed, q.bits, r, c)) {
        if (code_mismatches++ < 5)
          ADD_FAILURE() << key << ": code of row " << r << ", input " << c << " is " << code_at(q.packed, q.bits, r, c)
                        << ", reference " << code_at(packed, q.bits, r, c);
      }
  EXPECT_EQ(code_mismatches, 0) << key;
  for (int64_t i = 0; i < packed.numel(); ++i)
    ASSERT_EQ(q.packed.data<uint32_t>()[i], packed.data<uint32_t>()[i]) << key << ": packed word " << i;
  int64_t inexact = 0;
  for (const auto& [ours, ref, what] : {std::tuple{q.scales, scales, "scale"}, std::tuple{q.biases, biases, "bias"}})
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const uint16_t a = ours.data<uint16_t>()[i], b = ref.data<uint16_t>()[i];
      if (a == b) continue;
      ++inexact;
      const bool same_sign = (a & 0x8000u) == (b & 0x8000u);
      EXPECT_TRUE(same_sign && std::abs(int(a & 0x7fffu) - int(b & 0x7fffu)) <= 1)
          << key << ": " << what << " " << i << " is " << storage_to_f32(a, ours.dtype()) << ", reference "
          << storage_to_f32(b, ref.dtype());
    }
  if (inexact) std::printf("%s: %lld scales or biases one ulp apart\n", key.c_str(), (long long)inexact);
}

}  // namespace

TEST(Quantize, MatchesTheReferenceForEveryBitWidthGroupSizeAndScaleDtype) {
  const Array x = fixture().get("x");
  ASSERT_EQ(x.dtype(), DType::f32);
  for (int bits : {2, 3, 4, 6, 8})
    for (int group : {32, 64, 128})
      for (DType sdt : {DType::f16, DType::bf16}) {
        char key[32];
        std::snprintf(key, sizeof key, "b%d_g%d_%s", bits, group, short_name(sdt));
        const QuantizedMatrix q = quantize_affine(x, bits, group, sdt);
        EXPECT_EQ(q.bits, bits);
        EXPECT_EQ(q.group_size, group);
        EXPECT_EQ(q.in_features(), x.dim(1));
        expect_matches(q, key);
      }
}

TEST(Quantize, UpcastsFloat16AndBfloat16Inputs) {
  const Array xb = fixture().get("x_bf16");
  ASSERT_EQ(xb.dtype(), DType::bf16);
  expect_matches(quantize_affine(xb, 4, 64, DType::bf16), "x_bf16.b4_g64_bf16");
  const Array xh = fixture().get("x_f16");
  ASSERT_EQ(xh.dtype(), DType::f16);
  expect_matches(quantize_affine(xh, 8, 32, DType::f16), "x_f16.b8_g32_f16");
}

TEST(Quantize, DequantizedRoundTripErrorIsBoundedByHalfAStep) {
  // With the stored scale s and bias b, a group's codes span [b, b + n_bins * s]. A value
  // inside that span (or within half a step of it) is at most half a step from its code's
  // value. MLX's rounding of q0 makes the edge exact at the cost of the other end: that end
  // may fall short of the group's other extreme by under a step, and values past it take
  // the end code, as may values that rounding the scale to 16 bits moved out of the span.
  // The engine's dequantize kernel must reproduce the test's own decode.
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t out = 37, in = 256;
  Array w = Array::empty({out, in}, DType::f32);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = dist(rng) * (1.0f + float(i / in));
  for (int bits : {2, 3, 4, 6, 8})
    for (int group : {32, 64, 128})
      for (DType sdt : {DType::f16, DType::bf16}) {
        const QuantizedMatrix q = quantize_affine(w, bits, group, sdt);
        const Array d = ops::dequantize(q, DType::f32);
        const double n_bins = double((1 << bits) - 1);
        const double u = sdt == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);  // unit roundoff
        double worst_inside = 0;
        int64_t n_outside = 0;
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c) {
            const std::string where = "bits " + std::to_string(bits) + ", group " + std::to_string(group) + ", " +
                                      dtype_name(sdt) + ", row " + std::to_string(r) + ", input " + std::to_string(c);
            const int64_t g = r * (in / group) + c / group;
            const double s = storage_to_f32(q.scales.data<uint16_t>()[g], sdt);
            const double b = storage_to_f32(q.biases.data<uint16_t>()[g], sdt);
            const double decoded = s * double(code_at(q.packed, bits, r, c)) + b;
            const double kernel = d.data<float>()[r * in + c];
            ASSERT_NEAR(kernel, decoded, 1e-6 * (std::fabs(decoded) + std::fabs(b))) << where;
            const double x = w.data<float>()[r * in + c];
            const double lo = std::min(b, b + n_bins * s), hi = std::max(b, b + n_bins * s);
            const double step = std::fabs(s), slack = 1e-6 * (std::fabs(x) + std::fabs(b) + hi - lo);
            const double err = std::fabs(decoded - x);
            if (x >= lo - step / 2 && x <= hi + step / 2) {
              ASSERT_LE(err, step / 2 + slack) << where;
              worst_inside = std::max(worst_inside, err / step);
            } else {
              ++n_outside;
              ASSERT_NEAR(decoded, x < lo ? lo : hi, slack) << where << ": a value past the codes takes the end code";
              // Under a step of shortfall from q0, plus what storage rounding moved the far end.
              ASSERT_LT(err, step * (1 + n_bins * u) + u * std::fabs(b) + slack) << where;
            }
          }
        EXPECT_GT(worst_inside, 0.3) << "the round trip is suspiciously exact";
        EXPECT_LT(n_outside, out * in / 20) << "values past the codes' span should be rare";
      }
}

TEST(Quantize, RejectsUnsupportedArguments) {
  Array w = Array::zeros({4, 64}, DType::f32);
  EXPECT_THROW(quantize_affine(w, 5, 64, DType::f16), InvalidInput);
  EXPECT_THROW(quantize_affine(w, 4, 48, DType::f16), InvalidInput);
  EXPECT_THROW(quantize_affine(w, 4, 128, DType::f16), InvalidInput);  // 128 does not divide 64
  EXPECT_THROW(quantize_affine(w, 4, 64, DType::f32), InvalidInput);
  EXPECT_THROW(quantize_affine(Array::zeros({4, 64}, DType::i32), 4, 64, DType::f16), InvalidInput);
  try {
    quantize_affine(Array::zeros({4, 96}, DType::f32), 4, 64, DType::f16);
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide"), std::string::npos) << e.what();
  }
}

}  // namespace osprey
