// The decode step's fused linear layers (ops::rms_norm_linear, ops::linear_add_,
// ops::silu_linear_add_) on every device, for dense f32 / f16 / bf16 and MLX-quantized (4 and
// 8 bits, and 3 bits, which no fused kernel takes) weights, at row counts below, at and past
// the GEMV's 8: against double-precision references that read the stored weights back
// themselves, and, on CUDA, against the unfused ops they replace (bit for bit where the fused
// kernel promises it). The CUDA instances skip without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "core/half.h"
#include "model/quantize.h"
#include "support/numeric.h"

namespace osprey {
namespace {

using testing::random_floats;
using testing::rel_error;

constexpr int64_t kIn = 256, kOut = 100;  // kOut: not a multiple of any GEMV block's rows
const int64_t kRowCounts[] = {1, 3, 8, 9};

struct Weight {
  std::string name;
  LinearWeight w;           // on the device
  std::vector<double> ref;  // [out, in]: the stored weights, read back by the test
};

double half_value(uint16_t h, DType dt) { return dt == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h); }

// Code i of a packed row, bit by bit (stream bit t is bit t % 32 of word t / 32).
uint32_t read_code(const uint32_t* words, int64_t i, int bits) {
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t t = i * bits + b;
    q |= ((words[t / 32] >> (t % 32)) & 1u) << b;
  }
  return q;
}

class FusedLinear : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
      device_ = Device::cuda(0);
    }
  }

  Array on_device(const std::vector<float>& v, Shape shape) const {
    Array a = Array::empty(shape, DType::f32);
    std::copy(v.begin(), v.end(), a.data<float>());
    return ops::to_device(a, device_);
  }
  static std::vector<float> host(const Array& a) {
    Array h = ops::to_device(a, Device::cpu());
    return {h.data<float>(), h.data<float>() + h.numel()};
  }

  Weight dense(DType dt, int64_t out, int64_t in, std::mt19937& rng) const {
    const std::vector<float> v = random_floats(size_t(out * in), rng, -0.1f, 0.1f);
    Array h = Array::empty({out, in}, dt);
    Weight w;
    w.name = dtype_name(dt);
    w.ref.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::f32) {
        h.data<float>()[i] = v[i];
        w.ref[i] = v[i];
      } else {
        const uint16_t b = dt == DType::f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
        h.data<uint16_t>()[i] = b;
        w.ref[i] = half_value(b, dt);
      }
    }
    w.w.dense = ops::to_device(h, device_);
    return w;
  }

  Weight quantized(int bits, DType scale_dt, int64_t out, int64_t in, std::mt19937& rng) const {
    const std::vector<float> v = random_floats(size_t(out * in), rng, -0.1f, 0.1f);
    Array h = Array::empty({out, in}, DType::f32);
    std::copy(v.begin(), v.end(), h.data<float>());
    const QuantizedMatrix q = quantize_affine(h, bits, 64, scale_dt);
    Weight w;
    w.name = "q" + std::to_string(bits) + "-" + dtype_name(scale_dt);
    const int64_t words = in * bits / 32, groups = in / 64;
    w.ref.resize(size_t(out * in));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t i = 0; i < in; ++i) {
        const double s = half_value(q.scales.data<uint16_t>()[r * groups + i / 64], scale_dt);
        const double b = half_value(q.biases.data<uint16_t>()[r * groups + i / 64], scale_dt);
        w.ref[size_t(r * in + i)] = s * read_code(q.packed.data<uint32_t>() + r * words, i, bits) + b;
      }
    w.w.quant.packed = ops::to_device(q.packed, device_);
    w.w.quant.scales = ops::to_device(q.scales, device_);
    w.w.quant.biases = ops::to_device(q.biases, device_);
    w.w.quant.bits = bits;
    w.w.quant.group_size = 64;
    return w;
  }

  std::vector<Weight> weights(int64_t out, int64_t in, std::mt19937& rng) const {
    std::vector<Weight> ws;
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) ws.push_back(dense(dt, out, in, rng));
    ws.push_back(quantized(4, DType::f16, out, in, rng));
    ws.push_back(quantized(4, DType::bf16, out, in, rng));
    ws.push_back(quantized(8, DType::f16, out, in, rng));
    ws.push_back(quantized(3, DType::f16, out, in, rng));  // no fused kernel: the composition
    return ws;
  }

  // y[j, r] = sum_k xs[j, k] w[r, k] + bias[r], in double.
  static std::vector<double> matmul(const std::vector<double>& xs, int64_t n, const Weight& w, int64_t out,
                                    int64_t in, const std::vector<float>& bias) {
    std::vector<double> y(size_t(n * out));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t r = 0; r < out; ++r) {
        double acc = bias[size_t(r)];
        for (int64_t k = 0; k < in; ++k) acc += xs[size_t(j * in + k)] * w.ref[size_t(r * in + k)];
        y[size_t(j * out + r)] = acc;
      }
    return y;
  }

  // The relative error allowed for n rows of w: f32 products, except where x is rounded: past
  // 8 rows CUDA's linear rounds it to the weight's 16-bit type for cuBLAS (bf16: 8 bits of
  // mantissa), and the CPU's 4-bit matvec takes it as int8 with a scale per 32 values.
  double tolerance(int64_t n, const Weight& w) const {
    if (device_.is_cpu()) return w.w.quantized() && w.w.quant.bits == 4 ? 2e-3 : 2e-5;
    return n <= 8 ? 2e-5 : 5e-3;
  }

  Device device_ = Device::cpu();
};

