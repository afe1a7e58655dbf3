// Batch invariance (ops::set_batch_invariant): with the mode on, row i of every row-wise op's
// result over n rows must equal, byte for byte, the op applied to that row alone, on every
// device, for the dense (f32, f16, bf16) and MLX-quantized (4 and 8 bits, group 64) linear
// layers and for the norms, activations, rotary embedding, embedding lookups and element-wise
// ops. Invariant-mode linear layers are also checked against a double-precision reference, so
// that a kernel cannot pass by being consistently wrong. argmax_rows against a plain host
// argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/quantize.h"
#include "support/device_test.h"
#include "support/numeric.h"

namespace osprey {
namespace {

using testing::random_floats;
using testing::rel_error;

// Row counts of a batch: below, at and past the GEMV chunk (8) and the CPU kernels' switch
// points (16), and a large batch.
const std::vector<int64_t> kRowCounts = {1, 2, 7, 8, 9, 16, 17, 33, 64, 100};
constexpr int64_t kMaxRows = 100;

// Turns the mode on for a scope and off again, whatever the test does.
struct InvariantMode {
  InvariantMode() { ops::set_batch_invariant(true); }
  ~InvariantMode() { ops::set_batch_invariant(false); }
  InvariantMode(const InvariantMode&) = delete;
  InvariantMode& operator=(const InvariantMode&) = delete;
};

class BatchInvariant : public testing::DeviceTest {
 protected:
  void TearDown() override { EXPECT_FALSE(ops::batch_invariant()) << "the mode leaked out of the test"; }

  // Rows [first, first + count) of a host matrix [*, row] on the device.
  Array rows_on_device(const std::vector<float>& v, int64_t row, int64_t first, int64_t count) const {
    return on_device({v.begin() + first * row, v.begin() + (first + count) * row}, {count, row});
  }
  Array ids_on_device(const std::vector<int32_t>& v, int64_t first, int64_t count) const {
    return upload(std::vector<int32_t>(v.begin() + first, v.begin() + first + count), {count}, DType::i32);
  }

  // f(first, count) runs the op on input rows [first, first + count) and returns its result
  // [count, width] on the host. Every row of every batch size must equal its row alone.
  void expect_rows_invariant(const std::string& what, int64_t width,
                             const std::function<std::vector<float>(int64_t, int64_t)>& f) const {
    InvariantMode mode;
    std::vector<std::vector<float>> alone(kMaxRows);
    for (int64_t i = 0; i < kMaxRows; ++i) {
      alone[size_t(i)] = f(i, 1);
      ASSERT_EQ(int64_t(alone[size_t(i)].size()), width) << what;
    }
    for (int64_t n : kRowCounts) {
      const std::vector<float> got = f(0, n);
      ASSERT_EQ(int64_t(got.size()), n * width) << what << " n=" << n;
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float* g = got.data() + i * width;
        const float* a = alone[size_t(i)].data();
        if (std::memcmp(g, a, size_t(width) * sizeof(float)) == 0) continue;
        int64_t c = 0;
        while (std::memcmp(g + c, a + c, sizeof(float)) == 0) ++c;
        if (++mismatches <= 3)
          ADD_FAILURE() << what << ": n=" << n << ", row " << i << " differs from the row alone at column " << c
                        << " (" << g[c] << " vs " << a[c] << ")";
      }
      EXPECT_EQ(mismatches, 0) << what << " n=" << n;
    }
  }
};

// ---- the mode itself ----------------------------------------------------------------------

TEST_P(BatchInvariant, ModeIsOffByDefaultAndTheGuardRestoresIt) {
  EXPECT_FALSE(ops::batch_invariant());
  {
    InvariantMode mode;
    EXPECT_TRUE(ops::batch_invariant());
  }
  EXPECT_FALSE(ops::batch_invariant());
}

// ---- linear layers ------------------------------------------------------------------------

struct LinearShape {
  int64_t in, out;
};

// y = x w^T + b in double, w [out, in] as the kernels see it (already rounded to its dtype).
std::vector<double> linear_ref(const std::vector<float>& x, int64_t n, const std::vector<float>& w,
                               const std::vector<float>& b, int64_t in, int64_t out) {
  std::vector<double> y(size_t(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double s = b.empty() ? 0.0 : double(b[size_t(r)]);
      for (int64_t k = 0; k < in; ++k) s += double(x[size_t(i * in + k)]) * double(w[size_t(r * in + k)]);
      y[size_t(i * out + r)] = s;
    }
  return y;
}

TEST_P(BatchInvariant, DenseLinearRowsMatchTheRowAlone) {
  std::mt19937 rng(101);
  // in 203: not a whole number of SIMD blocks or 16-byte chunks (the kernels' tails and the
  // CUDA scalar kernel); 1024 x 300: several threads and tiles.
  for (const LinearShape s : {LinearShape{203, 37}, LinearShape{1024, 300}}) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const std::vector<float> x = random_floats(size_t(kMaxRows * s.in), rng, -2.0f, 2.0f);
      const std::vector<float> b = random_floats(size_t(s.out), rng);
      Array w32 = Array::empty({s.out, s.in}, DType::f32);
      const std::vector<float> wv = random_floats(size_t(s.out * s.in), rng, -0.5f, 0.5f);
      std::copy(wv.begin(), wv.end(), w32.data<float>());
      Array w_cpu = ops::cast(w32, dt);
      Array w = ops::to_device(w_cpu, device());
      Array bias = on_device(b, {s.out});
      const std::string what = std::string("linear ") + dtype_name(dt) + " [" + std::to_string(s.out) + ", " +
                               std::to_string(s.in) + "]";
      for (bool with_bias : {false, true})
        expect_rows_invariant(what + (with_bias ? " + bias" : ""), s.out, [&](int64_t first, int64_t count) {
          return host(ops::linear(rows_on_device(x, s.in, first, count), w, with_bias ? bias : Array{}));
        });
      // Still the right product: every row of the largest batch near the double reference.
      InvariantMode mode;
      const std::vector<float> got = host(ops::linear(rows_on_device(x, s.in, 0, kMaxRows), w, bias));
      const std::vector<float> w_seen = host(w_cpu);
      EXPECT_LT(rel_error(got, linear_ref(x, kMaxRows, w_seen, b, s.in, s.out)), 1e-5) << what;
    }
  }
}

