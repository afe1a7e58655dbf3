// Images in a Gemma 3 prompt (model/model.h ImageSpan): the soft tokens replace the image
// tokens' embeddings and the rows of one image see each other on every layer. Against
//  - the double-precision Gemma 3 forward of tests/support/family_reference.cpp with the same
//    soft tokens and transformers' image-block mask, on a tiny random checkpoint written here;
//  - transformers' Gemma3ForConditionalGeneration on the gemma3-mm fixture with a real test
//    image (pixel values, the tower's output, soft tokens, logits, greedy tokens), when
//    tools/make_fixtures.py has written those references (a skip names them otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/ops.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "serve/generate.h"
#include "support/device_test.h"
#include "support/family_harness.h"
#include "support/test_util.h"
#include "vision/image_decode.h"
#include "vision/image_preprocess.h"
#include "vision/image_prompt.h"
#include "vision/vision_fixtures.h"
#include "vision/vision_tower.h"

namespace osprey {
namespace {

using testing::RefWeights;
using testing::TempDir;

// The tiny Gemma 3 language model (window 8) wrapped as Gemma3ForConditionalGeneration with a
// vision_config (its tower's tensors are not needed by the decoder).
nlohmann::json wrapped_config(const nlohmann::json& text) { return testing::tiny_gemma3_vlm_config(text); }

struct Image {
  int64_t pos0;
  std::vector<std::vector<double>> rows;  // [4][hidden], float32-exact
};

std::vector<Image> random_images(const std::vector<int64_t>& starts, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, 3.0);
  std::vector<Image> out;
  for (int64_t s : starts) {
    Image im{s, {}};
    for (int r = 0; r < 4; ++r) {
      std::vector<double> v(static_cast<size_t>(hidden));
      for (double& x : v) x = double(float(d(rng)));
      im.rows.push_back(v);
    }
    out.push_back(im);
  }
  return out;
}

testing::RefImages ref_images(const std::vector<Image>& images, size_t n_tokens) {
  testing::RefImages r;
  r.groups.assign(n_tokens, -1);
  for (size_t g = 0; g < images.size(); ++g)
    for (int64_t i = 0; i < int64_t(images[g].rows.size()); ++i) {
      r.rows[images[g].pos0 + i] = images[g].rows[size_t(i)];
      if (size_t(images[g].pos0 + i) < n_tokens) r.groups[size_t(images[g].pos0 + i)] = int(g);
    }
  return r;
}

std::vector<ImageSpan> spans_of(const std::vector<Image>& images, const Device& device) {
  std::vector<ImageSpan> spans;
  for (const Image& im : images) {
    const int64_t h = int64_t(im.rows[0].size());
    Array a = Array::empty({int64_t(im.rows.size()), h}, DType::f32);
    for (size_t r = 0; r < im.rows.size(); ++r)
      for (int64_t j = 0; j < h; ++j) a.data<float>()[int64_t(r) * h + j] = float(im.rows[r][size_t(j)]);
    spans.push_back({im.pos0, ops::to_device(a, device)});
  }
  return spans;
}

// The message of the E that one pass of a 6-token prompt with `spans` throws ("" when none).
template <class E>
std::string forward_error(Model& m, const std::vector<ImageSpan>& spans) {
  SequenceCache cache = m.make_cache({});
  return testing::error_of<E>([&] { m.forward(testing::tokens_of(testing::random_prompt(6, 1)), cache, true, spans); });
}

class Gemma3Images : public testing::DeviceTest {
 protected:
  double tolerance() const { return on_cuda() ? 1e-2 : 3e-3; }
};

TEST_P(Gemma3Images, SoftTokensAndTheImageMaskMatchTheReference) {
  const nlohmann::json text = testing::tiny_gemma3_config();
  const std::string prefix = "language_model.model.";
  const RefWeights w = testing::gemma3_weights(text, 41, {}, prefix);
  TempDir dir;
  testing::write_checkpoint(dir.path(), wrapped_config(text), w);
  auto m = testing::load_on(dir.path(), device());
  // Two images, the second past the window (8) of the first; 26 tokens, then 3 decoded.
  std::vector<int32_t> ids = testing::random_prompt(29, 12);
  const std::vector<Image> images = random_images({4, 15}, 64, 5);
  for (const Image& im : images)
    for (int i = 0; i < 4; ++i) ids[size_t(im.pos0 + i)] = 250;
  const DType rows = testing::kv_rows(*m);
  const testing::RefImages ri = ref_images(images, ids.size());
  const auto ref = testing::gemma3_reference(text, w, ids, prefix, nullptr, rows, &ri);
  // The mask matters: the causal reading of the same prompt is far off.
  testing::RefImages causal = ri;
  causal.groups.clear();
  const auto ref_causal = testing::gemma3_reference(text, w, ids, prefix, nullptr, rows, &causal);
  double mask_effect = 0;
  for (size_t t = 0; t < ref.size(); ++t)
    for (size_t j = 0; j < ref[t].size(); ++j) mask_effect = std::max(mask_effect, std::fabs(ref[t][j] - ref_causal[t][j]));
  ASSERT_GT(mask_effect, 0.5);

  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 26);
  const std::vector<ImageSpan> spans = spans_of(images, device());
  {  // one pass over the whole prompt
    SequenceCache cache = m->make_cache({});
    const Array l = ops::to_device(m->forward(testing::tokens_of(prompt), cache, true, spans), Device::cpu());
    ASSERT_EQ(l.dim(0), 26);
    EXPECT_LT(testing::worst_error(l, ref), tolerance()) << "one pass";
    // Then text decoded one token at a time, after the images.
    for (size_t t = 26; t < ids.size(); ++t) {
      const Array s = ops::to_device(m->forward(testing::tokens_of({ids[t]}), cache, false), Device::cpu());
      EXPECT_LT(testing::worst_error(s, ref, int64_t(t)), tolerance()) << "decode at " << t;
    }
  }
  {  // chunks that end before, inside text and right after an image
    SequenceCache cache = m->make_cache({});
    int64_t at = 0;
    for (int64_t end : {3, 10, 19, 26}) {
      const std::vector<int32_t> chunk(prompt.begin() + at, prompt.begin() + end);
      const Array l = ops::to_device(m->forward(testing::tokens_of(chunk), cache, true, spans), Device::cpu());
      EXPECT_LT(testing::worst_error(l, ref, at), tolerance()) << "chunk [" << at << ", " << end << ")";
      at = end;
    }
  }
}

