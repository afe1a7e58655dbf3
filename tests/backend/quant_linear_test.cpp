// cpu::linear_q, linear_q_f32, linear_q4_int8 (every instruction set the CPU has),
// dequantize_rows and dequantize against double-precision references that read the codes back
// from the packed words with their own bit arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/quant_int8.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/quant.h"
#include "core/env.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/quantize.h"
#include "support/cpu_levels.h"
#include "support/numeric.h"
#include "support/test_util.h"

namespace osprey {
namespace {

// A random quantized [out, in] matrix with its exact weights in double.
struct QMatrix {
  int64_t out = 0, in = 0;
  int bits = 0, group_size = 0;
  DType scale_dtype = DType::f16;
  std::vector<uint32_t> packed{};  // [out, in * bits / 32]
  std::vector<uint16_t> scales{};  // [out, in / group_size]
  std::vector<uint16_t> biases{};  // [out, in / group_size]
  std::vector<double> w{};         // [out, in], scale * q + bias from the stored values

  QuantArgs args() const {
    return {.packed = packed.data(), .scales = scales.data(), .biases = biases.data(), .scale_dtype = scale_dtype,
            .bits = bits, .group_size = group_size, .out = out, .in = in};
  }
};

double half_value(uint16_t h, DType dt) { return dt == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h); }
uint16_t to_half(float f, DType dt) { return dt == DType::f16 ? f32_to_f16(f) : f32_to_bf16(f); }

// Code i of a row, bit by bit: bit b of the code is stream bit i * bits + b, stream bit t being
// bit t % 32 of word t / 32.
uint32_t read_code(const uint32_t* row_words, int64_t i, int bits) {
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t t = i * bits + b;
    q |= ((row_words[t / 32] >> (t % 32)) & 1u) << b;
  }
  return q;
}

QMatrix make_matrix(int64_t out, int64_t in, int bits, int group_size, DType scale_dtype, std::mt19937& rng) {
  QMatrix m{.out = out, .in = in, .bits = bits, .group_size = group_size, .scale_dtype = scale_dtype};
  const int64_t words_per_row = in * bits / 32, n_groups = in / group_size;
  const uint32_t levels = 1u << bits;
  std::uniform_int_distribution<uint32_t> code_dist(0, levels - 1);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<uint32_t> codes(size_t(out * in));
  for (auto& q : codes) q = code_dist(rng);
  m.packed.assign(size_t(out * words_per_row), 0u);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t i = 0; i < in; ++i) {
      const uint64_t bit = uint64_t(i) * bits;
      const uint64_t v = uint64_t(codes[size_t(r * in + i)]) << (bit % 32);
      uint32_t* word = &m.packed[size_t(r * words_per_row + int64_t(bit / 32))];
      word[0] |= uint32_t(v);
      if (v >> 32) word[1] |= uint32_t(v >> 32);
    }
  // Weights spread over about [-1, 1], as MLX's quantizer makes them: a signed scale, the bias
  // near the low edge.
  m.scales.resize(size_t(out * n_groups));
  m.biases.resize(size_t(out * n_groups));
  for (size_t g = 0; g < m.scales.size(); ++g) {
    const float s = (0.5f + unit(rng)) * 2.0f / float(levels - 1) * (unit(rng) < 0.3f ? -1.0f : 1.0f);
    m.scales[g] = to_half(s, scale_dtype);
    m.biases[g] = to_half(-s * float(levels - 1) / 2.0f + 0.4f * (unit(rng) - 0.5f), scale_dtype);
  }
  m.w.resize(size_t(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t i = 0; i < in; ++i) {
      const uint32_t q = read_code(&m.packed[size_t(r * words_per_row)], i, bits);
      EXPECT_EQ(q, codes[size_t(r * in + i)]) << "test packing, bits=" << bits;
      const size_t g = size_t(r * n_groups + i / group_size);
      m.w[size_t(r * in + i)] = half_value(m.scales[g], scale_dtype) * double(q) + half_value(m.biases[g], scale_dtype);
    }
  return m;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) { return testing::random_floats(n, rng); }

// An f32 array [rows, cols] of random_vector's values.
Array random_array(int64_t rows, int64_t cols, std::mt19937& rng) {
  Array a = Array::empty({rows, cols}, DType::f32);
  const std::vector<float> v = random_vector(size_t(rows * cols), rng);
  std::copy(v.begin(), v.end(), a.data<float>());
  return a;
}

// The tile kernels' arguments for q (f16 scales) with the tiles of qt.
QuantArgs tile_args(const QuantizedMatrix& q, const QuantizedMatrix& qt) {
  return {.packed = q.packed.data<uint32_t>(), .scales = q.scales.raw(), .biases = q.biases.raw(),
          .scale_dtype = DType::f16, .bits = q.bits, .group_size = q.group_size, .out = q.out_features(),
          .in = q.in_features(), .tiles = qt.cpu_tiles.raw()};
}

// The kernel under test, on n rows of x (plus bias, or none) into y.
using TileKernel =
    std::function<void(const float* x, int64_t n, const float* bias, float* y, ThreadPool& pool, cpu::Int8Isa isa)>;

// ref [n, out] = x w^T in double, and mag [n, out] = sum_k |w x| (the scale of f32 rounding).
void reference(const QMatrix& m, const std::vector<float>& x, int64_t n, std::vector<double>& ref,
               std::vector<double>& mag) {
  ref.assign(size_t(n * m.out), 0.0);
  mag.assign(size_t(n * m.out), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < m.out; ++o) {
      double s = 0.0, a = 0.0;
      for (int64_t k = 0; k < m.in; ++k) {
        const double t = double(x[size_t(i * m.in + k)]) * m.w[size_t(o * m.in + k)];
        s += t;
        a += std::abs(t);
      }
      ref[size_t(i * m.out + o)] = s;
      mag[size_t(i * m.out + o)] = a;
    }
}

// Largest |y - (ref + bias)| / mag over the outputs (NaN, e.g. an output left unwritten, fails).
double worst_error(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& mag,
                   int64_t out, const float* bias) {
  double worst = 0.0;
  for (size_t e = 0; e < y.size(); ++e) {
    const double want = ref[e] + (bias ? double(bias[e % size_t(out)]) : 0.0);
    const double err = std::abs(double(y[e]) - want) / (mag[e] + 1e-30);
    if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
  }
  return worst;
}

class QuantLinear : public testing::CpuLevelTest {};

TEST_P(QuantLinear, F32ActivationsMatchDoubleReference) {
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(2024);
  for (int bits : {2, 3, 4, 6, 8})
    for (int g : {16, 32, 64, 128})  // 16: 8-bit codes only (GGUF's Q6_K)
      for (DType sd : {DType::f16, DType::bf16})
        // in: one group, a ragged number of SIMD blocks of codes, several k blocks.
        for (int64_t in : {int64_t(g), int64_t(5) * g, int64_t(13) * g})
          for (int64_t out : {37, 129}) {
            if (!supported_quant_group(bits, g)) continue;
            const QMatrix m = make_matrix(out, in, bits, g, sd, rng);
            const QuantArgs a = m.args();
            const std::vector<float> bias = random_vector(size_t(out), rng);
            for (int64_t n : {1, 2, 5, 16, 17, 40, 100}) {
              const std::vector<float> x = random_vector(size_t(n * in), rng);
              std::vector<double> ref, mag;
              reference(m, x, n, ref, mag);
              for (ThreadPool* pool : {&pool1, &pool3})
                for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
                  std::vector<float> y(size_t(n * out), std::nanf(""));
                  cpu::kernels().linear_q_f32(x.data(), n, a, b, y.data(), *pool);
                  EXPECT_LT(worst_error(y, ref, mag, out, b), 2e-6)
                      << "bits=" << bits << " group=" << g << " scales=" << dtype_name(sd) << " n=" << n
                      << " in=" << in << " out=" << out << " threads=" << pool->n_threads()
                      << " bias=" << (b != nullptr);
                }
            }
          }
}