TEST_P(FusedLinear, RmsNormLinearMatchesReference) {
  std::mt19937 rng(7);
  const std::vector<float> nw = random_floats(kIn, rng, 0.5f, 1.5f), bias = random_floats(kOut, rng);
  for (const Weight& w : weights(kOut, kIn, rng))
    for (int64_t n : kRowCounts)
      for (bool unit_offset : {false, true}) {
        const std::vector<float> x = random_floats(size_t(n * kIn), rng, -2.0f, 2.0f);
        const float eps = 1e-5f;
        std::vector<double> xs(x.size());
        for (int64_t j = 0; j < n; ++j) {
          double ss = 0.0;
          for (int64_t k = 0; k < kIn; ++k) ss += double(x[size_t(j * kIn + k)]) * x[size_t(j * kIn + k)];
          const double inv = 1.0 / std::sqrt(ss / kIn + eps);
          for (int64_t k = 0; k < kIn; ++k)
            xs[size_t(j * kIn + k)] = x[size_t(j * kIn + k)] * inv * (nw[size_t(k)] + (unit_offset ? 1.0 : 0.0));
        }
        const std::vector<double> ref = matmul(xs, n, w, kOut, kIn, bias);
        const Array got = ops::rms_norm_linear(on_device(x, {n, kIn}), on_device(nw, {kIn}), eps, unit_offset, w.w,
                                               on_device(bias, {kOut}));
        ASSERT_EQ(got.shape(), (Shape{n, kOut}));
        EXPECT_LT(rel_error(host(got), ref), tolerance(n, w)) << w.name << " n=" << n << " unit_offset=" << unit_offset;
      }
}

