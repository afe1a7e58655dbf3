// The FP8 linear on CUDA (backend/cuda/fp8_linear.h, via ops::linear and directly) against
// the CPU's linear over the same layer dequantized to bfloat16 by formats/hub_quant.h's
// dequantize_fp8 (checked against transformers by hub_quant_test), and against a double
// reference built here from the e4m3 definition and the checkpoint's scale layout. The CUDA
// tests skip without a device; the CPU's refusal runs in every build.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#ifdef OSPREY_WITH_CUDA
#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/runtime.h"
#endif
#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/hub_quant.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"
#include "support/numeric.h"
#include "support/test_util.h"

namespace osprey {
namespace {

enum class Layout { tensor, channel, block };
const char* layout_name(Layout l) { return l == Layout::tensor ? "tensor" : l == Layout::channel ? "channel" : "block"; }

constexpr int64_t kBlock = 128;

// A random FP8 layer written as a checkpoint ("l.weight" F8_E4M3 [out, in], "l.weight_scale"
// float32 in `layout`), its double weights from the format's definition, and its CPU reference.
struct Fp8Case {
  Layout layout;
  int64_t out, in;
  testing::TempDir dir;
  std::vector<uint8_t> codes;  // [out, in]
  std::vector<float> raw_scales;
  std::vector<double> w;       // [out, in] e4m3(code) * scale
  HubQuant hq;

  Fp8Case(Layout l, int64_t o, int64_t i, uint32_t seed) : layout(l), out(o), in(i) {
    std::mt19937 rng(seed);
    codes.resize(size_t(out * in));
    for (auto& c : codes) {
      do c = uint8_t(rng()); while ((c & 0x7f) == 0x7f);  // every code but the two NaNs
    }
    const int64_t brows = (out + kBlock - 1) / kBlock, bcols = (in + kBlock - 1) / kBlock;
    const int64_t n_scales = l == Layout::tensor ? 1 : l == Layout::channel ? out : brows * bcols;
    std::uniform_real_distribution<float> mag(1e-3f, 4e-3f);
    raw_scales.resize(size_t(n_scales));
    for (auto& s : raw_scales) s = mag(rng);
    w.resize(size_t(out * in));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t k = 0; k < in; ++k) {
        const float s = l == Layout::tensor    ? raw_scales[0]
                        : l == Layout::channel ? raw_scales[size_t(r)]
                                               : raw_scales[size_t((r / kBlock) * bcols + k / kBlock)];
        w[size_t(r * in + k)] = double(e4m3_to_float(codes[size_t(r * in + k)])) * double(s);
      }
    Array wa = Array::empty({out, in}, DType::u8);
    std::copy(codes.begin(), codes.end(), wa.data<uint8_t>());
    const Shape sshape = l == Layout::tensor ? Shape{1} : l == Layout::channel ? Shape{out, 1} : Shape{brows, bcols};
    Array sa = Array::empty(sshape, DType::f32);
    std::copy(raw_scales.begin(), raw_scales.end(), sa.data<float>());
    write_safetensors(dir.path() / "model.safetensors", {{"l.weight", wa}, {"l.weight_scale", sa}}, {}, {"l.weight"});
    hq.method = HubQuantMethod::fp8;
    hq.name = "compressed-tensors";
  }
  SafeTensors open() const { return SafeTensors::open_file(dir.path() / "model.safetensors"); }
  std::string label() const {
    return std::string(layout_name(layout)) + " [" + std::to_string(out) + ", " + std::to_string(in) + "]";
  }
};

TEST(CudaFp8, CpuRefusesFp8WeightsByName) {
  const Fp8Case c(Layout::channel, 16, 32, 9);
  LinearWeight lw = fp8_weight(load_fp8(c.open(), c.hq, "l", c.out, c.in).m);
  try {
    ops::linear(Array::zeros({1, 32}, DType::f32), lw);
    FAIL() << "the CPU ran an FP8 linear";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("FP8"), std::string::npos) << e.what();
  }
}

// Blocks that do not divide the inputs: groups of gcd(in, 128) inputs, each taking its
// block's scale (checked here against the raw scales, element by element).
TEST(CudaFp8, BlockScalesNotDividingTheInputsBecomeSmallerGroups) {
  for (int64_t in : {200, 160, 64}) {
    const Fp8Case c(Layout::block, 130, in, 8);
    const LoadedFp8 f = load_fp8(c.open(), c.hq, "l", c.out, c.in);
    const int64_t groups = f.m.scales.dim(1);
    ASSERT_EQ(groups, in == 200 ? 25 : in == 160 ? 5 : 1) << in;
    const int64_t bcols = (in + kBlock - 1) / kBlock;
    for (int64_t r = 0; r < c.out; ++r)
      for (int64_t k = 0; k < in; ++k)
        ASSERT_EQ(f.m.scales.data<float>()[r * groups + k / (in / groups)],
                  c.raw_scales[size_t((r / kBlock) * bcols + k / kBlock)])
            << "in " << in << " [" << r << ", " << k << "]";
  }
}