TEST_P(QuantLinear, F32ActivationsLargerShapesMatchDoubleReference) {
  // Many row tiles per thread, several k blocks for every n, an odd row count.
  ThreadPool pool(3);
  std::mt19937 rng(77);
  for (int bits : {4, 8, 2})
    for (int g : {16, 64, 128}) {
      if (!supported_quant_group(bits, g)) continue;
      const int64_t out = 301, in = 4096 + 3 * g;
      const QMatrix m = make_matrix(out, in, bits, g, bits == 8 ? DType::bf16 : DType::f16, rng);
      const std::vector<float> bias = random_vector(size_t(out), rng);
      for (int64_t n : {1, 3, 16, 33}) {
        const std::vector<float> x = random_vector(size_t(n * in), rng);
        std::vector<double> ref, mag;
        reference(m, x, n, ref, mag);
        std::vector<float> y(size_t(n * out), std::nanf(""));
        cpu::kernels().linear_q_f32(x.data(), n, m.args(), bias.data(), y.data(), pool);
        EXPECT_LT(worst_error(y, ref, mag, out, bias.data()), 2e-6) << "bits=" << bits << " group=" << g << " n=" << n;
      }
    }
}

// x rounded as linear_q4_int8 documents it, from its definition: per block of 32 values,
// step = max|x| / 127, h = round(x * (127 / max|x|)), l = round((x - step * h) * (256 * 127 /
// max|x|)) clamped to [-127, 127] (f32, ties to even), x ~= step / 256 * (256 h + l).
// Without the low part (Int8Activations::int8): x ~= step * h, to within step / 2.
void round_to_int8(const std::vector<float>& x, int64_t n, int64_t in, std::vector<double>& rounded,
                   std::vector<double>& half_step, bool low_part = true) {
  rounded.assign(x.size(), 0.0);
  half_step.assign(x.size(), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < in; b += 32) {
      const float* xb = &x[size_t(i * in + b)];
      float amax = 0.0f;
      for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xb[k]));
      const float step = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int k = 0; k < 32; ++k) {
        const float h = std::nearbyint(xb[k] * inv);
        const float l = std::clamp(std::nearbyint(std::fma(-step, h, xb[k]) * (inv * 256.0f)), -127.0f, 127.0f);
        ASSERT_LE(std::fabs(h), 127.0f);
        if (!low_part) {
          rounded[size_t(i * in + b + k)] = double(step) * double(h);
          half_step[size_t(i * in + b + k)] = double(step) / 2.0;
          continue;
        }
        rounded[size_t(i * in + b + k)] = double(step) / 256.0 * (256.0 * double(h) + double(l));
        // The documented bound: step / 512, or step / 256 where l was clamped.
        half_step[size_t(i * in + b + k)] = double(step) / (std::fabs(l) == 127.0f ? 256.0 : 512.0);
      }
    }
}

// The int8 path's reference: per weight, scale * q times the rounded x plus bias times x itself.
// ref [n, out], mag [n, out] = sum |terms|, bound [n, out] = sum |scale * q| * (the documented
// bound of rounding x).
void int8_reference(const QMatrix& m, const std::vector<float>& x, int64_t n, std::vector<double>& ref,
                    std::vector<double>& mag, std::vector<double>& bound, bool low_part = true) {
  std::vector<double> rounded, half_step;
  round_to_int8(x, n, m.in, rounded, half_step, low_part);
  ref.assign(size_t(n * m.out), 0.0);
  mag.assign(size_t(n * m.out), 0.0);
  bound.assign(size_t(n * m.out), 0.0);
  const int64_t n_groups = m.in / m.group_size;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < m.out; ++o) {
      double s = 0.0, a = 0.0, e = 0.0;
      for (int64_t k = 0; k < m.in; ++k) {
        const size_t g = size_t(o * n_groups + k / m.group_size);
        const double bias = half_value(m.biases[g], m.scale_dtype);
        const double sq = m.w[size_t(o * m.in + k)] - bias;  // scale * q, exact in double
        const size_t xi = size_t(i * m.in + k);
        const double t1 = sq * rounded[xi], t2 = bias * double(x[xi]);
        s += t1 + t2;
        a += std::abs(t1) + std::abs(t2);
        e += std::abs(sq) * half_step[xi];
      }
      ref[size_t(i * m.out + o)] = s;
      mag[size_t(i * m.out + o)] = a;
      bound[size_t(i * m.out + o)] = e;
    }
}

