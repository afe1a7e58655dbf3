// The KV cache's packed row formats (core/dtype.h, backend/kv_quant.h) on the CPU: the bytes
// ops::write_kv_rows and ops::write_kv_paged store are those of llama.cpp's q8_0 block and of an
// e4m3 row with a float32 scale, computed here independently (the e4m3 codes by the table
// search of formats/hub_quant, the q8_0 block as llama.cpp's quantize_row_q8_0_ref writes it);
// attention over every pair of key and value types, dense (decode, prefill, split keys, a ring)
// and paged, equals a double-precision attention over the values the stored bytes decode to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/kv_quant.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/hub_quant.h"
#include "kv/kv_cache.h"

namespace osprey {
namespace {

constexpr DType kTypes[] = {DType::f16, DType::bf16, DType::q8_0, DType::fp8_e4m3};

// llama.cpp's quantize_row_q8_0_ref, one block of 32: d = amax / 127 (stored as f16), codes
// roundf(x * (1 / d)).
std::vector<uint8_t> ref_q8_0(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / float((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    out.push_back(uint8_t(dh & 0xff));
    out.push_back(uint8_t(dh >> 8));
    for (int i = 0; i < 32; ++i) out.push_back(uint8_t(int8_t(roundf(x[b * 32 + i] * id))));
  }
  return out;
}

// The fp8 row: s = amax / 448 as float32 (1 for a zero row), then e4m3(x / s) per element.
std::vector<uint8_t> ref_fp8(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &s, 4);
  for (int64_t i = 0; i < n; ++i) out.push_back(float_to_e4m3(double(x[i] / s)));
  return out;
}

// The values a stored row of `dt` decodes to, in double.
std::vector<double> decode_row(DType dt, const uint8_t* row, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::f16 || dt == DType::bf16) {
      uint16_t bits;
      std::memcpy(&bits, row + 2 * i, 2);
      out[size_t(i)] = dt == DType::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    } else if (dt == DType::q8_0) {
      const uint8_t* b = row + (i / 32) * 34;
      const double d = f16_to_f32(uint16_t(b[0] | (b[1] << 8)));
      out[size_t(i)] = d * double(int8_t(b[2 + i % 32]));
    } else {
      float s;
      std::memcpy(&s, row, 4);
      out[size_t(i)] = double(s) * double(e4m3_to_float(row[4 + i]));
    }
  }
  return out;
}

std::string type_name(DType dt) { return dtype_name(dt); }

// Rows [n, heads, hd] f32, uniform in [-range, range), one row in eight scaled by 1/100 (so
// that a row's scale matters) and one element in 16 an outlier of 4 * range.
Array random_rows(int64_t n, int64_t heads, int64_t hd, std::mt19937& rng, float range = 1.0f) {
  std::uniform_real_distribution<float> u(-range, range);
  Array a = Array::empty({n, heads, hd}, DType::f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < n * heads; ++i) {
    const float row_scale = i % 8 == 3 ? 0.01f : 1.0f;
    for (int64_t d = 0; d < hd; ++d) p[i * hd + d] = u(rng) * row_scale * (d % 16 == 5 ? 4.0f : 1.0f);
  }
  return a;
}

// A [heads, cap, width] buffer of dt whose every byte is `fill`.
Array filled_buffer(DType dt, int64_t heads, int64_t cap, int64_t hd, uint8_t fill) {
  Array a = Array::empty({heads, cap, packed_row_width(dt, hd)}, dt);
  std::memset(a.raw(), fill, a.nbytes());
  return a;
}

const uint8_t* row_bytes(const Array& buf, int64_t h, int64_t r) {
  return static_cast<const uint8_t*>(buf.raw()) + size_t((h * buf.dim(1) + r) * buf.dim(2)) * buf.itemsize();
}

}  // namespace