#ifdef OSPREY_WITH_CUDA

template <typename X>
std::vector<double> linear_ref(const std::vector<double>& w, const std::vector<X>& x, const std::vector<float>& bias,
                               int64_t n, int64_t out, int64_t in) {
  std::vector<double> y(size_t(n * out));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < out; ++r) {
      double sum = bias[size_t(r)];
      for (int64_t k = 0; k < in; ++k) sum += w[size_t(r * in + k)] * x[size_t(j * in + k)];
      y[size_t(j * out + r)] = sum;
    }
  return y;
}

// x [n, in] as the W8A8 path sees it, from the e4m3 definition (formats/hub_quant.h's
// float_to_e4m3: nearest, ties to even, saturating): per row, amax = max |x|, codes
// e4m3(x * (448 / amax)) with the product in f32, values code * amax / 448 (a zero row: codes of x).
std::vector<double> w8a8_rows(const std::vector<float>& x, int64_t n, int64_t in) {
  std::vector<double> q(x.size());
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.0f;
    for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(x[size_t(j * in + k)]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = amax > 0.0f ? 448.0f / amax : 1.0f;
    for (int64_t k = 0; k < in; ++k)
      q[size_t(j * in + k)] = double(e4m3_to_float(float_to_e4m3(double(x[size_t(j * in + k)] * inv)))) * scale;
  }
  return q;
}

Array host_array(const std::vector<float>& v, Shape shape) {
  Array a = Array::empty(shape, DType::f32);
  std::copy(v.begin(), v.end(), a.data<float>());
  return a;
}

