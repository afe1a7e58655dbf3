// The quantized CUDA kernels (backend/cuda/quant_kernels.h) against a host reference that
// reads every code bit by bit from the packed words and accumulates in double precision.
// Every output buffer is filled with NaN before the kernel runs, so an unwritten element fails.
#ifdef OSPREY_WITH_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_linear.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda_available.h"
#include "core/env.h"
#include "core/error.h"
#include "core/half.h"
#include "support/cuda_buffers.h"
#include "support/numeric.h"

namespace osprey {
namespace {


constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using testing::DeviceVec;
using testing::rel_error;
using testing::random_floats;
using testing::st;
using testing::sync;



// A random quantized [out, in] matrix on the host: uniformly random packed words (every bit
// pattern is a valid set of codes), scales of either sign, biases.
struct HostQuant {
  int bits = 4, group = 64;
  DType sdt = DType::f16;
  int64_t out = 0, in = 0;
  std::vector<uint32_t> packed;  // [out, in * bits / 32]
  std::vector<uint16_t> scales;  // [out, in / group]
  std::vector<uint16_t> biases;

  int64_t words_per_row() const { return in * bits / 32; }
  double param(const std::vector<uint16_t>& v, int64_t r, int64_t k) const {
    const uint16_t h = v[size_t(r * (in / group) + k / group)];
    return sdt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  // Code k of row r: bit b of the code is stream bit k * bits + b of the row's words.
  uint32_t code(int64_t r, int64_t k) const {
    uint32_t q = 0;
    for (int b = 0; b < bits; ++b) {
      const int64_t bit = k * bits + b;
      const uint32_t word = packed[size_t(r * words_per_row() + bit / 32)];
      q |= ((word >> (bit % 32)) & 1u) << b;
    }
    return q;
  }
  double weight(int64_t r, int64_t k) const { return param(scales, r, k) * code(r, k) + param(biases, r, k); }
  std::vector<double> weights() const {
    std::vector<double> w(size_t(out * in));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t k = 0; k < in; ++k) w[size_t(r * in + k)] = weight(r, k);
    return w;
  }
};

uint16_t to_bits(DType dt, float f) { return dt == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f); }

HostQuant make_quant(int bits, int group, DType sdt, int64_t out, int64_t in, std::mt19937& rng) {
  HostQuant q;
  q.bits = bits, q.group = group, q.sdt = sdt, q.out = out, q.in = in;
  q.packed.resize(size_t(out * q.words_per_row()));
  for (auto& w : q.packed) w = uint32_t(rng());
  const size_t n_groups = size_t(out * (in / group));
  std::uniform_real_distribution<float> mag(0.5f, 1.5f), bias(-0.1f, 0.1f);
  const float unit = 0.2f / float((1 << bits) - 1);
  q.scales.resize(n_groups);
  q.biases.resize(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    q.scales[g] = to_bits(sdt, (rng() & 1 ? -1.0f : 1.0f) * unit * mag(rng));
    q.biases[g] = to_bits(sdt, bias(rng));
  }
  return q;
}

// The matrix on the device; `word_pad` words in front of the packed words (1 makes them
// 4- but not 16-byte aligned).
struct DeviceQuant {
  DeviceQuant(const HostQuant& h, size_t word_pad = 0)
      : host(h), packed(h.packed, word_pad), scales(h.scales), biases(h.biases) {}
  QuantArgs args() const {
    QuantArgs a;
    a.packed = packed.get();
    a.scales = scales.get();
    a.biases = biases.get();
    a.scale_dtype = host.sdt;
    a.bits = host.bits;
    a.group_size = host.group;
    a.out = host.out;
    a.in = host.in;
    return a;
  }
  const HostQuant& host;
  DeviceVec<uint32_t> packed;
  DeviceVec<uint16_t> scales, biases;
};

// y[j, r] = bias[r] + sum_k w[r, k] x[j, k] in double, for the first n rows of x.
std::vector<double> linear_ref(const std::vector<double>& w, const std::vector<float>& x, const std::vector<float>* bias,
                               int64_t n, int64_t out, int64_t in) {
  std::vector<double> y(size_t(n * out));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < out; ++r) {
      double sum = bias ? (*bias)[size_t(r)] : 0.0;
      const double* wr = w.data() + r * in;
      const float* xj = x.data() + j * in;
      for (int64_t k = 0; k < in; ++k) sum += wr[k] * xj[k];
      y[size_t(j * out + r)] = sum;
    }
  return y;
}

// Runs fn (linear_q's signature) on the first n rows of x and returns the relative error
// against the reference.
template <class Fn>
double run_linear(Fn fn, const DeviceQuant& dw, const std::vector<double>& w, const std::vector<float>& x,
                  const std::vector<float>* bias, int64_t n, size_t x_pad = 0) {
  const int64_t out = dw.host.out, in = dw.host.in;
  DeviceVec<float> dx(std::vector<float>(x.begin(), x.begin() + n * in), x_pad);
  DeviceVec<float> dbias(bias ? *bias : std::vector<float>{});
  DeviceVec<float> dy(std::vector<float>(size_t(n * out), kNaN));
  fn(dx.get(), n, dw.args(), bias ? dbias.get() : nullptr, dy.get(), st());
  return rel_error(dy.download(), linear_ref(w, x, bias, n, out, in));
}