TEST_P(Gemma3Images, AnImageSplitBetweenPassesIsRefused) {
  const nlohmann::json text = testing::tiny_gemma3_config();
  TempDir dir;
  testing::write_checkpoint(dir.path(), wrapped_config(text), testing::gemma3_weights(text, 41, {}, "language_model.model."));
  auto m = testing::load_on(dir.path(), device());
  const std::string e = forward_error<InvalidInput>(*m, spans_of(random_images({4}, 64, 5), device()));
  EXPECT_TRUE(testing::contains(e, "[4, 8) is split by a pass over [0, 6)"));
}

TEST_P(Gemma3Images, ATextOnlyModelRefusesImagesByName) {
  const nlohmann::json text = testing::tiny_gemma3_config();
  TempDir dir;
  testing::write_checkpoint(dir.path(), text, testing::gemma3_weights(text, 41));
  auto m = testing::load_on(dir.path(), device());
  const std::string e = forward_error<Unsupported>(*m, spans_of(random_images({1}, 64, 5), device()));
  EXPECT_TRUE(testing::contains(e, "gemma3_text takes no image input"));
  EXPECT_FALSE(load_image_encoder(dir.path(), {}).has_value());
}

TEST_P(Gemma3Images, GenerateNeverCutsAnImageBetweenPrefillChunks) {
  const nlohmann::json text = testing::tiny_gemma3_config();
  TempDir dir;
  testing::write_checkpoint(dir.path(), wrapped_config(text), testing::gemma3_weights(text, 41, {}, "language_model.model."));
  auto m = testing::load_on(dir.path(), device());
  std::vector<int32_t> prompt = testing::random_prompt(14, 3);
  const std::vector<ImageSpan> spans = spans_of(random_images({3, 9}, 64, 5), device());
  std::vector<std::vector<int32_t>> replies;
  for (int64_t chunk : {512, 5, 3, 1}) {  // 5 and 3 would cut both images, 1 every one
    SequenceCache cache = m->make_cache({});
    GenerateParams gp;
    gp.max_tokens = 6;
    gp.prefill_chunk = chunk;
    gp.images = spans;
    replies.push_back(generate(*m, cache, prompt, gp).tokens);
    EXPECT_EQ(replies.back(), replies.front()) << "prefill chunks of " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Gemma3Images, OSPREY_DEVICES);

// ---- the gemma3-mm fixture against transformers

class Gemma3FixtureImages : public testing::DeviceTest {
 protected:
  void SetUp() override {
    testing::DeviceTest::SetUp();
    if (IsSkipped()) return;
    dir_ = testing::fixture_dir("gemma3-mm");
    ref_ = std::make_unique<SafeTensors>(SafeTensors::open_file(dir_ / "reference.safetensors"));
    if (!ref_->contains("image_logits_0"))
      GTEST_SKIP() << "tests/fixtures/models/gemma3-mm/reference.safetensors has no image references "
                      "(image_logits_0, image_features_0, ...): regenerate the fixture with tools/make_fixtures.py "
                      "--families gemma3,gemma3-mm (torch + transformers)";
    model_ = testing::load_on(dir_, device());
    LoadOptions opt;
    opt.device = device();
    encoder_ = load_image_encoder(dir_, opt);
    ASSERT_TRUE(encoder_.has_value());
  }
  // The fixture's test image i as Osprey preprocesses it.
  Array pixels(int i) const {
    const char* files[] = {"jpeg_rgb_120x80.jpg", "png_rgb_64x48.png"};
    const std::string bytes = testing::read_file(testing::source_dir() / "tests/fixtures/vision/images" / files[i]);
    const RgbImage img = decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end()));
    return preprocess_image(img, encoder_->processor);
  }
  static double rel_error(const std::vector<float>& ours, const Array& ref) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      worst = std::max(worst, double(std::fabs(ours[size_t(i)] - ref.data<float>()[i])));
      scale = std::max(scale, double(std::fabs(ref.data<float>()[i])));
    }
    return worst / scale;
  }
  std::vector<ImageSpan> spans(const Array& features, const std::vector<int32_t>& prompt) const {
    const int32_t image_id = encoder_->tower->config().image_token_id;
    int64_t pos0 = -1;
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] == image_id) {
        pos0 = int64_t(i);
        break;
      }
    EXPECT_GE(pos0, 0);
    return {{pos0, features}};
  }
  double tolerance() const { return on_cuda() ? 1e-2 : 3e-3; }

  std::filesystem::path dir_;
  std::unique_ptr<SafeTensors> ref_;
  std::unique_ptr<Model> model_;
  std::optional<ImageEncoder> encoder_;
};

