#include "model/llama.h"

#include <cmath>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "model/blocks.h"
#include "model/config_reader.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace osprey {

LlamaConfig parse_llama_config(const ConfigReader& c, double default_rope_theta) {
  LlamaConfig cfg;
  static_cast<DecoderDims&>(cfg) = parse_decoder_dims(c, DecoderDefaults{});
  cfg.model_type = c.get_string("model_type");
  cfg.rms_norm_eps = c.get_float("rms_norm_eps", 1e-6);
  cfg.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  if (!(cfg.rms_norm_eps > 0) || !std::isfinite(cfg.rms_norm_eps))
    c.fail("rms_norm_eps", "must be positive, got " + c.json()["rms_norm_eps"].dump());
  cfg.rope = parse_rope(c, default_rope_theta);
  cfg.quant = parse_quant_config(c);
  return cfg;
}

namespace {

struct LlamaLayer {
  Array attn_norm, mlp_norm;  // [hidden] f32
  Array q_norm, k_norm;       // [head_dim] f32 when qk_norm
  LinearGroup qkv;            // q [n_heads hd, hidden], k, v [n_kv_heads hd, hidden], biases when attention_bias
  LinearWeight wo;            // [hidden, n_heads hd]
  Array bo;                   // [hidden] f32 or undefined
  LinearGroup gate_up;        // gate, up [f, hidden]
  LinearWeight w_down;        // [hidden, f]
  Array b_down;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const LlamaConfig& cfg, const SafeTensors& st, const LoadOptions& opt) : cfg_(cfg), comm_(opt.comm) {
    WeightLoader w(st, opt, cfg.quant);
    const int64_t h = cfg.hidden_size, hd = cfg.head_dim, f = cfg.intermediate_size;
    const int64_t q_out = cfg.n_heads * hd, kv_out = cfg.n_kv_heads * hd;
    // Tensor parallelism: q/k/v and gate/up split by their output rows (whole heads), o and
    // down by their input columns (their partial sums meet in an all-reduce), the head by
    // vocabulary rows. A row-split layer's bias is added by rank 0 alone, before the sum. The
    // embedding stays whole on every rank: a lookup of a few rows, from the map on the CPU.
    const ShardSpec shard = comm_ ? comm_->shard() : ShardSpec{};
    heads_ = shard_heads(cfg.n_heads, cfg.n_kv_heads, shard);
    const ShardRange ff = shard_range(f, shard), vocab = shard_range(cfg.vocab_size, shard);
    const bool lead = shard.rank == 0;
    auto rows = [&](const ShardRange& r) {
      return shard.sharded() ? WeightSlice::by_rows(r.begin, r.count()) : WeightSlice{};
    };
    auto cols = [&](const ShardRange& r) {
      return shard.sharded() ? WeightSlice::by_cols(r.begin, r.count()) : WeightSlice{};
    };
    const ShardRange q_rows{heads_.q_head0 * hd, (heads_.q_head0 + heads_.n_heads) * hd};
    const ShardRange kv_rows{heads_.kv_head0 * hd, (heads_.kv_head0 + heads_.n_kv_heads) * hd};
    embed_ = w.linear("model.embed_tokens", cfg.vocab_size, h);
    const DType dt = embed_.quantized() ? embed_.quant.scales.dtype() : embed_.dense.dtype();
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LlamaLayer L;
      L.attn_norm = w.vector_f32(p + "input_layernorm.weight", h);
      L.mlp_norm = w.vector_f32(p + "post_attention_layernorm.weight", h);
      if (cfg.qk_norm) {
        L.q_norm = w.vector_f32(p + "self_attn.q_norm.weight", hd);
        L.k_norm = w.vector_f32(p + "self_attn.k_norm.weight", hd);
      }
      // A row-split layer's bias is added once, by rank 0, before the reduction.
      auto row_split_bias = [&](const std::string& name) {
        if (lead) return w.vector_f32(name, h);
        w.ignore(name);
        return Array();
      };
      auto part = [&](const std::string& name, int64_t out, const ShardRange& r) {
        return shard.sharded() ? WeightLoader::GroupPart{name, out, r.begin, r.count()}
                               : WeightLoader::GroupPart{name, out};
      };
      L.qkv = w.linear_group({part(p + "self_attn.q_proj", q_out, q_rows), part(p + "self_attn.k_proj", kv_out, kv_rows),
                              part(p + "self_attn.v_proj", kv_out, kv_rows)},
                             h, dt, cfg.attention_bias);
      L.wo = w.linear(p + "self_attn.o_proj", h, q_out, dt, cols(q_rows));
      if (cfg.o_proj_bias) L.bo = row_split_bias(p + "self_attn.o_proj.bias");
      L.gate_up = w.linear_group({part(p + "mlp.gate_proj", f, ff), part(p + "mlp.up_proj", f, ff)}, h, dt,
                                 cfg.mlp_bias);
      L.w_down = w.linear(p + "mlp.down_proj", h, f, dt, cols(ff));
      if (cfg.mlp_bias) L.b_down = row_split_bias(p + "mlp.down_proj.bias");
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32("model.norm.weight", h);
    if (cfg.tie_word_embeddings && !st.contains("lm_head.weight"))
      lm_head_ = shard.sharded() ? w.linear("model.embed_tokens", cfg.vocab_size, h, dt, rows(vocab)) : embed_;
    else
      lm_head_ = w.linear("lm_head", cfg.vocab_size, h, dt, rows(vocab));
    std::vector<float> inv = rope_inv_freq(cfg.rope, hd);
    Array inv_host = Array::empty({int64_t(inv.size())}, DType::f32);
    std::copy(inv.begin(), inv.end(), inv_host.data<float>());
    inv_freq_ = w.constant(inv_host);

    info_.model_type = cfg.model_type;
    info_.vocab_size = cfg.vocab_size;
    info_.hidden_size = h;
    info_.n_layers = cfg.n_layers;
    info_.max_position_embeddings = cfg.max_position_embeddings;
    w.record_weights(info_, dt);
    w.finish();
  }