const int kBits[] = {2, 3, 4, 6, 8};
const int kGroups[] = {16, 32, 64, 128};  // 16 with 8-bit codes only (supported_quant_group)
const DType kScaleTypes[] = {DType::f16, DType::bf16};

// The GEMV accumulates exact products in f32; the GEMM path and the tensor-core kernel (4-bit,
// aligned, every n) round x and w to 16 bits.
double linear_tolerance(int64_t n, DType sdt, int bits = 0) {
  if (n <= cuda::kGemvMaxRows && bits != 4) return 1e-5;
  return sdt == DType::bf16 ? 2e-2 : 3e-3;
}

TEST(CudaQuant, LinearAllFormats) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(1);
  const int64_t in = 384;
  for (int bits : kBits)
    for (int group : kGroups)
      for (DType sdt : kScaleTypes)
        for (int64_t out : {37, 129}) {
          if (!supported_quant_group(bits, group)) continue;
          const HostQuant q = make_quant(bits, group, sdt, out, in, rng);
          const std::vector<double> w = q.weights();
          DeviceQuant dw(q);
          const auto x = random_floats(size_t(200 * in), rng);
          const auto bias = random_floats(size_t(out), rng);
          for (int64_t n : {1, 2, 3, 5, 8, 9, 33, 200})
            for (bool with_bias : {false, true})
              EXPECT_LT(run_linear(&cuda::linear_q, dw, w, x, with_bias ? &bias : nullptr, n),
                        linear_tolerance(n, sdt, bits))
                  << bits << "-bit g" << group << " " << dtype_name(sdt) << " n=" << n << " out=" << out
                  << " bias=" << with_bias;
        }
}

// Rows that span several iterations of a block (in > 128 chunks), every rows-per-block choice
// of the fast kernel, row counts that leave a partial last block, and fewer rows than a block.
TEST(CudaQuant, GemvLongRowsEveryBlockShape) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(2);
  struct Shape {
    int64_t out, in;  // 8256: 258 four-bit chunks of 32 a row, 516 eight-bit chunks of 16
  };
  for (const Shape sh : {Shape{333, 8256}, Shape{5, 256}})
    for (int bits : {4, 8, 3, 16})  // 16: 8-bit codes in groups of 16
      for (DType sdt : kScaleTypes) {
        const HostQuant q = bits == 16 ? make_quant(8, 16, sdt, sh.out, sh.in, rng)
                                       : make_quant(bits, 64, sdt, sh.out, sh.in, rng);
        const std::vector<double> w = q.weights();
        DeviceQuant dw(q);
        const auto x = random_floats(size_t(8 * sh.in), rng);
        const auto bias = random_floats(size_t(sh.out), rng);
        for (int rows : {0, 1, 4, 8})
          for (int64_t n : {1, 2, 3, 5, 8}) {
            if (bits == 3 && rows > 1) continue;  // the generic kernel has one block shape
            const double err = run_linear(
                [rows](const float* x, int64_t n, const QuantArgs& a, const float* b, float* y, cudaStream_t s) {
                  cuda::linear_q_gemv(x, n, a, b, y, s, rows);
                },
                dw, w, x, n % 2 ? &bias : nullptr, n);
            EXPECT_LT(err, 1e-5) << bits << "-bit " << dtype_name(sdt) << " out=" << sh.out
                                 << " rows/block=" << rows << " n=" << n;
          }
      }
}

// Packed words only 4-byte aligned and x only 4-byte aligned take the generic kernel.
TEST(CudaQuant, GemvMisalignedInputs) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(3);
  const int64_t out = 70, in = 512;
  for (int bits : kBits)
    for (int word_pad : {0, 1})
      for (int x_pad : {0, 1}) {
        if (word_pad == 0 && x_pad == 0) continue;
        const HostQuant q = make_quant(bits, 128, DType::bf16, out, in, rng);
        const std::vector<double> w = q.weights();
        DeviceQuant dw(q, size_t(word_pad));
        const auto x = random_floats(size_t(8 * in), rng);
        for (int64_t n : {1, 6})
          EXPECT_LT(run_linear(&cuda::linear_q, dw, w, x, nullptr, n, size_t(x_pad)), 1e-5)
              << bits << "-bit word_pad=" << word_pad << " x_pad=" << x_pad << " n=" << n;
      }
}