TEST(KVTypes, E4M3EncodingIsTheNearestCodeTiesToEven) {
  // Every code's value, the midpoints between neighbours and the floats either side of them,
  // values past 448, subnormals and zeros, both signs.
  std::vector<float> xs = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 465.0f, 1e6f, 1e-12f, 0.0009765625f, 0.001953125f};
  for (int c = 0; c < 126; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;
    for (float x : {lo, hi, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) xs.push_back(x);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(e(rng)));
  for (float x : std::vector<float>(xs))
    for (float s : {x, -x}) EXPECT_EQ(kvq::f32_to_e4m3(s), float_to_e4m3(double(s))) << s;
  for (int c = 0; c < 256; ++c) {
    const float a = kvq::e4m3_to_f32(uint8_t(c)), b = e4m3_to_float(uint8_t(c));
    if (std::isnan(b))
      EXPECT_TRUE(std::isnan(a)) << c;
    else
      EXPECT_EQ(a, b) << c;
  }
}

TEST(KVTypes, WrittenRowsAreTheReferenceBytesAndNothingElseChanges) {
  std::mt19937 rng(1);
  const int64_t heads = 3, hd = 64, cap = 20;
  for (DType dt : {DType::q8_0, DType::fp8_e4m3}) {
    for (int64_t ring : {int64_t(0), cap}) {
      Array keys = filled_buffer(dt, heads, cap, hd, 0xab), values = filled_buffer(dt, heads, cap, hd, 0xcd);
      // Rows 5 .. 11 (a ring: positions 17 .. 23, wrapping to rows 17, 18, 19, 0, 1, 2, 3).
      const int64_t n = 7, pos0 = ring ? 17 : 5;
      Array k = random_rows(n, heads, hd, rng), v = random_rows(n, heads, hd, rng);
      // A zero row quantizes with scale 0 (q8_0) or 1 (fp8).
      std::fill_n(k.data<float>(), hd, 0.0f);
      ops::write_kv_rows(keys, values, k, v, pos0, {}, ring);
      for (int64_t r = 0; r < cap; ++r) {
        const int64_t i = ring ? ((r - pos0 % cap) + cap) % cap : r - pos0;
        const bool written = i >= 0 && i < n;
        for (int64_t h = 0; h < heads; ++h)
          for (auto [buf, src, fill] : {std::tuple{&keys, &k, 0xab}, std::tuple{&values, &v, 0xcd}}) {
            const uint8_t* got = row_bytes(*buf, h, r);
            std::vector<uint8_t> want;
            if (written) {
              const float* x = src->data<float>() + (i * heads + h) * hd;
              want = dt == DType::q8_0 ? ref_q8_0(x, hd) : ref_fp8(x, hd);
            } else {
              want.assign(size_t(packed_row_width(dt, hd)), uint8_t(fill));
            }
            ASSERT_EQ(std::vector<uint8_t>(got, got + buf->dim(2)), want)
                << type_name(dt) << " ring " << ring << " row " << r << " head " << h;
          }
      }
    }
  }
}

