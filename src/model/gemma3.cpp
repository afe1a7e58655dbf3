// Gemma 3 (model_type gemma3_text), and the language model of Gemma3ForConditionalGeneration
// (model_type gemma3: the text config under `text_config`, the weights under
// `language_model.model.` or `model.language_model.`; the vision tower and projector are
// src/vision/vision_tower.h's to load, and this decoder takes their soft tokens (ImageSpan)).
//
// Per layer: x += post_attn_norm(attn(input_norm(x))); x += post_ffn_norm(mlp(pre_ffn_norm(x))),
// every RMSNorm scaling by (1 + w); q and k normed per head before RoPE; GeGLU (tanh GELU);
// sliding-window and full layers with their own RoPE; embeddings times sqrt(hidden) rounded
// to the weights' dtype; tied head; optional final-logit softcapping. All of it is a
// DecoderSpec (model/decoder.h): this file reads the config.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/layer_types.h"

namespace osprey {
namespace {

// The text config's fields, with Gemma3TextConfig's defaults for the keys it omits (the Hub's
// gemma-3-4b text_config leaves out vocab_size, head_dim, query_pre_attn_scalar, rope_theta ...).
DecoderSpec parse_gemma3_text_config(const ConfigReader& c) {
  DecoderSpec cfg;
  const DecoderDefaults defaults{.vocab_size = 262208, .hidden_size = 2304, .intermediate_size = 9216,
                                 .n_layers = 26, .n_heads = 8, .n_kv_heads = 4, .head_dim = 256,
                                 .max_position_embeddings = 131072};  // Gemma3TextConfig's
  static_cast<DecoderDims&>(cfg) = parse_decoder_dims(c, defaults);
  cfg.norm = DecoderNorm::rms_unit_offset;
  cfg.block = DecoderBlock::sandwich;
  cfg.activation = DecoderActivation::gelu_tanh;
  cfg.qk_norm = true;
  cfg.embed_scale_sqrt_hidden = true;
  cfg.kv_rows_follow_weights = true;
  cfg.require_all_read = true;
  cfg.norm_eps = c.get_float("rms_norm_eps", 1e-6);
  cfg.query_pre_attn_scalar = c.get_float("query_pre_attn_scalar", 256);
  cfg.final_logit_softcap = c.get_float("final_logit_softcapping", 0.0);
  cfg.attn_logit_softcap = c.get_float("attn_logit_softcapping", 0.0);
  read_bias_and_tying(c, cfg, /*tie_default=*/true);
  if (!(cfg.norm_eps > 0)) c.fail("rms_norm_eps", "must be positive");
  if (!(cfg.query_pre_attn_scalar > 0) || !std::isfinite(cfg.query_pre_attn_scalar))
    c.fail("query_pre_attn_scalar", "must be a positive number (the attention scale is its inverse square root), got " +
                                        c.json()["query_pre_attn_scalar"].dump());
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    const double v = c.get_float(key, 0.0);
    if (c.has(key) && !(v > 0 && std::isfinite(v))) c.fail(key, "must be positive or null, got " + c.json()[key].dump());
  }
  c.get_choice("hidden_activation", "gelu_pytorch_tanh", {"gelu_pytorch_tanh"});
  if (c.get_bool("use_bidirectional_attention", false))
    throw Unsupported(c.where() + ": field \"use_bidirectional_attention\": bidirectional attention is not supported");

  read_sliding_layers(c, cfg, 6, 4096);

  // transformers 5 writes one rope_parameters object per layer type; the Hub's 4.x configs
  // give rope_theta and rope_scaling for full layers and rope_local_base_freq for sliding ones.
  const auto params = c.get_object("rope_parameters");
  const bool by_type = params && (params->has("full_attention") || params->has("sliding_attention"));
  cfg.rope = parse_rope(c, 1e6, by_type ? "full_attention" : "");
  cfg.has_rope_sliding = true;
  if (by_type && params->has("sliding_attention")) {
    cfg.rope_sliding = parse_rope(c, 1e4, "sliding_attention");
  } else {
    cfg.rope_sliding.theta = c.get_float("rope_local_base_freq", 1e4);
    if (!(cfg.rope_sliding.theta > 0)) c.fail("rope_local_base_freq", "must be positive");
  }
  return cfg;
}

// Where the text model's weights sit: `prefix` + "embed_tokens", "layers.N.", "norm"; the head.
void set_text_model_names(DecoderSpec& spec, const SafeTensors& st, bool conditional) {
  if (!conditional) return;
  // Gemma3ForConditionalGeneration: the Hub's files and transformers 5 name it differently;
  // the vision tower and projector are not loaded.
  spec.ignored_prefixes = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                           "model.multi_modal_projector."};
  if (st.contains("language_model.model.embed_tokens.weight")) {
    spec.prefix = "language_model.model.";
    spec.lm_head = "language_model.lm_head";
  } else if (st.contains("model.language_model.embed_tokens.weight")) {
    spec.prefix = "model.language_model.";
  } else {
    throw InvalidInput("missing tensor: " + st.source().string() +
                       " has neither language_model.model.embed_tokens.weight (the Hub's Gemma 3 layout) nor "
                       "model.language_model.embed_tokens.weight (the transformers 5 layout)");
  }
}

}  // namespace

void register_gemma3_family() {
  register_family("gemma3_text", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_gemma3_text_config(c);
    spec.model_type = "gemma3_text";
    spec.quant = parse_quant_config(c);
    spec.kv_cache_scheme = parse_kv_cache_scheme(c);
    return build_decoder(spec, st, o);
  });
  register_family("gemma3", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    const std::optional<ConfigReader> text = c.get_object("text_config");
    if (!text)
      c.fail("text_config", "missing: a gemma3 (Gemma3ForConditionalGeneration) config holds its language model's "
                            "settings there");
    DecoderSpec spec = parse_gemma3_text_config(*text);
    spec.model_type = "gemma3";
    spec.quant = parse_quant_config(c);
    spec.kv_cache_scheme = parse_kv_cache_scheme(c);
    spec.image_input = c.has("vision_config");  // the tower itself: vision/vision_tower.h
    set_text_model_names(spec, st, true);
    std::unique_ptr<Model> model = build_decoder(spec, st, o);
    // The text config's special tokens, merged with the outer config's by load_model.
    ModelInfo& info = model->mutable_info();
    for (int32_t id : text->get_int_list("eos_token_id"))
      if (std::find(info.eos_ids.begin(), info.eos_ids.end(), id) == info.eos_ids.end()) info.eos_ids.push_back(id);
    if (text->has("bos_token_id")) info.bos_id = int32_t(text->get_int("bos_token_id"));
    return model;
  });
}

}  // namespace osprey