TEST_P(BatchInvariant, QuantizedLinearRowsMatchTheRowAlone) {
  std::mt19937 rng(102);
  for (const LinearShape s : {LinearShape{320, 37}, LinearShape{1024, 300}}) {
    for (int bits : {4, 8}) {
      for (DType sdt : {DType::f16, DType::bf16}) {
        const std::vector<float> x = random_floats(size_t(kMaxRows * s.in), rng, -2.0f, 2.0f);
        const std::vector<float> b = random_floats(size_t(s.out), rng);
        Array w32 = Array::empty({s.out, s.in}, DType::f32);
        const std::vector<float> wv = random_floats(size_t(s.out * s.in), rng, -0.5f, 0.5f);
        std::copy(wv.begin(), wv.end(), w32.data<float>());
        const QuantizedMatrix q_cpu = quantize_affine(w32, bits, 64, sdt);
        QuantizedMatrix q = q_cpu;
        q.packed = ops::to_device(q_cpu.packed, device());
        q.scales = ops::to_device(q_cpu.scales, device());
        q.biases = ops::to_device(q_cpu.biases, device());
        Array bias = on_device(b, {s.out});
        // On the CPU, 4 bits (8 with VNNI): the tiles made at load (the tile kernel, every n).
        ops::repack_for_cpu(q);
        const std::string what = "linear q" + std::to_string(bits) + " g64 " + dtype_name(sdt) + " [" +
                                 std::to_string(s.out) + ", " + std::to_string(s.in) + "]" +
                                 (q.cpu_tiles.defined() ? " tiles" : "");
        for (bool with_bias : {false, true})
          expect_rows_invariant(what + (with_bias ? " + bias" : ""), s.out, [&](int64_t first, int64_t count) {
            return host(ops::linear(rows_on_device(x, s.in, first, count), q, with_bias ? bias : Array{}));
          });
        // Against the dequantized weights in double (the CPU's 4-bit path rounds x to about
        // 16 bits, hence the looser bound).
        InvariantMode mode;
        const std::vector<float> got = host(ops::linear(rows_on_device(x, s.in, 0, kMaxRows), q, bias));
        const std::vector<float> w_seen = host(ops::dequantize(q_cpu, DType::f32));
        EXPECT_LT(rel_error(got, linear_ref(x, kMaxRows, w_seen, b, s.in, s.out)), 1e-4) << what;
      }
    }
  }
}