TEST(KVTypes, PagedWritesStoreTheSameBytesAndGatherReturnsThem) {
  std::mt19937 rng(2);
  const int64_t heads = 2, hd = 32, bs = 4, n_blocks = 5;
  for (DType dt : {DType::q8_0, DType::fp8_e4m3}) {
    const int64_t w = packed_row_width(dt, hd);
    // Values of another type: f16.
    Array keys = Array::zeros({n_blocks, heads, bs, w}, dt), values = Array::zeros({n_blocks, heads, bs, hd}, DType::f16);
    // A sequence of 9 rows in blocks 3, 0, 4.
    const std::vector<int32_t> blocks = {3, 0, 4};
    Array slots = Array::empty({9}, DType::i32);
    for (int32_t j = 0; j < 9; ++j) slots.data<int32_t>()[j] = blocks[size_t(j / bs)] * int32_t(bs) + j % int32_t(bs);
    Array k = random_rows(9, heads, hd, rng), v = random_rows(9, heads, hd, rng);
    ops::write_kv_paged(keys, values, k, v, slots);
    Array ids = Array::empty({3}, DType::i32);
    std::copy(blocks.begin(), blocks.end(), ids.data<int32_t>());
    Array gk = ops::gather_kv_blocks(keys, ids, 9), gv = ops::gather_kv_blocks(values, ids, 9);
    ASSERT_EQ(gk.dtype(), dt);
    ASSERT_EQ(gk.shape(), (Shape{heads, 9, w}));
    for (int64_t j = 0; j < 9; ++j)
      for (int64_t h = 0; h < heads; ++h) {
        const float* x = k.data<float>() + (j * heads + h) * hd;
        const std::vector<uint8_t> want = dt == DType::q8_0 ? ref_q8_0(x, hd) : ref_fp8(x, hd);
        const uint8_t* got = row_bytes(gk, h, j);
        ASSERT_EQ(std::vector<uint8_t>(got, got + w), want) << type_name(dt) << " row " << j << " head " << h;
        const uint16_t* vh = gv.data<uint16_t>() + (h * 9 + j) * hd;
        for (int64_t d = 0; d < hd; ++d)
          ASSERT_EQ(vh[d], f32_to_f16(v.data<float>()[(j * heads + h) * hd + d])) << "row " << j;
      }
  }
}

namespace {

struct Case {
  int64_t n = 1;          // query rows
  int64_t n_keys = 100;   // keys cached (the queries are the last n of them)
  int window = 0;
  int64_t ring = 0;       // > 0: a ring of that many rows (a rotating cache), window == ring - n + 1
};

// [n, n_heads * hd] in double: query row i at position n_keys - n + i over keys (k_rows,
// v_rows: per kv head, per position, the decoded row).
std::vector<double> reference(const Case& c, const Array& q, const std::vector<std::vector<std::vector<double>>>& kd,
                              const std::vector<std::vector<std::vector<double>>>& vd, double scale) {
  const int64_t n_heads = q.dim(1), hd = q.dim(2), n_kv = int64_t(kd.size()), group = n_heads / n_kv;
  std::vector<double> out(size_t(c.n * n_heads * hd), 0.0);
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t p = c.n_keys - c.n + i;
    const int64_t lo = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t hk = h / group;
      std::vector<double> logits;
      double mx = -1e300;
      for (int64_t j = lo; j <= p; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          dot += double(q.data<float>()[(i * n_heads + h) * hd + d]) * kd[size_t(hk)][size_t(j)][size_t(d)];
        logits.push_back(dot * scale);
        mx = std::max(mx, dot * scale);
      }
      double sum = 0.0;
      for (double& l : logits) sum += (l = std::exp(l - mx));
      for (int64_t j = lo; j <= p; ++j)
        for (int64_t d = 0; d < hd; ++d)
          out[size_t((i * n_heads + h) * hd + d)] +=
              logits[size_t(j - lo)] / sum * vd[size_t(hk)][size_t(j)][size_t(d)];
    }
  }
  return out;
}

// Decoded rows of a [heads, rows, width] buffer, per head and position (a ring: position p at
// row p % rows).
std::vector<std::vector<std::vector<double>>> decode_buffer(const Array& buf, int64_t hd, int64_t n_pos, int64_t ring) {
  std::vector<std::vector<std::vector<double>>> out(size_t(buf.dim(0)));
  for (int64_t h = 0; h < buf.dim(0); ++h)
    for (int64_t p = 0; p < n_pos; ++p)
      out[size_t(h)].push_back(decode_row(buf.dtype(), row_bytes(buf, h, ring ? p % ring : p), hd));
  return out;
}

}  // namespace