TEST_P(Gemma3FixtureImages, PixelValuesTowerAndSoftTokensEqualTransformers) {
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const Array px = pixels(i);
    const Array want = ref_->get("image_pixel_values_" + std::to_string(i));
    ASSERT_EQ(px.shape(), want.shape());
    double worst = 0;
    for (int64_t j = 0; j < px.numel(); ++j)
      worst = std::max(worst, double(std::fabs(px.data<float>()[j] - want.data<float>()[j])));
    EXPECT_LE(worst, 1e-5) << "pixel values";
    // The tower from transformers' own pixel values, so that its error is its own.
    const Array patches = encoder_->tower->encode_patches(want);
    EXPECT_LT(rel_error(host(patches), ref_->get("image_patches_" + std::to_string(i))), 1e-2) << "tower";
    EXPECT_LT(rel_error(host(encoder_->tower->project(patches)), ref_->get("image_features_" + std::to_string(i))), 1e-2)
        << "soft tokens";
  }
}

TEST_P(Gemma3FixtureImages, LogitsAndGreedyTokensEqualTransformers) {
  const std::vector<int32_t> prompt = testing::ints(ref_->get("image_tokens"));
  std::vector<std::vector<float>> ours(2);
  for (int i = 0; i < 2; ++i) {
    const Array features = encoder_->tower->encode(pixels(i));
    SequenceCache cache = model_->make_cache({});
    const Array l = ops::to_device(model_->forward(testing::tokens_of(prompt), cache, true, spans(features, prompt)),
                                   Device::cpu());
    const Array want = ref_->get("image_logits_" + std::to_string(i));
    ASSERT_EQ(l.shape(), want.shape());
    const int64_t vocab = l.dim(1);
    double worst = 0;
    for (int64_t t = 0; t < l.dim(0); ++t)
      worst = std::max(worst, testing::relative_row_error(l.data<float>() + t * vocab, want.data<float>() + t * vocab, vocab));
    EXPECT_LT(worst, tolerance()) << "image " << i;
    ours[size_t(i)].assign(l.data<float>(), l.data<float>() + l.numel());
  }
  double differ = 0;
  for (size_t j = 0; j < ours[0].size(); ++j) differ = std::max(differ, double(std::fabs(ours[0][j] - ours[1][j])));
  EXPECT_GT(differ, 1e-2) << "a different image must change the logits";

  // Greedy: the prompt with image 0, then one token at a time.
  const std::vector<int32_t> want = testing::ints(ref_->get("image_greedy_tokens_0"));
  const Array margins = ref_->get("image_greedy_margins_0");
  const Array features = encoder_->tower->encode(pixels(0));
  SequenceCache cache = model_->make_cache({});
  Array l = ops::to_device(model_->forward(testing::tokens_of(prompt), cache, false, spans(features, prompt)), Device::cpu());
  for (size_t t = 0; t < want.size(); ++t) {
    const float* row = l.data<float>();
    const int32_t next = int32_t(std::max_element(row, row + l.dim(1)) - row);
    if (margins.data<float>()[t] < 1e-3) break;  // a near tie: the order after it is not fixed
    ASSERT_EQ(next, want[t]) << "greedy token " << t;
    l = ops::to_device(model_->forward(testing::tokens_of({next}), cache, false), Device::cpu());
  }
}