// ---- norms --------------------------------------------------------------------------------

// 67: odd widths put a row's elements at different SIMD / float4 positions in a batch than
// alone; 1536 needs more than one pass of a 1024-thread block.
const std::vector<int64_t> kWidths = {67, 256, 1536};

TEST_P(BatchInvariant, NormRowsMatchTheRowAlone) {
  std::mt19937 rng(103);
  for (int64_t d : kWidths) {
    const std::vector<float> x = random_floats(size_t(kMaxRows * d), rng, -3.0f, 3.0f);
    const std::vector<float> y = random_floats(size_t(kMaxRows * d), rng, -3.0f, 3.0f);
    Array w = on_device(random_floats(size_t(d), rng, 0.5f, 1.5f), {d});
    Array bias = on_device(random_floats(size_t(d), rng), {d});
    const std::string sd = " d=" + std::to_string(d);
    for (bool unit_offset : {false, true})
      expect_rows_invariant("rms_norm" + sd + (unit_offset ? " (1 + w)" : ""), d, [&](int64_t first, int64_t count) {
        return host(ops::rms_norm(rows_on_device(x, d, first, count), w, 1e-6f, unit_offset));
      });
    expect_rows_invariant("layer_norm" + sd, d, [&](int64_t first, int64_t count) {
      return host(ops::layer_norm(rows_on_device(x, d, first, count), w, bias, 1e-5f));
    });
    expect_rows_invariant("layer_norm without bias" + sd, d, [&](int64_t first, int64_t count) {
      return host(ops::layer_norm(rows_on_device(x, d, first, count), w, Array{}, 1e-5f));
    });
    // add_rms_norm: both the normed output and the updated residual.
    expect_rows_invariant("add_rms_norm" + sd, 2 * d, [&](int64_t first, int64_t count) {
      Array xa = rows_on_device(x, d, first, count);
      const std::vector<float> normed = host(ops::add_rms_norm(xa, rows_on_device(y, d, first, count), w, 1e-6f));
      const std::vector<float> sum = host(xa);
      std::vector<float> both;
      for (int64_t i = 0; i < count; ++i) {
        both.insert(both.end(), normed.begin() + i * d, normed.begin() + (i + 1) * d);
        both.insert(both.end(), sum.begin() + i * d, sum.begin() + (i + 1) * d);
      }
      return both;
    });
  }
}

// The q heads of fused q/k/v rows (strided rows), normed and rotated in place.
TEST_P(BatchInvariant, HeadNormAndRopeRowsMatchTheRowAlone) {
  std::mt19937 rng(104);
  const int64_t nh = 4, nkv = 2;
  for (int64_t hd : {64, 128}) {
    const int64_t row = (nh + 2 * nkv) * hd, width = nh * hd;
    const std::vector<float> x = random_floats(size_t(kMaxRows * row), rng, -3.0f, 3.0f);
    Array w = on_device(random_floats(size_t(hd), rng, 0.5f, 1.5f), {hd});
    std::vector<int32_t> pos(kMaxRows);
    for (auto& p : pos) p = int32_t(rng() % 4096);
    std::vector<float> inv(size_t(hd / 2));
    for (int64_t k = 0; k < hd / 2; ++k) inv[size_t(k)] = float(std::pow(10000.0, -2.0 * double(k) / double(hd)));
    Array inv_freq = on_device(inv, {hd / 2});
    auto q_heads = [&](const Array& xa, int64_t count) {
      return Array::strided(xa.buffer(), xa.byte_offset(), {count, nh, hd}, {row, hd, 1}, DType::f32);
    };
    // The q heads of the rows, after the op, as [count, width].
    auto q_part = [&](const Array& xa, int64_t count) {
      const std::vector<float> all = host(xa);
      std::vector<float> q;
      for (int64_t i = 0; i < count; ++i) q.insert(q.end(), all.begin() + i * row, all.begin() + i * row + width);
      return q;
    };
    const std::string sh = " head_dim=" + std::to_string(hd);
    for (bool unit_offset : {false, true})
      expect_rows_invariant("head_rms_norm_" + sh, width, [&](int64_t first, int64_t count) {
        Array xa = rows_on_device(x, row, first, count);
        Array q = q_heads(xa, count);
        ops::head_rms_norm_(q, w, 1e-6f, unit_offset);
        return q_part(xa, count);
      });
    for (bool interleaved : {false, true})
      expect_rows_invariant(std::string("rope_") + (interleaved ? " interleaved" : "") + sh, width,
                            [&](int64_t first, int64_t count) {
                              Array xa = rows_on_device(x, row, first, count);
                              Array q = q_heads(xa, count);
                              ops::rope_(q, ids_on_device(pos, first, count), inv_freq, interleaved, 1.25f);
                              return q_part(xa, count);
                            });
  }
}

