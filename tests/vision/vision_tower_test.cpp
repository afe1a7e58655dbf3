// The SigLIP vision tower and Gemma 3's projector (src/vision/vision_tower.h) on a tiny random
// checkpoint written here, against a double-precision forward pass written below from
// transformers' modeling_siglip.py and modeling_gemma3.py (Gemma3MultiModalProjector),
// independent of src/. The transformers references of the gemma3-mm fixture are compared in
// gemma3_image_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/ops.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"
#include "support/device_test.h"
#include "support/family_reference.h"
#include "support/test_util.h"
#include "vision/vision_tower.h"

namespace osprey {
namespace {

using testing::RefWeights;
using Mat = std::vector<double>;  // row-major

// Vision hidden 32 in 4 heads of 8, 2 layers, 56-pixel images of 14-pixel patches (4 x 4),
// 4 soft tokens (2 x 2, each the mean of 2 x 2 patches), text hidden 24.
nlohmann::json tiny_config() {
  return {{"model_type", "gemma3"},
          {"mm_tokens_per_image", 4},
          {"image_token_index", 60},
          {"boi_token_index", 61},
          {"eoi_token_index", 62},
          {"text_config", {{"hidden_size", 24}}},
          {"vision_config",
           {{"model_type", "siglip_vision_model"},
            {"hidden_size", 32},
            {"intermediate_size", 48},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"image_size", 56},
            {"patch_size", 14},
            {"layer_norm_eps", 1e-6}}}};
}

RefWeights tiny_weights(uint32_t seed, const std::string& T = "vision_tower.vision_model.") {
  std::mt19937 rng(seed);
  RefWeights w;
  const int64_t h = 32, f = 48, p = 14;
  testing::add_random(w, rng, T + "embeddings.patch_embedding.weight", {h, 3, p, p}, 0.05);
  testing::add_random(w, rng, T + "embeddings.patch_embedding.bias", {h}, 0.1);
  testing::add_random(w, rng, T + "embeddings.position_embedding.weight", {16, h}, 0.5);
  for (int l = 0; l < 2; ++l) {
    const std::string pre = T + "encoder.layers." + std::to_string(l) + ".";
    for (const char* ln : {"layer_norm1", "layer_norm2"}) {
      testing::add_random(w, rng, pre + ln + ".weight", {h}, 0.2, 1.0);
      testing::add_random(w, rng, pre + ln + ".bias", {h}, 0.1);
    }
    for (const char* m : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      testing::add_random(w, rng, pre + "self_attn." + m + ".weight", {h, h}, 0.3);
      testing::add_random(w, rng, pre + "self_attn." + m + ".bias", {h}, 0.1);
    }
    testing::add_random(w, rng, pre + "mlp.fc1.weight", {f, h}, 0.3);
    testing::add_random(w, rng, pre + "mlp.fc1.bias", {f}, 0.1);
    testing::add_random(w, rng, pre + "mlp.fc2.weight", {h, f}, 0.3);
    testing::add_random(w, rng, pre + "mlp.fc2.bias", {h}, 0.1);
  }
  testing::add_random(w, rng, T + "post_layernorm.weight", {h}, 0.2, 1.0);
  testing::add_random(w, rng, T + "post_layernorm.bias", {h}, 0.1);
  testing::add_random(w, rng, "multi_modal_projector.mm_soft_emb_norm.weight", {h}, 0.2);
  testing::add_random(w, rng, "multi_modal_projector.mm_input_projection_weight", {h, 24}, 0.3);
  return w;
}

std::vector<float> random_pixels(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(3 * 56 * 56);
  for (float& x : v) x = u(rng);
  return v;
}

// x [n, in] @ W[out, in]^T + b
Mat lin(const Mat& x, int64_t n, const testing::RefTensor& W, const testing::RefTensor* b) {
  const int64_t out = W.shape[0], in = W.shape[1];
  Mat y(size_t(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? b->v[size_t(o)] : 0.0;
      for (int64_t k = 0; k < in; ++k) s += x[size_t(i * in + k)] * W.v[size_t(o * in + k)];
      y[size_t(i * out + o)] = s;
    }
  return y;
}

Mat layer_norm(const Mat& x, int64_t n, const testing::RefTensor& g, const testing::RefTensor& b, double eps) {
  const int64_t d = int64_t(g.v.size());
  Mat y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0, var = 0;
    for (int64_t k = 0; k < d; ++k) mean += x[size_t(i * d + k)];
    mean /= double(d);
    for (int64_t k = 0; k < d; ++k) var += (x[size_t(i * d + k)] - mean) * (x[size_t(i * d + k)] - mean);
    var /= double(d);
    for (int64_t k = 0; k < d; ++k)
      y[size_t(i * d + k)] = (x[size_t(i * d + k)] - mean) / std::sqrt(var + eps) * g.v[size_t(k)] + b.v[size_t(k)];
  }
  return y;
}

// The tower's last hidden state [16, 32] and the projected soft tokens [4, 24].
struct RefOut {
  Mat patches, tokens;
};

RefOut reference(const RefWeights& w, const std::vector<float>& px, const std::string& T = "vision_tower.vision_model.") {
  const int64_t h = 32, heads = 4, hd = 8, n = 16, p = 14, S = 56;
  auto W = [&](const std::string& name) -> const testing::RefTensor& { return w.at(name); };
  // Conv2d(3, h, kernel p, stride p): patch (py, px) -> row py * 4 + px.
  Mat x(size_t(n * h));
  const auto& cw = W(T + "embeddings.patch_embedding.weight");
  for (int64_t py = 0; py < 4; ++py)
    for (int64_t pxi = 0; pxi < 4; ++pxi)
      for (int64_t o = 0; o < h; ++o) {
        double s = W(T + "embeddings.patch_embedding.bias").v[size_t(o)];
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t dy = 0; dy < p; ++dy)
            for (int64_t dx = 0; dx < p; ++dx)
              s += double(px[size_t((c * S + py * p + dy) * S + pxi * p + dx)]) *
                   cw.v[size_t(((o * 3 + c) * p + dy) * p + dx)];
        x[size_t((py * 4 + pxi) * h + o)] = s + W(T + "embeddings.position_embedding.weight").v[size_t((py * 4 + pxi) * h + o)];
      }
  for (int l = 0; l < 2; ++l) {
    const std::string pre = T + "encoder.layers." + std::to_string(l) + ".";
    const Mat a = layer_norm(x, n, W(pre + "layer_norm1.weight"), W(pre + "layer_norm1.bias"), 1e-6);
    const Mat q = lin(a, n, W(pre + "self_attn.q_proj.weight"), &W(pre + "self_attn.q_proj.bias"));
    const Mat k = lin(a, n, W(pre + "self_attn.k_proj.weight"), &W(pre + "self_attn.k_proj.bias"));
    const Mat v = lin(a, n, W(pre + "self_attn.v_proj.weight"), &W(pre + "self_attn.v_proj.bias"));
    Mat att(size_t(n * h), 0.0);
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += q[size_t(i * h + hh * hd + e)] * k[size_t(j * h + hh * hd + e)];
          s[size_t(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t e = 0; e < hd; ++e) att[size_t(i * h + hh * hd + e)] += s[size_t(j)] / z * v[size_t(j * h + hh * hd + e)];
      }
    const Mat o = lin(att, n, W(pre + "self_attn.out_proj.weight"), &W(pre + "self_attn.out_proj.bias"));
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const Mat b = layer_norm(x, n, W(pre + "layer_norm2.weight"), W(pre + "layer_norm2.bias"), 1e-6);
    Mat m = lin(b, n, W(pre + "mlp.fc1.weight"), &W(pre + "mlp.fc1.bias"));
    for (double& e : m) e = 0.5 * e * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (e + 0.044715 * e * e * e)));
    const Mat m2 = lin(m, n, W(pre + "mlp.fc2.weight"), &W(pre + "mlp.fc2.bias"));
    for (size_t i = 0; i < x.size(); ++i) x[i] += m2[i];
  }
  RefOut r;
  r.patches = layer_norm(x, n, W(T + "post_layernorm.weight"), W(T + "post_layernorm.bias"), 1e-6);
  // AvgPool2d(2) over the 4 x 4 grid, Gemma RMSNorm (1 + w), then @ [h, 24].
  Mat pooled(size_t(4 * h), 0.0);
  for (int64_t ty = 0; ty < 2; ++ty)
    for (int64_t tx = 0; tx < 2; ++tx)
      for (int64_t dy = 0; dy < 2; ++dy)
        for (int64_t dx = 0; dx < 2; ++dx)
          for (int64_t c = 0; c < h; ++c)
            pooled[size_t((ty * 2 + tx) * h + c)] += r.patches[size_t(((ty * 2 + dy) * 4 + tx * 2 + dx) * h + c)] / 4.0;
  const auto& g = W("multi_modal_projector.mm_soft_emb_norm.weight");
  const auto& proj = W("multi_modal_projector.mm_input_projection_weight");
  r.tokens.assign(size_t(4 * 24), 0.0);
  for (int64_t t = 0; t < 4; ++t) {
    double ms = 0;
    for (int64_t c = 0; c < h; ++c) ms += pooled[size_t(t * h + c)] * pooled[size_t(t * h + c)];
    const double inv = 1.0 / std::sqrt(ms / double(h) + 1e-6);
    for (int64_t o = 0; o < 24; ++o) {
      double s = 0;
      for (int64_t c = 0; c < h; ++c) s += pooled[size_t(t * h + c)] * inv * (1.0 + g.v[size_t(c)]) * proj.v[size_t(c * 24 + o)];
      r.tokens[size_t(t * 24 + o)] = s;
    }
  }
  return r;
}

