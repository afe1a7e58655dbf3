// Gemma 3 (model_type gemma3_text), and the language model of Gemma3ForConditionalGeneration
// (model_type gemma3: the text config under `text_config`, the weights under
// `language_model.model.` or `model.language_model.`, the vision tower ignored).
//
// Per layer: x += post_attn_norm(attn(input_norm(x))); x += post_ffn_norm(mlp(pre_ffn_norm(x))),
// every RMSNorm scaling by (1 + w); q and k normed per head before RoPE; GeGLU (tanh GELU);
// sliding-window and full layers with their own RoPE; embeddings times sqrt(hidden) rounded
// to the weights' dtype; tied head; optional final-logit softcapping.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "core/log.h"
#include "model/blocks.h"
#include "model/config_reader.h"
#include "model/decoder_dims.h"
#include "model/layer_types.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace osprey {
namespace {

struct Gemma3Config : DecoderDims {
  std::string model_type;
  double rms_norm_eps = 1e-6;
  double query_pre_attn_scalar = 256;  // attention scale = query_pre_attn_scalar^-0.5
  int64_t sliding_window = 0;
  std::vector<bool> sliding;           // per layer
  RopeConfig rope_full, rope_sliding;  // full layers: rope_theta (+ scaling); sliding: the local base
  double final_logit_softcapping = 0;  // 0: none
  double attn_logit_softcapping = 0;   // 0: none
  bool attention_bias = false;
  bool tie_word_embeddings = true;
  QuantConfig quant;
};

// The text config's fields, with Gemma3TextConfig's defaults for the keys it omits (the Hub's
// gemma-3-4b text_config leaves out vocab_size, head_dim, query_pre_attn_scalar, rope_theta ...).
Gemma3Config parse_gemma3_text_config(const ConfigReader& c) {
  Gemma3Config cfg;
  DecoderDefaults defaults;  // Gemma3TextConfig's
  defaults.vocab_size = 262208;
  defaults.hidden_size = 2304;
  defaults.intermediate_size = 9216;
  defaults.n_layers = 26;
  defaults.n_heads = 8;
  defaults.n_kv_heads = 4;
  defaults.head_dim = 256;
  defaults.max_position_embeddings = 131072;
  static_cast<DecoderDims&>(cfg) = parse_decoder_dims(c, defaults);
  cfg.rms_norm_eps = c.get_float("rms_norm_eps", 1e-6);
  cfg.query_pre_attn_scalar = c.get_float("query_pre_attn_scalar", 256);
  cfg.sliding_window = c.get_int("sliding_window", 4096);
  cfg.final_logit_softcapping = c.get_float("final_logit_softcapping", 0.0);
  cfg.attn_logit_softcapping = c.get_float("attn_logit_softcapping", 0.0);
  cfg.attention_bias = c.get_bool("attention_bias", false);
  cfg.tie_word_embeddings = c.get_bool("tie_word_embeddings", true);
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) c.fail(key, "must be positive, got " + std::to_string(v));
  };
  if (!(cfg.rms_norm_eps > 0)) c.fail("rms_norm_eps", "must be positive");
  if (!(cfg.query_pre_attn_scalar > 0) || !std::isfinite(cfg.query_pre_attn_scalar))
    c.fail("query_pre_attn_scalar", "must be a positive number (the attention scale is its inverse square root), got " +
                                        c.json()["query_pre_attn_scalar"].dump());
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    const double v = c.get_float(key, 0.0);
    if (c.has(key) && !(v > 0 && std::isfinite(v))) c.fail(key, "must be positive or null, got " + c.json()[key].dump());
  }
  const std::string act = c.get_string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw Unsupported(c.where() + ": field \"hidden_activation\": \"" + act +
                      "\" is not supported (Gemma 3 uses \"gelu_pytorch_tanh\")");
  if (c.get_bool("use_bidirectional_attention", false))
    throw Unsupported(c.where() + ": field \"use_bidirectional_attention\": bidirectional attention is not supported");

  cfg.sliding = parse_sliding_layers(c, cfg.n_layers, 6);
  bool any_sliding = false;
  for (bool s : cfg.sliding) any_sliding = any_sliding || s;
  if (any_sliding) positive("sliding_window", cfg.sliding_window);
  if (cfg.sliding_window > INT32_MAX) c.fail("sliding_window", "is too large");

  // transformers 5 writes one rope_parameters object per layer type; the Hub's 4.x configs
  // give rope_theta and rope_scaling for full layers and rope_local_base_freq for sliding ones.
  const auto params = c.get_object("rope_parameters");
  const bool by_type = params && (params->has("full_attention") || params->has("sliding_attention"));
  cfg.rope_full = parse_rope(c, 1e6, by_type ? "full_attention" : "");
  if (by_type && params->has("sliding_attention")) {
    cfg.rope_sliding = parse_rope(c, 1e4, "sliding_attention");
  } else {
    cfg.rope_sliding.theta = c.get_float("rope_local_base_freq", 1e4);
    if (!(cfg.rope_sliding.theta > 0)) c.fail("rope_local_base_freq", "must be positive");
  }
  return cfg;
}

