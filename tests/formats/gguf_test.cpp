// The GGUF reader on files built byte by byte: well-formed ones read back field for field, and
// each kind of malformed one (truncations, huge counts, overflowing dimensions, bad offsets,
// bad types) ends in an error that names what is wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "core/error.h"
#include "formats/gguf.h"
#include "support/gguf_bytes.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;

using testing::TempDir;
using testing::write_file;

using Bytes = testing::GgufBytes;

// Opens `bytes` as a .gguf file; returns the InvalidInput's text.
std::string open_error(const std::string& bytes) {
  TempDir dir;
  write_file(dir / "m.gguf", bytes);
  return error_of<InvalidInput>([&] { GgufFile::open(dir / "m.gguf"); });
}

// A well-formed file: every scalar type, a string array, an int array, two tensors.
Bytes good_file() {
  Bytes f;
  f.header(3, 2, 16);
  f.str("u8").put<uint32_t>(0).put<uint8_t>(200);
  f.str("i8").put<uint32_t>(1).put<int8_t>(-5);
  f.str("u16").put<uint32_t>(2).put<uint16_t>(60000);
  f.str("i16").put<uint32_t>(3).put<int16_t>(-30000);
  f.kv_u32("u32", 4000000000u);
  f.str("i32").put<uint32_t>(5).put<int32_t>(-2000000000);
  f.str("f32").put<uint32_t>(6).put<float>(0.25f);
  f.str("bool").put<uint32_t>(7).put<uint8_t>(1);
  f.kv_str("general.architecture", "llama");
  f.str("u64").put<uint32_t>(10).put<uint64_t>(1ull << 40);
  f.str("i64").put<uint32_t>(11).put<int64_t>(-(1ll << 40));
  f.str("f64").put<uint32_t>(12).put<double>(1e-6);
  f.str("strs").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("a").str("").str("\xc4\xa0x");
  f.str("ints").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(3).put<int32_t>(7).put<int32_t>(-1).put<int32_t>(0);
  f.str("floats").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(2).put<float>(-1.5f).put<float>(2.0f);
  f.kv_u32("general.alignment", 64);
  // w: F16 [2, 3] (ne = {3, 2}) at 0; q: Q8_0 [1, 32] (one 34-byte block) at 64.
  f.tensor("w", {3, 2}, 1, 0);
  f.tensor("q", {32, 1}, 8, 64);
  f.align(64);
  std::string data(64 + 34, '\0');
  const uint16_t halves[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};  // 1..6 in float16
  std::memcpy(data.data(), halves, sizeof(halves));
  data[64] = 0x11;
  f.b += data;
  return f;
}

}  // namespace

TEST(Gguf, ReadsEveryValueTypeAndTensorsInPlace) {
  TempDir dir;
  write_file(dir / "m.gguf", good_file().b);
  GgufFile g = GgufFile::open(dir / "m.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.get_uint("u8"), 200u);
  EXPECT_EQ(g.get_int("i8"), -5);
  EXPECT_EQ(g.get_uint("u16"), 60000u);
  EXPECT_EQ(g.get_int("i16"), -30000);
  EXPECT_EQ(g.get_uint("u32"), 4000000000u);
  EXPECT_EQ(g.get_int("i32"), -2000000000);
  EXPECT_EQ(g.get_float("f32"), 0.25);
  EXPECT_TRUE(g.get_bool("bool"));
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_uint("u64"), 1ull << 40);
  EXPECT_EQ(g.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(g.get_float("f64"), 1e-6);
  EXPECT_EQ(g.get_string_array("strs"), (std::vector<std::string_view>{"a", "", "\xc4\xa0x"}));
  EXPECT_EQ(g.get_int_array("ints"), (std::vector<int64_t>{7, -1, 0}));
  EXPECT_EQ(g.get_float_array("floats"), (std::vector<float>{-1.5f, 2.0f}));
  EXPECT_EQ(g.array_size("strs"), 3u);

  ASSERT_EQ(g.tensors().size(), 2u);
  const GgufTensorInfo* w = g.tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type, GgufType::F16);
  EXPECT_EQ(w->shape, (Shape{2, 3}));
  Array a = g.tensor_array(*w);
  EXPECT_EQ(a.dtype(), DType::f16);
  EXPECT_EQ(a.data<uint16_t>()[5], 0x4600);
  const GgufTensorInfo* q = g.tensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->nbytes, 34u);
  Array qa = g.tensor_array(*q);
  EXPECT_EQ(qa.dtype(), DType::u8);
  EXPECT_EQ(qa.shape(), (Shape{1, 34}));
  EXPECT_EQ(qa.data<uint8_t>()[0], 0x11);
  // The arrays point into the mapping: no copy.
  EXPECT_EQ(static_cast<const uint8_t*>(qa.raw()) - static_cast<const uint8_t*>(a.raw()), 64);
  EXPECT_EQ(g.tensor("missing"), nullptr);
}

