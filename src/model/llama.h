#pragma once
// The Llama decoder (Llama 3.x) and its close relatives that differ only in typed config
// fields (Qwen2: q/k/v biases, tied embeddings; Qwen3: q/k norms; Mistral: a sliding window).
#include <memory>
#include <string>

#include "model/decoder_dims.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/weight_loader.h"

namespace osprey {

struct LlamaConfig : DecoderDims {
  std::string model_type;
  double rms_norm_eps = 1e-5;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o, for Llama's attention_bias) biases
  bool o_proj_bias = false;
  bool mlp_bias = false;
  // Qwen3: q and k go through a per-head RMSNorm (self_attn.q_norm / k_norm, [head_dim]) between
  // the projection and RoPE.
  bool qk_norm = false;
  // Mistral: every layer attends to the last sliding_window positions (a rotating cache of that
  // many rows); 0: full attention.
  int64_t sliding_window = 0;
  QuantConfig quant;  // MLX affine quantization; not present for a dense checkpoint
};

// The fields every Llama-like config.json has; errors name the field.
LlamaConfig parse_llama_config(const ConfigReader& config, double default_rope_theta);

std::unique_ptr<Model> build_llama_model(const LlamaConfig& config, const SafeTensors& weights,
                                         const LoadOptions& options);

}  // namespace osprey
