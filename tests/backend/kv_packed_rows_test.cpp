// The CPU attention kernels' in-register decoding of packed K/V rows (backend/cpu/kv_rows.h), at
// every level of the kernels, dense and paged, with one query vector per kv head (paged: decoded
// where read) and eight (paged: one dequantized copy shared): every fp8 code and every q8_0
// byte, under extreme q8_0 scales, against values decoded here independently (fp8 by
// formats/hub_quant's e4m3 table, q8_0 as its f16 scale times the int8).
//  - Values: with one cached key the softmax weight is exactly 1, so the output is the value row
//    itself, bit for bit (NaN for fp8's NaN codes 0x7f and 0xff).
//  - Keys: with two cached keys, the one under test and a zero row, over values e0 and e1, the
//    output's first two elements are p0 / (p0 + p1) and p1 / (p0 + p1), so the key's score is
//    log(out[0] / out[1]). A one-hot query picks one element of the key; its weight sets the
//    score near +-4, so that a wrong code (at least 1/16 off, relatively) is far outside the
//    rounding of the softmax (a few float ulps, 1e-5 relative is allowed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/half.h"
#include "formats/hub_quant.h"
#include "support/cpu_levels.h"

namespace osprey {
namespace {

enum class Layout { dense, paged };

constexpr int64_t kBlockRows = 16;  // paged: rows per block

// One decode query over n_keys cached rows per kv head. k_rows / v_rows: [n_kv][n_keys] rows of
// packed_row_width(type, hd) elements' bytes; q: [n_heads * hd]. Returns [n_heads * hd].
std::vector<float> decode(Layout layout, DType kt, DType vt, const std::vector<std::vector<uint8_t>>& k_rows,
                          const std::vector<std::vector<uint8_t>>& v_rows, const std::vector<float>& q, int64_t n_kv,
                          int64_t n_heads, int64_t hd, int64_t n_keys) {
  const int64_t kw = packed_row_width(kt, hd) * int64_t(dtype_size(kt));
  const int64_t vw = packed_row_width(vt, hd) * int64_t(dtype_size(vt));
  Array qa = Array::empty({1, n_heads, hd}, DType::f32);
  std::memcpy(qa.raw(), q.data(), q.size() * sizeof(float));
  ops::AttentionParams p;
  p.scale = 1.0f;
  Array keys, values;
  // Row (h, j) of a [heads, rows, width] or [1, heads, kBlockRows, width] buffer: the same place.
  const int64_t rows = layout == Layout::dense ? n_keys : kBlockRows;
  if (layout == Layout::dense) {
    keys = Array::empty({n_kv, n_keys, packed_row_width(kt, hd)}, kt);
    values = Array::empty({n_kv, n_keys, packed_row_width(vt, hd)}, vt);
    p.q_pos0 = n_keys - 1;
    p.keys = ops::LinearKeys{0};
  } else {
    keys = Array::empty({1, n_kv, kBlockRows, packed_row_width(kt, hd)}, kt);
    values = Array::empty({1, n_kv, kBlockRows, packed_row_width(vt, hd)}, vt);
    Array tables = Array::zeros({1, 1}, DType::i32);
    Array lens = Array::empty({1}, DType::i32);
    lens.data<int32_t>()[0] = int32_t(n_keys);
    p.keys = ops::PagedKeys{tables, lens, 0};
  }
  std::memset(keys.raw(), 0xff, keys.nbytes());  // rows past n_keys: NaN in every format
  std::memset(values.raw(), 0xff, values.nbytes());
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t j = 0; j < n_keys; ++j) {
      uint8_t* kd = static_cast<uint8_t*>(keys.raw()) + (h * rows + j) * kw;
      uint8_t* vd = static_cast<uint8_t*>(values.raw()) + (h * rows + j) * vw;
      std::memcpy(kd, k_rows[size_t(h * n_keys + j)].data(), size_t(kw));
      std::memcpy(vd, v_rows[size_t(h * n_keys + j)].data(), size_t(vw));
    }
  const Array out = ops::attention(qa, keys, values, p);
  return std::vector<float>(out.data<float>(), out.data<float>() + n_heads * hd);
}

std::vector<uint8_t> f16_row(const std::vector<float>& x) {
  std::vector<uint8_t> out(2 * x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = f32_to_f16(x[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// An fp8 row: float32 scale s, then the codes.
std::vector<uint8_t> fp8_row(float s, const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> out(4 + codes.size());
  std::memcpy(out.data(), &s, 4);
  std::copy(codes.begin(), codes.end(), out.begin() + 4);
  return out;
}

// A q8_0 row: per block of 32, the f16 scale bits then 32 int8 bytes.
std::vector<uint8_t> q8_row(const std::vector<uint16_t>& scales, const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < scales.size(); ++b) {
    out.push_back(uint8_t(scales[b] & 0xff));
    out.push_back(uint8_t(scales[b] >> 8));
    out.insert(out.end(), codes.begin() + std::ptrdiff_t(32 * b), codes.begin() + std::ptrdiff_t(32 * (b + 1)));
  }
  return out;
}

// The value a row's element d decodes to, in double (independent of the kernels).
double decoded(DType dt, const std::vector<uint8_t>& row, int64_t d) {
  if (dt == DType::q8_0) {
    const uint8_t* b = row.data() + (d / 32) * 34;
    return double(f16_to_f32(uint16_t(b[0] | (b[1] << 8)))) * double(int8_t(b[2 + d % 32]));
  }
  float s;
  std::memcpy(&s, row.data(), 4);
  return double(s) * double(e4m3_to_float(row[size_t(4 + d)]));
}

// Row r (of two) of the codes under test: fp8 every code 0..255, q8_0 every byte, split over the
// two rows of hd = 128. q8_0's blocks take extreme f16 scales: the largest (65504), the smallest
// subnormal (2^-24), a negative one and an ordinary one.
// With nan_codes false, fp8's NaN codes are replaced by 0x3a (a row without them is decoded
// by the paged kernel without fixing NaN lanes).
std::vector<uint8_t> test_row(DType dt, int r, int64_t hd, bool keys, bool nan_codes) {
  // hd == 128: bytes r * 128 + d, so that the two rows hold each byte once; else a spread of them.
  std::vector<uint8_t> codes(static_cast<size_t>(hd));
  for (int64_t d = 0; d < hd; ++d) codes[size_t(d)] = uint8_t(hd == 128 ? r * 128 + d : (r * 128 + d * 37) % 256);
  if (dt == DType::fp8_e4m3) {
    // Keys: a NaN code would make the score NaN whatever the query (0 * NaN); the values test
    // the NaN codes.
    if (!nan_codes)
      for (uint8_t& c : codes)
        if ((c & 0x7f) == 0x7f) c = 0x3a;
    return fp8_row(keys ? 4.0f / 448.0f : 0.37f, codes);
  }
  const std::vector<uint16_t> scales = keys ? std::vector<uint16_t>{0x2c00, 0x1c00, 0xa400, 0x2a66}  // 1/16 .. 2^-8
                                            : std::vector<uint16_t>{0x7bff, 0x0001, 0xb800, 0x2e66};
  return q8_row(std::vector<uint16_t>(scales.begin(), scales.begin() + hd / 32), codes);
}

class KVPackedRows : public testing::CpuLevelTest {};

TEST_P(KVPackedRows, ValueRowsDecodeToEveryCodeBitForBit) {
  const int64_t n_kv = 2;
  for (DType vt : {DType::fp8_e4m3, DType::q8_0})
    for (int64_t hd : {int64_t(128), int64_t(32), int64_t(40)})
      for (bool nan_codes : {true, false}) {
        if (vt == DType::q8_0 && (hd % 32 != 0 || !nan_codes)) continue;
        for (Layout layout : {Layout::dense, Layout::paged})
          for (int64_t group : {1, 8}) {
            const int64_t n_heads = n_kv * group;
            std::vector<std::vector<uint8_t>> k_rows, v_rows;
            for (int r = 0; r < n_kv; ++r) {
              k_rows.push_back(f16_row(std::vector<float>(size_t(hd), 0.0f)));
              v_rows.push_back(test_row(vt, r, hd, false, nan_codes));
            }
            const std::vector<float> q(size_t(n_heads * hd), 0.5f);
            const std::vector<float> out = decode(layout, DType::f16, vt, k_rows, v_rows, q, n_kv, n_heads, hd, 1);
            for (int64_t h = 0; h < n_heads; ++h)
              for (int64_t d = 0; d < hd; ++d) {
                const float want = float(decoded(vt, v_rows[size_t(h / group)], d));
                const float got = out[size_t(h * hd + d)];
                const std::string where = std::string(dtype_name(vt)) +
                                          (layout == Layout::dense ? " dense" : " paged") + ", group " +
                                          std::to_string(group) + ", head_dim " + std::to_string(hd) + ", head " +
                                          std::to_string(h) + ", element " + std::to_string(d);
                if (std::isnan(want))
                  EXPECT_TRUE(std::isnan(got)) << where << ": " << got;
                else
                  EXPECT_EQ(got, want) << where;
              }
          }
      }
}

TEST_P(KVPackedRows, KeyRowsScoreAsEveryDecodedCode) {
  const int64_t n_kv = 2;
  for (DType kt : {DType::fp8_e4m3, DType::q8_0})
    for (int64_t hd : {int64_t(128), int64_t(40)}) {
      if (kt == DType::q8_0 && hd % 32 != 0) continue;
      for (Layout layout : {Layout::dense, Layout::paged})
        for (int64_t group : {1, 8}) {
          const int64_t n_heads = n_kv * group;
          // Per kv head: key 0 the row under test, key 1 a zero row; values e0 and e1.
          std::vector<std::vector<uint8_t>> k_rows, v_rows;
          std::vector<float> e0(size_t(hd), 0.0f), e1(size_t(hd), 0.0f);
          e0[0] = 1.0f;
          e1[1] = 1.0f;
          for (int r = 0; r < n_kv; ++r) {
            k_rows.push_back(test_row(kt, r, hd, true, false));
            const std::vector<uint8_t> zeros(static_cast<size_t>(hd), 0);
            k_rows.push_back(kt == DType::q8_0 ? q8_row(std::vector<uint16_t>(size_t(hd / 32), 0), zeros)
                                               : fp8_row(1.0f, zeros));
            v_rows.push_back(f16_row(e0));
            v_rows.push_back(f16_row(e1));
          }
          // Each call: query head g of every kv head picks element d0 + g.
          for (int64_t d0 = 0; d0 < hd; d0 += group) {
            std::vector<float> q(size_t(n_heads * hd), 0.0f);
            std::vector<double> want(size_t(n_heads), 0.0);
            for (int64_t h = 0; h < n_heads; ++h) {
              const int64_t d = d0 + h % group;
              if (d >= hd) continue;
              const double k = decoded(kt, k_rows[size_t(2 * (h / group))], d);
              const double w = k != 0.0 ? 4.0 / std::fabs(k) : 1.0;  // the score near +-4
              q[size_t(h * hd + d)] = float(w);
              want[size_t(h)] = double(float(w)) * k;
            }
            const std::vector<float> out = decode(layout, kt, DType::f16, k_rows, v_rows, q, n_kv, n_heads, hd, 2);
            for (int64_t h = 0; h < n_heads; ++h) {
              if (d0 + h % group >= hd) continue;
              const double got = std::log(double(out[size_t(h * hd)]) / double(out[size_t(h * hd + 1)]));
              EXPECT_NEAR(got, want[size_t(h)], 1e-5 * std::fabs(want[size_t(h)]) + 1e-6)
                  << dtype_name(kt) << (layout == Layout::dense ? " dense" : " paged") << ", group " << group
                  << ", head_dim " << hd << ", element " << d0 + h % group;
            }
          }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(CpuLevels, KVPackedRows, OSPREY_ALL_CPU_LEVELS);

}  // namespace
}  // namespace osprey