std::vector<cpu::Int8Isa> supported_isas() {
  std::vector<cpu::Int8Isa> isas;
  for (cpu::Int8Isa isa : {cpu::Int8Isa::avx2, cpu::Int8Isa::avx_vnni, cpu::Int8Isa::avx512bw,
                           cpu::Int8Isa::avx512_vnni, cpu::Int8Isa::amx})
    if (cpu::int8_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

TEST(QuantLinearInt8, EveryInstructionSetMatchesRoundedActivationReference) {
  const std::vector<cpu::Int8Isa> isas = supported_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(808);
  for (int g : {32, 64, 128})
    for (DType sd : {DType::f16, DType::bf16})
      // in: one group, ragged numbers of 64- and 128-code vectors, several k chunks.
      for (int64_t in : {int64_t(g), int64_t(5) * g, int64_t(13) * g})
        for (int64_t out : {37, 129}) {
          const QMatrix m = make_matrix(out, in, 4, g, sd, rng);
          const std::vector<float> bias = random_vector(size_t(out), rng);
          for (int64_t n : {1, 2, 5, 17, 40}) {
            std::vector<float> x = random_vector(size_t(n * in), rng);
            if (n == 5) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
            std::vector<double> ref, mag, bound;
            int8_reference(m, x, n, ref, mag, bound);
            for (cpu::Int8Isa isa : isas)
              for (ThreadPool* pool : {&pool1, &pool3})
                for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
                  std::vector<float> y(size_t(n * out), std::nanf(""));
                  cpu::linear_q4_int8(x.data(), n, m.args(), b, y.data(), *pool, isa);
                  EXPECT_LT(worst_error(y, ref, mag, out, b), 2e-6)
                      << cpu::int8_isa_name(isa) << " group=" << g << " scales=" << dtype_name(sd) << " n=" << n
                      << " in=" << in << " out=" << out << " threads=" << pool->n_threads()
                      << " bias=" << (b != nullptr);
                }
          }
        }
}

TEST_P(QuantLinear, Int8ErrorAgainstF32ActivationsStaysWithinTheRoundingBound) {
  // linear_q on 4-bit weights (the int8 path at every level but scalar) against the exact
  // product: within the largest effect of rounding x to int8, plus f32 rounding.
  ThreadPool pool(2);
  std::mt19937 rng(909);
  for (int g : {32, 64, 128}) {
    const int64_t out = 301, in = 2048 + 3 * g;
    const QMatrix m = make_matrix(out, in, 4, g, DType::f16, rng);
    for (int64_t n : {1, 3, 33}) {
      std::vector<float> x = random_vector(size_t(n * in), rng);
      for (size_t k = 0; k < x.size(); k += 97) x[k] *= 8.0f;  // outliers in some blocks
      std::vector<double> ref, mag, iref, imag, bound;
      reference(m, x, n, ref, mag);
      int8_reference(m, x, n, iref, imag, bound);
      std::vector<float> y(size_t(n * out), std::nanf(""));
      cpu::kernels().linear_q(x.data(), n, m.args(), nullptr, y.data(), pool);
      double worst_rel = 0.0;
      for (size_t e = 0; e < y.size(); ++e) {
        const double err = std::abs(double(y[e]) - ref[e]);
        ASSERT_LE(err, bound[e] + 2e-6 * mag[e]) << "group=" << g << " n=" << n << " output " << e;
        worst_rel = std::max(worst_rel, err / mag[e]);
      }
      // The measured worst error relative to sum |w x| is about 1e-5 (with 8 bits of x alone it
      // was 2e-3).
      ASSERT_LT(worst_rel, 5e-5) << "group=" << g << " n=" << n;
    }
  }
}

TEST_P(QuantLinear, Int8PathLeavesOtherBitsOnF32Activations) {
  ThreadPool pool(2);
  std::mt19937 rng(31);
  for (int bits : {2, 3, 6, 8}) {
    const QMatrix m = make_matrix(45, 256, bits, 64, DType::bf16, rng);
    for (int64_t n : {1, 20}) {
      const std::vector<float> x = random_vector(size_t(n * m.in), rng);
      std::vector<double> ref, mag;
      reference(m, x, n, ref, mag);
      std::vector<float> y(size_t(n * m.out), std::nanf(""));
      cpu::kernels().linear_q(x.data(), n, m.args(), nullptr, y.data(), pool);
      EXPECT_LT(worst_error(y, ref, mag, m.out, nullptr), 2e-6) << "bits=" << bits << " n=" << n;
    }
  }
}

TEST_P(QuantLinear, Int8PathFollowsTheLevel) {
  // linear_q on 4-bit weights (n == 1 and n > 16) is, bit for bit, the int8 kernel of the
  // widest instruction set of the level's vector width that the CPU has (AMX-INT8 where
  // OSPREY_CPU_AMX=1 asks for it, else AVX-512 VNNI, else AVX-512BW at v4 and v4-bf16; AVX-VNNI,
  // else AVX2 at v3), and the f32-activation kernel at scalar.
  const CpuLevel level = GetParam();
  std::optional<cpu::Int8Isa> want;
  if (level == CpuLevel::v3)
    want = cpu::int8_isa_supported(cpu::Int8Isa::avx_vnni) ? cpu::Int8Isa::avx_vnni : cpu::Int8Isa::avx2;
  else if (level != CpuLevel::scalar)
    want = cpu::int8_isa_supported(cpu::Int8Isa::amx) && env_options().cpu_amx == true ? cpu::Int8Isa::amx
           : cpu::int8_isa_supported(cpu::Int8Isa::avx512_vnni) ? cpu::Int8Isa::avx512_vnni
                                                                : cpu::Int8Isa::avx512bw;
  ThreadPool pool(2);
  std::mt19937 rng(4242);
  const QMatrix m = make_matrix(45, 512, 4, 64, DType::f16, rng);
  for (int64_t n : {1, 20}) {
    const std::vector<float> x = random_vector(size_t(n * m.in), rng);
    std::vector<float> got(size_t(n * m.out), std::nanf("")), expected(got.size(), std::nanf(""));
    cpu::kernels().linear_q(x.data(), n, m.args(), nullptr, got.data(), pool);
    if (want)
      cpu::linear_q4_int8(x.data(), n, m.args(), nullptr, expected.data(), pool, *want);
    else
      cpu::kernels().linear_q_f32(x.data(), n, m.args(), nullptr, expected.data(), pool);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << "n=" << n << ", expected " << (want ? cpu::int8_isa_name(*want) : "f32 activations");
  }
}

TEST(QuantLinearInt8, ChoosesAnInstructionSetTheCpuHas) {
  cpu::Int8Isa best;
  if (!cpu::int8_isa_best(&best)) {
    EXPECT_TRUE(supported_isas().empty());
    GTEST_SKIP() << "this CPU has no AVX2";
  }
  EXPECT_TRUE(cpu::int8_isa_supported(best)) << cpu::int8_isa_name(best);
  // The best one is the last (widest) supported in the order avx2, avx-vnni, avx512bw, avx512-vnni,
  // and amx-int8 only where OSPREY_CPU_AMX=1 asks for it.
  std::vector<cpu::Int8Isa> offered = supported_isas();
  if (offered.back() == cpu::Int8Isa::amx && env_options().cpu_amx != true) offered.pop_back();
  EXPECT_EQ(int(best), int(offered.back())) << cpu::int8_isa_name(best);
  std::cout << "int8 kernels: " << cpu::int8_isa_name(best) << "\n";
  // Per level: none at scalar; at v3 a 256-bit one; at v4 and v4-bf16 the best.
  cpu::Int8Isa isa;
  EXPECT_FALSE(cpu::int8_isa_best(CpuLevel::scalar, &isa));
  ASSERT_TRUE(cpu::int8_isa_best(CpuLevel::v3, &isa));
  EXPECT_TRUE(isa == cpu::Int8Isa::avx2 || isa == cpu::Int8Isa::avx_vnni) << cpu::int8_isa_name(isa);
  EXPECT_TRUE(cpu::int8_isa_supported(isa)) << cpu::int8_isa_name(isa);
  for (CpuLevel level : {CpuLevel::v4, CpuLevel::v4_bf16}) {
    ASSERT_TRUE(cpu::int8_isa_best(level, &isa));
    EXPECT_EQ(int(isa), int(best)) << cpu_level_name(level);
  }
}

// Rows of x the tile tests run: a decode step, small batches, and prompts past the x-row
// passes of 4 (a remainder of 1 and 2) and past the rounding's split over threads (16 rows).
constexpr int64_t kTileTestRows[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 38};

// w's decode tiles in `buf` (8 bits: repack_q8_tiles, else repack_q4_tiles), and args that
// carry them.
QuantArgs with_tiles(const QMatrix& m, std::vector<uint8_t>& buf, ThreadPool& pool) {
  QuantArgs a = m.args();
  const bool q8 = m.bits == 8;
  // Not zero: padding rows must be written.
  buf.assign(size_t(q8 ? cpu::q8_tiles_bytes(a) : cpu::q4_tiles_bytes(a)), 0xa5);
  if (q8)
    cpu::repack_q8_tiles(a, buf.data(), pool);
  else
    cpu::repack_q4_tiles(a, buf.data(), pool);
  a.tiles = buf.data();
  return a;
}

std::vector<cpu::Int8Isa> vnni_isas() {
  std::vector<cpu::Int8Isa> isas;
  for (cpu::Int8Isa isa : supported_isas())
    if (cpu::int8_isa_exact_u8(isa)) isas.push_back(isa);
  return isas;
}

// m's decode tiles in `buf` (4 bits: repack_q4_tiles, 8: repack_q8_tiles), and the tile
// kernel of those bits over them.
TileKernel tile_kernel(const QMatrix& m, std::vector<uint8_t>& buf, ThreadPool& pool) {
  const QuantArgs a = with_tiles(m, buf, pool);
  if (m.bits == 8)
    return [a](const float* x, int64_t n, const float* b, float* y, ThreadPool& p, cpu::Int8Isa isa) {
      cpu::linear_q8_tiles(x, n, a, b, y, p, isa);
    };
  return [a](const float* x, int64_t n, const float* b, float* y, ThreadPool& p, cpu::Int8Isa isa) {
    cpu::linear_q4_int8(x, n, a, b, y, p, isa);
  };
}

// The tile kernel on m's tiles (repacked on the first pool), for every row count of
// kTileTestRows (at 5 rows with an all-zero block), every set of `isas`, every pool of `pools`,
// with a bias and without, against the double reference of the documented rounding of x.
void expect_tiles_match_reference(const QMatrix& m, const std::vector<cpu::Int8Isa>& isas,
                                  const std::vector<ThreadPool*>& pools, std::mt19937& rng) {
  std::vector<uint8_t> buf;
  const TileKernel kernel = tile_kernel(m, buf, *pools.front());
  const std::vector<float> bias = random_vector(size_t(m.out), rng);
  for (int64_t n : kTileTestRows) {
    std::vector<float> x = random_vector(size_t(n * m.in), rng);
    if (n == 5) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
    std::vector<double> ref, mag, bound;
    int8_reference(m, x, n, ref, mag, bound);
    for (cpu::Int8Isa isa : isas)
      for (ThreadPool* pool : pools)
        for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
          std::vector<float> y(size_t(n * m.out), std::nanf(""));
          kernel(x.data(), n, b, y.data(), *pool, isa);
          EXPECT_LT(worst_error(y, ref, mag, m.out, b), 2e-6)
              << cpu::int8_isa_name(isa) << " group=" << m.group_size << " scales=" << dtype_name(m.scale_dtype)
              << " n=" << n << " in=" << m.in << " out=" << m.out << " threads=" << pool->n_threads()
              << " bias=" << (b != nullptr);
        }
  }
}

