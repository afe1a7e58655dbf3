#include "model/decoder.h"

#include <cmath>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "core/log.h"
#include "formats/safetensors.h"
#include "model/blocks.h"
#include "model/kv_cache_scales.h"
#include "model/layer_types.h"

namespace osprey {
namespace {

struct DecoderLayer {
  Array norm_in;                  // input_layernorm
  Array norm_mid;                 // post_attention_layernorm (sequential: before the MLP; sandwich: after attention)
  Array norm_pre_ffn, norm_post_ffn;  // sandwich only
  Array q_norm, k_norm;           // [head_dim] f32 when qk_norm
  LinearGroup qkv;                // q [n_heads hd, hidden], k, v [n_kv_heads hd, hidden]
  LinearWeight wo;                // [hidden, n_heads hd]
  Array bo;                       // [hidden] f32 or undefined
  LinearGroup gate_up;            // gate, up [f, hidden]
  LinearWeight w_down;            // [hidden, f]
  Array b_down;
  std::unique_ptr<FeedForward> ffn;  // the family's block in place of the gated MLP, or null
};

// `v` as the nearest value of `dt` (f32 unchanged): transformers multiplies Gemma's embeddings
// by sqrt(hidden) held in the weights' dtype (55.4256 is 55.5 in bf16).
float in_dtype(float v, DType dt) {
  if (dt == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

class Decoder final : public Model {
 public:
  Decoder(const DecoderSpec& spec, const SafeTensors& st, const LoadOptions& opt) : spec_(spec), comm_(opt.comm) {
    WeightLoader w(st, opt, spec.quant);
    ignore_tensors(w, st);
    const int64_t h = spec.hidden_size, hd = spec.head_dim, f = spec.intermediate_size;
    const int64_t q_out = spec.n_heads * hd, kv_out = spec.n_kv_heads * hd;
    const ShardSpec shard = comm_ ? comm_->shard() : ShardSpec{};
    if (spec.feed_forward && shard.sharded())
      throw Unsupported(spec.model_type + ": tensor parallelism over its feed-forward blocks (experts) is not supported");
    heads_ = shard_heads(spec.n_heads, spec.n_kv_heads, shard);
    const ShardRange ff = shard_range(f, shard), vocab = shard_range(spec.vocab_size, shard);
    const bool lead = shard.rank == 0;
    auto rows = [&](const ShardRange& r) {
      return shard.sharded() ? WeightSlice::by_rows(r.begin, r.count()) : WeightSlice{};
    };
    auto cols = [&](const ShardRange& r) {
      return shard.sharded() ? WeightSlice::by_cols(r.begin, r.count()) : WeightSlice{};
    };
    auto part = [&](const std::string& name, int64_t out, const ShardRange& r) {
      return shard.sharded() ? WeightLoader::GroupPart{name, out, r.begin, r.count()} : WeightLoader::GroupPart{name, out};
    };
    // A row-split layer's bias is added once, by rank 0, before the reduction.
    auto row_split_bias = [&](const std::string& name) {
      if (lead) return w.vector_f32(name, h);
      w.ignore(name);
      return Array();
    };
    const ShardRange q_rows{heads_.q_head0 * hd, (heads_.q_head0 + heads_.n_heads) * hd};
    const ShardRange kv_rows{heads_.kv_head0 * hd, (heads_.kv_head0 + heads_.n_kv_heads) * hd};

    const std::string& P = spec.prefix;
    embed_ = w.table(P + "embed_tokens", spec.vocab_size, h);
    const DType dt = embed_.value_dtype();
    if (spec.embed_scale_sqrt_hidden) embed_scale_ = in_dtype(float(std::sqrt(double(h))), dt);
    kv_dtype_ = spec.kv_rows_follow_weights ? kv_rows_dtype(dt) : DType::f16;
    for (int64_t i = 0; i < spec.n_layers; ++i) {
      const std::string p = P + "layers." + std::to_string(i) + ".";
      DecoderLayer L;
      L.norm_in = w.vector_f32(p + "input_layernorm.weight", h);
      if (spec.block != DecoderBlock::parallel) L.norm_mid = w.vector_f32(p + "post_attention_layernorm.weight", h);
      if (spec.block == DecoderBlock::sandwich) {
        L.norm_pre_ffn = w.vector_f32(p + "pre_feedforward_layernorm.weight", h);
        L.norm_post_ffn = w.vector_f32(p + "post_feedforward_layernorm.weight", h);
      }
      if (spec.qk_norm) {
        L.q_norm = w.vector_f32(p + "self_attn.q_norm.weight", hd);
        L.k_norm = w.vector_f32(p + "self_attn.k_norm.weight", hd);
      }
      L.qkv = w.linear_group({part(p + "self_attn.q_proj", q_out, q_rows), part(p + "self_attn.k_proj", kv_out, kv_rows),
                              part(p + "self_attn.v_proj", kv_out, kv_rows)},
                             h, dt, spec.attention_bias);
      L.wo = w.linear(p + "self_attn.o_proj", h, q_out, dt, cols(q_rows));
      if (spec.o_proj_bias) L.bo = row_split_bias(p + "self_attn.o_proj.bias");
      if (spec.feed_forward) L.ffn = spec.feed_forward(FeedForwardContext{w, p, i, h, dt});
      if (!L.ffn) {
        L.gate_up = w.linear_group({part(p + "mlp.gate_proj", f, ff), part(p + "mlp.up_proj", f, ff)}, h, dt,
                                   spec.mlp_bias);
        L.w_down = w.linear(p + "mlp.down_proj", h, f, dt, cols(ff));
        if (spec.mlp_bias) L.b_down = row_split_bias(p + "mlp.down_proj.bias");
      }
      layers_.push_back(std::move(L));
    }
    final_norm_ = w.vector_f32(P + "norm.weight", h);
    // A bare base model (!spec.head) has none: hidden states only.
    if (spec.head && spec.tie_word_embeddings && !st.contains(spec.lm_head + ".weight"))
      lm_head_ = shard.sharded() ? w.linear(P + "embed_tokens", spec.vocab_size, h, dt, rows(vocab)) : embed_;
    else if (spec.head)
      lm_head_ = w.linear(spec.lm_head, spec.vocab_size, h, dt, rows(vocab));
    // An untied dense table is read a few rows a step: where it is a view of the mapped file, the
    // pages that loading brought in go back (a lookup reads its rows from the file again).
    if (lm_head_.storage() != embed_.storage()) embed_.release_table_pages();
    inv_freq_full_ = inv_freq(w, spec.rope);
    inv_freq_sliding_ = spec.has_rope_sliding ? inv_freq(w, spec.rope_sliding) : inv_freq_full_;
    kv_scales_ = read_kv_cache_scales(
        w, st, spec.kv_cache_scheme, {P, spec.n_layers, spec.n_kv_heads, heads_.kv_head0, heads_.n_kv_heads});
    if (spec.require_all_read) w.require_all_read(spec.model_type);

    info_.model_type = spec.model_type;
    info_.vocab_size = spec.vocab_size;
    info_.hidden_size = h;
    info_.n_layers = spec.n_layers;
    info_.max_position_embeddings = spec.max_position_embeddings;
    info_.embedding_only = !spec.head;
    w.record_weights(info_, dt);
    w.finish();
  }

 public:
  bool replayable_step() const override {
    for (const DecoderLayer& L : layers_)
      if (L.ffn && !L.ffn->replayable()) return false;
    return true;
  }

 protected:
  KVCacheParams layer_cache_params(int64_t layer, const KVCacheParams& params) const override {
    KVCacheParams p = layer_kv_params(params, heads_.n_kv_heads, spec_.head_dim, kv_dtype_, window(size_t(layer)));
    if (!kv_scales_.empty()) apply_kv_cache_scales(p, kv_scales_[size_t(layer)]);
    return p;
  }

  Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel();
    Array x = residual(tokens, positions, cache);
    if (!all_logits && n > 1) x = ops::cast(x.slice_rows(n - 1, n), DType::f32);
    return head(x);
  }

  Array hidden_tokens(const Array& tokens, const Array& positions, SequenceCache& cache) override {
    Array h = norm(residual(tokens, positions, cache), final_norm_);  // [n, hidden]
    return h.dtype() == DType::f32 ? h : ops::cast(h, DType::f32);
  }

  // The chunk is cut after each image, so that every pass ends with its image (if it has one):
  // its rows then see the whole image among the keys written so far.
  Array forward_images(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits,
                       std::span<const ImageSpan> images) override {
    if (!spec_.image_input) throw Unsupported(spec_.model_type + " takes no image input (a text-only model)");
    if (comm_) throw Unsupported(spec_.model_type + ": image input with tensor parallelism is not supported");
    const int64_t n = tokens.numel(), p0 = cache.offset();
    std::vector<Array> parts;  // logits of each pass
    int64_t begin = 0;
    size_t next = 0;
    while (begin < n) {
      const ImageSpan* span = next < images.size() ? &images[next] : nullptr;
      const int64_t end = span ? span->pos0 + span->embeds.dim(0) - p0 : n;
      Array x = residual(tokens.slice_rows(begin, end), positions.slice_rows(begin, end), cache, span);
      const bool last = end == n;
      if (all_logits || last) {
        if (!all_logits && end - begin > 1) x = ops::cast(x.slice_rows(end - begin - 1, end - begin), DType::f32);
        parts.push_back(head(x));
      }
      begin = end;
      next += span ? 1 : 0;
    }
    if (parts.size() == 1) return parts[0];
    int64_t rows = 0;
    for (const Array& a : parts) rows += a.dim(0);
    Array out = Array::empty({rows, parts[0].dim(1)}, DType::f32, parts[0].device());
    rows = 0;
    for (const Array& a : parts) {
      ops::copy_into(out.slice_rows(rows, rows + a.dim(0)), a);
      rows += a.dim(0);
    }
    return out;
  }

 private:
  // The final norm and the head over x [rows, hidden] -> logits [rows, vocab].
  Array head(Array x) const {
    x = norm(x, final_norm_);
    Array logits = ops::linear(x, lm_head_);  // [rows, vocab] (a rank: its vocabulary slice)
    if (comm_) logits = comm_->all_gather_cols(logits, spec_.vocab_size);
    if (spec_.final_logit_softcap > 0) ops::softcap_(logits, float(spec_.final_logit_softcap));
    if (spec_.logit_scale != 0) ops::scale_(logits, float(spec_.logit_scale));
    return logits;
  }

  // The residual stream after the last layer, [n, hidden] f32 on the model's device. `image`,
  // when given, lies wholly inside these rows and ends with them.
  Array residual(const Array& tokens, const Array& positions, SequenceCache& cache,
                 const ImageSpan* image = nullptr) const {
    Array x = ops::embedding(embed_, tokens, embed_scale_);  // [n, hidden] f32: the residual stream
    if (image) {
      const int64_t r0 = image->pos0 - cache.offset();
      ops::copy_into(x.slice_rows(r0, r0 + image->embeds.dim(0)), image->embeds);
    }
    Array h = norm(x, layers_[0].norm_in);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const DecoderLayer& L = layers_[li];
      const Array* next_norm = li + 1 < layers_.size() ? &layers_[li + 1].norm_in : nullptr;
      Array a = attention(h, li, positions, cache, image);  // [n, this rank's heads * hd]
      switch (spec_.block) {
        case DecoderBlock::sequential: {
          h = add_norm(x, reduced(ops::linear(a, L.wo, L.bo)), L.norm_mid);
          add_then_norm(x, feed_forward(h, L), next_norm, h);
          break;
        }
        case DecoderBlock::sandwich: {
          Array o = norm(reduced(ops::linear(a, L.wo, L.bo)), L.norm_mid);
          h = add_norm(x, o, L.norm_pre_ffn);
          ops::add_(x, norm(feed_forward(h, L), L.norm_post_ffn));
          if (next_norm) h = norm(x, *next_norm);
          break;
        }
        case DecoderBlock::parallel: {
          Array m = feed_forward(h, L);
          ops::add_(x, reduced(ops::linear(a, L.wo, L.bo)));
          ops::add_(x, m);
          if (next_norm) h = norm(x, *next_norm);
          break;
        }
      }
    }
    return x;
  }

  void ignore_tensors(WeightLoader& w, const SafeTensors& st) const {
    if (spec_.ignored_prefixes.empty()) return;
    size_t n_ignored = 0;
    for (const std::string& name : st.names())
      for (const std::string& p : spec_.ignored_prefixes)
        if (name.rfind(p, 0) == 0) {
          w.ignore(name);
          ++n_ignored;
          break;
        }
    if (n_ignored > 0)
      log_info(spec_.model_type + ": loading the language model only; " + std::to_string(n_ignored) +
               " tensors of other parts (a vision tower, a projector) are ignored");
  }

  Array inv_freq(WeightLoader& w, const RopeConfig& rope) const {
    std::vector<float> inv = rope_inv_freq(rope, spec_.head_dim);
    Array host = Array::empty({int64_t(inv.size())}, DType::f32);
    std::copy(inv.begin(), inv.end(), host.data<float>());
    return w.constant(host);
  }

  bool sliding(size_t layer) const { return !spec_.sliding.empty() && spec_.sliding[layer]; }
  int64_t window(size_t layer) const { return sliding(layer) ? spec_.sliding_window : 0; }

  Array norm(const Array& x, const Array& w) const {
    const float eps = float(spec_.norm_eps);
    if (spec_.norm == DecoderNorm::layer_norm) return ops::layer_norm(x, w, Array(), eps);
    return ops::rms_norm(x, w, eps, spec_.norm == DecoderNorm::rms_unit_offset);
  }
  // x += y; returns norm(x, w) (one fused op for RMSNorm).
  Array add_norm(Array& x, const Array& y, const Array& w) const {
    if (spec_.norm == DecoderNorm::layer_norm) {
      ops::add_(x, y);
      return norm(x, w);
    }
    return ops::add_rms_norm(x, y, w, float(spec_.norm_eps), spec_.norm == DecoderNorm::rms_unit_offset);
  }
  // x += y, and h = norm(x, *w) when there is a next layer to feed.
  void add_then_norm(Array& x, const Array& y, const Array* w, Array& h) const {
    if (w)
      h = add_norm(x, y, *w);
    else
      ops::add_(x, y);
  }
  // A row-split layer's output: the sum over the ranks.
  Array reduced(Array partial) const {
    if (comm_) comm_->all_reduce_sum_(partial);
    return partial;
  }

  Array attention(const Array& h, size_t li, const Array& positions, SequenceCache& cache,
                  const ImageSpan* image = nullptr) const {
    const DecoderLayer& L = layers_[li];
    const bool slides = sliding(li);
    QKTransform t;
    t.q_norm = L.q_norm;
    t.k_norm = L.k_norm;
    t.norm_eps = float(spec_.norm_eps);
    t.norm_unit_offset = spec_.norm == DecoderNorm::rms_unit_offset;
    if (slides || spec_.rope_full_layers) {
      t.inv_freq = slides ? inv_freq_sliding_ : inv_freq_full_;
      t.interleaved = spec_.rope_interleaved;
    }
    const AttentionShape shape{heads_.n_heads, heads_.n_kv_heads, spec_.head_dim};
    AttentionInputs in = attention_inputs(h, L.qkv, shape, positions, t);
    KVView kv = cache.layer(li).update_and_fetch(in.k, in.v, positions);
    ops::AttentionParams ap = kv.attention_params();
    const double scalar = spec_.query_pre_attn_scalar > 0 ? spec_.query_pre_attn_scalar : double(spec_.head_dim);
    ap.scale = float(1.0 / std::sqrt(scalar));
    ap.window = int(window(li));
    ap.softcap = float(spec_.attn_logit_softcap);
    Array out = ops::attention(in.q, kv.keys, kv.values, ap);
    if (image) image_rows_attention(in.q, kv, ap, *image, out);
    return out;
  }

  // The rows of `image` (the last rows of this pass) again, each seeing the whole image: the
  // row at position p sees what it sees causally and the image's later rows, which for an image
  // no longer than the window is keys (p - window, end - 1]: one query placed at end - 1, with
  // the window widened by end - 1 - p (0: every key up to end - 1).
  // NOTE: one attention call per image row and layer (256 for a Gemma 3 image).
  void image_rows_attention(const Array& q, const KVView& kv, ops::AttentionParams ap, const ImageSpan& image,
                            Array& out) const {
    const int64_t n = q.dim(0), len = image.embeds.dim(0), last = image.pos0 + len - 1;
    const int64_t q_pos0 = kv.pos0;  // the position of row 0 of this pass
    if (std::holds_alternative<ops::PagedKeys>(ap.keys))
      throw Unsupported(spec_.model_type + ": image input through a paged KV pool is not supported");
    if (ap.window > 0 && len > ap.window)
      throw Unsupported(spec_.model_type + ": an image of " + std::to_string(len) + " tokens in a sliding window of " +
                        std::to_string(ap.window));
    ap.positions = Array();  // each call places its query by q_pos0, on the host
    ap.max_keys = 0;
    const int window = ap.window;
    ap.q_pos0 = last;
    for (int64_t p = image.pos0; p <= last; ++p) {
      const int64_t r = p - q_pos0;
      if (r < 0 || r >= n) throw InvalidInput("image rows outside the pass");
      ap.window = window > 0 ? int(window + (last - p)) : 0;
      const Array row = ops::attention(q.slice_rows(r, r + 1), kv.keys, kv.values, ap);
      ops::copy_into(out.slice_rows(r, r + 1), row);
    }
  }

  Array mlp(const Array& h, const DecoderLayer& L) const {
    return spec_.activation == DecoderActivation::gelu_tanh ? gelu_gate(h, L.gate_up) : silu_gate(h, L.gate_up);
  }
  // The layer's feed-forward output over h (its normed input), summed over the ranks: the
  // family's block where it gave one (never sharded), else the gated MLP and down_proj.
  Array feed_forward(const Array& h, const DecoderLayer& L) const {
    if (L.ffn) return L.ffn->forward(h);
    return reduced(ops::linear(mlp(h, L), L.w_down, L.b_down));
  }

  DecoderSpec spec_;
  Communicator* comm_ = nullptr;  // tensor parallelism; null for the whole model
  HeadShard heads_;               // this rank's heads (all of them when not sharded)
  LinearWeight embed_, lm_head_;  // a tied head is the embedding table itself
  float embed_scale_ = 1.0f;
  DType kv_dtype_ = DType::f16;
  std::vector<LayerKVScales> kv_scales_;  // per layer: the checkpoint's fixed KV-cache scales, or none
  Array final_norm_, inv_freq_full_, inv_freq_sliding_;
  std::vector<DecoderLayer> layers_;
};

}  // namespace

void read_bias_and_tying(const ConfigReader& c, DecoderSpec& spec, bool tie_default) {
  spec.attention_bias = c.get_bool("attention_bias", false);
  spec.o_proj_bias = spec.attention_bias;
  spec.tie_word_embeddings = c.get_bool("tie_word_embeddings", tie_default);
}

void read_sliding_layers(const ConfigReader& c, DecoderSpec& spec, int64_t default_pattern, int64_t default_window) {
  SlidingLayers layers = parse_sliding_window(c, spec.n_layers, default_pattern, default_window);
  spec.sliding = std::move(layers.sliding);
  spec.sliding_window = layers.window;
}

std::unique_ptr<Model> build_decoder(const DecoderSpec& spec, const SafeTensors& weights, const LoadOptions& options) {
  // The same computation over tensors laid out otherwise (TensorLayout).
  const TensorLayout& layout = weights.layout();
  DecoderSpec s = spec;
  if (layout.qk_rows_interleaved) {
    if (spec.rope_interleaved)
      throw InvalidInput(weights.source().string() + ": the q/k rows are marked as permuted to interleaved pairs, but " +
                         spec.model_type + " rotates interleaved pairs already");
    s.rope_interleaved = true;
  }
  if (layout.norm_unit_offset_folded && spec.norm == DecoderNorm::rms_unit_offset) s.norm = DecoderNorm::rms;
  // A bare base model (AutoModel's layout): its tensors lack the prefix, and a head is loaded
  // only where the file has one.
  if (!s.prefix.empty() && !weights.contains(s.prefix + "embed_tokens.weight") &&
      weights.contains("embed_tokens.weight")) {
    s.prefix = "";
    s.head = weights.contains(s.lm_head + ".weight");
  }
  return std::make_unique<Decoder>(s, weights, options);
}

}  // namespace osprey
