// ops::write_kv_rows on the CPU and on CUDA: bf16 rows rounded to nearest even (checked
// against a rounding written here from the bit layout), f16 rows, and ring writes that wrap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "support/device_test.h"
#include "support/numeric.h"

namespace osprey {
namespace {

constexpr int64_t kHeads = 2, kDim = 16, kRows = 8;
constexpr uint16_t kSentinel = 0x7bcd;

using testing::bf16_nearest_even;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Values that probe the rounding: exact ties both ways, just above and below a tie, carries
// into the exponent, values past f16's range, negatives, then random floats.
std::vector<float> probe_values(size_t n, std::mt19937& rng) {
  std::vector<float> v = {from_bits(0x3f808000u), from_bits(0x3f818000u), from_bits(0x3f808001u),
                          from_bits(0x3f807fffu), from_bits(0xbf818000u), from_bits(0x3fffffffu),
                          from_bits(0x477fff80u), 1.0e5f,                 -2.5e5f,
                          3.0e38f,                from_bits(0x00018000u), 0.0f,
                          -0.0f,                  65504.0f,               70000.0f,
                          1.0f / 3.0f};
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  while (v.size() < n) v.push_back(dist(rng));
  v.resize(n);
  return v;
}

class KVRows : public testing::DeviceTest {
 protected:
  // A [kHeads, kRows, kDim] cache of `dtype` filled with the sentinel bits.
  Array sentinel_cache(DType dtype) const {
    Array a = Array::empty({kHeads, kRows, kDim}, dtype);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<uint16_t>()[i] = kSentinel;
    return on_device(a);
  }
  static std::vector<uint16_t> bits(const Array& a) { return download<uint16_t>(a); }
};

// Source rows [n, kHeads, kDim] of `values` (in order).
Array source_rows(int64_t n, const std::vector<float>& values) {
  Array a = Array::empty({n, kHeads, kDim}, DType::f32);
  std::memcpy(a.data<float>(), values.data(), size_t(a.numel()) * 4);
  return a;
}

TEST_P(KVRows, Bf16RowsRoundToNearestEven) {
  std::mt19937 rng(5);
  const int64_t n = 3, row0 = 2;
  const std::vector<float> kv = probe_values(size_t(n * kHeads * kDim), rng);
  std::vector<float> vv(kv.rbegin(), kv.rend());
  Array keys = sentinel_cache(DType::bf16), values = sentinel_cache(DType::bf16);
  ops::write_kv_rows(keys, values, on_device(source_rows(n, kv)), on_device(source_rows(n, vv)), row0);
  const std::vector<uint16_t> kb = bits(keys), vb = bits(values);
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t d = 0; d < kDim; ++d) {
        const size_t at = size_t((h * kRows + r) * kDim + d);
        const bool written = r >= row0 && r < row0 + n;
        const size_t src = size_t(((r - row0) * kHeads + h) * kDim + d);
        const uint16_t want_k = written ? bf16_nearest_even(kv[src]) : kSentinel;
        const uint16_t want_v = written ? bf16_nearest_even(vv[src]) : kSentinel;
        ASSERT_EQ(kb[at], want_k) << "key head " << h << " row " << r << " dim " << d;
        ASSERT_EQ(vb[at], want_v) << "value head " << h << " row " << r << " dim " << d;
      }
}

// Ring rows: positions 14, 15, 16 of a ring of 8 land at rows 6, 7, 0, from host positions and
// from device positions alike.
TEST_P(KVRows, RingWritesWrap) {
  std::mt19937 rng(6);
  const int64_t n = 3, p0 = 14;
  // Exact in f16 and bf16: multiples of 1/8 up to 16.
  std::vector<float> kv(size_t(n * kHeads * kDim)), vv(kv.size());
  std::uniform_int_distribution<int> q(-128, 128);
  for (auto& x : kv) x = float(q(rng)) / 8.0f;
  for (auto& x : vv) x = float(q(rng)) / 8.0f;
  for (DType dtype : {DType::f16, DType::bf16})
    for (bool device_pos : {false, true}) {
      Array keys = sentinel_cache(dtype), values = sentinel_cache(dtype);
      Array pos;
      if (device_pos) {
        Array p = Array::empty({n}, DType::i32);
        for (int64_t i = 0; i < n; ++i) p.data<int32_t>()[i] = int32_t(p0 + i);
        pos = on_device(p);
      }
      ops::write_kv_rows(keys, values, on_device(source_rows(n, kv)), on_device(source_rows(n, vv)), p0, pos, kRows);
      Array kc = ops::cast(ops::to_device(keys, Device::cpu()), DType::f32);
      const std::vector<uint16_t> kb = bits(keys);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t r = 0; r < kRows; ++r) {
          const int64_t i = r >= 6 ? r - 6 : (r == 0 ? 2 : -1);  // source row of ring row r
          for (int64_t d = 0; d < kDim; ++d) {
            const size_t at = size_t((h * kRows + r) * kDim + d);
            if (i < 0) {
              ASSERT_EQ(kb[at], kSentinel) << "ring row " << r << " was not to be written";
            } else {
              ASSERT_EQ(kc.data<float>()[at], kv[size_t((i * kHeads + h) * kDim + d)])
                  << dtype_name(dtype) << " ring row " << r << " head " << h << " dim " << d;
            }
          }
        }
    }
}

TEST_P(KVRows, RejectsARingOfAnotherSize) {
  Array keys = sentinel_cache(DType::bf16), values = sentinel_cache(DType::bf16);
  std::vector<float> z(size_t(kHeads * kDim), 0.0f);
  Array k = on_device(source_rows(1, z));
  EXPECT_THROW(ops::write_kv_rows(keys, values, k, k, 20, {}, kRows + 1), InvalidInput);
  EXPECT_THROW(ops::write_kv_rows(keys, values, k, k, kRows, {}), InvalidInput);
}

INSTANTIATE_TEST_SUITE_P(Devices, KVRows, OSPREY_DEVICES);

}  // namespace
}  // namespace osprey