// A row of y from the tile kernel of m has the same bits for any n (a decode step, a batch, a
// prompt), any place in the batch, any thread count and every instruction set of `isas` (each
// lane is one output row): 40 random rows through the kernel alone and in runs of 2 to 40.
void expect_rows_the_same_alone_and_batched(const QMatrix& m, const std::vector<cpu::Int8Isa>& isas, std::mt19937& rng) {
  ThreadPool pool1(1), pool2(2);
  std::vector<uint8_t> buf;
  const TileKernel kernel = tile_kernel(m, buf, pool2);
  const int64_t in = m.in, out = m.out;
  const int64_t n = 40;
  const std::vector<float> x = random_vector(size_t(n * in), rng);
  std::vector<float> alone(size_t(n * out));
  for (int64_t i = 0; i < n; ++i) kernel(x.data() + i * in, 1, nullptr, alone.data() + i * out, pool1, isas.front());
  for (cpu::Int8Isa isa : isas)
    for (int64_t rows : {2, 3, 5, 8, 20, 40})
      for (int64_t i0 = 0; i0 + rows <= n; i0 += rows) {
        std::vector<float> y(size_t(rows * out), std::nanf(""));
        kernel(x.data() + i0 * in, rows, nullptr, y.data(), pool2, isa);
        EXPECT_EQ(std::memcmp(y.data(), alone.data() + i0 * out, y.size() * sizeof(float)), 0)
            << cpu::int8_isa_name(isa) << " rows=" << rows << " from " << i0;
      }
}

TEST(QuantLinearInt8, TilesMatchRoundedActivationReference) {
  // The tile kernel (every n with w.tiles: decode, batches, prompts) on every instruction set
  // against the double reference of the documented rounding of x; out not a multiple of 16 (a
  // padded tile), more threads than tiles, bias or none.
  const std::vector<cpu::Int8Isa> isas = supported_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  ThreadPool pool1(1), pool3(3), pool5(5);
  std::mt19937 rng(5150);
  for (int g : {32, 64, 128})
    for (DType sd : {DType::f16, DType::bf16})
      for (int64_t in : {int64_t(g), int64_t(5) * g})
        for (int64_t out : {16, 37, 129}) {
          const QMatrix m = make_matrix(out, in, 4, g, sd, rng);
          expect_tiles_match_reference(m, isas, {&pool1, &pool3, &pool5}, rng);
        }
}

// Int8Activations::int8 (OSPREY_CPU_Q4_ACTIVATIONS=int8): x is its high int8 part alone, on
// the matvec (n = 1), the GEMM (n > 1) and the tile kernel (with tiles), every set,
// against the double reference of that rounding; and it is not the split16 result.
TEST(QuantLinearInt8, HighPartAloneMatchesItsRoundingReference) {
  const std::vector<cpu::Int8Isa> isas = supported_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(4242);
  int told_apart = 0, cases = 0;
  for (int g : {32, 64, 128})
    for (DType sd : {DType::f16, DType::bf16})
      for (int64_t in : {int64_t(g), int64_t(5) * g})
        for (int64_t out : {37, 129}) {
          const QMatrix m = make_matrix(out, in, 4, g, sd, rng);
          std::vector<uint8_t> buf;
          const QuantArgs plain = m.args(), tiled = with_tiles(m, buf, pool3);
          const std::vector<float> bias = random_vector(size_t(out), rng);
          for (int64_t n : {1, 2, 5, 8, 17, 40}) {
            std::vector<float> x = random_vector(size_t(n * in), rng);
            if (n == 5) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
            std::vector<double> ref, mag, bound, ref16, mag16, bound16;
            int8_reference(m, x, n, ref, mag, bound, /*low_part=*/false);
            int8_reference(m, x, n, ref16, mag16, bound16);
            for (cpu::Int8Isa isa : isas)
              for (ThreadPool* pool : {&pool1, &pool3})
                for (const QuantArgs* a : {&plain, &tiled}) {
                  const float* b = n % 2 ? bias.data() : nullptr;
                  std::vector<float> y(size_t(n * out), std::nanf(""));
                  cpu::linear_q4_int8(x.data(), n, *a, b, y.data(), *pool, isa, cpu::Int8Activations::int8);
                  EXPECT_LT(worst_error(y, ref, mag, out, b), 2e-6)
                      << cpu::int8_isa_name(isa) << " group=" << g << " scales=" << dtype_name(sd) << " n=" << n
                      << " in=" << in << " out=" << out << " threads=" << pool->n_threads()
                      << " tiles=" << (a == &tiled);
                  ++cases;
                  told_apart += worst_error(y, ref16, mag16, out, b) > 2e-6;
                }
          }
        }
  // The two roundings differ by up to step / 2 per value: the high part alone is not split16.
  EXPECT_GT(told_apart, cases / 2) << told_apart << " of " << cases;
}

TEST(QuantLinearInt8, TileRowsAreTheSameAloneInABatchAndOnEveryInstructionSet) {
  // A row of y from the tile kernel has the same bits for any n (a decode step, a batch, a
  // prompt), any place in the batch, any thread count and every instruction set (each lane is
  // one output row).
  const std::vector<cpu::Int8Isa> isas = supported_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937 rng(77);
  expect_rows_the_same_alone_and_batched(make_matrix(75, 640, 4, 64, DType::bf16, rng), isas, rng);
}

