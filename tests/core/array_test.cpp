#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/ops.h"
#include "core/array.h"
#include "core/error.h"
#include "core/half.h"

namespace osprey {

TEST(Array, EveryArrayHasItsOwnIdentity) {
  Array a = Array::empty({4, 8}, DType::f32);
  Array b = a;  // a handle copy: same identity
  Array c = a.reshape({8, 4});
  Array d = a.slice_rows(1, 3);
  EXPECT_EQ(a.id(), b.id());
  EXPECT_NE(a.id(), c.id());
  EXPECT_NE(a.id(), d.id());
  EXPECT_NE(c.id(), d.id());
  EXPECT_EQ(a.buffer(), c.buffer());
  EXPECT_EQ(d.data<float>(), a.data<float>() + 8);
}

TEST(Array, ReshapeChecksElementCount) { EXPECT_THROW(Array::empty({4, 8}, DType::f32).reshape({5, 6}), InvalidInput); }

TEST(Half, Float16RoundTripsAndRoundsToNearestEven) {
  // Every finite half value converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
  // Halfway between 1 and the next half (1 + 2^-10): ties to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0.00048828125f), 0x3c02);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
}

TEST(Half, Bfloat16RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    if ((h & 0x7f80) == 0x7f80) continue;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(uint16_t(h))), h);
  }
  float one_and_half_ulp;
  uint32_t u = 0x3f808000u;  // 1 + 2^-8 exactly between bf16(1) and the next
  std::memcpy(&one_and_half_ulp, &u, 4);
  EXPECT_EQ(f32_to_bf16(one_and_half_ulp), 0x3f80);
}

TEST(Ops, CopyIntoCastsThroughStridedViews) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-2, 2);
  Array src = Array::empty({3, 5}, DType::f32);
  for (int i = 0; i < 15; ++i) src.data<float>()[i] = dist(rng);
  // A transposed view [5, 3] of the source, copied into f16.
  Array srcT = Array::strided(src.buffer(), 0, {5, 3}, {1, 5}, DType::f32);
  Array dst = Array::empty({5, 3}, DType::f16);
  ops::copy_into(dst, srcT);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(dst.data<uint16_t>()[r * 3 + c], f32_to_f16(src.data<float>()[c * 5 + r]));
}

}  // namespace osprey

namespace osprey {

// A shape read from a file or flag whose size does not fit is refused by name, never wrapped
// into a small allocation.
TEST(Array, EmptyOfAShapeTooLargeIsNamed) {
  try {
    Array::empty({int64_t(1) << 40, int64_t(1) << 30}, DType::f32);
    FAIL() << "no error";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("[1099511627776, 1073741824] float32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than 2^63 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Array::empty({-4, 2}, DType::f32), InvalidInput);
}

}  // namespace osprey
