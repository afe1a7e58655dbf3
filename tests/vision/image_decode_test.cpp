// Decoding against Pillow: tests/fixtures/vision/reference.safetensors holds each test image as
// Pillow opens it and transformers' convert_to_rgb makes it RGB (tools/make_vision_fixtures.py).
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "formats/safetensors.h"
#include "support/test_util.h"
#include "vision/vision_fixtures.h"
#include "vision/image_decode.h"

namespace osprey {
namespace {

using testing::error_of;
using testing::image_bytes;

TEST(ImageDecode, EveryTestImageEqualsPillowsRgb) {
  const SafeTensors ref = testing::vision_reference();
  for (const testing::VisionImage& c : testing::kVisionImages) {
    SCOPED_TRACE(c.name);
    const RgbImage img = decode_image(image_bytes(c.file));
    const Array want = ref.get(std::string("decoded_") + c.name);
    ASSERT_EQ(want.dtype(), DType::u8);
    ASSERT_EQ(img.height, want.dim(0));
    ASSERT_EQ(img.width, want.dim(1));
    const uint8_t* w = want.data<uint8_t>();
    int64_t differing = 0, worst = 0;
    for (size_t i = 0; i < img.rgb.size(); ++i) {
      const int64_t d = std::abs(int64_t(img.rgb[i]) - int64_t(w[i]));
      differing += d != 0;
      worst = std::max(worst, d);
    }
    EXPECT_EQ(differing, 0) << "worst difference " << worst;
  }
}

TEST(ImageDecode, FormatIsToldByMagicBytesNotByName) {
  EXPECT_EQ(sniff_image_format(image_bytes("png_rgb_64x48.png")), ImageFormat::png);
  EXPECT_EQ(sniff_image_format(image_bytes("jpeg_rgb_120x80.jpg")), ImageFormat::jpeg);
  EXPECT_EQ(sniff_image_format(image_bytes("webp_lossy_96x64.webp")), ImageFormat::webp);
  EXPECT_EQ(sniff_image_format(image_bytes("gif_40x25.gif")), ImageFormat::gif);
  const std::vector<uint8_t> bmp = {'B', 'M', 0, 0, 0, 0, 0, 0};
  EXPECT_NE(error_of<InvalidInput>([&] { decode_image(bmp); }).find("looks like a BMP"), std::string::npos);
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_NE(error_of<InvalidInput>([&] { decode_image(text); }).find("not a PNG, JPEG, WebP or GIF image"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidInput>([&] { decode_image(std::vector<uint8_t>{}); }).find("0 bytes"), std::string::npos);
}

TEST(ImageDecode, TruncatedFilesAreRefusedNamingTheFormat) {
  for (const testing::VisionImage& c : testing::kVisionImages) {
    SCOPED_TRACE(c.name);
    std::vector<uint8_t> b = image_bytes(c.file);
    b.resize(b.size() / 2);
    const std::string msg = error_of<InvalidInput>([&] { decode_image(b); });
    EXPECT_NE(msg.find("malformed or truncated"), std::string::npos) << msg;
  }
}

TEST(ImageDecode, CorruptBodiesAreRefused) {
  // The header intact, the rest overwritten.
  for (const char* file : {"png_rgb_64x48.png", "jpeg_rgb_120x80.jpg", "webp_lossy_96x64.webp", "gif_40x25.gif"}) {
    SCOPED_TRACE(file);
    std::vector<uint8_t> b = image_bytes(file);
    for (size_t i = 40; i < b.size(); ++i) b[i] = uint8_t(i * 7919u >> 3);
    const std::string msg = error_of<InvalidInput>([&] { decode_image(b); });
    EXPECT_NE(msg.find("malformed or truncated"), std::string::npos) << msg;
  }
}

TEST(ImageDecode, ImagesPastThePixelLimitAreRefusedBeforeDecoding) {
  ImageDecodeLimits limits;
  limits.max_pixels = 64 * 48 - 1;
  for (const char* file : {"png_rgb_64x48.png", "jpeg_rgb_120x80.jpg", "webp_lossy_96x64.webp"}) {
    SCOPED_TRACE(file);
    const std::string msg = error_of<InvalidInput>([&] { decode_image(image_bytes(file), limits); });
    EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
  }
  limits.max_pixels = 64 * 48;
  EXPECT_EQ(decode_image(image_bytes("png_rgb_64x48.png"), limits).width, 64);
}

TEST(ImageDecode, CompositeOverWhiteMatchesPillowsIntegerFormula) {
  uint8_t out[3];
  const uint8_t clear[4] = {10, 20, 30, 0};
  composite_over_white(clear, out);
  EXPECT_EQ(out[0], 255);
  const uint8_t opaque[4] = {10, 20, 30, 255};
  composite_over_white(opaque, out);
  EXPECT_EQ(out[0], 10);
  EXPECT_EQ(out[2], 30);
  // Half alpha: (0 * 128 + 255 * 127) / 255 = 127, which Pillow's rounding gives.
  const uint8_t half[4] = {0, 0, 0, 128};
  composite_over_white(half, out);
  EXPECT_EQ(out[0], 127);
}

}  // namespace
}  // namespace osprey