TEST(Gguf, TypedGettersNameTheKeyAndTheTypes) {
  TempDir dir;
  write_file(dir / "m.gguf", good_file().b);
  GgufFile g = GgufFile::open(dir / "m.gguf");
  EXPECT_NE(error_of<InvalidInput>([&] { g.get_string("u32"); }).find("metadata key u32 is uint32, but a string"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { g.get_uint("i8"); }).find("must not be negative"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { g.get_float_array("strs"); }).find("array of string"), std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { g.get_int("nope"); }).find("missing metadata key nope"), std::string::npos);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const std::string whole = good_file().b;
  TempDir dir;
  // Every prefix of the header and tensor table, and a data section one byte short.
  for (size_t n = 0; n < whole.size(); ++n) {
    if (n > 0 && n < whole.size() - 40 && n % 7 != 0) continue;  // every 7th byte, and the data's end
    write_file(dir / "t.gguf", whole.substr(0, n));
    const std::string e = error_of<InvalidInput>([&] { GgufFile::open(dir / "t.gguf"); });
    EXPECT_NE(e, "") << "a file cut at byte " << n << " was accepted";
    EXPECT_NE(e.find("t.gguf"), std::string::npos) << e;
  }
}

TEST(Gguf, RefusesBadMagicAndVersions) {
  Bytes f;
  f.b = "GGUG";
  f.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
  EXPECT_NE(open_error(f.b).find("not a GGUF file"), std::string::npos);
  TempDir dir;
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    Bytes g;
    g.header(v, 0, 0);
    write_file(dir / "v.gguf", g.b);
    const std::string e = error_of<Unsupported>([&] { GgufFile::open(dir / "v.gguf"); });
    EXPECT_NE(e.find("GGUF version " + std::to_string(v)), std::string::npos) << e;
    if (v == 0x03000000u) {
      EXPECT_NE(e.find("big-endian"), std::string::npos) << e;
    }
  }
  Bytes v2;
  v2.header(2, 0, 1).kv_str("general.architecture", "qwen2");
  write_file(dir / "v2.gguf", v2.b);
  EXPECT_EQ(GgufFile::open(dir / "v2.gguf").get_string("general.architecture"), "qwen2");
}

TEST(Gguf, HugeCountsAreRefusedBeforeAnyAllocation) {
  Bytes t;
  t.header(3, ~0ull, 0);
  EXPECT_NE(open_error(t.b).find("the tensor count is 18446744073709551615, more than"), std::string::npos);
  Bytes k;
  k.header(3, 0, 1ull << 62);
  EXPECT_NE(open_error(k.b).find("the metadata key/value count is"), std::string::npos);
  // A string length past the file, an array count past the file (u8 and string elements).
  Bytes s;
  s.header(3, 0, 1).put<uint64_t>(~0ull).put<uint64_t>(0);
  EXPECT_NE(open_error(s.b).find("reading metadata pair 0's key (a string of 18446744073709551615 bytes)"),
            std::string::npos);
  Bytes a;
  a.header(3, 0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(1ull << 60);
  EXPECT_NE(open_error(a.b).find("the value of key arr (its element count) is 1152921504606846976"), std::string::npos);
  Bytes as;
  as.header(3, 0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("x").str("yy").put<uint64_t>(5);
  EXPECT_NE(open_error(as.b).find("truncated at byte 78 reading the value of key arr[2] (a string of 5 bytes)"),
            std::string::npos)
      << open_error(as.b);
  Bytes a64;  // count * 8 would wrap 64 bits
  a64.header(3, 0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(10).put<uint64_t>(1ull << 61);
  EXPECT_NE(open_error(a64.b).find("more than the"), std::string::npos);
}

TEST(Gguf, RefusesBadValueTypes) {
  Bytes t;
  t.header(3, 0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
  EXPECT_NE(open_error(t.b).find("key k has unknown value type 13"), std::string::npos);
  Bytes e;
  e.header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0);
  EXPECT_NE(open_error(e.b).find("an array of unknown value type 77"), std::string::npos);
  Bytes b;
  b.header(3, 0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2);
  EXPECT_NE(open_error(b.b).find("a bool of value 2"), std::string::npos);
  Bytes d;
  d.header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2);
  EXPECT_NE(open_error(d.b).find("key k appears twice"), std::string::npos);
  Bytes n;
  n.header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).put<uint32_t>(4).put<uint64_t>(0);
  TempDir dir;
  write_file(dir / "n.gguf", n.b);
  EXPECT_NE(error_of<Unsupported>([&] { GgufFile::open(dir / "n.gguf"); }).find("array of arrays"), std::string::npos);
}

TEST(Gguf, RefusesBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Bytes f;
    f.header(3, 0, 1).kv_u32("general.alignment", a);
    EXPECT_NE(open_error(f.b).find("general.alignment must be a power of two"), std::string::npos) << a;
  }
  Bytes s;
  s.header(3, 0, 1).kv_str("general.alignment", "32");
  EXPECT_NE(open_error(s.b).find("got a string"), std::string::npos);
}

