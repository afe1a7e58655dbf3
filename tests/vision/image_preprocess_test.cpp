// Preprocessing against Pillow and transformers' arithmetic: pixels_<name>_<S> in
// tests/fixtures/vision/reference.safetensors are Gemma3ImageProcessor's pixel values at S x S
// (Pillow's bilinear resize, then rescale and normalize as transformers orders them),
// computed by tools/make_vision_fixtures.py.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "formats/safetensors.h"
#include "support/test_util.h"
#include "vision/vision_fixtures.h"
#include "vision/image_decode.h"
#include "vision/image_preprocess.h"

namespace osprey {
namespace {

using testing::error_of;
using testing::image_bytes;

TEST(ImagePreprocess, PixelValuesEqualPillowAndTransformersAtSeveralSizes) {
  const SafeTensors ref = testing::vision_reference();
  for (const testing::VisionImage& im : testing::kVisionImages) {
    const RgbImage img = decode_image(image_bytes(im.file));
    for (int64_t s : {64, 100}) {
      SCOPED_TRACE(std::string(im.name) + " at " + std::to_string(s));
      ImageProcessorConfig cfg;
      cfg.height = cfg.width = s;
      const Array got = preprocess_image(img, cfg);
      const Array want = ref.get(std::string("pixels_") + im.name + "_" + std::to_string(s));
      ASSERT_EQ(got.shape(), want.shape());
      const float* g = got.data<float>();
      const float* w = want.data<float>();
      double worst = 0;
      for (int64_t i = 0; i < got.numel(); ++i) worst = std::max(worst, double(std::fabs(g[i] - w[i])));
      EXPECT_LE(worst, 1e-5);
    }
  }
}

TEST(ImagePreprocess, ResizeKeepsAnUnchangedSizeAndScalesEachAxisAlone) {
  RgbImage img{3, 2, {0, 0, 0, 255, 255, 255, 0, 0, 0, 10, 10, 10, 20, 20, 20, 30, 30, 30}};
  EXPECT_EQ(resize_bilinear(img, 3, 2).rgb, img.rgb);
  // Halving the width of [0, 255, 0] row: taps over the whole row (support 1.5), weights
  // 0.5/1.5 .. : Pillow's fixed-point result (computed by hand from its formula).
  const RgbImage one = resize_bilinear(img, 1, 2);
  ASSERT_EQ(one.width, 1);
  EXPECT_EQ(one.height, 2);
  EXPECT_EQ(one.rgb[3], 20);  // the second row's mean, symmetric taps
}

TEST(ImagePreprocess, ConfigIsReadFromPreprocessorConfigJson) {
  testing::TempDir dir;
  EXPECT_EQ(load_image_processor_config(dir.path(), 448).height, 448);
  testing::write_file(dir / "preprocessor_config.json",
                      R"({"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 896, "width": 896},
                          "resample": 2, "rescale_factor": 0.00392156862745098, "image_mean": [0.5, 0.5, 0.5],
                          "image_std": [0.5, 0.5, 0.5], "do_pan_and_scan": null, "do_convert_rgb": null})");
  const ImageProcessorConfig c = load_image_processor_config(dir.path(), 448);
  EXPECT_EQ(c.height, 896);
  EXPECT_EQ(c.width, 896);
  EXPECT_DOUBLE_EQ(c.image_std[2], 0.5);
  testing::write_file(dir / "preprocessor_config.json", R"({"resample": 3})");
  EXPECT_NE(error_of<Unsupported>([&] { load_image_processor_config(dir.path(), 448); }).find("resample"),
            std::string::npos);
  EXPECT_FALSE(c.do_pan_and_scan);  // null: Gemma3Processor's defaults
  EXPECT_EQ(c.pan_and_scan_min_crop_size, 256);
  EXPECT_EQ(c.pan_and_scan_max_num_crops, 4);
  EXPECT_DOUBLE_EQ(c.pan_and_scan_min_ratio_to_activate, 1.2);
  testing::write_file(dir / "preprocessor_config.json",
                      R"({"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 128, "pan_and_scan_max_num_crops": 3,
                          "pan_and_scan_min_ratio_to_activate": 1.5})");
  const ImageProcessorConfig p = load_image_processor_config(dir.path(), 448);
  EXPECT_TRUE(p.do_pan_and_scan);
  EXPECT_EQ(p.pan_and_scan_min_crop_size, 128);
  EXPECT_EQ(p.pan_and_scan_max_num_crops, 3);
  EXPECT_DOUBLE_EQ(p.pan_and_scan_min_ratio_to_activate, 1.5);
  for (const char* bad : {R"({"pan_and_scan_min_crop_size": 0})", R"({"pan_and_scan_max_num_crops": 0})",
                          R"({"pan_and_scan_min_ratio_to_activate": -1})", R"({"do_pan_and_scan": "yes"})"}) {
    testing::write_file(dir / "preprocessor_config.json", bad);
    const std::string e = error_of<InvalidInput>([&] { load_image_processor_config(dir.path(), 448); });
    EXPECT_NE(e.find("pan_and_scan"), std::string::npos) << bad << ": " << e;
  }
  testing::write_file(dir / "preprocessor_config.json", R"({"image_mean": [0.5, 0.5]})");
  EXPECT_NE(error_of<InvalidInput>([&] { load_image_processor_config(dir.path(), 448); }).find("image_mean"),
            std::string::npos);
}