// ---- activations and element-wise ops -----------------------------------------------------

TEST_P(BatchInvariant, ActivationRowsMatchTheRowAlone) {
  std::mt19937 rng(105);
  for (int64_t f : kWidths) {
    const std::vector<float> gate = random_floats(size_t(kMaxRows * f), rng, -6.0f, 6.0f);
    const std::vector<float> up = random_floats(size_t(kMaxRows * f), rng, -3.0f, 3.0f);
    const std::vector<float> gu = random_floats(size_t(kMaxRows * 2 * f), rng, -6.0f, 6.0f);
    const std::string sf = " f=" + std::to_string(f);
    expect_rows_invariant("silu_mul" + sf, f, [&](int64_t first, int64_t count) {
      return host(ops::silu_mul(rows_on_device(gate, f, first, count), rows_on_device(up, f, first, count)));
    });
    expect_rows_invariant("gelu_tanh_mul" + sf, f, [&](int64_t first, int64_t count) {
      return host(ops::gelu_tanh_mul(rows_on_device(gate, f, first, count), rows_on_device(up, f, first, count)));
    });
    expect_rows_invariant("silu_mul_split" + sf, f, [&](int64_t first, int64_t count) {
      return host(ops::silu_mul_split(rows_on_device(gu, 2 * f, first, count)));
    });
    expect_rows_invariant("gelu_tanh_mul_split" + sf, f, [&](int64_t first, int64_t count) {
      return host(ops::gelu_tanh_mul_split(rows_on_device(gu, 2 * f, first, count)));
    });
  }
}

TEST_P(BatchInvariant, ElementwiseRowsMatchTheRowAlone) {
  std::mt19937 rng(106);
  for (int64_t d : kWidths) {
    const std::vector<float> x = random_floats(size_t(kMaxRows * d), rng, -60.0f, 60.0f);
    const std::vector<float> y = random_floats(size_t(kMaxRows * d), rng, -3.0f, 3.0f);
    const std::string sd = " d=" + std::to_string(d);
    expect_rows_invariant("add_" + sd, d, [&](int64_t first, int64_t count) {
      Array xa = rows_on_device(x, d, first, count);
      ops::add_(xa, rows_on_device(y, d, first, count));
      return host(xa);
    });
    expect_rows_invariant("scale_" + sd, d, [&](int64_t first, int64_t count) {
      Array xa = rows_on_device(x, d, first, count);
      ops::scale_(xa, 0.37f);
      return host(xa);
    });
    expect_rows_invariant("softcap_" + sd, d, [&](int64_t first, int64_t count) {
      Array xa = rows_on_device(x, d, first, count);
      ops::softcap_(xa, 30.0f);
      return host(xa);
    });
    for (DType dt : {DType::f16, DType::bf16})
      expect_rows_invariant(std::string("cast to ") + dtype_name(dt) + " and back" + sd, d,
                            [&](int64_t first, int64_t count) {
                              return host(ops::cast(ops::cast(rows_on_device(x, d, first, count), dt), DType::f32));
                            });
  }
}