// The weights of the text model: `prefix` + "embed_tokens", "layers.N.", "norm"; the head.
struct Gemma3Names {
  std::string prefix;
  std::string lm_head;
};

Gemma3Names text_model_names(const SafeTensors& st, bool conditional) {
  if (!conditional) return {"model.", "lm_head"};
  // Gemma3ForConditionalGeneration: the Hub's files and transformers 5 name it differently.
  if (st.contains("language_model.model.embed_tokens.weight")) return {"language_model.model.", "language_model.lm_head"};
  if (st.contains("model.language_model.embed_tokens.weight")) return {"model.language_model.", "lm_head"};
  throw InvalidInput("missing tensor: " + st.source().string() +
                     " has neither language_model.model.embed_tokens.weight (the Hub's Gemma 3 layout) nor "
                     "model.language_model.embed_tokens.weight (the transformers 5 layout)");
}

bool is_vision_tensor(const std::string& name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

// `v` as the nearest value of `dt` (f32 unchanged): transformers multiplies the embeddings by
// sqrt(hidden) held in the weights' dtype (55.4256 is 55.5 in bf16).
float in_dtype(float v, DType dt) {
  if (dt == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

Array inv_freq_array(WeightLoader& w, const RopeConfig& rope, int64_t head_dim) {
  std::vector<float> inv = rope_inv_freq(rope, head_dim);
  Array host = Array::empty({int64_t(inv.size())}, DType::f32);
  std::copy(inv.begin(), inv.end(), host.data<float>());
  return w.constant(host);
}

struct Gemma3Layer {
  Array input_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm;  // [hidden] f32
  Array q_norm, k_norm;                                           // [head_dim] f32
  LinearGroup qkv;                                                // q, k, v
  LinearWeight wo;                                                // [hidden, n_heads hd]
  Array bo;
  LinearGroup gate_up;  // gate, up [f, hidden]
  LinearWeight w_down;  // [hidden, f]
};

class Gemma3Model final : public Model {
 public:
  Gemma3Model(const Gemma3Config& cfg, const SafeTensors& st, const LoadOptions& opt, bool conditional) : cfg_(cfg) {
    require_unsharded(opt, cfg.model_type);
    WeightLoader w(st, opt, cfg.quant);
    const Gemma3Names names = text_model_names(st, conditional);
    if (conditional) {
      size_t n_vision = 0;
      for (const std::string& name : st.names())
        if (is_vision_tensor(name)) {
          w.ignore(name);
          ++n_vision;
        }
      if (n_vision > 0)
        log_info("gemma3: loading the language model only; the vision tower and projector (" +
                 std::to_string(n_vision) + " tensors) are ignored");
    }
    const std::string& P = names.prefix;
    const int64_t h = cfg.hidden_size, hd = cfg.head_dim, f = cfg.intermediate_size;
    const int64_t q_out = cfg.n_heads * hd, kv_out = cfg.n_kv_heads * hd;
    embed_ = w.linear(P + "embed_tokens", cfg.vocab_size, h);
    const DType dt = embed_.quantized() ? embed_.quant.scales.dtype() : embed_.dense.dtype();
    embed_scale_ = in_dtype(float(std::sqrt(double(h))), dt);
    kv_dtype_ = kv_rows_dtype(dt);
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const std::string p = P + "layers." + std::to_string(i) + ".";
      Gemma3Layer L;
      L.input_norm = w.vector_f32(p + "input_layernorm.weight", h);
      L.post_attn_norm = w.vector_f32(p + "post_attention_layernorm.weight", h);
      L.pre_ffn_norm = w.vector_f32(p + "pre_feedforward_layernorm.weight", h);
      L.post_ffn_norm = w.vector_f32(p + "post_feedforward_layernorm.weight", h);
      L.q_norm = w.vector_f32(p + "self_attn.q_norm.weight", hd);
      L.k_norm = w.vector_f32(p + "self_attn.k_norm.weight", hd);
      L.qkv = w.linear_group({{p + "self_attn.q_proj", q_out}, {p + "self_attn.k_proj", kv_out},
                              {p + "self_attn.v_proj", kv_out}},
                             h, dt, cfg.attention_bias);
      L.wo = w.linear(p + "self_attn.o_proj", h, q_out, dt);
      if (cfg.attention_bias) L.bo = w.vector_f32(p + "self_attn.o_proj.bias", h);
      L.gate_up = w.linear_group({{p + "mlp.gate_proj", f}, {p + "mlp.up_proj", f}}, h, dt, false);
      L.w_down = w.linear(p + "mlp.down_proj", h, f, dt);
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32(P + "norm.weight", h);
    // Tied (as Gemma 3 is): the embedding table is the head unless the file has its own.
    const bool own_head = st.contains(names.lm_head + ".weight") || !cfg.tie_word_embeddings;
    lm_head_ = own_head ? w.linear(names.lm_head, cfg.vocab_size, h, dt) : embed_;
    inv_freq_full_ = inv_freq_array(w, cfg.rope_full, hd);
    inv_freq_sliding_ = inv_freq_array(w, cfg.rope_sliding, hd);
    w.require_all_read(conditional ? "gemma3" : "gemma3_text");

    info_.model_type = cfg.model_type;
    info_.vocab_size = cfg.vocab_size;
    info_.hidden_size = h;
    info_.n_layers = cfg.n_layers;
    info_.max_position_embeddings = cfg.max_position_embeddings;
    w.record_weights(info_, dt);
    w.finish();
  }

 protected:
  KVCacheParams layer_cache_params(int64_t layer, const KVCacheParams& params) const override {
    return layer_kv_params(params, cfg_.n_kv_heads, cfg_.head_dim, kv_dtype_,
                           cfg_.sliding[size_t(layer)] ? cfg_.sliding_window : 0);
  }

  Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel();
    const float eps = float(cfg_.rms_norm_eps);
    const AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim};
    const float scale = float(1.0 / std::sqrt(cfg_.query_pre_attn_scalar));

    Array x = ops::embedding(embed_, tokens, embed_scale_);  // [n, hidden] f32: the residual stream
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Gemma3Layer& L = layers_[li];
      const bool sliding = cfg_.sliding[li];
      QKTransform t;
      t.q_norm = L.q_norm;
      t.k_norm = L.k_norm;
      t.norm_eps = eps;
      t.norm_unit_offset = true;
      t.inv_freq = sliding ? inv_freq_sliding_ : inv_freq_full_;
      Array h = ops::rms_norm(x, L.input_norm, eps, true);
      AttentionInputs in = attention_inputs(h, L.qkv, shape, positions, t);
      KVView kv = cache.layer(li).update_and_fetch(in.k, in.v, positions);
      ops::AttentionParams ap = kv.attention_params();
      ap.scale = scale;
      ap.window = sliding ? int(cfg_.sliding_window) : 0;
      ap.softcap = float(cfg_.attn_logit_softcapping);
      Array a = ops::attention(in.q, kv.keys, kv.values, ap);  // [n, nh * hd]
      Array o = ops::rms_norm(ops::linear(a, L.wo, L.bo), L.post_attn_norm, eps, true);
      h = ops::add_rms_norm(x, o, L.pre_ffn_norm, eps, true);  // x += o; h = pre_ffn_norm(x)
      Array d = ops::linear(gelu_gate(h, L.gate_up), L.w_down);
      ops::add_(x, ops::rms_norm(d, L.post_ffn_norm, eps, true));
    }
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    x = ops::rms_norm(x, final_norm_, eps, true);
    Array logits = ops::linear(x, lm_head_);
    if (cfg_.final_logit_softcapping > 0) ops::softcap_(logits, float(cfg_.final_logit_softcapping));
    return logits;
  }

 private:
  Gemma3Config cfg_;
  LinearWeight embed_, lm_head_;
  float embed_scale_ = 1.0f;
  DType kv_dtype_ = DType::f16;
  Array final_norm_, inv_freq_full_, inv_freq_sliding_;
  std::vector<Gemma3Layer> layers_;
};

}  // namespace