TEST(QuantLinearInt8, RepackForCpuFeedsTheOpAndTilesOfAnotherMatrixAreRefused) {
  std::mt19937 rng(6);
  Array w32 = random_array(37, 256, rng);
  const QuantizedMatrix q = quantize_affine(w32, 4, 64, DType::f16);
  QuantizedMatrix qt = q;
  ops::repack_for_cpu(qt);
  cpu::Int8Isa isa;
  if (!cpu::int8_isa_best(cpu_level(), &isa)) {
    EXPECT_FALSE(qt.cpu_tiles.defined()) << "tiles made for a level that does not read them";
    GTEST_SKIP() << "this CPU level has no int8 kernels";
  }
  ASSERT_TRUE(qt.cpu_tiles.defined());
  Array x = random_array(3, 256, rng);
  // The op on the tiles is the tile kernel of the level's instruction set, bit for bit.
  QuantArgs a = tile_args(q, qt);
  // Symmetric data gives MLX's quantizer q0 = 8 in every group (bias -8 scale): scales-only tiles.
  a.tiles_zero = qt.cpu_tiles_zero;
  ASSERT_TRUE(cpu::int8_isa_best(cpu_level(), &isa));
  std::vector<float> want(3 * 37);
  cpu::linear_q4_int8(x.data<float>(), 3, a, nullptr, want.data(), cpu_pool(), isa);
  const Array y = ops::linear(x, qt);
  EXPECT_EQ(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)), 0);
  // Tiles that do not fit the matrix's shape are refused by name.
  QuantizedMatrix other = quantize_affine(w32.slice_rows(0, 16), 4, 64, DType::f16);
  other.cpu_tiles = qt.cpu_tiles;
  const std::string e = testing::error_of<InvalidInput>([&] { (void)ops::linear(x, other); });
  EXPECT_NE(e.find("cpu_tiles"), std::string::npos) << "tiles of a 37-row matrix taken for a 16-row one: " << e;
  // Other bits get no tiles (8 bits get tiles of their own, tested below).
  QuantizedMatrix q6 = quantize_affine(w32, 6, 64, DType::f16);
  ops::repack_for_cpu(q6);
  EXPECT_FALSE(q6.cpu_tiles.defined());
}

// ops::keep_tiles_only: a matrix with tiles the level's linear takes drops its packed words,
// scales and biases; linear gives the same bits for every n, the shape stays, and the ops that
// read packed words refuse it by name. 4 and 8 bits (8 where the level has VNNI).
TEST(QuantLinearInt8, TilesOnlyMatrixGivesTheSameRowsAndRefusesWhatReadsPackedWords) {
  std::mt19937 rng(61);
  Array w32 = random_array(37, 256, rng);
  cpu::Int8Isa isa;
  const bool level_has = cpu::int8_isa_best(cpu_level(), &isa);
  for (int bits : {4, 8}) {
    QuantizedMatrix q = quantize_affine(w32, bits, 64, DType::bf16);
    ops::repack_for_cpu(q);
    const bool takes = level_has && (bits == 4 || cpu::int8_isa_exact_u8(isa));
    QuantizedMatrix t = q;
    ASSERT_EQ(ops::keep_tiles_only(t), takes && q.cpu_tiles.defined()) << bits << " bits";
    if (!t.tiles_only()) {
      EXPECT_TRUE(t.packed.defined());
      continue;
    }
    EXPECT_FALSE(t.packed.defined() || t.scales.defined() || t.biases.defined());
    EXPECT_EQ(t.out_features(), 37);
    EXPECT_EQ(t.in_features(), 256);
    EXPECT_EQ(t.nbytes(), t.cpu_tiles.nbytes());
    for (int64_t n : {1, 3, 9, 40}) {
      Array x = random_array(n, 256, rng);
      const Array want = ops::linear(x, q), got = ops::linear(x, t);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << bits << " bits, n=" << n;
    }
    Array ids = Array::empty({1}, DType::i32);
    ids.data<int32_t>()[0] = 3;
    for (const char* op : {"embedding", "dequantize"})
      try {
        if (std::string(op) == "embedding")
          (void)ops::embedding(t, ids);
        else
          (void)ops::dequantize(t);
        ADD_FAILURE() << op << " took a tiles-only matrix";
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("tiles only"), std::string::npos) << e.what();
      }
  }
}

TEST(QuantLinearInt8, OnlyVnniSetsTakeFullByteCodes) {
  // vpmaddubsw's pair sums overflow 16 bits for codes near 255 times 127; vpdpbusd and
  // TDPBSUD do not.
  EXPECT_FALSE(cpu::int8_isa_exact_u8(cpu::Int8Isa::avx2));
  EXPECT_FALSE(cpu::int8_isa_exact_u8(cpu::Int8Isa::avx512bw));
  EXPECT_TRUE(cpu::int8_isa_exact_u8(cpu::Int8Isa::avx_vnni));
  EXPECT_TRUE(cpu::int8_isa_exact_u8(cpu::Int8Isa::avx512_vnni));
  EXPECT_TRUE(cpu::int8_isa_exact_u8(cpu::Int8Isa::amx));
}

TEST(QuantLinearInt8, Tiles8MatchRoundedActivationReference) {
  // The 8-bit tile kernel on every VNNI set against the double reference of the documented
  // rounding of x; groups of 16 (GGUF Q6_K's) to 128, a padded tile, more threads than tiles.
  const std::vector<cpu::Int8Isa> isas = vnni_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no VNNI";
  ThreadPool pool1(1), pool3(3), pool5(5);
  std::mt19937 rng(4242);
  for (int g : {16, 32, 64, 128})
    for (DType sd : {DType::f16, DType::bf16})
      for (int64_t in : {int64_t(std::max(g, 32)), int64_t(5) * std::max(g, 32)})
        for (int64_t out : {16, 37, 129}) {
          const QMatrix m = make_matrix(out, in, 8, g, sd, rng);
          expect_tiles_match_reference(m, isas, {&pool1, &pool3, &pool5}, rng);
        }
}

TEST(QuantLinearInt8, Tile8RowsAreTheSameAloneInABatchAndOnEveryVnniSet) {
  const std::vector<cpu::Int8Isa> isas = vnni_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no VNNI";
  std::mt19937 rng(78);
  expect_rows_the_same_alone_and_batched(make_matrix(75, 640, 8, 16, DType::f16, rng), isas, rng);
}

TEST(QuantLinearInt8, RepackForCpuGivesEightBitTilesWhereTheLevelHasVnni) {
  std::mt19937 rng(16);
  Array w32 = random_array(37, 256, rng);
  const QuantizedMatrix q = quantize_affine(w32, 8, 32, DType::f16);
  QuantizedMatrix qt = q;
  ops::repack_for_cpu(qt);
  cpu::Int8Isa isa;
  if (!cpu::int8_isa_best(cpu_level(), &isa) || !cpu::int8_isa_exact_u8(isa)) {
    EXPECT_FALSE(qt.cpu_tiles.defined()) << "8-bit tiles made for a level without VNNI";
    GTEST_SKIP() << "this CPU level has no VNNI";
  }
  ASSERT_TRUE(qt.cpu_tiles.defined());
  Array x = random_array(5, 256, rng);
  const QuantArgs a = tile_args(q, qt);
  std::vector<float> want(5 * 37);
  cpu::linear_q8_tiles(x.data<float>(), 5, a, nullptr, want.data(), cpu_pool(), isa);
  const Array y = ops::linear(x, qt);
  EXPECT_EQ(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)), 0);
  // ... and within the rounding of x of the plain (f32) path on the same codes.
  const Array plain = ops::linear(x, q);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(y.data<float>()[i], plain.data<float>()[i], 2e-3 * (1.0 + std::abs(plain.data<float>()[i]))) << i;
  // 4-bit tiles are not 8-bit ones: a 4-bit matrix given these is refused by name.
  QuantizedMatrix q4 = quantize_affine(w32, 4, 32, DType::f16);
  q4.cpu_tiles = qt.cpu_tiles;
  const std::string e = testing::error_of<InvalidInput>([&] { (void)ops::linear(x, q4); });
  EXPECT_NE(e.find("cpu_tiles"), std::string::npos) << "8-bit tiles taken for a 4-bit matrix: " << e;
}

