#include "model/llama.h"

#include <cmath>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/buffer.h"
#include "core/error.h"
#include "model/config_reader.h"
#include "model/fuse.h"
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
  cfg.quant = parse_quant_config(c);
  return cfg;
}

namespace {

struct LlamaLayer {
  Array attn_norm, mlp_norm;        // [hidden] f32
  LinearWeight wq, wk, wv, wo;      // [out, in], dense or quantized
  Array bq, bk, bv, bo;             // [out] f32 or undefined
  LinearWeight w_gate, w_up, w_down;
  Array b_gate, b_up, b_down;
  // CUDA: q/k/v and gate/up with their rows stacked (model/fuse.h); the parts are then dropped.
  LinearWeight wqkv, w_gate_up;  // [(n_heads + 2 n_kv_heads) head_dim, hidden], [2 f, hidden]
  Array bqkv, b_gate_up;
};

void fuse_layer(LlamaLayer& L) {
  L.wqkv = fuse_rows({&L.wq, &L.wk, &L.wv});
  if (L.wqkv.defined()) {
    L.bqkv = fuse_biases({&L.bq, &L.bk, &L.bv});
    L.wq = L.wk = L.wv = LinearWeight();
    L.bq = L.bk = L.bv = Array();
  }
  L.w_gate_up = fuse_rows({&L.w_gate, &L.w_up});
  if (L.w_gate_up.defined()) {
    L.b_gate_up = fuse_biases({&L.b_gate, &L.b_up});
    L.w_gate = L.w_up = LinearWeight();
    L.b_gate = L.b_up = Array();
  }
}

// Columns [c0, c0 + heads * head_dim) of x [n, row] as [n, heads, head_dim] (a view).
Array head_view(const Array& x, int64_t c0, int64_t heads, int64_t head_dim) {
  return Array::strided(x.buffer(), x.byte_offset() + size_t(c0) * x.itemsize(), {x.dim(0), heads, head_dim},
                        {x.dim(1), head_dim, 1}, x.dtype());
}

class LlamaModel final : public Model {
 public:
  LlamaModel(const LlamaConfig& cfg, const SafeTensors& st, const LoadOptions& opt) : cfg_(cfg) {
    WeightLoader w(st, opt, cfg.quant);
    const int64_t h = cfg.hidden_size, hd = cfg.head_dim, f = cfg.intermediate_size;
    const int64_t q_out = cfg.n_heads * hd, kv_out = cfg.n_kv_heads * hd;
    embed_ = w.linear("model.embed_tokens", cfg.vocab_size, h);
    const DType dt = embed_.quantized() ? embed_.quant.scales.dtype() : embed_.dense.dtype();
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LlamaLayer L;
      L.attn_norm = w.vector_f32(p + "input_layernorm.weight", h);
      L.mlp_norm = w.vector_f32(p + "post_attention_layernorm.weight", h);
      L.wq = w.linear(p + "self_attn.q_proj", q_out, h, dt);
      L.wk = w.linear(p + "self_attn.k_proj", kv_out, h, dt);
      L.wv = w.linear(p + "self_attn.v_proj", kv_out, h, dt);
      L.wo = w.linear(p + "self_attn.o_proj", h, q_out, dt);
      if (cfg.attention_bias) {
        L.bq = w.vector_f32(p + "self_attn.q_proj.bias", q_out);
        L.bk = w.vector_f32(p + "self_attn.k_proj.bias", kv_out);
        L.bv = w.vector_f32(p + "self_attn.v_proj.bias", kv_out);
      }
      if (cfg.o_proj_bias) L.bo = w.vector_f32(p + "self_attn.o_proj.bias", h);
      L.w_gate = w.linear(p + "mlp.gate_proj", f, h, dt);
      L.w_up = w.linear(p + "mlp.up_proj", f, h, dt);
      L.w_down = w.linear(p + "mlp.down_proj", h, f, dt);
      if (cfg.mlp_bias) {
        L.b_gate = w.vector_f32(p + "mlp.gate_proj.bias", f);
        L.b_up = w.vector_f32(p + "mlp.up_proj.bias", f);
        L.b_down = w.vector_f32(p + "mlp.down_proj.bias", h);
      }
      fuse_layer(L);
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32("model.norm.weight", h);
    if (cfg.tie_word_embeddings && !st.contains("lm_head.weight"))
      lm_head_ = embed_;
    else
      lm_head_ = w.linear("lm_head", cfg.vocab_size, h, dt);
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
    info_.n_params = w.params_loaded();
    if (auto q = w.dominant_quant()) {
      info_.quant_bits = q->bits;
      info_.quant_group_size = q->group_size;
    }
    w.finish();
    // The fused layers' parts went back to the allocator's cache: give them to the system.
    if (!opt.device.is_cpu()) allocator_for(opt.device).trim();
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

  using Model::forward;
  Array forward(const Array& tokens, const Array& positions_in, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel(), pos0 = cache.offset();
    const int64_t hd = cfg_.head_dim, nh = cfg_.n_heads, nkv = cfg_.n_kv_heads;
    const float eps = float(cfg_.rms_norm_eps);
    const bool gpu = !device_.is_cpu();
    if (n <= 0) throw InvalidInput("forward: no tokens");
    Array positions = positions_in;
    if (!positions.defined()) {
      positions = Array::empty({n}, DType::i32);
      for (int64_t i = 0; i < n; ++i) positions.data<int32_t>()[i] = int32_t(pos0 + i);
      positions = ops::to_device(positions, device_);
    } else if (positions.numel() != n || !(positions.device() == device_)) {
      throw InvalidInput("forward: positions " + describe(positions) + " do not match " + std::to_string(n) +
                         " tokens on " + device_.str());
    }

    const Array ids = ops::to_device(tokens, device_);
    Array x = embed_.quantized() ? ops::embedding(embed_.quant, ids) : ops::embedding(embed_.dense, ids);  // [n, hidden]
    ops::AttentionParams ap;
    ap.q_pos0 = pos0;
    ap.scale = float(1.0 / std::sqrt(double(hd)));
    if (gpu) ap.positions = positions;  // graph-stable: lengths read on the device
    Array h = ops::rms_norm(x, layers_[0].attn_norm, eps);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const LlamaLayer& L = layers_[li];
      Array q, k, v;  // [n, heads, hd]
      if (L.wqkv.defined()) {
        Array qkv = ops::linear(h, L.wqkv, L.bqkv);  // [n, (nh + 2 nkv) hd]
        Array qk = head_view(qkv, 0, nh + nkv, hd);
        ops::rope_(qk, positions, inv_freq_, false);
        q = head_view(qkv, 0, nh, hd);
        k = head_view(qkv, nh * hd, nkv, hd);
        v = head_view(qkv, (nh + nkv) * hd, nkv, hd);
        if (!q.is_contiguous()) q = ops::cast(q, DType::f32);
      } else {
        q = ops::linear(h, L.wq, L.bq).reshape({n, nh, hd});
        k = ops::linear(h, L.wk, L.bk).reshape({n, nkv, hd});
        v = ops::linear(h, L.wv, L.bv).reshape({n, nkv, hd});
        ops::rope_(q, positions, inv_freq_, false);
        ops::rope_(k, positions, inv_freq_, false);
      }
      auto [keys, values] = cache.layer(li).update_and_fetch(k, v, gpu ? positions : Array());
      ap.max_keys = cache.layer(li).capacity();
      Array a = ops::attention(q, keys, values, ap);  // [n, nh * hd]
      h = ops::add_rms_norm(x, ops::linear(a, L.wo, L.bo), L.mlp_norm, eps);
      Array g = L.w_gate_up.defined()
                    ? ops::silu_mul_split(ops::linear(h, L.w_gate_up, L.b_gate_up))
                    : ops::silu_mul(ops::linear(h, L.w_gate, L.b_gate), ops::linear(h, L.w_up, L.b_up));  // [n, f]
      Array d = ops::linear(g, L.w_down, L.b_down);
      if (li + 1 < layers_.size())
        h = ops::add_rms_norm(x, d, layers_[li + 1].attn_norm, eps);
      else
        ops::add_(x, d);
    }
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    x = ops::rms_norm(x, final_norm_, eps);
    return ops::linear(x, lm_head_);
  }

 private:
  LlamaConfig cfg_;
  LinearWeight embed_, lm_head_;  // a tied head is the embedding table itself
  Array final_norm_, inv_freq_;
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