// The many-rows path in several scratch chunks: by rows (out >= in) and by input columns,
// accumulated into y (out < in).
TEST(CudaQuant, GemmInChunks) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(4);
  struct Shape {
    int64_t out, in;
  };
  for (const Shape sh : {Shape{8192, 4224}, Shape{1024, 40960}})
    for (DType sdt : kScaleTypes) {
      const HostQuant q = make_quant(4, 64, sdt, sh.out, sh.in, rng);
      const std::vector<double> w = q.weights();
      DeviceQuant dw(q);
      const auto x = random_floats(size_t(20 * sh.in), rng);
      const auto bias = random_floats(size_t(sh.out), rng);
      for (int64_t n : {9, 20})
        EXPECT_LT(run_linear(&cuda::linear_q_gemm, dw, w, x, n == 9 ? &bias : nullptr, n), linear_tolerance(n, sdt))
            << dtype_name(sdt) << " out=" << sh.out << " in=" << sh.in << " n=" << n;
    }
}

// The tensor-core kernel rounds each weight once to the scales' 16-bit type (s * q + b, one
// rounding) and x to the same type, and accumulates the exact products in f32: against that
// rounding done here in double it agrees to f32 accumulation error, and against the exact
// weights to the 16-bit rounding.
double round16(DType sdt, double v) {
  return sdt == DType::bf16 ? bf16_to_f32(f32_to_bf16(float(v))) : f16_to_f32(f32_to_f16(float(v)));
}

// Every block shape (x-row tiles 1, 2, 4; 4 or 8 warps) on odd row counts, inputs that end
// inside a 128-code block, each group size and both 16-bit types, 1 to 256 rows of x.
TEST(CudaQuant, MmaEveryShapeAgainstRoundedReference) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  struct Shape {
    int64_t out, in;
    int group;
  };
  for (const Shape sh : {Shape{37, 352, 32}, Shape{129, 384, 128}, Shape{16, 4224, 64}, Shape{1000, 4160, 64},
                         Shape{5, 256, 128}})
    for (DType sdt : kScaleTypes) {
      const HostQuant q = make_quant(4, sh.group, sdt, sh.out, sh.in, rng);
      const std::vector<double> w = q.weights();
      std::vector<double> w16(w.size());
      for (size_t i = 0; i < w.size(); ++i) w16[i] = round16(sdt, w[i]);
      DeviceQuant dw(q);
      const int64_t max_n = sh.out >= 1000 ? 64 : 256;
      const auto x = random_floats(size_t(max_n * sh.in), rng, -2.0f, 2.0f);
      std::vector<float> x16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16[i] = float(round16(sdt, x[i]));
      const auto bias = random_floats(size_t(sh.out), rng);
      for (int64_t n : {1, 2, 3, 7, 8, 9, 16, 17, 33, 64, 100, 256}) {
        if (n > max_n) continue;
        const std::vector<float>* b = n % 2 ? &bias : nullptr;
        const int64_t out = sh.out, in = sh.in;
        const std::vector<double> ref16 = linear_ref(w16, x16, b, n, out, in), ref = linear_ref(w, x, b, n, out, in);
        for (int tiles : {0, 1, 2, 4})
          for (int warps : {0, 4, 8}) {
            DeviceVec<float> dx(std::vector<float>(x.begin(), x.begin() + n * in));
            DeviceVec<float> dbias(bias);
            DeviceVec<float> dy(std::vector<float>(size_t(n * out), kNaN));
            cuda::linear_q_mma(dx.get(), n, dw.args(), b ? dbias.get() : nullptr, dy.get(), st(), tiles, warps);
            const std::vector<float> got = dy.download();
            const std::string what = std::string(dtype_name(sdt)) + " g" + std::to_string(sh.group) + " out=" +
                                     std::to_string(out) + " in=" + std::to_string(in) + " n=" + std::to_string(n) +
                                     " tiles=" + std::to_string(tiles) + " warps=" + std::to_string(warps);
            EXPECT_LT(rel_error(got, ref16), 1e-5) << what;
            EXPECT_LT(rel_error(got, ref), linear_tolerance(n, sdt, 4)) << what;
          }
      }
    }
}

