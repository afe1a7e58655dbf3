// Cohere2 (model_type cohere2, Command R7B).
//
// Per layer, a parallel block: h = LayerNorm(x) (no bias); x += attn(h) + mlp(h). Sliding-window
// layers rotate q and k with interleaved (GPT-J) pairs; full-attention layers have no position
// encoding at all. Tied head; logits times logit_scale.
#include <cmath>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
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

struct Cohere2Config : DecoderDims {  // head_dim: always hidden_size / num_attention_heads
  double layer_norm_eps = 1e-5;
  double logit_scale = 0.0625;
  int64_t sliding_window = 0;
  std::vector<bool> sliding;  // per layer
  RopeConfig rope;            // of the sliding layers
  bool attention_bias = false;
  bool tie_word_embeddings = true;
  QuantConfig quant;
};

// With Cohere2Config's defaults for omitted keys.
Cohere2Config parse_cohere2_config(const ConfigReader& c) {
  Cohere2Config cfg;
  DecoderDefaults defaults;  // Cohere2Config's
  defaults.vocab_size = 256000;
  defaults.hidden_size = 8192;
  defaults.intermediate_size = 22528;
  defaults.n_layers = 40;
  defaults.n_heads = 64;
  defaults.max_position_embeddings = 8192;
  static_cast<DecoderDims&>(cfg) = parse_decoder_dims(c, defaults);
  cfg.layer_norm_eps = c.get_float("layer_norm_eps", 1e-5);
  cfg.logit_scale = c.get_float("logit_scale", 0.0625);
  cfg.sliding_window = c.get_int("sliding_window", 4096);
  cfg.attention_bias = c.get_bool("attention_bias", false);
  cfg.tie_word_embeddings = c.get_bool("tie_word_embeddings", true);
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) c.fail(key, "must be positive, got " + std::to_string(v));
  };
  if (cfg.hidden_size % cfg.n_heads != 0 || cfg.head_dim != cfg.hidden_size / cfg.n_heads)
    c.fail("head_dim", "Cohere2's head size is hidden_size / num_attention_heads = " +
                           std::to_string(cfg.hidden_size / cfg.n_heads) + ", got " + std::to_string(cfg.head_dim));
  if (!(cfg.layer_norm_eps > 0)) c.fail("layer_norm_eps", "must be positive");
  if (!std::isfinite(cfg.logit_scale) || cfg.logit_scale == 0)
    c.fail("logit_scale", "must be a finite non-zero number, got " + c.json()["logit_scale"].dump());
  const std::string act = c.get_string("hidden_act", "silu");
  if (act != "silu") throw Unsupported(c.where() + ": field \"hidden_act\": \"" + act + "\" is not supported (silu is)");
  if (c.get_bool("use_qk_norm", false))
    throw Unsupported(c.where() + ": field \"use_qk_norm\": q/k LayerNorm is not supported for cohere2");
  cfg.sliding = parse_sliding_layers(c, cfg.n_layers, 4);
  bool any_sliding = false;
  for (bool s : cfg.sliding) any_sliding = any_sliding || s;
  if (any_sliding) positive("sliding_window", cfg.sliding_window);
  if (cfg.sliding_window > INT32_MAX) c.fail("sliding_window", "is too large");
  cfg.rope = parse_rope(c, 10000.0, "sliding_attention");
  cfg.quant = parse_quant_config(c);
  return cfg;
}

struct Cohere2Layer {
  Array norm;           // [hidden] f32 (LayerNorm weight; no bias)
  LinearGroup qkv;      // q, k, v (biases when attention_bias)
  LinearWeight wo;      // [hidden, n_heads hd]
  Array bo;             // [hidden] f32 or undefined
  LinearGroup gate_up;  // gate, up [f, hidden]
  LinearWeight w_down;  // [hidden, f]
};

