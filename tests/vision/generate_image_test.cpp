// `osprey generate --image`: a tiny Gemma 3 vision-language checkpoint written here, prompts
// by token ids; the reply against the library path (vision/ and Model::forward with images),
// and the errors that name what is wrong.
#include <gtest/gtest.h>

#include <random>

#include "backend/ops.h"
#include "model/model.h"
#include "support/family_harness.h"
#include "support/family_reference.h"
#include "support/test_util.h"
#include "vision/image_decode.h"
#include "vision/image_preprocess.h"
#include "vision/vision_fixtures.h"
#include "vision/vision_tower.h"

namespace osprey {
namespace {

using testing::contains;
using testing::run_osprey;
using testing::TempDir;

const std::string kImages = testing::source_dir().string() + "/tests/fixtures/vision/images/";

// Text: the tiny Gemma 3 (vocab 256); vision: a 28-pixel SigLIP of 14-pixel patches, 4 soft
// tokens; image tokens 250 (begin 251, end 252).
void write_vlm(const std::filesystem::path& dir) {
  const nlohmann::json text = testing::tiny_gemma3_config();
  nlohmann::json c = testing::tiny_gemma3_vlm_config(text);
  c["boi_token_index"] = 251;
  c["eoi_token_index"] = 252;
  testing::RefWeights w = testing::gemma3_weights(text, 51, {}, "language_model.model.");
  std::mt19937 rng(52);
  const std::string T = "vision_tower.vision_model.";
  testing::add_random(w, rng, T + "embeddings.patch_embedding.weight", {32, 3, 14, 14}, 0.05);
  testing::add_random(w, rng, T + "embeddings.patch_embedding.bias", {32}, 0.1);
  testing::add_random(w, rng, T + "embeddings.position_embedding.weight", {4, 32}, 0.5);
  const std::string l = T + "encoder.layers.0.";
  for (const char* ln : {"layer_norm1", "layer_norm2"}) {
    testing::add_random(w, rng, l + ln + ".weight", {32}, 0.2, 1.0);
    testing::add_random(w, rng, l + ln + ".bias", {32}, 0.1);
  }
  for (const char* m : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    testing::add_random(w, rng, l + "self_attn." + m + ".weight", {32, 32}, 0.3);
    testing::add_random(w, rng, l + "self_attn." + m + ".bias", {32}, 0.1);
  }
  testing::add_random(w, rng, l + "mlp.fc1.weight", {48, 32}, 0.3);
  testing::add_random(w, rng, l + "mlp.fc1.bias", {48}, 0.1);
  testing::add_random(w, rng, l + "mlp.fc2.weight", {32, 48}, 0.3);
  testing::add_random(w, rng, l + "mlp.fc2.bias", {32}, 0.1);
  testing::add_random(w, rng, T + "post_layernorm.weight", {32}, 0.2, 1.0);
  testing::add_random(w, rng, T + "post_layernorm.bias", {32}, 0.1);
  testing::add_random(w, rng, "multi_modal_projector.mm_soft_emb_norm.weight", {32}, 0.2);
  testing::add_random(w, rng, "multi_modal_projector.mm_input_projection_weight", {32, 64}, 2.0);
  testing::write_checkpoint(dir, c, w);
}

const char* kIds = "--token-ids 2,17,33,251,250,250,250,250,252";

// The CLI's reply equals the library's greedy continuation with the same image (the library
// path itself is checked against references in vision_tower_test.cpp and gemma3_image_test.cpp).
TEST(GenerateImage, RepliesAsTheLibraryDoesWithTheImage) {
  TempDir dir;
  write_vlm(dir.path());
  auto model = testing::load_on(dir.path(), Device::cpu());
  std::optional<ImageEncoder> enc = load_image_encoder(dir.path(), {});
  ASSERT_TRUE(enc.has_value());
  const std::vector<int32_t> prompt = {2, 17, 33, 251, 250, 250, 250, 250, 252};
  for (const char* file : {"png_rgb_64x48.png", "jpeg_progressive_300x200.jpg"}) {
    SCOPED_TRACE(file);
    const testing::CommandResult r = run_osprey("generate -m " + dir.path().string() + " " + kIds + " --image " +
                                                kImages + file + " -n 8 --ignore-eos --json -q --device cpu");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<int32_t> cli = nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>();
    const std::string bytes = testing::read_file(kImages + file);
    const RgbImage img = decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end()));
    const std::vector<ImageSpan> spans = {{4, enc->tower->encode(preprocess_image(img, enc->processor))}};
    SequenceCache cache = model->make_cache({});
    Array l = ops::to_device(model->forward(testing::tokens_of(prompt), cache, false, spans), Device::cpu());
    std::vector<int32_t> lib;
    for (int t = 0; t < 8; ++t) {
      const float* row = l.data<float>();
      lib.push_back(int32_t(std::max_element(row, row + l.dim(1)) - row));
      l = ops::to_device(model->forward(testing::tokens_of({lib.back()}), cache, false), Device::cpu());
    }
    EXPECT_EQ(cli, lib);
  }
  // NOTE: this tiny random model's greedy reply hardly depends on the image (it repeats the last
  // token), so the equality above cannot tell a dropped image; the encoder's line says it ran.
  const testing::CommandResult r = run_osprey("generate -m " + dir.path().string() + " " + kIds + " --image " +
                                              kImages + "png_rgb_64x48.png -n 2 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "images: 1 encoded in"));
}

// --pan-and-scan: the 64x48 PNG (ratio 1.33 >= 1.2) is cut, by Gemma3ImageProcessor's rule with
// crops of at least 16 pixels, into max(2, floor(1.33 + .5)) = 2 crops of 32 columns; the
// prompt's three runs of image tokens take the image, then the crops (cut here by hand).
TEST(GenerateImage, PanAndScanFillsARunForTheImageAndEachCrop) {
  TempDir dir;
  write_vlm(dir.path());
  testing::write_file(dir / "preprocessor_config.json", R"({"pan_and_scan_min_crop_size": 16})");
  auto model = testing::load_on(dir.path(), Device::cpu());
  std::optional<ImageEncoder> enc = load_image_encoder(dir.path(), {});
  ASSERT_TRUE(enc.has_value());
  const std::vector<int32_t> prompt = {2, 17, 33, 251, 250, 250, 250, 250, 252, 5, 251, 250, 250, 250,
                                       250, 252, 6, 251, 250, 250, 250, 250, 252};
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string m = "generate -m " + dir.path().string() + " --token-ids " + ids + " --image " + kImages +
                        "png_rgb_64x48.png -n 6 --ignore-eos --json -q --device cpu";
  testing::CommandResult r = run_osprey(m + " --pan-and-scan");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int32_t> cli = nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>();
  const std::string bytes = testing::read_file(kImages + "png_rgb_64x48.png");
  const RgbImage img = decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  ASSERT_EQ(img.width, 64);
  std::vector<ImageSpan> spans = {{4, enc->tower->encode(preprocess_image(img, enc->processor))}};
  for (int64_t c = 0; c < 2; ++c) {
    RgbImage crop;
    crop.width = 32;
    crop.height = img.height;
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 32 * c; x < 32 * c + 32; ++x)
        for (int k = 0; k < 3; ++k) crop.rgb.push_back(img.rgb[size_t((y * img.width + x) * 3 + k)]);
    spans.push_back({10 + 6 * c + 1, enc->tower->encode(preprocess_image(crop, enc->processor))});
  }
  SequenceCache cache = model->make_cache({});
  Array l = ops::to_device(model->forward(testing::tokens_of(prompt), cache, false, spans), Device::cpu());
  std::vector<int32_t> lib;
  for (int t = 0; t < 6; ++t) {
    const float* row = l.data<float>();
    lib.push_back(int32_t(std::max_element(row, row + l.dim(1)) - row));
    l = ops::to_device(model->forward(testing::tokens_of({lib.back()}), cache, false), Device::cpu());
  }
  EXPECT_EQ(cli, lib);
  // Without it the image has one run, and the prompt's three are refused by name.
  r = run_osprey(m);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "holds the tokens of 3 image(s) for 1 --image file(s)")) << r.err;
  r = run_osprey(m + " --no-pan-and-scan");
  EXPECT_TRUE(contains(r.err, "holds the tokens of 3 image(s) for 1 --image file(s)")) << r.err;
  testing::write_file(dir / "preprocessor_config.json", R"({"pan_and_scan_min_crop_size": 16, "do_pan_and_scan": true})");
  r = run_osprey(m);  // the model's own setting
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_osprey("generate -m " + dir.path().string() + " " + kIds + " -n 2 -q --device cpu --pan-and-scan");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--pan-and-scan requires --image")) << r.err;
}