// Pan-and-scan against Gemma3ImageProcessor(do_pan_and_scan=True, crops of at least 16
// pixels): each test image's views (the image, then its crops) as pixel values, and the logits
// of a prompt holding image 0's views as consecutive runs of image tokens.
TEST_P(Gemma3FixtureImages, PanAndScanViewsAndLogitsEqualTransformers) {
  if (!ref_->contains("pas_logits"))
    GTEST_SKIP() << "tests/fixtures/models/gemma3-mm/reference.safetensors has no pan-and-scan references "
                    "(pas_pixel_values_0, pas_logits): regenerate it with tools/make_fixtures.py --families gemma3-mm";
  ImageProcessorConfig processor = encoder_->processor;
  processor.do_pan_and_scan = true;
  processor.pan_and_scan_min_crop_size = 16;
  const char* files[] = {"webp_lossy_96x64.webp", "jpeg_progressive_300x200.jpg", "jpeg_gray_31x45.jpg"};
  std::vector<Array> views0;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(files[i]);
    const std::string bytes = testing::read_file(testing::source_dir() / "tests/fixtures/vision/images" / files[i]);
    std::vector<RgbImage> images;
    images.push_back(decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end())));
    const ImageViews v = image_views(std::move(images), processor);
    const Array want = ref_->get("pas_pixel_values_" + std::to_string(i));
    EXPECT_EQ(int64_t(v.n_crops[0]), int64_t(ref_->get("pas_num_crops_" + std::to_string(i)).data<int32_t>()[0]));
    ASSERT_EQ(int64_t(v.views.size()), want.dim(0));
    const int64_t per = want.numel() / want.dim(0);
    for (size_t k = 0; k < v.views.size(); ++k) {
      const Array px = preprocess_image(v.views[k], processor);
      ASSERT_EQ(px.numel(), per);
      double worst = 0;
      for (int64_t j = 0; j < per; ++j)
        worst = std::max(worst, double(std::fabs(px.data<float>()[j] - want.data<float>()[int64_t(k) * per + j])));
      EXPECT_LE(worst, 1e-5) << "view " << k;
      if (i == 0) views0.push_back(px);
    }
  }
  const std::vector<int32_t> prompt = testing::ints(ref_->get("pas_tokens"));
  const std::vector<int64_t> starts = image_token_runs(prompt, encoder_->tower->config());
  ASSERT_EQ(starts.size(), views0.size());
  std::vector<ImageSpan> spans;
  for (size_t k = 0; k < starts.size(); ++k) spans.push_back({starts[k], encoder_->tower->encode(views0[k])});
  SequenceCache cache = model_->make_cache({});
  const Array l = ops::to_device(model_->forward(testing::tokens_of(prompt), cache, true, spans), Device::cpu());
  const Array want = ref_->get("pas_logits");
  ASSERT_EQ(l.shape(), want.shape());
  double worst = 0;
  for (int64_t t = 0; t < l.dim(0); ++t)
    worst = std::max(worst, testing::relative_row_error(l.data<float>() + t * l.dim(1), want.data<float>() + t * l.dim(1), l.dim(1)));
  EXPECT_LT(worst, tolerance());
}

INSTANTIATE_TEST_SUITE_P(Devices, Gemma3FixtureImages, OSPREY_DEVICES);

}  // namespace
}  // namespace osprey