std::vector<float> to_host(const Array& a) {
  const Array c = ops::to_device(a, Device::cpu());
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// Runs every path on rows 1..8, 33 and 512 of x for one case (33: the GEMV's chunks of 8
// with a remainder of one, and past kFp8GemvMaxRows).
void check_case(const Fp8Case& c) {
  const SafeTensors st = c.open();
  const LoadedFp8 loaded = load_fp8(st, c.hq, "l", c.out, c.in);
  LinearWeight lw = fp8_weight(Fp8Matrix{ops::to_device(loaded.m.codes, Device::cuda()),
                                         ops::to_device(loaded.m.scales, Device::cuda())});
  const Array dense = dequantize_fp8(st, c.hq, "l", c.out, c.in, DType::bf16).w;  // the CPU's bf16 weights
  std::mt19937 rng(7);
  const int64_t max_n = 512;
  const std::vector<float> x = testing::random_floats(size_t(max_n * c.in), rng);
  const std::vector<float> bias = testing::random_floats(size_t(c.out), rng);
  const Array bias_cpu = host_array(bias, {c.out}), bias_gpu = ops::to_device(bias_cpu, Device::cuda());
  const bool gemv = c.in % 16 == 0 && (c.in / loaded.m.scales.dim(1)) % 16 == 0;
  Fp8Args a;
  a.codes = lw.payload<Fp8Matrix>()->codes.data<uint8_t>();
  a.scales = lw.payload<Fp8Matrix>()->scales.data<float>();
  a.out = c.out;
  a.in = c.in;
  a.n_groups = lw.payload<Fp8Matrix>()->scales.dim(1);
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 33, 512}) {
    SCOPED_TRACE(c.label() + ", n = " + std::to_string(n));
    const std::vector<float> xn(x.begin(), x.begin() + n * c.in);
    const Array x_cpu = host_array(xn, {n, c.in}), x_gpu = ops::to_device(x_cpu, Device::cuda());
    const std::vector<double> exact = linear_ref(c.w, xn, bias, n, c.out, c.in);
    const std::vector<float> cpu_bf16 = to_host(ops::linear(x_cpu, dense, bias_cpu));
    // The CPU's bf16 weights are the exact ones rounded to 2^-9: a sanity bound on the reference.
    ASSERT_LT(testing::rel_error(cpu_bf16, exact), 4e-3);
    const bool mma = cuda::linear_fp8_mma_takes(x_gpu.data<float>(), a);
    const std::vector<double> w8a8 = linear_ref(c.w, w8a8_rows(xn, n, c.in), bias, n, c.out, c.in);
    // e4m3 activations (3 mantissa bits) against exact ones: a sanity bound on that reference.
    ASSERT_LT(testing::rel_error(std::vector<float>(w8a8.begin(), w8a8.end()), exact), 5e-2);
    const std::vector<float> got = to_host(ops::linear(x_gpu, lw, bias_gpu));
    if (mma && n > cuda::kFp8GemvMaxRowsBesideMma) {
      EXPECT_LT(testing::rel_error(got, w8a8), 1e-3) << "ops::linear (W8A8 on the tensor cores)";
    } else {
      EXPECT_LT(testing::rel_error(got, exact), n <= cuda::kFp8GemvMaxRows && gemv ? 1e-5 : 8e-3) << "ops::linear";
      std::vector<double> cpu_ref(cpu_bf16.begin(), cpu_bf16.end());
      EXPECT_LT(testing::rel_error(got, cpu_ref), 1e-2) << "ops::linear against the CPU's bf16 linear";
    }
    if (mma) {
      for (bool in_cublas : {true, false}) {
        Array ym = Array::empty({n, c.out}, DType::f32, Device::cuda());
        cuda::linear_fp8_mma(x_gpu.data<float>(), n, a, bias_gpu.data<float>(), ym.data<float>(), cuda::stream(),
                             in_cublas);
        EXPECT_LT(testing::rel_error(to_host(ym), w8a8), 1e-3)
            << "linear_fp8_mma, scales applied " << (in_cublas ? "by cuBLASLt" : "after the product");
      }
    } else {
      Array ym = Array::empty({n, c.out}, DType::f32, Device::cuda());
      EXPECT_THROW(cuda::linear_fp8_mma(x_gpu.data<float>(), n, a, nullptr, ym.data<float>(), cuda::stream()),
                   Unsupported);
    }
    Array y = Array::empty({n, c.out}, DType::f32, Device::cuda());
    cuda::linear_fp8_gemm(x_gpu.data<float>(), n, a, bias_gpu.data<float>(), y.data<float>(), cuda::stream());
    EXPECT_LT(testing::rel_error(to_host(y), exact), 8e-3) << "linear_fp8_gemm (x and w rounded to bf16)";
    if (gemv) {
      Array yg = Array::empty({n, c.out}, DType::f32, Device::cuda());
      cuda::linear_fp8_gemv(x_gpu.data<float>(), n, a, bias_gpu.data<float>(), yg.data<float>(), cuda::stream());
      EXPECT_LT(testing::rel_error(to_host(yg), exact), 1e-5) << "linear_fp8_gemv (exact products, f32 sums)";
    } else {
      Array yg = Array::empty({n, c.out}, DType::f32, Device::cuda());
      EXPECT_THROW(cuda::linear_fp8_gemv(x_gpu.data<float>(), n, a, nullptr, yg.data<float>(), cuda::stream()),
                   Unsupported);
    }
  }
}

#define OSPREY_SKIP_WITHOUT_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(CudaFp8, PerTensorScaleMatchesTheDequantizedLinear) {
  OSPREY_SKIP_WITHOUT_CUDA();
  check_case(Fp8Case(Layout::tensor, 300, 384, 1));
}

TEST(CudaFp8, PerRowScalesMatchTheDequantizedLinear) {
  OSPREY_SKIP_WITHOUT_CUDA();
  check_case(Fp8Case(Layout::channel, 300, 384, 2));
  check_case(Fp8Case(Layout::channel, 77, 2048, 3));  // several 512-input passes of a warp
}

TEST(CudaFp8, BlockScalesMatchTheDequantizedLinear) {
  OSPREY_SKIP_WITHOUT_CUDA();
  check_case(Fp8Case(Layout::block, 300, 384, 4));  // a partial block of rows
  check_case(Fp8Case(Layout::block, 129, 1024, 5));
  check_case(Fp8Case(Layout::block, 130, 160, 10));  // groups of 32 inputs (gcd with 128)
  check_case(Fp8Case(Layout::block, 130, 200, 11));  // groups of 8: the cuBLAS path
}

