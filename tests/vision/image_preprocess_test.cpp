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
  testing::write_file(dir / "preprocessor_config.json", R"({"do_pan_and_scan": true})");
  EXPECT_NE(error_of<Unsupported>([&] { load_image_processor_config(dir.path(), 448); }).find("pan-and-scan"),
            std::string::npos);
  testing::write_file(dir / "preprocessor_config.json", R"({"image_mean": [0.5, 0.5]})");
  EXPECT_NE(error_of<InvalidInput>([&] { load_image_processor_config(dir.path(), 448); }).find("image_mean"),
            std::string::npos);
}

}  // namespace
}  // namespace osprey
