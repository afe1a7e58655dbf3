#pragma once
// Tiny random Gemma 3, Cohere2 and Mistral checkpoints written by the tests, and plain
// double-precision forward passes of those families written from their definitions
// (independent of src/model): the references for tests/model/gemma3_test.cpp,
// cohere2_test.cpp and mistral_window_test.cpp.
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace osprey::testing {

// Weights by tensor name, as the exact values the checkpoint stores (rounded to bf16).
struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> v;
};
using RefWeights = std::map<std::string, RefTensor>;

// Draws a [shape] tensor of offset + std * N(0, 1), rounded to bf16, into `w`.
void add_random(RefWeights& w, std::mt19937& rng, const std::string& name, std::vector<int64_t> shape, double std,
                double offset = 0.0);
// config.json and model.safetensors (bf16) in `dir`.
void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const RefWeights& w);

// `kv_rows` f16 or bf16: the keys and values attention reads are rounded to that type first
// (what an engine's 16-bit KV cache does), to predict the error that rounding alone causes.

// Gemma 3 as config.json says (the keys the tests write: vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// rms_norm_eps, query_pre_attn_scalar, sliding_window, layer_types, rope_theta, rope_scaling
// (linear), rope_local_base_freq, final_logit_softcapping, tie_word_embeddings), weights
// named as in `prefix` ("model."). Returns logits [T][vocab] at every position.
struct RefStats {
  double max_abs_residual = 0;        // over the residual stream, every layer
  double max_abs_down_proj_input = 0;  // the GeGLU product
};
// Images in a Gemma 3 prompt (transformers' token_type_ids): `rows` replace those positions'
// scaled embeddings (an image's soft tokens); positions of one group (>= 0; -1: text) see each
// other on every layer besides the causal and window mask. `groups` empty: no image.
struct RefImages {
  std::map<int64_t, std::vector<double>> rows;
  std::vector<int> groups;
};
std::vector<std::vector<double>> gemma3_reference(const nlohmann::json& config, const RefWeights& w,
                                                  const std::vector<int32_t>& tokens,
                                                  const std::string& prefix = "model.", RefStats* stats = nullptr,
                                                  DType kv_rows = DType::f32, const RefImages* images = nullptr);
// Scales of the random weights: the defaults keep activations of order one; larger ones push
// the residual stream and the GeGLU product past float16's range.
struct Gemma3Scales {
  double embed_std = 1.0;
  double pre_ffn_norm = 1.0;  // the pre-feedforward norms' scale (1 + w) is about this
  double post_norm = 1.0;     // the post-attention and post-feedforward norms' likewise
};
// Random weights for such a config, named from `prefix`.
RefWeights gemma3_weights(const nlohmann::json& config, uint32_t seed, const Gemma3Scales& scales = {},
                          const std::string& prefix = "model.");

// Cohere2 likewise (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, layer_norm_eps, logit_scale, sliding_window,
// layer_types, rope_theta).
std::vector<std::vector<double>> cohere2_reference(const nlohmann::json& config, const RefWeights& w,
                                                   const std::vector<int32_t>& tokens, DType kv_rows = DType::f32);
RefWeights cohere2_weights(const nlohmann::json& config, uint32_t seed);

// Mistral likewise: the Llama decoder (RMSNorm, rotary pairs (i, i + head_dim / 2), SiLU-gated
// MLP, an untied lm_head) with every layer attending to the last `sliding_window` positions,
// as transformers defines it: query i sees key j iff j <= i and i - j < sliding_window (keys
// vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, rms_norm_eps, rope_theta, sliding_window (0 or null: full
// attention)).
std::vector<std::vector<double>> mistral_reference(const nlohmann::json& config, const RefWeights& w,
                                                   const std::vector<int32_t>& tokens, DType kv_rows = DType::f32);
RefWeights mistral_weights(const nlohmann::json& config, uint32_t seed);

}  // namespace osprey::testing