// linear_q sends aligned 4-bit weights to the tensor-core kernel for kQuantMmaMinRows to
// linear_q_mma_max_rows rows (the GEMV below, dequantize + cuBLAS above) and refuses other
// formats there by name.
TEST(CudaQuant, MmaDispatchAndRefusals) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(8);
  const HostQuant q = make_quant(4, 64, DType::f16, 300, 512, rng);
  DeviceQuant dw(q);
  const auto x = random_floats(size_t(40 * 512), rng);
  DeviceVec<float> dx(x), y1(std::vector<float>(size_t(40 * 300), kNaN)), y2(std::vector<float>(size_t(40 * 300), kNaN));
  auto same = [&](int64_t n, auto&& path) {
    cuda::linear_q(dx.get(), n, dw.args(), nullptr, y1.get(), st());
    path(n);
    const auto a = y1.download(), b = y2.download();
    return std::memcmp(a.data(), b.data(), size_t(n * 300) * sizeof(float)) == 0;
  };
  auto mma = [&](int64_t n) { cuda::linear_q_mma(dx.get(), n, dw.args(), nullptr, y2.get(), st()); };
  auto gemv = [&](int64_t n) { cuda::linear_q_gemv(dx.get(), n, dw.args(), nullptr, y2.get(), st()); };
  auto gemm = [&](int64_t n) { cuda::linear_q_gemm(dx.get(), n, dw.args(), nullptr, y2.get(), st()); };
  const int64_t top = cuda::linear_q_mma_max_rows(dw.args());
  if (env_options().cuda_quant_mma) {
    EXPECT_EQ(16, top);  // the measured crossover (docs/design.md, "Quantized weights")
    for (int64_t n : {int64_t(1), cuda::kQuantMmaMinRows - 1}) EXPECT_TRUE(same(n, gemv)) << "n=" << n;
    for (int64_t n : {cuda::kQuantMmaMinRows, int64_t(9), top}) EXPECT_TRUE(same(n, mma)) << "n=" << n;
    EXPECT_TRUE(same(top + 1, gemm)) << "n=" << top + 1;
    EXPECT_TRUE(same(40, gemm));
  } else {
    EXPECT_EQ(0, top);  // OSPREY_CUDA_QUANT_MMA=0
    for (int64_t n : {1, 4, 8}) EXPECT_TRUE(same(n, gemv)) << "n=" << n;
    for (int64_t n : {9, 16}) EXPECT_TRUE(same(n, gemm)) << "n=" << n;
  }
  const HostQuant q8 = make_quant(8, 64, DType::f16, 16, 512, rng);
  DeviceQuant dw8(q8);
  EXPECT_FALSE(cuda::linear_q_mma_supported(dx.get(), dw8.args()));
  EXPECT_THROW(cuda::linear_q_mma(dx.get(), 1, dw8.args(), nullptr, y1.get(), st()), Unsupported);
  EXPECT_THROW(cuda::linear_q_mma(dx.get(), 1, dw.args(), nullptr, y1.get(), st(), 3), Unsupported);
  EXPECT_THROW(cuda::linear_q_mma(dx.get(), 1, dw.args(), nullptr, y1.get(), st(), 0, 5), Unsupported);
}

TEST(CudaQuant, EmbeddingGathersDequantizedRows) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  const int64_t vocab = 37, d = 384;
  const std::vector<int32_t> ids = {3, 0, 36, 3, 17, 8, 22, 1, 30};
  const int64_t n = int64_t(ids.size());
  for (int bits : kBits)
    for (int group : kGroups)
      for (DType sdt : kScaleTypes) {
        if (!supported_quant_group(bits, group)) continue;
        const HostQuant q = make_quant(bits, group, sdt, vocab, d, rng);
        DeviceQuant dw(q);
        DeviceVec<int32_t> dids(ids);
        DeviceVec<float> out(std::vector<float>(size_t(n * d), kNaN));
        cuda::embedding_q(dw.args(), dids.get(), n, 1.7f, out.get(), st());
        std::vector<double> ref(size_t(n * d));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < d; ++k) ref[size_t(i * d + k)] = q.weight(ids[size_t(i)], k) * 1.7;
        EXPECT_LT(rel_error(out.download(), ref), 1e-6) << bits << "-bit g" << group << " " << dtype_name(sdt);
      }
}

TEST(CudaQuant, DequantizeToEveryFloatType) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(6);
  const int64_t out = 37, in = 384;
  for (int bits : kBits)
    for (int group : kGroups)
      for (DType sdt : kScaleTypes) {
        if (!supported_quant_group(bits, group)) continue;
        const HostQuant q = make_quant(bits, group, sdt, out, in, rng);
        const std::vector<double> ref = q.weights();
        DeviceQuant dw(q);
        for (DType odt : {DType::f32, DType::f16, DType::bf16})
          for (size_t pad : {size_t(0), size_t(1)}) {  // pad 1: a misaligned destination
            std::vector<float> got(size_t(out * in));
            if (odt == DType::f32) {
              DeviceVec<float> d(std::vector<float>(got.size(), kNaN), pad);
              cuda::dequantize(dw.args(), odt, d.get(), st());
              got = d.download();
            } else {
              DeviceVec<uint16_t> d(std::vector<uint16_t>(got.size(), 0x7fff), pad);  // NaN in both types
              cuda::dequantize(dw.args(), odt, d.get(), st());
              const auto bits16 = d.download();
              for (size_t i = 0; i < got.size(); ++i)
                got[i] = odt == DType::f16 ? f16_to_f32(bits16[i]) : bf16_to_f32(bits16[i]);
            }
            const double tol = odt == DType::f32 ? 1e-6 : odt == DType::f16 ? 1e-3 : 8e-3;
            EXPECT_LT(rel_error(got, ref), tol) << bits << "-bit g" << group << " " << dtype_name(sdt) << " -> "
                                                << dtype_name(odt) << " pad=" << pad;
          }
      }
}

