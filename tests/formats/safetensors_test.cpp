#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;

using testing::TempDir;
using testing::write_file;

// A safetensors file from a raw header string and data bytes.
std::string raw_file(const std::string& header, const std::string& data, int64_t claimed_len = -1) {
  uint64_t n = claimed_len >= 0 ? uint64_t(claimed_len) : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

}  // namespace

TEST(SafeTensors, ReadsTensorsZeroCopy) {
  TempDir dir;
  std::string data(12, '\0');
  float vals[3] = {1.5f, -2.0f, 3.25f};
  std::memcpy(data.data(), vals, 12);
  // The header padded with spaces so that the data is 8-byte aligned, as writers align it.
  write_file(dir / "model.safetensors",
             raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"}}  )", data));
  SafeTensors st = SafeTensors::open(dir.path());
  Array a = st.get("a");
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_EQ(a.data<float>()[2], 3.25f);
  EXPECT_EQ(st.metadata().at("format"), "pt");
}

TEST(SafeTensors, WriterRoundTrips) {
  TempDir dir;
  Array a = Array::empty({2, 3}, DType::bf16);
  for (int i = 0; i < 6; ++i) a.data<uint16_t>()[i] = f32_to_bf16(float(i) - 2.5f);
  write_safetensors(dir / "x.safetensors", {{"w", a}}, {{"k", "v"}});
  SafeTensors st = SafeTensors::open_file(dir / "x.safetensors");
  Array b = st.get("w", DType::bf16, {2, 3});
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), 12));
}

TEST(SafeTensors, ShardedCheckpointFollowsTheIndex) {
  TempDir dir;
  Array a = Array::zeros({4}, DType::f32), b = Array::zeros({2, 2}, DType::f16);
  a.data<float>()[3] = 7.0f;
  write_safetensors(dir / "model-00001-of-00002.safetensors", {{"x.a", a}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"x.b", b}});
  write_file(dir / "model.safetensors.index.json",
             R"({"metadata":{},"weight_map":{"x.a":"model-00001-of-00002.safetensors","x.b":"model-00002-of-00002.safetensors"}})");
  SafeTensors st = SafeTensors::open(dir.path());
  EXPECT_EQ(st.get("x.a").data<float>()[3], 7.0f);
  EXPECT_EQ(st.info("x.b").dtype, DType::f16);
}

TEST(SafeTensors, IndexNamingAMissingShardIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json", R"({"weight_map":{"x":"model-00009.safetensors"}})");
  EXPECT_NE(error_of<IoError>([&] { SafeTensors::open(dir.path()); }).find("model-00009.safetensors"), std::string::npos);
}

TEST(SafeTensors, TruncatedFileIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors", "abc");
  EXPECT_NE(error_of<InvalidInput>([&] { SafeTensors::open(dir.path()); }).find("truncated"), std::string::npos);
}

TEST(SafeTensors, HeaderLengthPastEndIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors", raw_file("{}", "", 1000));
  EXPECT_NE(error_of<InvalidInput>([&] { SafeTensors::open(dir.path()); }).find("header length 1000"), std::string::npos);
}

TEST(SafeTensors, MalformedJsonHeaderIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors", raw_file(R"({"a": {"dtype": )", ""));
  EXPECT_NE(error_of<InvalidInput>([&] { SafeTensors::open(dir.path()); }).find("malformed JSON header"), std::string::npos);
}

TEST(SafeTensors, DataOutOfBoundsIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors",
             raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0')));
  std::string msg = error_of<InvalidInput>([&] { SafeTensors::open(dir.path()); });
  EXPECT_NE(msg.find("tensor w"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of bounds"), std::string::npos) << msg;
}

TEST(SafeTensors, SizeThatDisagreesWithShapeIsAnError) {
  TempDir dir;
  write_file(dir / "model.safetensors",
             raw_file(R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,6]}})", std::string(6, '\0')));
  EXPECT_NE(error_of<InvalidInput>([&] { SafeTensors::open(dir.path()); }).find("needs 8"), std::string::npos);
}

TEST(SafeTensors, UnknownDtypeIsNamed) {
  TempDir dir;
  write_file(dir / "model.safetensors",
             raw_file(R"({"w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')));
  EXPECT_NE(error_of<Unsupported>([&] { SafeTensors::open(dir.path()); }).find("F8_E5M2"), std::string::npos);
}

TEST(SafeTensors, MissingTensorIsNamed) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", Array::zeros({1}, DType::f32)}});
  SafeTensors st = SafeTensors::open(dir.path());
  EXPECT_NE(error_of<InvalidInput>([&] { st.get("model.norm.weight"); }).find("missing tensor model.norm.weight"),
            std::string::npos);
}

TEST(SafeTensors, WrongDtypeOrShapeIsNamed) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", Array::zeros({2, 3}, DType::f32)}});
  SafeTensors st = SafeTensors::open(dir.path());
  std::string msg = error_of<InvalidInput>([&] { st.get("a", DType::bf16, {2, 3}); });
  EXPECT_NE(msg.find("tensor a"), std::string::npos);
  EXPECT_NE(msg.find("bfloat16[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(error_of<InvalidInput>([&] { st.get("a", DType::f32, {3, 2}); }).find("float32[3, 2]"), std::string::npos);
}

TEST(SafeTensors, MissingFolderAndEmptyFolderAreErrors) {
  TempDir dir;
  EXPECT_NE(error_of<IoError>([&] { SafeTensors::open(dir / "nope"); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { SafeTensors::open(dir.path()); }).find("no .safetensors"), std::string::npos);
}

}  // namespace osprey

namespace osprey {

// A full disk is named as such (here /dev/full, where every write fails with ENOSPC).
TEST(SafeTensors, WriteToAFullDiskIsAnIoErrorNamingTheCause) {
  Array a = Array::zeros({64}, DType::f32);
  const std::string msg = error_of<IoError>([&] { write_safetensors("/dev/full", {{"w", a}}); });
  EXPECT_NE(msg.find("/dev/full: write failed: No space left on device"), std::string::npos) << msg;
}

}  // namespace osprey