TEST(KVTypes, AttentionOverEveryPairOfTypesEqualsADoublePrecisionReference) {
  const int64_t n_heads = 8, n_kv = 2, hd = 64;
  const double scale = 1.0 / std::sqrt(double(hd));
  // Decode (the direct path for 16-bit rows), a prefill chunk (the blocked path), a decode over
  // enough keys to split them, and a ring's decode and chunk.
  const Case cases[] = {{1, 100, 0, 0}, {13, 77, 0, 0}, {1, 1100, 0, 0}, {1, 40, 16, 16}, {3, 45, 14, 16}};
  std::mt19937 rng(3);
  for (DType kt : kTypes)
    for (DType vt : kTypes)
      for (const Case& c : cases) {
        const int64_t cap = c.ring ? c.ring : c.n_keys + 5;
        Array keys = filled_buffer(kt, n_kv, cap, hd, 0xff), values = filled_buffer(vt, n_kv, cap, hd, 0xff);
        // The rows in chunks of at most the ring (rows past the live ones stay NaN-ish bytes).
        for (int64_t p0 = 0; p0 < c.n_keys;) {
          const int64_t m = std::min<int64_t>(c.ring ? c.ring : c.n_keys, c.n_keys - p0);
          ops::write_kv_rows(keys, values, random_rows(m, n_kv, hd, rng), random_rows(m, n_kv, hd, rng), p0, {},
                             c.ring);
          p0 += m;
        }
        Array q = random_rows(c.n, n_heads, hd, rng, 2.0f);
        ops::AttentionParams p;
        p.q_pos0 = c.n_keys - c.n;
        p.scale = float(scale);
        p.window = c.window;
        if (c.ring)
          p.keys = ops::RingKeys{c.ring};
        else
          p.keys = ops::LinearKeys{0};
        const Array lk = c.ring ? keys : kv_rows_view(keys, 0, c.n_keys);
        const Array lv = c.ring ? values : kv_rows_view(values, 0, c.n_keys);
        const Array out = ops::attention(q, lk, lv, p);
        // Positions before the ring's oldest held one are never read (window); decode the held ones.
        std::vector<std::vector<std::vector<double>>> kd, vd;
        if (c.ring) {
          kd.assign(size_t(n_kv), {});
          vd.assign(size_t(n_kv), {});
          for (int64_t h = 0; h < n_kv; ++h)
            for (int64_t pos = 0; pos < c.n_keys; ++pos) {
              const bool held = pos >= c.n_keys - c.ring;
              const int64_t r = pos % c.ring;
              kd[size_t(h)].push_back(held ? decode_row(kt, row_bytes(keys, h, r), hd) : std::vector<double>(size_t(hd)));
              vd[size_t(h)].push_back(held ? decode_row(vt, row_bytes(values, h, r), hd)
                                           : std::vector<double>(size_t(hd)));
            }
        } else {
          kd = decode_buffer(keys, hd, c.n_keys, 0);
          vd = decode_buffer(values, hd, c.n_keys, 0);
        }
        const std::vector<double> want = reference(c, q, kd, vd, scale);
        double worst = 0.0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(out.data<float>()[i]) - want[i]));
        EXPECT_LT(worst, 2e-5) << "keys " << type_name(kt) << ", values " << type_name(vt) << ": n " << c.n << ", keys "
                               << c.n_keys << ", ring " << c.ring;
      }
}