TEST(Gguf, RefusesBadTensorInfos) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes) {
    Bytes f;
    f.header(3, 1, 0).tensor("t", std::move(ne), type, offset).align(32);
    f.b += std::string(data_bytes, '\0');
    return open_error(f.b);
  };
  EXPECT_NE(one({}, 0, 0, 4).find("tensor t: 0 dimensions"), std::string::npos);
  EXPECT_NE(one({1, 1, 1, 1, 1}, 0, 0, 4).find("tensor t: 5 dimensions"), std::string::npos);
  // Dimensions whose product overflows 63 and 64 bits; a dimension past INT64_MAX.
  EXPECT_NE(one({1ull << 32, 1ull << 32}, 0, 0, 4).find("are too large"), std::string::npos);
  EXPECT_NE(one({1ull << 40, 1ull << 23}, 0, 0, 4).find("are too large"), std::string::npos);
  EXPECT_NE(one({~0ull}, 0, 0, 4).find("are too large"), std::string::npos);
  // Element count fits, bytes do not: 2^62 f32 elements.
  EXPECT_NE(one({1ull << 62}, 0, 0, 4).find("size in bytes does not fit"), std::string::npos);
  EXPECT_NE(one({4}, 99, 0, 16).find("unknown tensor type 99"), std::string::npos);
  EXPECT_NE(one({33, 1}, 8, 0, 68).find("not whole Q8_0 blocks of 32"), std::string::npos);
  EXPECT_NE(one({4}, 0, 8, 64).find("not a multiple of the alignment 32"), std::string::npos);
  EXPECT_NE(one({4}, 0, 32, 40).find("run past the end of the 40-byte data section"), std::string::npos);
  EXPECT_NE(one({4}, 0, ~0ull & ~31ull, 64).find("run past the end"), std::string::npos);
  EXPECT_NE(one({16}, 0, 0, 63).find("run past the end of the 63-byte data section"), std::string::npos);
  EXPECT_EQ(one({16}, 0, 0, 64), "");

  Bytes two;  // overlapping tensors, and one name twice
  two.header(3, 2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).align(32);
  two.b += std::string(128, '\0');
  EXPECT_NE(open_error(two.b).find("tensor b (at data offset 32) overlaps tensor a"), std::string::npos);
  Bytes dup;
  dup.header(3, 2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).align(32);
  dup.b += std::string(64, '\0');
  EXPECT_NE(open_error(dup.b).find("tensor a: appears twice"), std::string::npos);
  Bytes far;  // the data section would start past the end of the file
  far.header(3, 1, 0).tensor("a", {0}, 0, 0);
  EXPECT_NE(open_error(far.b).find("past the end of the file"), std::string::npos);
}

TEST(Gguf, NamesTypesAndBlocks) {
  EXPECT_EQ(gguf_type_name(12), "Q4_K");
  EXPECT_EQ(gguf_type_name(4), "type 4");  // a removed type's id
  EXPECT_EQ(gguf_block(14)->bytes, 210);
  EXPECT_EQ(gguf_block(14)->elements, 256);
  EXPECT_FALSE(gguf_block(1000).has_value());
  EXPECT_EQ(*gguf_dense_dtype(GgufType::BF16), DType::bf16);
  EXPECT_FALSE(gguf_dense_dtype(GgufType::Q4_0).has_value());
}

}  // namespace osprey