class Cohere2Model final : public Model {
 public:
  Cohere2Model(const Cohere2Config& cfg, const SafeTensors& st, const LoadOptions& opt) : cfg_(cfg) {
    require_unsharded(opt, "cohere2");
    WeightLoader w(st, opt, cfg.quant);
    const int64_t h = cfg.hidden_size, hd = cfg.head_dim, f = cfg.intermediate_size;
    const int64_t q_out = cfg.n_heads * hd, kv_out = cfg.n_kv_heads * hd;
    embed_ = w.linear("model.embed_tokens", cfg.vocab_size, h);
    const DType dt = embed_.quantized() ? embed_.quant.scales.dtype() : embed_.dense.dtype();
    kv_dtype_ = kv_rows_dtype(dt);
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      Cohere2Layer L;
      L.norm = w.vector_f32(p + "input_layernorm.weight", h);
      L.qkv = w.linear_group({{p + "self_attn.q_proj", q_out}, {p + "self_attn.k_proj", kv_out},
                              {p + "self_attn.v_proj", kv_out}},
                             h, dt, cfg.attention_bias);
      L.wo = w.linear(p + "self_attn.o_proj", h, q_out, dt);
      if (cfg.attention_bias) L.bo = w.vector_f32(p + "self_attn.o_proj.bias", h);
      L.gate_up = w.linear_group({{p + "mlp.gate_proj", f}, {p + "mlp.up_proj", f}}, h, dt, false);
      L.w_down = w.linear(p + "mlp.down_proj", h, f, dt);
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32("model.norm.weight", h);
    const bool own_head = st.contains("lm_head.weight") || !cfg.tie_word_embeddings;
    lm_head_ = own_head ? w.linear("lm_head", cfg.vocab_size, h, dt) : embed_;
    std::vector<float> inv = rope_inv_freq(cfg.rope, hd);
    Array inv_host = Array::empty({int64_t(inv.size())}, DType::f32);
    std::copy(inv.begin(), inv.end(), inv_host.data<float>());
    inv_freq_ = w.constant(inv_host);
    w.require_all_read("cohere2");

    info_.model_type = "cohere2";
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
    const float eps = float(cfg_.layer_norm_eps);
    const AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim};
    const float scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));
    const Array no_bias;

    Array x = ops::embedding(embed_, tokens);  // [n, hidden] f32: the residual stream
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Cohere2Layer& L = layers_[li];
      const bool sliding = cfg_.sliding[li];
      QKTransform t;
      if (sliding) {
        t.inv_freq = inv_freq_;
        t.interleaved = true;
      }
      Array h = ops::layer_norm(x, L.norm, no_bias, eps);
      AttentionInputs in = attention_inputs(h, L.qkv, shape, positions, t);
      KVView kv = cache.layer(li).update_and_fetch(in.k, in.v, positions);
      ops::AttentionParams ap = kv.attention_params();
      ap.scale = scale;
      ap.window = sliding ? int(cfg_.sliding_window) : 0;
      Array a = ops::attention(in.q, kv.keys, kv.values, ap);  // [n, nh * hd]
      Array m = ops::linear(silu_gate(h, L.gate_up), L.w_down);
      ops::add_(x, ops::linear(a, L.wo, L.bo));
      ops::add_(x, m);
    }
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    x = ops::layer_norm(x, final_norm_, no_bias, eps);
    Array logits = ops::linear(x, lm_head_);
    ops::scale_(logits, float(cfg_.logit_scale));
    return logits;
  }

 private:
  Cohere2Config cfg_;
  LinearWeight embed_, lm_head_;
  DType kv_dtype_ = DType::f16;
  Array final_norm_, inv_freq_;
  std::vector<Cohere2Layer> layers_;
};

}  // namespace

void register_cohere2_family() {
  register_family("cohere2", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    return std::unique_ptr<Model>(std::make_unique<Cohere2Model>(parse_cohere2_config(c), st, o));
  });
}

}  // namespace osprey
