// cpu::linear and its two paths against a naive double-precision loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/kernel_table.h"
#include "core/error.h"
#include "core/half.h"
#include "support/cpu_levels.h"
#include "support/numeric.h"

namespace osprey {
namespace {

using LinearFn = void (*)(const float*, int64_t, int64_t, const void*, DType, int64_t, const float*, float*,
                          ThreadPool&);

// Random weights stored in `dtype`, plus their exact f32 values for the reference.
struct Weights {
  DType dtype;
  std::vector<float> f32;      // used when dtype == f32
  std::vector<uint16_t> bits;  // f16 / bf16
  std::vector<float> exact;    // the values the kernel sees, as f32

  const void* data() const { return dtype == DType::f32 ? static_cast<const void*>(f32.data()) : bits.data(); }
};

Weights make_weights(DType dtype, int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Weights w;
  w.dtype = dtype;
  w.exact.resize(size_t(out * in));
  if (dtype == DType::f32) w.f32.resize(w.exact.size());
  else w.bits.resize(w.exact.size());
  for (size_t i = 0; i < w.exact.size(); ++i) {
    const float v = dist(rng);
    if (dtype == DType::f32) {
      w.f32[i] = w.exact[i] = v;
    } else if (dtype == DType::f16) {
      w.bits[i] = f32_to_f16(v);
      w.exact[i] = f16_to_f32(w.bits[i]);
    } else {
      w.bits[i] = f32_to_bf16(v);
      w.exact[i] = bf16_to_f32(w.bits[i]);
    }
  }
  return w;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) { return testing::random_floats(n, rng); }

// ||y - ref|| / ||ref|| with ref = x w^T + bias computed in double.
double relative_error(const std::vector<float>& x, int64_t n, int64_t in, const Weights& w, int64_t out,
                      const float* bias, const std::vector<float>& y) {
  double err = 0.0, norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double ref = bias ? double(bias[o]) : 0.0;
      for (int64_t k = 0; k < in; ++k) ref += double(x[i * in + k]) * double(w.exact[o * in + k]);
      const double d = double(y[i * out + o]) - ref;
      err += d * d;
      norm += ref * ref;
    }
  }
  return std::sqrt(err / norm);
}

struct Case {
  int64_t n, in, out;
};

void check_all(LinearFn fn, const char* name) {
  const std::vector<Case> cases = {
      {1, 100, 37}, {2, 100, 37}, {3, 64, 48},   {7, 100, 37},  {64, 100, 37},
      {129, 100, 37}, {1, 300, 130}, {3, 257, 97}, {64, 256, 96}, {129, 300, 130},
      {7, 16, 1},   {9, 5, 3},      {1, 1024, 67}, {20, 1030, 200},
  };
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(1234);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Case& c : cases) {
      const Weights w = make_weights(dtype, c.out, c.in, rng);
      const std::vector<float> x = random_vector(size_t(c.n * c.in), rng);
      const std::vector<float> bias = random_vector(size_t(c.out), rng);
      for (ThreadPool* pool : {&pool1, &pool3}) {
        for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
          std::vector<float> y(static_cast<size_t>(c.n * c.out), std::nanf(""));
          fn(x.data(), c.n, c.in, w.data(), dtype, c.out, b, y.data(), *pool);
          const double err = relative_error(x, c.n, c.in, w, c.out, b, y);
          EXPECT_LT(err, 1e-5) << name << " dtype=" << dtype_name(dtype) << " n=" << c.n << " in=" << c.in
                               << " out=" << c.out << " threads=" << pool->n_threads() << " bias=" << (b != nullptr);
        }
      }
    }
  }
}

class Linear : public testing::CpuLevelTest {};

TEST_P(Linear, MatchesDoubleReference) { check_all(cpu::kernels().linear, "linear"); }
TEST_P(Linear, RowsPathMatchesDoubleReference) { check_all(cpu::kernels().linear_rows, "linear_rows"); }
TEST_P(Linear, GemmPathMatchesDoubleReference) { check_all(cpu::kernels().linear_gemm, "linear_gemm"); }

TEST_P(Linear, LargeGemmMatchesDoubleReference) {
  // Several k blocks and many panels, ragged edges in every dimension; more rows than one
  // packed chunk of x holds.
  ThreadPool pool(3);
  std::mt19937 rng(99);
  for (const Case& c : std::vector<Case>{{77, 1100, 301}, {1100, 70, 50}, {600, 300, 20}}) {
    const Weights w = make_weights(DType::bf16, c.out, c.in, rng);
    const std::vector<float> x = random_vector(size_t(c.n * c.in), rng);
    const std::vector<float> bias = random_vector(size_t(c.out), rng);
    std::vector<float> y(static_cast<size_t>(c.n * c.out));
    cpu::kernels().linear(x.data(), c.n, c.in, w.data(), DType::bf16, c.out, bias.data(), y.data(), pool);
    EXPECT_LT(relative_error(x, c.n, c.in, w, c.out, bias.data(), y), 1e-5) << "n=" << c.n;
  }
}

TEST_P(Linear, RejectsIntegerWeights) {
  ThreadPool pool(1);
  std::vector<float> x(4, 1.0f), y(2);
  std::vector<int32_t> w(8, 1);
  EXPECT_THROW(cpu::kernels().linear(x.data(), 1, 4, w.data(), DType::i32, 2, nullptr, y.data(), pool), Unsupported);
  EXPECT_THROW(cpu::kernels().linear(x.data(), 8, 4, w.data(), DType::i32, 2, nullptr, y.data(), pool), Unsupported);
}

// Throughput on this machine (run with --gtest_also_run_disabled_tests). GEMM: n=512,
// in=out=2048 bf16; matvec: n=1, in=out=4096 bf16, rotating over 8 weight matrices so that w
// comes from memory, not cache.
using testing::best_seconds;

TEST_P(Linear, DISABLED_LinearThroughput) {
  std::mt19937 rng(7);
  for (int threads : {1, 0}) {
    ThreadPool pool(threads);
    {
      const int64_t n = 512, in = 2048, out = 2048;
      const Weights w = make_weights(DType::bf16, out, in, rng);
      const std::vector<float> x = random_vector(size_t(n * in), rng);
      std::vector<float> y(static_cast<size_t>(n * out));
      const double s = best_seconds(
          5, [&](int) { cpu::kernels().linear(x.data(), n, in, w.data(), DType::bf16, out, nullptr, y.data(), pool); });
      std::cout << "gemm 512x2048x2048 bf16, " << pool.n_threads() << " threads: " << 2.0 * n * in * out / s / 1e9
                << " GFLOP/s\n";
    }
    {
      const int64_t in = 4096, out = 4096;
      std::vector<Weights> ws;
      for (int i = 0; i < 8; ++i) ws.push_back(make_weights(DType::bf16, out, in, rng));
      const std::vector<float> x = random_vector(size_t(in), rng);
      std::vector<float> y(static_cast<size_t>(out));
      const double s = best_seconds(64, [&](int r) {
        cpu::kernels().linear(x.data(), 1, in, ws[r % 8].data(), DType::bf16, out, nullptr, y.data(), pool);
      });
      std::cout << "matvec 4096x4096 bf16, " << pool.n_threads() << " threads: " << 2.0 * in * out / s / 1e9
                << " GB/s of weights\n";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuLevels, Linear, OSPREY_ALL_CPU_LEVELS);

}  // namespace
}  // namespace osprey