TEST(QuantLinearInt8, Tiles8RejectWhatTheyDoNotTake) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  const QMatrix m8 = make_matrix(16, 64, 8, 32, DType::f16, rng);
  const QMatrix m4 = make_matrix(16, 64, 4, 32, DType::f16, rng);
  std::vector<float> x(64 * 9, 1.0f), y(16 * 9);
  std::vector<uint8_t> tiles(size_t(cpu::q8_tiles_bytes(m8.args())));
  EXPECT_THROW(cpu::repack_q8_tiles(m4.args(), tiles.data(), pool), Unsupported);
  EXPECT_FALSE(cpu::int8_tiles8_takes(m4.args()));
  EXPECT_TRUE(cpu::int8_tiles8_takes(m8.args()));
  QuantArgs no_tiles = m8.args();
  EXPECT_THROW(cpu::linear_q8_tiles(x.data(), 1, no_tiles, nullptr, y.data(), pool, cpu::Int8Isa::avx2), Unsupported);
  cpu::repack_q8_tiles(m8.args(), tiles.data(), pool);
  QuantArgs a = m8.args();
  a.tiles = tiles.data();
  // Without VNNI.
  EXPECT_THROW(cpu::linear_q8_tiles(x.data(), 1, a, nullptr, y.data(), pool, cpu::Int8Isa::avx2), Unsupported);
  EXPECT_THROW(cpu::linear_q8_tiles(x.data(), 1, a, nullptr, y.data(), pool, cpu::Int8Isa::avx512bw), Unsupported);
}

// m with every bias replaced by -z times its scale (exact for a power-of-two z), as GGUF's
// Q4_0 (z 8), Q8_0 (z 128) and Q6_K (z 32) are held.
QMatrix make_symmetric(QMatrix m, int z) {
  const int64_t n_groups = m.in / m.group_size, words_per_row = m.in * m.bits / 32;
  for (size_t g = 0; g < m.scales.size(); ++g)
    m.biases[g] = to_half(float(-z * half_value(m.scales[g], m.scale_dtype)), m.scale_dtype);
  for (int64_t r = 0; r < m.out; ++r)
    for (int64_t i = 0; i < m.in; ++i) {
      const size_t g = size_t(r * n_groups + i / m.group_size);
      const uint32_t q = read_code(&m.packed[size_t(r * words_per_row)], i, m.bits);
      m.w[size_t(r * m.in + i)] = half_value(m.scales[g], m.scale_dtype) * double(q) + half_value(m.biases[g], m.scale_dtype);
    }
  return m;
}

// Tiles of m (4 or 8 bits) with the given tiles_zero, in buf.
QuantArgs with_tiles_zero(const QMatrix& m, int zero, std::vector<uint8_t>& buf, ThreadPool& pool) {
  QuantArgs a = m.args();
  a.tiles_zero = zero;
  buf.assign(size_t(m.bits == 8 ? cpu::q8_tiles_bytes(a) : cpu::q4_tiles_bytes(a)), 0xa5);
  if (m.bits == 8)
    cpu::repack_q8_tiles(a, buf.data(), pool);
  else
    cpu::repack_q4_tiles(a, buf.data(), pool);
  a.tiles = buf.data();
  return a;
}

TEST(QuantLinearInt8, SymmetricTilesGiveTheSameResultsFromFewerBytes) {
  // A matrix whose biases are -z times its scales: its z is found, its tiles leave the biases
  // out (bytes from the layout), and the kernels give what the tiles with biases give, float
  // for float, within the rounded-activation reference's bound.
  const std::vector<cpu::Int8Isa> isas = supported_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(1717);
  struct Case { int bits, group, z; DType sd; };
  for (const Case c : {Case{4, 32, 8, DType::f16}, Case{4, 64, 8, DType::bf16}, Case{4, 128, 4, DType::f16},
                       Case{8, 16, 32, DType::f16}, Case{8, 32, 128, DType::f16}, Case{8, 64, 128, DType::bf16}}) {
    const int64_t out = 37, in = 256;
    const QMatrix plain = make_matrix(out, in, c.bits, c.group, c.sd, rng);
    const QMatrix m = make_symmetric(plain, c.z);
    EXPECT_EQ(cpu::tiles_symmetric_zero(m.args()), c.z) << c.bits << " bits, group " << c.group;
    EXPECT_EQ(cpu::tiles_symmetric_zero(plain.args()), 0) << c.bits << " bits, group " << c.group;
    std::vector<uint8_t> with_biases, scales_only;
    const QuantArgs a0 = with_tiles_zero(m, 0, with_biases, pool3);
    const QuantArgs az = with_tiles_zero(m, c.z, scales_only, pool3);
    // Per 16-row tile and group: 16 scales (and 16 biases) of 2 bytes, then the codes.
    const int64_t n_tiles = (out + 15) / 16, n_groups = in / c.group, codes = 16 * c.group * c.bits / 8;
    EXPECT_EQ(int64_t(with_biases.size()), n_tiles * n_groups * (64 + codes));
    EXPECT_EQ(int64_t(scales_only.size()), n_tiles * n_groups * (32 + codes));
    for (int64_t n : {1, 3, 8, 16, 35}) {  // 16 and 35: AMX's runs of 16 rows (and a remainder)
      const std::vector<float> x = random_vector(size_t(n * in), rng);
      std::vector<double> ref, mag, bound;
      int8_reference(m, x, n, ref, mag, bound);
      for (cpu::Int8Isa isa : isas) {
        if (c.bits == 8 && !cpu::int8_isa_exact_u8(isa)) continue;
        for (ThreadPool* pool : {&pool1, &pool3}) {
          std::vector<float> y0(size_t(n * out), std::nanf("")), yz(size_t(n * out), std::nanf(""));
          if (c.bits == 8) {
            cpu::linear_q8_tiles(x.data(), n, a0, nullptr, y0.data(), *pool, isa);
            cpu::linear_q8_tiles(x.data(), n, az, nullptr, yz.data(), *pool, isa);
          } else {
            cpu::linear_q4_int8(x.data(), n, a0, nullptr, y0.data(), *pool, isa);
            cpu::linear_q4_int8(x.data(), n, az, nullptr, yz.data(), *pool, isa);
          }
          for (size_t i = 0; i < y0.size(); ++i)
            ASSERT_EQ(yz[i], y0[i]) << cpu::int8_isa_name(isa) << " " << c.bits << " bits, group " << c.group
                                    << " n=" << n << " at " << i;
          EXPECT_LT(worst_error(yz, ref, mag, out, nullptr), 2e-6) << cpu::int8_isa_name(isa) << " " << c.bits
                                                                    << " bits, group " << c.group << " n=" << n;
        }
      }
    }
  }
}