TEST(CudaQuant, RejectsUnsupportedFormats) {
  SKIP_WITHOUT_CUDA();
  QuantArgs a;
  a.out = 4, a.in = 64, a.bits = 5, a.group_size = 64;
  EXPECT_THROW(cuda::linear_q(nullptr, 1, a, nullptr, nullptr, st()), Unsupported);
  a.bits = 4, a.group_size = 16;
  EXPECT_THROW(cuda::dequantize(a, DType::f32, nullptr, st()), Unsupported);
  a.group_size = 64, a.scale_dtype = DType::f32;
  EXPECT_THROW(cuda::embedding_q(a, nullptr, 1, 1.0f, nullptr, st()), Unsupported);
}

// ---- Benchmarks (run with --gtest_also_run_disabled_tests) ----

struct BenchShape {
  const char* name;
  int64_t out, in;
  int per_token;  // matrices of this shape an 8B Llama-3 decode step multiplies (32 layers)
};
const BenchShape kLlama8B[] = {{"q/o 4096x4096", 4096, 4096, 64},
                               {"k/v 1024x4096", 1024, 4096, 64},
                               {"gate/up 14336x4096", 14336, 4096, 64},
                               {"down 4096x14336", 4096, 14336, 32},
                               {"head 128256x4096", 128256, 4096, 1}};

// A device buffer of random bytes (timing only).
struct DeviceBytes {
  explicit DeviceBytes(size_t n) {
    OSPREY_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16)));
    OSPREY_CUDA_CHECK(cudaMemset(p, 0x3a, n));
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(p); }
  void* p = nullptr;
};