TEST(KVTypes, PagedAttentionOverEveryPairOfTypesEqualsADoublePrecisionReference) {
  const int64_t n_heads = 4, n_kv = 2, hd = 32, bs = 16, n_blocks = 12, max_blocks = 5;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::mt19937 rng(4);
  const std::vector<int64_t> lens = {1, 37, 80, 16};
  for (DType kt : kTypes)
    for (DType vt : kTypes) {
      Array keys = Array::zeros({n_blocks, n_kv, bs, packed_row_width(kt, hd)}, kt);
      Array values = Array::zeros({n_blocks, n_kv, bs, packed_row_width(vt, hd)}, vt);
      // Sequence s takes blocks from a shuffled list.
      std::vector<int32_t> free_blocks(static_cast<size_t>(n_blocks));
      for (int32_t b = 0; b < n_blocks; ++b) free_blocks[size_t(b)] = b;
      std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
      Array tables = Array::zeros({int64_t(lens.size()), max_blocks}, DType::i32);
      Array seq_lens = Array::empty({int64_t(lens.size())}, DType::i32);
      std::vector<std::vector<std::vector<std::vector<double>>>> kd(lens.size()), vd(lens.size());
      size_t next = 0;
      for (size_t s = 0; s < lens.size(); ++s) {
        const int64_t len = lens[s], nb = (len + bs - 1) / bs;
        seq_lens.data<int32_t>()[s] = int32_t(len);
        for (int64_t b = 0; b < nb; ++b) tables.data<int32_t>()[int64_t(s) * max_blocks + b] = free_blocks[next++];
        Array slots = Array::empty({len}, DType::i32);
        for (int64_t j = 0; j < len; ++j)
          slots.data<int32_t>()[j] = tables.data<int32_t>()[int64_t(s) * max_blocks + j / bs] * int32_t(bs) + int32_t(j % bs);
        ops::write_kv_paged(keys, values, random_rows(len, n_kv, hd, rng), random_rows(len, n_kv, hd, rng), slots);
        kd[s].assign(size_t(n_kv), {});
        vd[s].assign(size_t(n_kv), {});
        for (int64_t h = 0; h < n_kv; ++h)
          for (int64_t j = 0; j < len; ++j) {
            const int64_t b = tables.data<int32_t>()[int64_t(s) * max_blocks + j / bs];
            auto at = [&](const Array& pool) {
              return static_cast<const uint8_t*>(pool.raw()) +
                     size_t(((b * n_kv + h) * bs + j % bs) * pool.dim(3)) * pool.itemsize();
            };
            kd[s][size_t(h)].push_back(decode_row(kt, at(keys), hd));
            vd[s][size_t(h)].push_back(decode_row(vt, at(values), hd));
          }
      }
      Array q = random_rows(int64_t(lens.size()), n_heads, hd, rng, 2.0f);
      ops::AttentionParams p;
      p.scale = float(scale);
      p.keys = ops::PagedKeys{tables, seq_lens, 64};
      const Array out = ops::attention(q, keys, values, p);
      for (size_t s = 0; s < lens.size(); ++s) {
        Array qs = Array::empty({1, n_heads, hd}, DType::f32);
        std::copy_n(q.data<float>() + s * size_t(n_heads * hd), n_heads * hd, qs.data<float>());
        const std::vector<double> want = reference({1, lens[s], 0, 0}, qs, kd[s], vd[s], scale);
        double worst = 0.0;
        for (size_t i = 0; i < want.size(); ++i)
          worst = std::max(worst, std::fabs(double(out.data<float>()[s * size_t(n_heads * hd) + i]) - want[i]));
        EXPECT_LT(worst, 2e-5) << "keys " << type_name(kt) << ", values " << type_name(vt) << ": sequence " << s;
      }
    }
}

TEST(KVTypes, BadBuffersAreRefusedByName) {
  Array k = Array::zeros({1, 1, 48}, DType::f32);
  // q8_0 rows of head_dim 48 (not a multiple of 32).
  Array keys = Array::zeros({1, 4, 48 / 32 * 34}, DType::q8_0), values = Array::zeros({1, 4, 48}, DType::f16);
  try {
    ops::write_kv_rows(keys, values, k, k, 0);
    FAIL() << "q8_0 rows of head_dim 48 were written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
  // An fp8 buffer whose rows are the width of f16's.
  Array fp8 = Array::zeros({1, 4, 32}, DType::fp8_e4m3), k32 = Array::zeros({1, 1, 32}, DType::f32);
  EXPECT_THROW(ops::write_kv_rows(fp8, fp8, k32, k32, 0), Error);
}

}  // namespace osprey