TEST(GenerateImage, ErrorsNameWhatIsWrong) {
  TempDir dir;
  write_vlm(dir.path());
  const std::string m = "generate -m " + dir.path().string() + " -n 2 -q --device cpu ";
  testing::CommandResult r = run_osprey(m + kIds + " --image " + kImages + "png_rgb_64x48.png --image " + kImages +
                                        "gif_40x25.gif");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "holds the tokens of 1 image(s) for 2 --image file(s)"));
  r = run_osprey(m + "--token-ids 2,17,251,250,250,250,252 --image " + kImages + "png_rgb_64x48.png");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "an image takes exactly 4"));
  testing::write_file(dir / "broken.png", testing::read_file(kImages + "png_rgb_64x48.png").substr(0, 300));
  r = run_osprey(m + kIds + " --image " + (dir / "broken.png").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--image " + (dir / "broken.png").string() + ": image: malformed or truncated PNG"));
  testing::write_file(dir / "note.txt", "just text");
  r = run_osprey(m + kIds + " --image " + (dir / "note.txt").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "not a PNG, JPEG, WebP or GIF image"));
  r = run_osprey(m + kIds + " --image " + (dir / "missing.png").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "missing.png: cannot open"));

  TempDir text_only;
  const nlohmann::json text = testing::tiny_gemma3_config();
  testing::write_checkpoint(text_only.path(), text, testing::gemma3_weights(text, 51));
  r = run_osprey("generate -m " + text_only.path().string() + " -n 2 -q --device cpu " + kIds + " --image " + kImages +
                 "png_rgb_64x48.png");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "takes no image input"));
}

}  // namespace
}  // namespace osprey