// Median over `reps` timings of `iters` calls of fn(i), in microseconds per call.
template <class Fn>
double time_us(Fn fn, int iters, int reps = 7) {
  for (int i = 0; i < 3; ++i) fn(i);
  cudaEvent_t a, b;
  OSPREY_CUDA_CHECK(cudaEventCreate(&a));
  OSPREY_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    OSPREY_CUDA_CHECK(cudaEventRecord(a, st()));
    for (int i = 0; i < iters; ++i) fn(i);
    OSPREY_CUDA_CHECK(cudaEventRecord(b, st()));
    OSPREY_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    OSPREY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1000.0 * ms / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Like time_us, with the `iters` calls captured once in a CUDA graph and the graph replayed,
// so that host launch overhead cannot hide in the timing of a few-microsecond kernel (the
// decode step is replayed as a graph too). Falls back to time_us if capture fails.
template <class Fn>
double graph_time_us(Fn fn, int iters, int reps = 7) {
  for (int i = 0; i < 3; ++i) fn(i);
  sync();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    OSPREY_CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; ++i) fn(i);
    OSPREY_CUDA_CHECK(cudaStreamEndCapture(st(), &graph));
    OSPREY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  } catch (const Error& e) {
    cudaStreamCaptureStatus status;
    if (cudaStreamIsCapturing(st(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t dropped = nullptr;
      cudaStreamEndCapture(st(), &dropped);
      if (dropped) cudaGraphDestroy(dropped);
    }
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    std::printf("(graph capture failed: %s; timing plain launches)\n", e.what());
    return time_us(fn, iters, reps);
  }
  const double us = time_us([&](int) { OSPREY_CUDA_CHECK(cudaGraphLaunch(exec, st())); }, 1, reps) / iters;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

// Enough copies of a matrix of `bytes` that cycling through them never hits in L2.
int copies_for(size_t bytes) { return int(std::clamp<size_t>((size_t(512) << 20) / bytes, 1, 64)); }

TEST(CudaQuant, DISABLED_QuantGemvBandwidth) {
  SKIP_WITHOUT_CUDA();
  std::printf("n=1 GEMV, bf16 scales, g64, replayed as a CUDA graph; GB/s counts packed words + scales + "
              "biases (+ x, y)\n");
  std::printf("%-20s %5s %9s %9s | %9s %9s %9s | dense f16 %9s\n", "shape", "bits", "us", "GB/s", "R=1 GB/s",
              "R=4 GB/s", "R=8 GB/s", "GB/s");
  double step_us[2] = {0.0, 0.0};  // an 8B decode step's linear layers, 4- and 8-bit
  for (const BenchShape& sh : kLlama8B) {
    for (int bits : {4, 8}) {
      const size_t packed_bytes = size_t(sh.out * sh.in * bits / 8);
      const size_t param_bytes = size_t(sh.out * (sh.in / 64) * 2);
      const size_t bytes = packed_bytes + 2 * param_bytes + size_t(sh.in + sh.out) * 4;
      const int n_copies = copies_for(bytes);
      std::vector<std::unique_ptr<DeviceBytes>> packed, scales, biases;
      for (int c = 0; c < n_copies; ++c) {
        packed.push_back(std::make_unique<DeviceBytes>(packed_bytes));
        scales.push_back(std::make_unique<DeviceBytes>(param_bytes));
        biases.push_back(std::make_unique<DeviceBytes>(param_bytes));
      }
      DeviceVec<float> x(std::vector<float>(size_t(sh.in), 0.5f)), y(std::vector<float>(size_t(sh.out), 0.0f));
      auto args = [&](int i) {
        QuantArgs a;
        const int c = i % n_copies;
        a.packed = static_cast<const uint32_t*>(packed[size_t(c)]->p);
        a.scales = scales[size_t(c)]->p;
        a.biases = biases[size_t(c)]->p;
        a.scale_dtype = DType::bf16;
        a.bits = bits;
        a.group_size = 64;
        a.out = sh.out;
        a.in = sh.in;
        return a;
      };
      const int iters = std::max(20, n_copies);
      double us[4];
      for (int rows : {0, 1, 4, 8}) {
        us[rows == 0 ? 0 : rows == 1 ? 1 : rows == 4 ? 2 : 3] = graph_time_us(
            [&](int i) { cuda::linear_q_gemv(x.get(), 1, args(i), nullptr, y.get(), st(), rows); }, iters);
      }
      const double gbs = double(bytes) / us[0] / 1e3;
      std::string dense = "";
      if (bits == 4) {
        const size_t dense_bytes = size_t(sh.out * sh.in * 2);
        const int dc = std::clamp<int>(int((size_t(512) << 20) / dense_bytes), 1, 16);
        std::vector<std::unique_ptr<DeviceBytes>> dw;
        for (int c = 0; c < dc; ++c) dw.push_back(std::make_unique<DeviceBytes>(dense_bytes));
        const double dus = graph_time_us(
            [&](int i) {
              cuda::linear_gemv(x.get(), 1, sh.in, dw[size_t(i % dc)]->p, DType::f16, sh.out, nullptr, y.get(), st());
            },
            std::max(20, dc));
        dense = std::to_string(int(double(dense_bytes) / dus / 1e3));
      }
      std::printf("%-20s %5d %9.2f %9.0f | %9.0f %9.0f %9.0f | %19s\n", sh.name, bits, us[0], gbs,
                  double(bytes) / us[1] / 1e3, double(bytes) / us[2] / 1e3, double(bytes) / us[3] / 1e3,
                  dense.c_str());
      step_us[bits == 4 ? 0 : 1] += sh.per_token * us[0];
    }
  }
  for (int b = 0; b < 2; ++b)
    std::printf("8B %d-bit decode step, linear layers only: %.0f us (%.0f tokens/s bound)\n", b == 0 ? 4 : 8,
                step_us[b], 1e6 / step_us[b]);
}

// The linear layers of an 8B Llama-3 decode step as the engine runs them (q/k/v and gate/up
// stacked), n = 1, f16 weights and MLX 4-bit g64: each shape's time and bandwidth with the rows per warp (or
// block) chosen by shape and forced to each choice, replayed as a CUDA graph.
TEST(CudaQuant, DISABLED_DecodeStepGemvBandwidth) {
  SKIP_WITHOUT_CUDA();
  struct Shape8B {
    const char* name;
    int64_t out, in;
    int per_token;
  };
  const Shape8B shapes[] = {{"qkv 6144x4096", 6144, 4096, 32},
                            {"o 4096x4096", 4096, 4096, 32},
                            {"gate_up 28672x4096", 28672, 4096, 32},
                            {"down 4096x14336", 4096, 14336, 32},
                            {"head 128256x4096", 128256, 4096, 1}};
  DeviceVec<float> y(std::vector<float>(size_t(128256), 0.0f));
  DeviceVec<float> x(std::vector<float>(size_t(2 * 14336), 0.25f));
  for (int bits : {16, 4}) {
    std::printf("%s, n = 1: us (GB/s) chosen | forced\n", bits == 16 ? "f16" : "MLX 4-bit g64 f16 scales");
    double step_us = 0.0;
    for (const Shape8B& sh : shapes) {
      const size_t wbytes = bits == 16 ? size_t(sh.out * sh.in * 2) : size_t(sh.out * sh.in / 2);
      const size_t pbytes = bits == 16 ? 0 : size_t(sh.out * (sh.in / 64) * 2);
      const size_t bytes = wbytes + 2 * pbytes;
      const int n_copies = copies_for(bytes);
      std::vector<std::unique_ptr<DeviceBytes>> w, sc, bi;
      for (int c = 0; c < n_copies; ++c) {
        w.push_back(std::make_unique<DeviceBytes>(wbytes));
        if (bits != 16) {
          sc.push_back(std::make_unique<DeviceBytes>(pbytes));
          bi.push_back(std::make_unique<DeviceBytes>(pbytes));
        }
      }
      auto qargs = [&](int i) {
        QuantArgs a;
        const size_t c = size_t(i % n_copies);
        a.packed = static_cast<const uint32_t*>(w[c]->p);
        a.scales = sc[c]->p;
        a.biases = bi[c]->p;
        a.scale_dtype = DType::f16;
        a.bits = 4;
        a.group_size = 64;
        a.out = sh.out;
        a.in = sh.in;
        return a;
      };
      const int iters = std::max(20, n_copies);
      auto run = [&](int rows) {
        return graph_time_us(
            [&](int i) {
              if (bits == 16) {
                cuda::linear_gemv(x.get(), 1, sh.in, w[size_t(i % n_copies)]->p, DType::f16, sh.out, nullptr, y.get(),
                                  st(), rows);
              } else {
                cuda::linear_q_gemv(x.get(), 1, qargs(i), nullptr, y.get(), st(), rows);
              }
            },
            iters);
      };
      const double chosen = run(0);
      std::string forced;
      for (int rows : bits == 16 ? std::vector<int>{1, 2, 4} : std::vector<int>{1, 4, 8}) {
        const double us = run(rows);
        forced += " r" + std::to_string(rows) + " " + std::to_string(int(us * 10) / 10.0).substr(0, 6) + " (" +
                  std::to_string(int(double(bytes) / us / 1e3)) + ")";
      }
      std::printf("  %-22s %8.2f us (%5.0f GB/s) |%s\n", sh.name, chosen, double(bytes) / chosen / 1e3,
                  forced.c_str());
      step_us += sh.per_token * chosen;
    }
    std::printf("  the step's linear layers: %.0f us (%.0f tokens/s bound)\n", step_us, 1e6 / step_us);
  }
}

// Fills `bytes` of device memory with random bits (timing inputs: never constant).
void fill_random(void* dst, size_t bytes, std::mt19937& rng) {
  std::vector<uint32_t> h((bytes + 3) / 4);
  for (auto& v : h) v = uint32_t(rng());
  OSPREY_CUDA_CHECK(cudaMemcpy(dst, h.data(), bytes, cudaMemcpyHostToDevice));
}

// Random finite 16-bit scales or biases of magnitude about `mag`.
void fill_params(void* dst, size_t count, DType sdt, float mag, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-mag, mag);
  std::vector<uint16_t> h(count);
  for (auto& v : h) v = to_bits(sdt, d(rng));
  OSPREY_CUDA_CHECK(cudaMemcpy(dst, h.data(), count * 2, cudaMemcpyHostToDevice));
}

// The Llama-3.1-8B linear shapes, 4-bit g64, for 1 to 256 rows of x: the tensor-core kernel
// (linear_q_mma, block shape picked by n) against the path linear_q took before it (the fused
// GEMV up to 8 rows, dequantize + cuBLAS above), and the dense f16 layer as the read-rate
// reference. GB/s counts the packed words, scales, biases, x and y once; TFLOP/s 2 n out in.
// Each call reads its own copy of the weights (copies_for), replayed as a CUDA graph.
TEST(CudaQuant, DISABLED_QuantKernelsByRows) {
  SKIP_WITHOUT_CUDA();
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const Shape shapes[] = {{"q/o 4096x4096", 4096, 4096},      {"k/v 1024x4096", 1024, 4096},
                          {"qkv 6144x4096", 6144, 4096},      {"gate/up 14336x4096", 14336, 4096},
                          {"gate_up 28672x4096", 28672, 4096}, {"down 4096x14336", 4096, 14336}};
  const int64_t kRows[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::mt19937 rng(11);
  for (DType sdt : kScaleTypes) {
    std::printf("\n4-bit g64, %s scales: us, GB/s and TFLOP/s; old = GEMV (n <= 8) or dequantize + cuBLAS; "
                "mma = linear_q_mma (picked block); t1/t2/t4 x w4/w8 = forced block shapes\n",
                dtype_name(sdt));
    std::printf("%-20s %4s | %8s %7s %6s | %8s %7s %6s | %6s | %s\n", "shape", "n", "old us", "GB/s", "TF/s",
                "mma us", "GB/s", "TF/s", "x old", "forced us (t,w)");
    for (const Shape& sh : shapes) {
      const size_t packed_bytes = size_t(sh.out * sh.in / 2), n_params = size_t(sh.out * (sh.in / 64));
      const size_t wbytes = packed_bytes + 4 * n_params;
      const int n_copies = copies_for(wbytes);
      std::vector<std::unique_ptr<DeviceBytes>> packed, scales, biases;
      for (int c = 0; c < n_copies; ++c) {
        packed.push_back(std::make_unique<DeviceBytes>(packed_bytes));
        scales.push_back(std::make_unique<DeviceBytes>(n_params * 2));
        biases.push_back(std::make_unique<DeviceBytes>(n_params * 2));
        fill_random(packed.back()->p, packed_bytes, rng);
        fill_params(scales.back()->p, n_params, sdt, 0.02f, rng);
        fill_params(biases.back()->p, n_params, sdt, 0.1f, rng);
      }
      auto args = [&](int i) {
        QuantArgs a;
        const size_t c = size_t(i % n_copies);
        a.packed = static_cast<const uint32_t*>(packed[c]->p);
        a.scales = scales[c]->p;
        a.biases = biases[c]->p;
        a.scale_dtype = sdt;
        a.bits = 4;
        a.group_size = 64;
        a.out = sh.out;
        a.in = sh.in;
        return a;
      };
      DeviceVec<float> x(random_floats(size_t(256 * sh.in), rng)), y(std::vector<float>(size_t(256 * sh.out), 0.0f));
      const int iters = std::max(20, n_copies);
      for (int64_t n : kRows) {
        const double bytes = double(wbytes) + double(n) * double(sh.in + sh.out) * 4.0;
        const double flops = 2.0 * double(n) * double(sh.out) * double(sh.in);
        const double old_us = graph_time_us(
            [&](int i) {
              if (n <= cuda::kGemvMaxRows)
                cuda::linear_q_gemv(x.get(), n, args(i), nullptr, y.get(), st());
              else
                cuda::linear_q_gemm(x.get(), n, args(i), nullptr, y.get(), st());
            },
            iters);
        auto mma_us = [&](int tiles, int warps) {
          return graph_time_us(
              [&](int i) { cuda::linear_q_mma(x.get(), n, args(i), nullptr, y.get(), st(), tiles, warps); }, iters);
        };
        const double us = mma_us(0, 0);
        std::string forced;
        for (int tiles : {1, 2, 4})
          for (int warps : {4, 8}) {
            if ((tiles > 1 && n <= 4) || sdt != DType::f16) continue;
            char buf[32];
            std::snprintf(buf, sizeof buf, " %.1f(%d,%d)", mma_us(tiles, warps), tiles, warps);
            forced += buf;
          }
        std::printf("%-20s %4lld | %8.2f %7.0f %6.1f | %8.2f %7.0f %6.1f | %6.2f |%s\n", sh.name,
                    static_cast<long long>(n), old_us, bytes / old_us / 1e3, flops / old_us / 1e6, us,
                    bytes / us / 1e3, flops / us / 1e6, old_us / us, forced.c_str());
      }
      if (sdt == DType::f16) {  // the dense f16 layer at n = 1: the read rate to compare with
        const size_t dense_bytes = size_t(sh.out * sh.in * 2);
        const int dc = copies_for(dense_bytes);
        std::vector<std::unique_ptr<DeviceBytes>> dw;
        for (int c = 0; c < dc; ++c) {
          dw.push_back(std::make_unique<DeviceBytes>(dense_bytes));
          fill_params(dw.back()->p, dense_bytes / 2, DType::f16, 0.05f, rng);
        }
        const double dus = graph_time_us(
            [&](int i) {
              cuda::linear_gemv(x.get(), 1, sh.in, dw[size_t(i % dc)]->p, DType::f16, sh.out, nullptr, y.get(), st());
            },
            std::max(20, dc));
        std::printf("%-20s    1 | dense f16 GEMV %8.2f us %7.0f GB/s\n", sh.name, dus, double(dense_bytes) / dus / 1e3);
      }
    }
  }
}

TEST(CudaQuant, DISABLED_QuantGemmPrefill) {
  SKIP_WITHOUT_CUDA();
  const int64_t n = 512;
  std::printf("n=%lld GEMM (dequantize + cuBLAS), 4-bit g64\n", static_cast<long long>(n));
  for (DType sdt : kScaleTypes) {
    double forward_ms = 0.0;
    for (const BenchShape& sh : kLlama8B) {
      if (sh.out == 128256) continue;  // the head sees only the last position of a prompt
      const size_t packed_bytes = size_t(sh.out * sh.in / 2), param_bytes = size_t(sh.out * (sh.in / 64) * 2);
      DeviceBytes packed(packed_bytes), scales(param_bytes), biases(param_bytes);
      DeviceVec<float> x(std::vector<float>(size_t(n * sh.in), 0.25f)), y(std::vector<float>(size_t(n * sh.out), 0.0f));
      QuantArgs a;
      a.packed = static_cast<const uint32_t*>(packed.p);
      a.scales = scales.p;
      a.biases = biases.p;
      a.scale_dtype = sdt;
      a.bits = 4;
      a.group_size = 64;
      a.out = sh.out;
      a.in = sh.in;
      const double us = time_us([&](int) { cuda::linear_q(x.get(), n, a, nullptr, y.get(), st()); }, 5, 5);
      const double tflops = 2.0 * double(n) * double(sh.out) * double(sh.in) / us / 1e6;
      std::printf("%-6s %-20s %9.1f us %7.1f TFLOP/s\n", dtype_name(sdt), sh.name, us, tflops);
      forward_ms += sh.per_token * us / 1e3;
    }
    std::printf("%s: linear layers of one %lld-token 8B forward: %.1f ms (%.0f tokens/s bound)\n", dtype_name(sdt),
                static_cast<long long>(n), forward_ms, double(n) / forward_ms * 1e3);
  }
}

}  // namespace
}  // namespace osprey

#endif  // OSPREY_WITH_CUDA
