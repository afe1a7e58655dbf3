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