void register_gemma3_family() {
  register_family("gemma3_text", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    Gemma3Config cfg = parse_gemma3_text_config(c);
    cfg.model_type = "gemma3_text";
    cfg.quant = parse_quant_config(c);
    return std::unique_ptr<Model>(std::make_unique<Gemma3Model>(cfg, st, o, false));
  });
  register_family("gemma3", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    const std::optional<ConfigReader> text = c.get_object("text_config");
    if (!text)
      c.fail("text_config", "missing: a gemma3 (Gemma3ForConditionalGeneration) config holds its language model's "
                            "settings there");
    Gemma3Config cfg = parse_gemma3_text_config(*text);
    cfg.model_type = "gemma3";
    cfg.quant = parse_quant_config(c);
    auto model = std::make_unique<Gemma3Model>(cfg, st, o, true);
    // The text config's special tokens, merged with the outer config's by load_model.
    ModelInfo& info = model->mutable_info();
    for (int32_t id : text->get_int_list("eos_token_id"))
      if (std::find(info.eos_ids.begin(), info.eos_ids.end(), id) == info.eos_ids.end()) info.eos_ids.push_back(id);
    if (text->has("bos_token_id")) info.bos_id = int32_t(text->get_int("bos_token_id"));
    return std::unique_ptr<Model>(std::move(model));
  });
}

}  // namespace osprey