// An image whose pixel (x, y) is (x mod 256, y mod 256, (x + y) mod 7): a crop's pixels show
// where in the image it was cut from.
RgbImage coordinate_image(int64_t width, int64_t height) {
  RgbImage im;
  im.width = width;
  im.height = height;
  im.rgb.resize(size_t(width * height * 3));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* p = &im.rgb[size_t((y * width + x) * 3)];
      p[0] = uint8_t(x % 256);
      p[1] = uint8_t(y % 256);
      p[2] = uint8_t((x + y) % 7);
    }
  return im;
}

struct Crop {
  int64_t x, y, width, height;
};

// Gemma3ImageProcessor.pan_and_scan with its defaults (min crop 256, at most 4 crops, ratio
// 1.2), each case worked by hand from that function:
//   1000x500: ratio 2; n = floor(2 + .5) = 2, <= floor(1000 / 256) = 3; crops of ceil(1000 / 2)
//             = 500: x = 0, 500.
//   1000x700: ratio 1.43 >= 1.2; n = floor(1.93) = 1, raised to 2; crops 500 wide, 700 tall.
//   1000x900: ratio 1.11 < 1.2: none.
//   300x1000: portrait, ratio 3.33; n = floor(3.83) = 3 <= floor(1000 / 256) = 3; crops of
//             ceil(1000 / 3) = 334 rows at y = 0, 334, 668, the last cut to 332 at the edge.
//   200x1000: ratio 5; n = min(5, 3) = 3; rows 334, but the width 200 < 256: none.
//   2000x300: ratio 6.67; n = min(floor(7.17) = 7, floor(2000 / 256) = 7) = 7, then at most 4;
//             crops of 500: x = 0, 500, 1000, 1500.
//   512x256:  ratio 2; n = 2; crops 256 x 256 (exactly the minimum: kept).
//   500x250:  ratio 2; n = min(2, floor(500 / 256) = 1) = 1, raised to 2; crops 250 < 256: none.
TEST(ImagePreprocess, PanAndScanCutsAsGemma3ImageProcessorDoes) {
  const ImageProcessorConfig config;
  const struct {
    int64_t width, height;
    std::vector<Crop> crops;
  } cases[] = {
      {1000, 500, {{0, 0, 500, 500}, {500, 0, 500, 500}}},
      {1000, 700, {{0, 0, 500, 700}, {500, 0, 500, 700}}},
      {1000, 900, {}},
      {300, 1000, {{0, 0, 300, 334}, {0, 334, 300, 334}, {0, 668, 300, 332}}},
      {200, 1000, {}},
      {2000, 300, {{0, 0, 500, 300}, {500, 0, 500, 300}, {1000, 0, 500, 300}, {1500, 0, 500, 300}}},
      {512, 256, {{0, 0, 256, 256}, {256, 0, 256, 256}}},
      {500, 250, {}},
  };
  for (const auto& c : cases) {
    const RgbImage image = coordinate_image(c.width, c.height);
    const std::vector<RgbImage> crops = pan_and_scan_crops(image, config);
    ASSERT_EQ(crops.size(), c.crops.size()) << c.width << "x" << c.height;
    for (size_t i = 0; i < crops.size(); ++i) {
      const Crop& want = c.crops[i];
      const RgbImage& got = crops[i];
      ASSERT_EQ(got.width, want.width) << c.width << "x" << c.height << " crop " << i;
      ASSERT_EQ(got.height, want.height) << c.width << "x" << c.height << " crop " << i;
      ASSERT_EQ(got.rgb.size(), size_t(want.width * want.height * 3));
      for (int64_t y = 0; y < got.height; ++y)
        for (int64_t x = 0; x < got.width; ++x) {
          const uint8_t* p = &got.rgb[size_t((y * got.width + x) * 3)];
          const int64_t sx = want.x + x, sy = want.y + y;
          ASSERT_TRUE(p[0] == sx % 256 && p[1] == sy % 256 && p[2] == (sx + sy) % 7)
              << c.width << "x" << c.height << " crop " << i << " at (" << x << ", " << y << ")";
        }
    }
  }
}

TEST(ImagePreprocess, PanAndScanFollowsItsSettings) {
  ImageProcessorConfig config;
  const RgbImage wide = coordinate_image(2000, 300);
  config.pan_and_scan_max_num_crops = 2;  // n = 7 -> 2 crops of 1000
  ASSERT_EQ(pan_and_scan_crops(wide, config).size(), 2u);
  EXPECT_EQ(pan_and_scan_crops(wide, config)[1].width, 1000);
  config.pan_and_scan_max_num_crops = 4;
  config.pan_and_scan_min_ratio_to_activate = 7.0;  // 6.67 < 7: none
  EXPECT_TRUE(pan_and_scan_crops(wide, config).empty());
  config.pan_and_scan_min_ratio_to_activate = 1.2;
  config.pan_and_scan_min_crop_size = 301;  // the 300 rows are less than a crop: none
  EXPECT_TRUE(pan_and_scan_crops(wide, config).empty());
}

}  // namespace
}  // namespace osprey