TEST(CudaFp8, W8A8TakesRowScalesOnlyAndZeroRowsStayZero) {
  OSPREY_SKIP_WITHOUT_CUDA();
  const Fp8Case c(Layout::channel, 64, 256, 12);
  const LoadedFp8 loaded = load_fp8(c.open(), c.hq, "l", c.out, c.in);
  const Array codes = ops::to_device(loaded.m.codes, Device::cuda()), scales = ops::to_device(loaded.m.scales, Device::cuda());
  Fp8Args a;
  a.codes = codes.data<uint8_t>();
  a.scales = scales.data<float>();
  a.out = c.out;
  a.in = c.in;
  a.n_groups = 1;
  // Rows of zeros beside a row of large values: each row has its own scale.
  std::vector<float> x(size_t(3 * c.in), 0.0f);
  std::mt19937 rng(3);
  const std::vector<float> r = testing::random_floats(size_t(c.in), rng);
  for (int64_t k = 0; k < c.in; ++k) x[size_t(c.in + k)] = 1000.0f * r[size_t(k)];
  const Array xg = ops::to_device(host_array(x, {3, c.in}), Device::cuda());
  ASSERT_TRUE(cuda::linear_fp8_mma_takes(xg.data<float>(), a));
  Array y = Array::empty({3, c.out}, DType::f32, Device::cuda());
  cuda::linear_fp8_mma(xg.data<float>(), 3, a, nullptr, y.data<float>(), cuda::stream());
  const std::vector<float> got = to_host(y);
  for (int64_t o = 0; o < c.out; ++o) {
    EXPECT_EQ(got[size_t(o)], 0.0f) << o;
    EXPECT_EQ(got[size_t(2 * c.out + o)], 0.0f) << o;
  }
  const std::vector<double> want = linear_ref(c.w, w8a8_rows(x, 3, c.in), std::vector<float>(size_t(c.out), 0.0f), 3,
                                              c.out, c.in);
  EXPECT_LT(testing::rel_error(got, want), 1e-3);
  a.n_groups = 2;  // block scales: not this path's
  EXPECT_FALSE(cuda::linear_fp8_mma_takes(xg.data<float>(), a));
  EXPECT_THROW(cuda::linear_fp8_mma(xg.data<float>(), 3, a, nullptr, y.data<float>(), cuda::stream()), Unsupported);
}

// A weights-only FP8 layer (the checkpoint declares no FP8 activations: Fp8Matrix::
// fp8_activations false) keeps x 16-bit at every row count: 512 rows, which take the W8A8
// tensor-core path when FP8 activations are declared, match the unquantized-activation
// reference and not the per-token e4m3 one.
TEST(CudaFp8, WeightsOnlyLayersKeepActivationsUnquantized) {
  OSPREY_SKIP_WITHOUT_CUDA();
  const Fp8Case c(Layout::channel, 300, 384, 13);
  const LoadedFp8 loaded = load_fp8(c.open(), c.hq, "l", c.out, c.in);
  LinearWeight lw = fp8_weight(Fp8Matrix{ops::to_device(loaded.m.codes, Device::cuda()),
                                         ops::to_device(loaded.m.scales, Device::cuda())});
  std::mt19937 rng(9);
  const int64_t n = 512;
  const std::vector<float> x = testing::random_floats(size_t(n * c.in), rng);
  const std::vector<float> zero(size_t(c.out), 0.0f);
  const Array xg = ops::to_device(host_array(x, {n, c.in}), Device::cuda());
  const std::vector<double> exact = linear_ref(c.w, x, zero, n, c.out, c.in);
  const std::vector<double> w8a8 = linear_ref(c.w, w8a8_rows(x, n, c.in), zero, n, c.out, c.in);
  ASSERT_GT(testing::rel_error(std::vector<float>(w8a8.begin(), w8a8.end()), exact), 1e-2)
      << "the two references must be told apart";
  lw.payload<Fp8Matrix>()->fp8_activations = false;
  const std::vector<float> weights_only = to_host(ops::linear(xg, lw));
  EXPECT_LT(testing::rel_error(weights_only, exact), 8e-3) << "x and w rounded to bf16 at most";
  lw.payload<Fp8Matrix>()->fp8_activations = true;
  const std::vector<float> declared = to_host(ops::linear(xg, lw));
  if (ops::fp8_tensor_cores(Device::cuda())) EXPECT_LT(testing::rel_error(declared, w8a8), 1e-3);
}

TEST(CudaFp8, InputsNotAMultipleOf16TakeTheGemmPath) {
  OSPREY_SKIP_WITHOUT_CUDA();
  check_case(Fp8Case(Layout::channel, 65, 200, 6));
  check_case(Fp8Case(Layout::tensor, 33, 24, 7));
}

#endif  // OSPREY_WITH_CUDA

}  // namespace
}  // namespace osprey
