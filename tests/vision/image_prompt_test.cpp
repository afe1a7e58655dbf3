// Where a Gemma 3 prompt's images go (vision/image_prompt.h): Gemma3Processor's expansion of the
// image marker, the image-token runs of a prompt of ids, and the prompt cache's salt.
#include <gtest/gtest.h>

#include "core/error.h"
#include "support/family_harness.h"
#include "support/test_util.h"
#include "vision/image_prompt.h"

namespace osprey {
namespace {

VisionConfig tiny() {
  VisionConfig c;
  c.mm_tokens_per_image = 3;
  c.image_token_id = 9;
  c.boi_token_id = 7;
  c.eoi_token_id = 8;
  return c;
}

TEST(ImagePrompt, MarkersExpandAsGemma3ProcessorDoes) {
  // transformers: text.replace(boi, "\n\n" + boi + image_token * n + eoi + "\n\n")
  EXPECT_EQ(expand_image_markers("A <start_of_image> B", tiny(), 1),
            "A \n\n<start_of_image><image_soft_token><image_soft_token><image_soft_token><end_of_image>\n\n B");
  EXPECT_EQ(expand_image_markers("<start_of_image><start_of_image>", tiny(), 2).size(),
            2 * (4 + 16 + 3 * 18 + 14));
  EXPECT_TRUE(testing::contains(testing::error_of<InvalidInput>([] { expand_image_markers("no marker", tiny(), 1); }),
                                "holds 0 image markers (<start_of_image>) for 1 image"));
  EXPECT_TRUE(testing::contains(
      testing::error_of<InvalidInput>([] { expand_image_markers("<start_of_image><image_soft_token>", tiny(), 1); }),
      "already"));
}

TEST(ImagePrompt, AnImageWithCropsIsIntroducedAsGemma3ProcessorWritesIt) {
  // transformers (Gemma3Processor.replace_image_token): with num_crops > 0 the marker becomes
  // "Here is the original image " + seq + " and here are some crops to help you see better "
  // + " ".join([seq] * num_crops), seq = "\n\n" + boi + image tokens + eoi + "\n\n".
  const std::string seq = "\n\n<start_of_image><image_soft_token><image_soft_token><image_soft_token><end_of_image>\n\n";
  const std::vector<size_t> crops = {2, 0};
  EXPECT_EQ(expand_image_markers("A <start_of_image> B <start_of_image> C", tiny(), std::span<const size_t>(crops)),
            "A Here is the original image " + seq + " and here are some crops to help you see better " + seq + " " +
                seq + " B " + seq + " C");
  const std::vector<size_t> one = {1};
  EXPECT_TRUE(testing::contains(
      testing::error_of<InvalidInput>([&] { expand_image_markers("none", tiny(), std::span<const size_t>(one)); }),
      "holds 0 image markers"));
}

TEST(ImagePrompt, ViewsAreEachImageThenItsCrops) {
  auto image = [](int64_t w, int64_t h, uint8_t v) {
    RgbImage im;
    im.width = w;
    im.height = h;
    im.rgb.assign(size_t(w * h * 3), v);
    return im;
  };
  ImageProcessorConfig processor;  // pan-and-scan off by default
  std::vector<RgbImage> images;
  images.push_back(image(1000, 500, 1));  // 2 crops when cut (image_preprocess_test)
  images.push_back(image(600, 600, 2));   // square: never cut
  ImageViews v = image_views(images, processor);
  EXPECT_EQ(v.views.size(), 2u);
  EXPECT_EQ(v.n_crops, (std::vector<size_t>{0, 0}));
  processor.do_pan_and_scan = true;
  v = image_views(images, processor);
  ASSERT_EQ(v.views.size(), 4u);
  EXPECT_EQ(v.n_crops, (std::vector<size_t>{2, 0}));
  EXPECT_EQ(v.views[0].width, 1000);  // the image first, then its crops, then the next image
  EXPECT_EQ(v.views[1].width, 500);
  EXPECT_EQ(v.views[2].width, 500);
  EXPECT_EQ(v.views[3].rgb[0], 2);
  v = image_views(images, processor, {false, true});  // a choice per image over the setting
  EXPECT_EQ(v.n_crops, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(v.views.size(), 2u);
}

TEST(ImagePrompt, RunsOfImageTokensAreFoundAndChecked) {
  const std::vector<int32_t> ids = {2, 5, 7, 9, 9, 9, 8, 5, 7, 9, 9, 9, 8};
  EXPECT_EQ(image_token_runs(ids, tiny()), (std::vector<int64_t>{3, 9}));
  EXPECT_TRUE(image_token_runs(std::vector<int32_t>{2, 5, 6}, tiny()).empty());
  const std::vector<int32_t> short_run = {7, 9, 9, 8};
  EXPECT_TRUE(testing::contains(testing::error_of<InvalidInput>([&] { image_token_runs(short_run, tiny()); }),
                                "positions [1, 3): an image takes exactly 3"));
  const std::vector<int32_t> no_begin = {5, 9, 9, 9, 8};
  EXPECT_TRUE(testing::contains(testing::error_of<InvalidInput>([&] { image_token_runs(no_begin, tiny()); }),
                                "not preceded by the begin-of-image token 7"));
  const std::vector<int32_t> no_end = {7, 9, 9, 9};
  EXPECT_TRUE(testing::contains(testing::error_of<InvalidInput>([&] { image_token_runs(no_end, tiny()); }),
                                "not followed by the end-of-image token 8"));
}

TEST(ImagePrompt, TheCacheSaltHoldsTheImagesBytes) {
  EXPECT_EQ(image_cache_salt({}), "");
  const std::string a = image_cache_salt({"abc"}), b = image_cache_salt({"abd"});
  EXPECT_NE(a, b);
  EXPECT_EQ(a, image_cache_salt({"abc"}));
  EXPECT_NE(image_cache_salt({"ab", "c"}), image_cache_salt({"a", "bc"}));
}

}  // namespace
}  // namespace osprey