TEST_P(BatchInvariant, EmbeddingRowsMatchTheRowAlone) {
  std::mt19937 rng(107);
  const int64_t vocab = 97, d = 192;
  std::vector<int32_t> ids(kMaxRows);
  for (auto& id : ids) id = int32_t(rng() % vocab);
  Array t32 = Array::empty({vocab, d}, DType::f32);
  const std::vector<float> tv = random_floats(size_t(vocab * d), rng);
  std::copy(tv.begin(), tv.end(), t32.data<float>());
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Array table = ops::to_device(ops::cast(t32, dt), device());
    expect_rows_invariant(std::string("embedding ") + dtype_name(dt), d, [&](int64_t first, int64_t count) {
      return host(ops::embedding(table, ids_on_device(ids, first, count), 1.5f));
    });
  }
  for (int bits : {4, 8}) {
    const QuantizedMatrix q_cpu = quantize_affine(t32, bits, 64, DType::bf16);
    QuantizedMatrix q = q_cpu;
    q.packed = ops::to_device(q_cpu.packed, device());
    q.scales = ops::to_device(q_cpu.scales, device());
    q.biases = ops::to_device(q_cpu.biases, device());
    expect_rows_invariant("embedding q" + std::to_string(bits), d, [&](int64_t first, int64_t count) {
      return host(ops::embedding(q, ids_on_device(ids, first, count), 1.5f));
    });
  }
}

// ---- argmax_rows --------------------------------------------------------------------------

// The lowest index of the row's maximum, NaN ranking as -inf (0 for a row of NaN), and
// whether the row holds a NaN or an infinity.
std::pair<int32_t, int32_t> host_argmax(const float* row, int64_t vocab) {
  int64_t best = -1;
  double best_v = 0.0;
  bool bad = false;
  for (int64_t i = 0; i < vocab; ++i) {
    const double v = std::isnan(row[i]) ? -INFINITY : double(row[i]);
    if (!std::isfinite(row[i])) bad = true;
    if (best < 0 || v > best_v) best = i, best_v = v;
  }
  return {int32_t(best), bad ? 1 : 0};
}

TEST_P(BatchInvariant, ArgmaxRowsMatchesAHostArgmax) {
  std::mt19937 rng(108);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t vocab : {1, 5, 1000, 40000}) {
    for (int64_t n : {1, 3, 17, 64}) {
      // Values on a coarse grid, so that ties are common; special rows after the first.
      std::vector<float> v(size_t(n * vocab));
      for (auto& e : v) e = float(int(rng() % 16)) - 8.0f;
      for (int64_t i = 1; i < n; ++i) {
        float* row = v.data() + i * vocab;
        const int64_t at = int64_t(rng() % uint32_t(vocab)), at2 = int64_t(rng() % uint32_t(vocab));
        switch (i % 8) {
          case 1: row[at] = nan; break;                         // a NaN among finite values
          case 2: row[at] = inf; row[at2] = inf; break;         // +inf twice: the lower index
          case 3: row[at] = -inf; break;                        // -inf: flagged, never chosen over finite
          case 4: std::fill(row, row + vocab, nan); break;      // all NaN: 0
          case 5:                                               // NaN and -inf only
            std::fill(row, row + vocab, nan);
            row[at] = -inf;
            break;
          case 6: std::fill(row, row + vocab, 2.5f); break;     // all tied: 0
          case 7: row[vocab - 1] = 100.0f; break;               // the last id
          default: break;
        }
      }
      Array logits = on_device(v, {n, vocab});
      Array out = ops::to_device(Array::empty({n}, DType::i32), device());
      Array bad = ops::to_device(Array::empty({n}, DType::i32), device());
      ops::argmax_rows(logits, out, bad);
      Array out_h = ops::to_device(out, Device::cpu()), bad_h = ops::to_device(bad, Device::cpu());
      for (int64_t i = 0; i < n; ++i) {
        const auto [id, flag] = host_argmax(v.data() + i * vocab, vocab);
        EXPECT_EQ(out_h.data<int32_t>()[i], id) << "vocab=" << vocab << " n=" << n << " row " << i;
        EXPECT_EQ(bad_h.data<int32_t>()[i], flag) << "vocab=" << vocab << " n=" << n << " row " << i;
      }
    }
  }
}

