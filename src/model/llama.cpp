#include "model/llama.h"

#include <cmath>

#include "backend/ops.h"
#include "core/error.h"
#include "model/config_reader.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace osprey {

LlamaConfig parse_llama_config(const ConfigReader& c, double default_rope_theta) {
  LlamaConfig cfg;
  cfg.model_type = c.get_string("model_type");
  cfg.vocab_size = c.get_int("vocab_size");
  cfg.hidden_size = c.get_int("hidden_size");
  cfg.intermediate_size = c.get_int("intermediate_size");
  cfg.n_layers = c.get_int("num_hidden_layers");
  cfg.n_heads = c.get_int("num_attention_heads");
  cfg.n_kv_heads = c.get_int("num_key_value_heads", cfg.n_heads);
  cfg.max_position_embeddings = c.get_int("max_position_embeddings", 2048);
  cfg.rms_norm_eps = c.get_float("rms_norm_eps", 1e-6);
  cfg.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) c.fail(key, "must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", cfg.vocab_size);
  positive("hidden_size", cfg.hidden_size);
  positive("intermediate_size", cfg.intermediate_size);
  positive("num_hidden_layers", cfg.n_layers);
  positive("num_attention_heads", cfg.n_heads);
  positive("num_key_value_heads", cfg.n_kv_heads);
  if (cfg.n_heads % cfg.n_kv_heads != 0)
    c.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(cfg.n_heads) + ")");
  if (c.has("head_dim")) {
    cfg.head_dim = c.get_int("head_dim");
  } else {
    if (cfg.hidden_size % cfg.n_heads != 0) c.fail("hidden_size", "is not a multiple of num_attention_heads");
    cfg.head_dim = cfg.hidden_size / cfg.n_heads;
  }
  positive("head_dim", cfg.head_dim);
  if (cfg.head_dim % 2 != 0) c.fail("head_dim", "must be even for rotary embeddings");
  cfg.rope = parse_rope(c, default_rope_theta);
  return cfg;
}

namespace {

struct LlamaLayer {
  Array attn_norm, mlp_norm;        // [hidden] f32
  Array wq, wk, wv, wo;             // [out, in]
  Array bq, bk, bv, bo;             // [out] f32 or undefined
  Array w_gate, w_up, w_down;
  Array b_gate, b_up, b_down;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const LlamaConfig& cfg, const SafeTensors& st, const LoadOptions& opt) : cfg_(cfg) {
    WeightLoader w(st, opt);
    const int64_t h = cfg.hidden_size, hd = cfg.head_dim, f = cfg.intermediate_size;
    const int64_t q_out = cfg.n_heads * hd, kv_out = cfg.n_kv_heads * hd;
    embed_ = w.matrix("model.embed_tokens.weight", cfg.vocab_size, h);
    const DType dt = embed_.dtype();
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LlamaLayer L;
      L.attn_norm = w.vector_f32(p + "input_layernorm.weight", h);
      L.mlp_norm = w.vector_f32(p + "post_attention_layernorm.weight", h);
      L.wq = w.matrix(p + "self_attn.q_proj.weight", q_out, h, dt);
      L.wk = w.matrix(p + "self_attn.k_proj.weight", kv_out, h, dt);
      L.wv = w.matrix(p + "self_attn.v_proj.weight", kv_out, h, dt);
      L.wo = w.matrix(p + "self_attn.o_proj.weight", h, q_out, dt);
      if (cfg.attention_bias) {
        L.bq = w.vector_f32(p + "self_attn.q_proj.bias", q_out);
        L.bk = w.vector_f32(p + "self_attn.k_proj.bias", kv_out);
        L.bv = w.vector_f32(p + "self_attn.v_proj.bias", kv_out);
      }
      if (cfg.o_proj_bias) L.bo = w.vector_f32(p + "self_attn.o_proj.bias", h);
      L.w_gate = w.matrix(p + "mlp.gate_proj.weight", f, h, dt);
      L.w_up = w.matrix(p + "mlp.up_proj.weight", f, h, dt);
      L.w_down = w.matrix(p + "mlp.down_proj.weight", h, f, dt);
      if (cfg.mlp_bias) {
        L.b_gate = w.vector_f32(p + "mlp.gate_proj.bias", f);
        L.b_up = w.vector_f32(p + "mlp.up_proj.bias", f);
        L.b_down = w.vector_f32(p + "mlp.down_proj.bias", h);
      }
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32("model.norm.weight", h);
    if (cfg.tie_word_embeddings && !st.contains("lm_head.weight"))
      lm_head_ = embed_;
    else
      lm_head_ = w.matrix("lm_head.weight", cfg.vocab_size, h, dt);
    std::vector<float> inv = rope_inv_freq(cfg.rope, hd);
    Array inv_host = Array::empty({int64_t(inv.size())}, DType::f32);
    std::copy(inv.begin(), inv.end(), inv_host.data<float>());
    inv_freq_ = ops::to_device(inv_host, opt.device);
    device_ = opt.device;

    info_.model_type = cfg.model_type;
    info_.vocab_size = cfg.vocab_size;
    info_.hidden_size = h;
    info_.n_layers = cfg.n_layers;
    info_.max_position_embeddings = cfg.max_position_embeddings;
    info_.weight_dtype = dt;
    info_.device = opt.device;
    info_.weight_bytes = w.bytes_loaded();
    w.finish();
  }

