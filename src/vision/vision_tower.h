#pragma once
// Gemma 3's image encoder: the SigLIP vision tower and the multi-modal projector of a
// Gemma3ForConditionalGeneration checkpoint (model_type gemma3), on the backend's ops (CPU and
// CUDA alike).
//
//   patches    pixel_values [3, S, S] cut into (S/p)^2 patches of p x p, each flattened as
//              (channel, row, column): the stride-p convolution as a linear layer
//   embeddings patch_embedding(patches) + bias + position_embedding[patch index]
//   layers     x += out_proj(attn(layer_norm1(x))), every patch attending to every patch
//              (multi-head, scale head_dim^-0.5); x += fc2(gelu_tanh(fc1(layer_norm2(x))))
//   post       post_layernorm(x)                              -> [(S/p)^2, vision hidden]
//   projector  average pool of k x k patches (k = (S/p) / sqrt(mm_tokens_per_image)),
//              Gemma RMSNorm (x / rms(x) * (1 + w), eps = the vision layer_norm_eps), then
//              x @ mm_input_projection_weight             -> [mm_tokens_per_image, text hidden]
//
// Tensor names: the tower under "vision_tower.vision_model." (the Hub's files) or
// "vision_tower." (transformers 5's), with "model." before either; the projector under
// "multi_modal_projector." or "model.multi_modal_projector.".
#include <filesystem>
#include <memory>
#include <optional>

#include "core/array.h"
#include "model/model.h"
#include "vision/image_preprocess.h"

namespace osprey {

class ConfigReader;
class SafeTensors;

struct VisionConfig {
  int64_t hidden_size = 768;  // SiglipVisionConfig's defaults for omitted keys
  int64_t intermediate_size = 3072;
  int64_t n_layers = 12;
  int64_t n_heads = 12;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  double layer_norm_eps = 1e-6;
  // The outer config's (Gemma3Config's defaults).
  int64_t mm_tokens_per_image = 256;
  int64_t text_hidden_size = 0;
  int32_t image_token_id = 262144;
  int32_t boi_token_id = 255999;
  int32_t eoi_token_id = 256000;

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t n_patches() const { return patches_per_side() * patches_per_side(); }
  int64_t tokens_per_side() const;  // sqrt(mm_tokens_per_image)
  int64_t pool_kernel() const { return patches_per_side() / tokens_per_side(); }
};

// The vision settings of a gemma3 config.json (its `vision_config`, `text_config.hidden_size`,
// `mm_tokens_per_image`, `image_token_index`, `boi_token_index`, `eoi_token_index`); nullopt
// when the config has no vision_config (a text-only model). Throws InvalidInput naming the
// field for sizes that do not fit together (an image not a whole number of patches, a token
// count that is not a square dividing the patch grid), Unsupported for a vision model type or
// activation other than SigLIP's.
std::optional<VisionConfig> parse_gemma3_vision_config(const ConfigReader& config);

class VisionTower {
 public:
  // Loads the tower and projector of `weights` on options.device. Throws InvalidInput naming a
  // missing or misshapen tensor.
  VisionTower(const VisionConfig& config, const SafeTensors& weights, const LoadOptions& options);
  ~VisionTower();
  VisionTower(const VisionTower&) = delete;
  VisionTower& operator=(const VisionTower&) = delete;

  const VisionConfig& config() const { return cfg_; }
  // pixel_values f32 [3, image_size, image_size] (CPU) -> the tower's last hidden state
  // (post_layernorm), f32 [n_patches, hidden] on the device.
  Array encode_patches(const Array& pixel_values) const;
  // The projector over encode_patches' output -> the image's soft tokens, f32
  // [mm_tokens_per_image, text hidden] on the device.
  Array project(const Array& patches) const;
  // project(encode_patches(pixel_values)).
  Array encode(const Array& pixel_values) const { return project(encode_patches(pixel_values)); }

 private:
  struct Layer;
  VisionConfig cfg_;
  Device device_;
  Array patch_w_, patch_b_;  // [hidden, 3 p p] f32, [hidden] f32
  Array pos_;                // [n_patches, hidden] f32
  std::vector<Layer> layers_;
  Array post_w_, post_b_;
  Array pool_;               // [mm_tokens, n_patches] f32: 1/k^2 where a patch falls in a token's window
  Array soft_norm_w_;        // [hidden] f32
  Array proj_;               // [text hidden, hidden] f32 (mm_input_projection_weight transposed)
};

// The vision tower of the checkpoint folder `dir` when its config.json has a vision_config
// (with the image processor's settings from preprocessor_config.json); null for a text-only
// model. Throws as VisionTower and load_image_processor_config do.
struct ImageEncoder {
  std::unique_ptr<VisionTower> tower;
  ImageProcessorConfig processor;
};
std::optional<ImageEncoder> load_image_encoder(const std::filesystem::path& dir, const LoadOptions& options);

}  // namespace osprey