// Masked (constrained greedy decoding): the lowest allowed index of the allowed maximum, -1
// when the row's mask allows nothing; ids past the mask's words are not allowed.
TEST_P(BatchInvariant, MaskedArgmaxRowsMatchesAHostArgmaxOverTheAllowedIds) {
  std::mt19937 rng(2024);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t vocab : {1, 37, 1000, 40000}) {
    for (int64_t n : {1, 5, 16}) {
      // Masks one word short of the vocabulary on every other case (the tail is then banned).
      const int64_t full = (vocab + 31) / 32, words = (n % 2 == 1 || full == 1) ? full : full - 1;
      std::vector<float> v(size_t(n * vocab));
      for (auto& e : v) e = float(int(rng() % 16)) - 8.0f;
      std::vector<uint32_t> m(size_t(n * words));
      for (int64_t i = 0; i < n; ++i) {
        uint32_t* row = m.data() + i * words;
        switch (i % 4) {
          case 0: for (int64_t w = 0; w < words; ++w) row[w] = uint32_t(rng()) & uint32_t(rng()); break;  // ~1/4
          case 1: if (i != 1 || vocab < 3) break; row[0] = 1u << 2; v[size_t(i * vocab + 1)] = 1e9f; break;  // one id
          case 2: for (int64_t w = 0; w < words; ++w) row[w] = ~0u; v[size_t(i * vocab)] = nan; break;
          default: row[words - 1] = 0x80000000u; break;  // at most the last id the mask reaches
        }
      }
      Array logits = on_device(v, {n, vocab});
      Array mask_host = Array::empty({n, words}, DType::u32);
      std::copy(m.begin(), m.end(), mask_host.data<uint32_t>());
      Array allowed = ops::to_device(mask_host, device());
      Array out = ops::to_device(Array::empty({n}, DType::i32), device());
      Array bad = ops::to_device(Array::empty({n}, DType::i32), device());
      ops::argmax_rows(logits, out, bad, allowed);
      Array out_h = ops::to_device(out, Device::cpu()), bad_h = ops::to_device(bad, Device::cpu());
      for (int64_t i = 0; i < n; ++i) {
        const float* row = v.data() + i * vocab;
        int64_t best = -1;
        double best_v = 0.0;
        bool flag = false;
        for (int64_t j = 0; j < vocab; ++j) {
          if (!std::isfinite(row[j])) flag = true;
          const bool ok = j < words * 32 && ((m[size_t(i * words + j / 32)] >> (j % 32)) & 1u);
          const double x = std::isnan(row[j]) ? -INFINITY : double(row[j]);
          if (ok && (best < 0 || x > best_v)) best = j, best_v = x;
        }
        EXPECT_EQ(out_h.data<int32_t>()[i], int32_t(best)) << "vocab=" << vocab << " n=" << n << " row " << i;
        EXPECT_EQ(bad_h.data<int32_t>()[i], flag ? 1 : 0) << "vocab=" << vocab << " n=" << n << " row " << i;
      }
    }
  }
}

TEST_P(BatchInvariant, ArgmaxRowsNamesABadArgument) {
  Array logits = on_device(std::vector<float>(12, 0.0f), {3, 4});
  Array out = ops::to_device(Array::empty({3}, DType::i32), device());
  Array bad = ops::to_device(Array::empty({3}, DType::i32), device());
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "(no InvalidInput)";
  };
  Array flat = on_device(std::vector<float>(12, 0.0f), {12});
  EXPECT_NE(message([&] { ops::argmax_rows(flat, out, bad); }).find("logits must"), std::string::npos);
  Array short_out = ops::to_device(Array::empty({2}, DType::i32), device());
  EXPECT_NE(message([&] { ops::argmax_rows(logits, short_out, bad); }).find("out must"), std::string::npos);
  Array f32_flags = ops::to_device(Array::empty({3}, DType::f32), device());
  EXPECT_NE(message([&] { ops::argmax_rows(logits, out, f32_flags); }).find("nonfinite must"), std::string::npos);
  Array i32_mask = ops::to_device(Array::empty({3, 1}, DType::i32), device());
  EXPECT_NE(message([&] { ops::argmax_rows(logits, out, bad, i32_mask); }).find("allowed must"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(BatchInvariantDevices, BatchInvariant, OSPREY_DEVICE_LEVELS);

}  // namespace
}  // namespace osprey