TEST(QuantLinearInt8, AmxRunsGiveTheVnniTileKernelsBits) {
  // AMX-INT8 takes runs of 16 rows of x through the tile unit (the rest through the VNNI tile
  // kernel): every row has the bits AVX-512 VNNI gives it, for 4 bits (groups 32-128, tiles with
  // biases and symmetric ones, x's low part or not) and 8 bits (groups 16-128), any thread
  // count, and each is within the double reference's bound of the documented rounding. The
  // shapes reach every edge of the AMX kernel's blocking (blocks of 4 weight tiles by 2 runs of
  // 16 rows, chunks of 128 codes): 3 and 10 tiles (a block of 3, a last block of 2), 1 to 6
  // runs (a last block of one run) with and without a remainder for VNNI, and an in that ends
  // in a partial chunk for groups 16-64.
  if (!cpu::int8_isa_supported(cpu::Int8Isa::amx)) GTEST_SKIP() << "this CPU (or its OS) has no AMX-INT8";
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(2024);
  struct Case { int bits, group, z; DType sd; };
  for (const Case c : {Case{4, 32, 0, DType::f16}, Case{4, 64, 0, DType::bf16}, Case{4, 128, 0, DType::f16},
                       Case{4, 32, 8, DType::f16}, Case{4, 64, 8, DType::bf16}, Case{8, 16, 0, DType::f16},
                       Case{8, 16, 32, DType::bf16}, Case{8, 32, 0, DType::bf16}, Case{8, 64, 128, DType::f16},
                       Case{8, 128, 0, DType::f16}})
    for (int64_t out : {37, 160}) {
      const int64_t in = 3 * std::max(c.group, 32) + (c.group <= 32 ? 2 * 32 : 0);
      QMatrix m = make_matrix(out, in, c.bits, c.group, c.sd, rng);
      if (c.z != 0) m = make_symmetric(m, c.z);
      std::vector<uint8_t> buf;
      const QuantArgs a = with_tiles_zero(m, c.z, buf, pool3);
      const std::vector<float> bias = random_vector(size_t(out), rng);
      for (int64_t n : {16, 31, 32, 33, 48, 64, 70, 100}) {
        const std::vector<float> x = random_vector(size_t(n * in), rng);
        for (bool lo : {true, false}) {
          if (c.bits == 8 && !lo) continue;  // the 8-bit kernels always take x's low part
          const auto act = lo ? cpu::Int8Activations::split16 : cpu::Int8Activations::int8;
          std::vector<double> ref, mag, bound;
          int8_reference(m, x, n, ref, mag, bound, lo);
          for (ThreadPool* pool : {&pool1, &pool3})
            for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
              std::vector<float> want(size_t(n * out), std::nanf("")), got(want.size(), std::nanf(""));
              if (c.bits == 8) {
                cpu::linear_q8_tiles(x.data(), n, a, b, want.data(), *pool, cpu::Int8Isa::avx512_vnni);
                cpu::linear_q8_tiles(x.data(), n, a, b, got.data(), *pool, cpu::Int8Isa::amx);
              } else {
                cpu::linear_q4_int8(x.data(), n, a, b, want.data(), *pool, cpu::Int8Isa::avx512_vnni, act);
                cpu::linear_q4_int8(x.data(), n, a, b, got.data(), *pool, cpu::Int8Isa::amx, act);
              }
              const std::string what = std::to_string(c.bits) + " bits, group " + std::to_string(c.group) + ", z " +
                                        std::to_string(c.z) + ", out " + std::to_string(out) + ", n " +
                                        std::to_string(n) + ", lo " + std::to_string(lo) + ", threads " +
                                        std::to_string(pool->n_threads());
              for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " at " << i;
              EXPECT_LT(worst_error(got, ref, mag, out, b), 2e-6) << what;
            }
        }
      }
    }
}

TEST(QuantLinearInt8, SymmetricTilesOfAMatrixThatIsNotAreRefused) {
  ThreadPool pool(1);
  std::mt19937 rng(23);
  const QMatrix plain = make_matrix(16, 64, 4, 32, DType::f16, rng);
  const QMatrix m = make_symmetric(plain, 8);
  std::vector<uint8_t> buf;
  EXPECT_THROW(with_tiles_zero(plain, 8, buf, pool), Unsupported);  // biases not -8 scales
  EXPECT_THROW(with_tiles_zero(m, 4, buf, pool), Unsupported);      // the wrong z
  EXPECT_THROW(with_tiles_zero(m, -8, buf, pool), Unsupported);
  const QMatrix m8 = make_symmetric(make_matrix(16, 64, 8, 16, DType::f16, rng), 32);
  EXPECT_THROW(with_tiles_zero(m8, 16, buf, pool), Unsupported);
  // One group off by one bias value is enough to make a matrix not symmetric.
  QMatrix off = m;
  off.biases[5] = uint16_t(off.biases[5] ^ 1u);
  EXPECT_EQ(cpu::tiles_symmetric_zero(off.args()), 0);
  EXPECT_THROW(with_tiles_zero(off, 8, buf, pool), Unsupported);
}

TEST(QuantLinearInt8, RepackForCpuKeepsTheScalesAloneOfASymmetricMatrix) {
  std::mt19937 rng(31);
  Array w32 = random_array(40, 256, rng);
  QuantizedMatrix q = quantize_affine(w32, 4, 32, DType::f16);
  // Q4_0's form: every bias -8 times its scale.
  uint16_t* s = q.scales.data<uint16_t>();
  uint16_t* b = q.biases.data<uint16_t>();
  for (int64_t i = 0; i < q.scales.numel(); ++i) b[i] = f32_to_f16(-8.0f * f16_to_f32(s[i]));
  QuantizedMatrix qt = q;
  ops::repack_for_cpu(qt);
  cpu::Int8Isa isa;
  if (!cpu::int8_isa_best(cpu_level(), &isa)) GTEST_SKIP() << "this CPU level has no integer kernels";
  ASSERT_TRUE(qt.cpu_tiles.defined());
  EXPECT_EQ(qt.cpu_tiles_zero, 8);
  EXPECT_EQ(int64_t(qt.cpu_tiles.nbytes()), 3 * 8 * (32 + 16 * 16));  // 3 tiles, 8 groups
  Array x = random_array(2, 256, rng);
  // The op equals the tile kernel on tiles that keep the biases.
  QuantArgs a;
  a.packed = q.packed.data<uint32_t>();
  a.scales = q.scales.raw();
  a.biases = q.biases.raw();
  a.scale_dtype = DType::f16;
  a.bits = 4;
  a.group_size = 32;
  a.out = 40;
  a.in = 256;
  std::vector<uint8_t> tiles(size_t(cpu::q4_tiles_bytes(a)));
  cpu::repack_q4_tiles(a, tiles.data(), cpu_pool());
  a.tiles = tiles.data();
  std::vector<float> want(2 * 40);
  cpu::linear_q4_int8(x.data<float>(), 2, a, nullptr, want.data(), cpu_pool(), isa);
  const Array y = ops::linear(x, qt);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << i;
  // A zero that does not fit the tiles' size is refused by name.
  QuantizedMatrix wrong = qt;
  wrong.cpu_tiles_zero = 0;
  try {
    (void)ops::linear(x, wrong);
    ADD_FAILURE() << "symmetric tiles read as tiles with biases";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_tiles"), std::string::npos) << e.what();
  }
}

TEST(QuantLinearInt8, RejectsWhatItDoesNotTake) {
  ThreadPool pool(1);
  std::mt19937 rng(2);
  const QMatrix m = make_matrix(4, 64, 8, 32, DType::f16, rng);
  std::vector<float> x(64, 1.0f), y(4);
  EXPECT_THROW(cpu::linear_q4_int8(x.data(), 1, m.args(), nullptr, y.data(), pool, cpu::Int8Isa::avx2), Unsupported);
  std::vector<uint8_t> tiles(64);
  EXPECT_THROW(cpu::repack_q4_tiles(m.args(), tiles.data(), pool), Unsupported);
}