 protected:
  KVCacheParams layer_cache_params(int64_t, const KVCacheParams& params) const override {
    return layer_kv_params(params, heads_.n_kv_heads, cfg_.head_dim, DType::f16, cfg_.sliding_window);
  }

  Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel();
    const float eps = float(cfg_.rms_norm_eps);
    const AttentionShape shape{heads_.n_heads, heads_.n_kv_heads, cfg_.head_dim};
    const float scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));

    Array x = ops::embedding(embed_, tokens);  // [n, hidden]
    Array h = ops::rms_norm(x, layers_[0].attn_norm, eps);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const LlamaLayer& L = layers_[li];
      QKTransform t;
      t.inv_freq = inv_freq_;
      t.q_norm = L.q_norm;
      t.k_norm = L.k_norm;
      t.norm_eps = eps;
      AttentionInputs in = attention_inputs(h, L.qkv, shape, positions, t);
      KVView kv = cache.layer(li).update_and_fetch(in.k, in.v, positions);
      ops::AttentionParams ap = kv.attention_params();
      ap.scale = scale;
      ap.window = int(cfg_.sliding_window);
      Array a = ops::attention(in.q, kv.keys, kv.values, ap);  // [n, nh * hd]
      Array o = ops::linear(a, L.wo, L.bo);
      if (comm_) comm_->all_reduce_sum_(o);
      h = ops::add_rms_norm(x, o, L.mlp_norm, eps);
      Array d = ops::linear(silu_gate(h, L.gate_up), L.w_down, L.b_down);
      if (comm_) comm_->all_reduce_sum_(d);
      if (li + 1 < layers_.size())
        h = ops::add_rms_norm(x, d, layers_[li + 1].attn_norm, eps);
      else
        ops::add_(x, d);
    }
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    x = ops::rms_norm(x, final_norm_, eps);
    Array logits = ops::linear(x, lm_head_);  // [rows, vocab] (a rank: its vocabulary slice)
    if (comm_) logits = comm_->all_gather_cols(logits, cfg_.vocab_size);
    return logits;
  }

 private:
  LlamaConfig cfg_;
  Communicator* comm_ = nullptr;  // tensor parallelism; null for the whole model
  HeadShard heads_;               // this rank's heads (all of them when not sharded)
  LinearWeight embed_, lm_head_;  // a tied head is the embedding table itself
  Array final_norm_, inv_freq_;
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
    c.get_choice("hidden_act", "silu", {"silu"});
    cfg.attention_bias = c.get_bool("attention_bias", false);
    cfg.o_proj_bias = cfg.attention_bias;
    cfg.mlp_bias = c.get_bool("mlp_bias", false);
    return build_llama_model(cfg, st, o);
  });
}

}  // namespace osprey