// max |ours - ref| / max |ref|
double rel_error(const std::vector<float>& ours, const Mat& ref) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(double(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return worst / scale;
}

class VisionTowerTest : public testing::DeviceTest {};

TEST_P(VisionTowerTest, PatchesAndSoftTokensMatchADoublePrecisionSiglipAndProjector) {
  for (const std::string T : {"vision_tower.vision_model.", "vision_tower."}) {  // the Hub's and transformers 5's names
    SCOPED_TRACE(T);
    testing::TempDir dir;
    const RefWeights w = tiny_weights(7, T);
    testing::write_checkpoint(dir.path(), tiny_config(), w);
    LoadOptions opt;
    opt.device = device();
    std::optional<ImageEncoder> enc = load_image_encoder(dir.path(), opt);
    ASSERT_TRUE(enc.has_value());
    EXPECT_EQ(enc->processor.height, 56);
    const std::vector<float> px = random_pixels(3);
    Array pixels = Array::empty({3, 56, 56}, DType::f32);
    std::copy(px.begin(), px.end(), pixels.data<float>());
    const RefOut ref = reference(w, px, T);
    const Array patches = enc->tower->encode_patches(pixels);
    ASSERT_EQ(patches.shape(), Shape({16, 32}));
    const Array tokens = enc->tower->project(patches);
    ASSERT_EQ(tokens.shape(), Shape({4, 24}));
    // Keys and values pass through float16, as the text model's cache does: ~1e-3.
    EXPECT_LT(rel_error(host(patches), ref.patches), 3e-3);
    EXPECT_LT(rel_error(host(tokens), ref.tokens), 3e-3);
  }
}

TEST_P(VisionTowerTest, ADifferentImageGivesDifferentSoftTokens) {
  testing::TempDir dir;
  testing::write_checkpoint(dir.path(), tiny_config(), tiny_weights(7));
  LoadOptions opt;
  opt.device = device();
  std::optional<ImageEncoder> enc = load_image_encoder(dir.path(), opt);
  ASSERT_TRUE(enc.has_value());
  Array a = Array::empty({3, 56, 56}, DType::f32), b = Array::empty({3, 56, 56}, DType::f32);
  const std::vector<float> pa = random_pixels(3), pb = random_pixels(4);
  std::copy(pa.begin(), pa.end(), a.data<float>());
  std::copy(pb.begin(), pb.end(), b.data<float>());
  const std::vector<float> ta = host(enc->tower->encode(a)), tb = host(enc->tower->encode(b));
  double diff = 0;
  for (size_t i = 0; i < ta.size(); ++i) diff = std::max(diff, double(std::fabs(ta[i] - tb[i])));
  EXPECT_GT(diff, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Devices, VisionTowerTest, OSPREY_DEVICES);

TEST(VisionConfig, BadSizesAreNamed) {
  nlohmann::json c = tiny_config();
  c["vision_config"]["image_size"] = 50;
  EXPECT_NE(testing::error_of<InvalidInput>([&] { parse_gemma3_vision_config(ConfigReader(c, "config.json")); })
                .find("image_size"),
            std::string::npos);
  c = tiny_config();
  c["mm_tokens_per_image"] = 9;  // 3 x 3 does not divide the 4 x 4 grid
  EXPECT_NE(testing::error_of<InvalidInput>([&] { parse_gemma3_vision_config(ConfigReader(c, "config.json")); })
                .find("mm_tokens_per_image"),
            std::string::npos);
  c = tiny_config();
  c["vision_config"]["hidden_act"] = "relu";
  EXPECT_NE(testing::error_of<Unsupported>([&] { parse_gemma3_vision_config(ConfigReader(c, "config.json")); })
                .find("hidden_act"),
            std::string::npos);
  c = tiny_config();
  c.erase("vision_config");
  EXPECT_FALSE(parse_gemma3_vision_config(ConfigReader(c, "config.json")).has_value());
}

}  // namespace
}  // namespace osprey