TEST_P(QuantLinear, DequantizeRowsMatchesReference) {
  std::mt19937 rng(5);
  for (int bits : {2, 3, 4, 6, 8})
    for (int g : {16, 32, 64, 128})
      for (DType sd : {DType::f16, DType::bf16}) {
        if (!supported_quant_group(bits, g)) continue;
        const QMatrix m = make_matrix(23, 3 * g, bits, g, sd, rng);
        const std::vector<int32_t> rows = {0, 22, 7, 7, 13, 1};
        const int64_t n = int64_t(rows.size());
        for (float scale : {1.0f, 0.37f}) {
          std::vector<float> out(size_t(n * m.in), std::nanf(""));
          cpu::kernels().dequantize_rows(m.args(), rows.data(), n, scale, out.data());
          for (int64_t i = 0; i < n; ++i)
            for (int64_t k = 0; k < m.in; ++k) {
              const double w = m.w[size_t(rows[size_t(i)] * m.in + k)];
              const float got = out[size_t(i * m.in + k)];
              if (scale == 1.0f) {
                // scale * q + bias is exact in double here, so its f32 rounding is the answer.
                ASSERT_EQ(got, float(w)) << "bits=" << bits << " group=" << g << " row=" << rows[size_t(i)]
                                         << " k=" << k;
              } else {
                // Rounded to f32, then scaled in f32: within one f32 ulp of the exact product.
                const double want = w * double(scale);
                ASSERT_LE(std::abs(double(got) - want), std::abs(want) * 1.2e-7 + 1e-30)
                    << "bits=" << bits << " group=" << g << " row=" << rows[size_t(i)] << " k=" << k;
              }
            }
        }
      }
}

TEST_P(QuantLinear, DequantizeMatchesReference) {
  std::mt19937 rng(6);
  for (int bits : {2, 3, 4, 6, 8})
    for (int g : {16, 32, 64, 128})
      for (DType sd : {DType::f16, DType::bf16}) {
        if (!supported_quant_group(bits, g)) continue;
        const QMatrix m = make_matrix(19, 5 * g, bits, g, sd, rng);
        const size_t count = size_t(m.out * m.in);
        std::vector<float> f32(count, std::nanf(""));
        cpu::kernels().dequantize(m.args(), DType::f32, f32.data());
        for (size_t e = 0; e < count; ++e)
          ASSERT_EQ(f32[e], float(m.w[e])) << "bits=" << bits << " group=" << g << " element " << e;
        for (DType od : {DType::f16, DType::bf16}) {
          std::vector<uint16_t> h(count, 0xffffu);
          cpu::kernels().dequantize(m.args(), od, h.data());
          // Nearest rounding to 11 (f16) or 8 (bf16) significant bits, plus f16's subnormal step.
          const double rel = od == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
          const double abs_step = od == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
          for (size_t e = 0; e < count; ++e)
            ASSERT_LE(std::abs(half_value(h[e], od) - m.w[e]), std::abs(m.w[e]) * rel + abs_step)
                << "out=" << dtype_name(od) << " bits=" << bits << " group=" << g << " element " << e;
        }
      }
}

TEST_P(QuantLinear, RejectsUnsupportedFormats) {
  ThreadPool pool(1);
  std::mt19937 rng(1);
  const QMatrix m = make_matrix(4, 64, 4, 32, DType::f16, rng);
  std::vector<float> x(64, 1.0f), y(4);
  QuantArgs a = m.args();
  a.bits = 5;
  EXPECT_THROW(cpu::kernels().linear_q(x.data(), 1, a, nullptr, y.data(), pool), Unsupported);
  a = m.args();
  a.group_size = 16;
  EXPECT_THROW(cpu::kernels().linear_q(x.data(), 1, a, nullptr, y.data(), pool), Unsupported);
  std::vector<int32_t> out(size_t(m.out * m.in));
  EXPECT_THROW(cpu::kernels().dequantize(m.args(), DType::i32, out.data()), Unsupported);
}

// Throughput on this machine (run with --gtest_also_run_disabled_tests), with x in f32 and
// through linear_q (int8 x): a 4-bit g64 f16-scale matvec of out 4096 x in 14336 (rotating over 4 matrices so that w comes from memory), in GB/s
// of w read (codes, scales and biases), and the same matrix times n = 512 rows, in GFLOP/s.
using testing::best_seconds;

// Random words and scales, with no reference weights (too large to keep in double).
QMatrix make_bench_matrix(int64_t out, int64_t in, std::mt19937& rng) {
  QMatrix m;
  m.out = out;
  m.in = in;
  m.bits = 4;
  m.group_size = 64;
  m.packed.resize(size_t(out * in / 8));
  for (auto& w : m.packed) w = rng();
  m.scales.resize(size_t(out * in / 64));
  m.biases.resize(m.scales.size());
  for (size_t g = 0; g < m.scales.size(); ++g) {
    m.scales[g] = f32_to_f16(0.01f);
    m.biases[g] = f32_to_f16(-0.08f);
  }
  return m;
}

TEST_P(QuantLinear, DISABLED_QuantLinearThroughput) {
  std::mt19937 rng(11);
  const int64_t out = 4096, in = 14336;
  std::vector<QMatrix> ms;
  for (int i = 0; i < 4; ++i) ms.push_back(make_bench_matrix(out, in, rng));
  const double w_bytes = double(ms[0].packed.size()) * 4 + double(ms[0].scales.size()) * 4;
  using Kernel = void (*)(const float*, int64_t, const QuantArgs&, const float*, float*, ThreadPool&);
  for (const auto& [name, kernel] : {std::pair<const char*, Kernel>{"f32 x", cpu::kernels().linear_q_f32},
                                     std::pair<const char*, Kernel>{"linear_q", cpu::kernels().linear_q}})
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::cout << name << ":\n";
    {
      const std::vector<float> x = random_vector(size_t(in), rng);
      std::vector<float> y(static_cast<size_t>(out));
      const double s = best_seconds(16, [&](int r) {
        kernel(x.data(), 1, ms[size_t(r % 4)].args(), nullptr, y.data(), pool);
      });
      std::cout << "q4 g64 matvec " << out << "x" << in << ", " << threads << " threads: " << w_bytes / s / 1e9
                << " GB/s of w (" << s * 1e3 << " ms)\n";
    }
    for (int64_t n : {4, 16}) {
      const std::vector<float> x = random_vector(size_t(n * in), rng);
      std::vector<float> y(size_t(n * out));
      const double s = best_seconds(8, [&](int r) {
        kernel(x.data(), n, ms[size_t(r % 4)].args(), nullptr, y.data(), pool);
      });
      std::cout << "q4 g64 n=" << n << ", " << threads << " threads: " << w_bytes / s / 1e9 << " GB/s of w, "
                << 2.0 * n * in * out / s / 1e9 << " GFLOP/s\n";
    }
    {
      const int64_t n = 512;
      const std::vector<float> x = random_vector(size_t(n * in), rng);
      std::vector<float> y(size_t(n * out));
      const double s = best_seconds(1, [&](int) {
        kernel(x.data(), n, ms[0].args(), nullptr, y.data(), pool);
      });
      std::cout << "q4 g64 gemm n=" << n << ", " << threads << " threads: " << 2.0 * n * in * out / s / 1e9
                << " GFLOP/s\n";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuLevels, QuantLinear, OSPREY_ALL_CPU_LEVELS);

}  // namespace
}  // namespace osprey