  SequenceCache make_cache(const CacheOptions& o) const override {
    std::vector<std::unique_ptr<KVCache>> layers;
    for (int64_t i = 0; i < cfg_.n_layers; ++i) {
      KVCacheParams p;
      p.n_kv_heads = cfg_.n_kv_heads;
      p.head_dim = cfg_.head_dim;
      p.step = o.step;
      p.device = device_;
      p.inplace = o.inplace;
      p.unsafe_skip_ownership_check = o.unsafe_skip_ownership_check;
      layers.push_back(std::make_unique<DenseKVCache>(p));
    }
    return SequenceCache(std::move(layers));
  }

  Array forward(const Array& tokens, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel(), pos0 = cache.offset();
    const int64_t hd = cfg_.head_dim;
    if (n <= 0) throw InvalidInput("forward: no tokens");
    Array positions = Array::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) positions.data<int32_t>()[i] = int32_t(pos0 + i);
    // NOTE: two small uploads per step on CUDA; pipelined decode keeps them on the device.
    positions = ops::to_device(positions, device_);

    Array x = ops::embedding(embed_, ops::to_device(tokens, device_));  // [n, hidden]
    ops::AttentionParams ap;
    ap.q_pos0 = pos0;
    ap.scale = float(1.0 / std::sqrt(double(hd)));
    for (size_t li = 0; li < layers_.size(); ++li) {
      const LlamaLayer& L = layers_[li];
      Array h = ops::rms_norm(x, L.attn_norm, float(cfg_.rms_norm_eps));
      Array q = ops::linear(h, L.wq, L.bq).reshape({n, cfg_.n_heads, hd});
      Array k = ops::linear(h, L.wk, L.bk).reshape({n, cfg_.n_kv_heads, hd});
      Array v = ops::linear(h, L.wv, L.bv).reshape({n, cfg_.n_kv_heads, hd});
      ops::rope_(q, positions, inv_freq_, false);
      ops::rope_(k, positions, inv_freq_, false);
      auto [keys, values] = cache.layer(li).update_and_fetch(k, v);
      Array a = ops::attention(q, keys, values, ap);  // [n, n_heads * hd]
      ops::add_(x, ops::linear(a, L.wo, L.bo));
      h = ops::rms_norm(x, L.mlp_norm, float(cfg_.rms_norm_eps));
      Array g = ops::silu_mul(ops::linear(h, L.w_gate, L.b_gate), ops::linear(h, L.w_up, L.b_up));
      ops::add_(x, ops::linear(g, L.w_down, L.b_down));
    }
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    x = ops::rms_norm(x, final_norm_, float(cfg_.rms_norm_eps));
    return ops::linear(x, lm_head_);
  }

 private:
  LlamaConfig cfg_;
  Array embed_, lm_head_, final_norm_, inv_freq_;
  Device device_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> build_llama_model(const LlamaConfig& config, const SafeTensors& weights,
                                         const LoadOptions& options) {
  return std::make_unique<LlamaModel>(config, weights, options);
}

void register_llama_family() {
  register_family("llama", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    LlamaConfig cfg = parse_llama_config(c, 10000.0);
    cfg.attention_bias = c.get_bool("attention_bias", false);
    cfg.o_proj_bias = cfg.attention_bias;
    cfg.mlp_bias = c.get_bool("mlp_bias", false);
    return build_llama_model(cfg, st, o);
  });
}

}  // namespace osprey