TEST_P(FusedLinear, LinearAddMatchesReferenceAndTheUnfusedOps) {
  std::mt19937 rng(8);
  const std::vector<float> bias = random_floats(kOut, rng);
  for (const Weight& w : weights(kOut, kIn, rng))
    for (int64_t n : kRowCounts) {
      const std::vector<float> a = random_floats(size_t(n * kIn), rng), x0 = random_floats(size_t(n * kOut), rng);
      std::vector<double> as(a.begin(), a.end());
      std::vector<double> ref = matmul(as, n, w, kOut, kIn, bias);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += x0[i];
      Array x = on_device(x0, {n, kOut});
      const Array ad = on_device(a, {n, kIn}), bd = on_device(bias, {kOut});
      ops::linear_add_(x, ad, w.w, bd);
      const std::vector<float> got = host(x);
      EXPECT_LT(rel_error(got, ref), tolerance(n, w)) << w.name << " n=" << n;
      Array unfused = on_device(x0, {n, kOut});
      ops::add_(unfused, ops::linear(ad, w.w, bd));
      EXPECT_EQ(std::memcmp(got.data(), host(unfused).data(), got.size() * sizeof(float)), 0)
          << w.name << " n=" << n << ": differs from add_(x, linear(a))";
    }
}

TEST_P(FusedLinear, SiluLinearAddMatchesReferenceAndTheUnfusedOps) {
  std::mt19937 rng(9);
  const std::vector<float> bias = random_floats(kOut, rng);
  for (const Weight& w : weights(kOut, kIn, rng))
    for (int64_t n : kRowCounts) {
      const std::vector<float> gu = random_floats(size_t(n * 2 * kIn), rng, -3.0f, 3.0f);
      const std::vector<float> x0 = random_floats(size_t(n * kOut), rng);
      std::vector<double> h(size_t(n * kIn));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < kIn; ++k) {
          const double g = gu[size_t(j * 2 * kIn + k)], u = gu[size_t(j * 2 * kIn + kIn + k)];
          h[size_t(j * kIn + k)] = g / (1.0 + std::exp(-g)) * u;
        }
      std::vector<double> ref = matmul(h, n, w, kOut, kIn, bias);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += x0[i];
      Array x = on_device(x0, {n, kOut});
      const Array gud = on_device(gu, {n, 2 * kIn}), bd = on_device(bias, {kOut});
      ops::silu_linear_add_(x, gud, w.w, bd);
      const std::vector<float> got = host(x);
      EXPECT_LT(rel_error(got, ref), tolerance(n, w)) << w.name << " n=" << n;
      Array unfused = on_device(x0, {n, kOut});
      ops::add_(unfused, ops::linear(ops::silu_mul_split(gud), w.w, bd));
      EXPECT_EQ(std::memcmp(got.data(), host(unfused).data(), got.size() * sizeof(float)), 0)
          << w.name << " n=" << n << ": differs from add_(x, linear(silu_mul_split(gu)))";
    }
}

TEST_P(FusedLinear, RejectsMismatchedShapes) {
  std::mt19937 rng(10);
  const Weight w = dense(DType::f16, kOut, kIn, rng);
  const Array nw = on_device(random_floats(kIn, rng), {kIn});
  EXPECT_THROW(ops::rms_norm_linear(on_device(random_floats(kIn + 8, rng), {1, kIn + 8}),
                                    on_device(random_floats(kIn + 8, rng), {kIn + 8}), 1e-5f, false, w.w),
               InvalidInput);
  EXPECT_THROW(ops::rms_norm_linear(on_device(random_floats(kIn, rng), {1, kIn}),
                                    on_device(random_floats(kIn - 8, rng), {kIn - 8}), 1e-5f, false, w.w),
               InvalidInput);
  Array x = on_device(random_floats(kOut, rng), {1, kOut});
  EXPECT_THROW(ops::linear_add_(x, on_device(random_floats(2 * kIn, rng), {2, kIn}), w.w), InvalidInput);
  EXPECT_THROW(ops::silu_linear_add_(x, on_device(random_floats(kIn, rng), {1, kIn}), w.w), InvalidInput);
  EXPECT_THROW(ops::linear_add_(x, on_device(random_floats(kIn, rng), {1, kIn}), w.w,
                                on_device(random_floats(kOut - 1, rng), {kOut - 1})),
               InvalidInput);
}

INSTANTIATE_TEST_SUITE_P(Devices, FusedLinear, ::testing::Values(std::string("cpu"), std::string("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace osprey
