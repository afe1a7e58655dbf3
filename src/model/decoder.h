#pragma once
// The decoder every family is: an embedding table, layers of grouped-query attention and a
// gated MLP, a final norm and a head. A family file reads its config.json into a DecoderSpec
// (what is particular to it: norms, activation, rotary variant, which layers slide, tensor
// names) and build_decoder does the rest for all of them: loading, tensor-parallel sharding,
// the forward pass.
//
// Tensor names, under `prefix` ("model." for most checkpoints):
//   embed_tokens, layers.N.{input_layernorm, post_attention_layernorm,
//   pre_feedforward_layernorm, post_feedforward_layernorm}.weight, layers.N.self_attn.
//   {q,k,v,o}_proj, layers.N.self_attn.{q,k}_norm.weight, layers.N.mlp.{gate,up,down}_proj,
//   norm.weight; and the head `lm_head` (or the embedding table, tied).
// A bare base model as transformers' AutoModel saves it (Qwen3Model, LlamaModel: the form
// sentence-transformers' embedding checkpoints take) has the same tensors without the prefix
// and no head: it loads as an embedding-only model (ModelInfo::embedding_only).
//
// A family may give some or all layers another feed-forward block than the gated MLP
// (DecoderSpec::feed_forward: a mixture of experts, model/moe.h); the decoder calls it where it
// would call the MLP, and such a model is not sharded.
//
// Tensor parallelism (LoadOptions::comm over N ranks): q/k/v and gate/up split by output rows
// (whole heads), o and down by input columns (their partial sums meet in an all-reduce before
// anything reads them), the head by vocabulary rows (gathered). A row-split layer's bias is
// added by rank 0 alone, before the sum. The embedding stays whole on every rank.
#include <memory>
#include <string>
#include <vector>

#include "model/decoder_dims.h"
#include "model/feed_forward.h"
#include "model/kv_cache_scales.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/weight_loader.h"

namespace osprey {

enum class DecoderNorm {
  rms,              // x / rms(x) * w
  rms_unit_offset,  // x / rms(x) * (1 + w) (Gemma)
  layer_norm,       // mean-centred LayerNorm with a weight and no bias (Cohere)
};

// How a layer joins attention and MLP to the residual stream x.
enum class DecoderBlock {
  // x += attn(norm_in(x)); x += mlp(post_attention_layernorm(x))   (Llama)
  sequential,
  // x += norm_post_attn(attn(norm_in(x))); x += norm_post_ffn(mlp(norm_pre_ffn(x)))   (Gemma 3)
  sandwich,
  // h = norm_in(x); x += attn(h) + mlp(h)   (Cohere)
  parallel,
};

enum class DecoderActivation { silu, gelu_tanh };

struct DecoderSpec : DecoderDims {
  std::string model_type;  // ModelInfo::model_type and messages
  double norm_eps = 1e-5;
  DecoderNorm norm = DecoderNorm::rms;
  DecoderBlock block = DecoderBlock::sequential;
  DecoderActivation activation = DecoderActivation::silu;
  // Per-head q and k RMSNorm (self_attn.q_norm / k_norm, [head_dim]) between the projection
  // and the rotary embedding, with `norm`'s unit offset.
  bool qk_norm = false;
  // The attention scale is query_pre_attn_scalar^-0.5; 0: head_dim's.
  double query_pre_attn_scalar = 0;
  bool embed_scale_sqrt_hidden = false;  // embeddings times sqrt(hidden) held in the weights' dtype
  double attn_logit_softcap = 0;   // 0: none
  double final_logit_softcap = 0;  // 0: none
  double logit_scale = 0;          // 0: none; else logits times it

  // Layers: `sliding` holds one entry per layer (empty: none slides); a sliding layer attends
  // to the last `sliding_window` positions through a rotating cache.
  int64_t sliding_window = 0;
  std::vector<bool> sliding;
  // Rotary embeddings: `rope` on full-attention layers (none when !rope_full_layers),
  // `rope_sliding` on sliding layers when has_rope_sliding (else `rope`); `rope_interleaved`
  // rotates pairs (2i, 2i+1).
  RopeConfig rope;
  bool rope_full_layers = true;
  bool has_rope_sliding = false;
  RopeConfig rope_sliding;
  bool rope_interleaved = false;

  bool attention_bias = false;  // q/k/v biases
  bool o_proj_bias = false;
  bool mlp_bias = false;
  // A layer's feed-forward block other than the gated MLP of intermediate_size (a family's
  // mixture of experts): called for each layer while loading; a null block (or no loader)
  // leaves that layer the gated MLP. A model with such blocks has a replayable step only when
  // every block is (FeedForward::replayable), and is not sharded for tensor parallelism.
  FeedForwardLoader feed_forward;
  bool tie_word_embeddings = false;  // the embedding table is the head unless the file has lm_head
  // K/V rows in bf16 for a bf16 checkpoint (activations that may pass float16's range), else f16.
  bool kv_rows_follow_weights = false;

  std::string prefix = "model.";
  std::string lm_head = "lm_head";
  // false: no head is loaded (a bare base model, ModelInfo::embedding_only). build_decoder
  // sets it, with prefix "", for a checkpoint whose tensors are a bare model's.
  bool head = true;
  // Tensors deliberately not loaded (a vision tower): names starting with one of these.
  std::vector<std::string> ignored_prefixes;
  // Prompts may hold images (Model::forward with ImageSpans: soft tokens in place of the
  // embeddings, bidirectional within each image on every layer); false: such a pass is refused.
  bool image_input = false;
  // Every tensor of the checkpoint must be read or ignored (else an error naming them).
  bool require_all_read = false;
  QuantConfig quant;  // MLX affine quantization; not present for a dense checkpoint
  // Whether config.json declares fixed KV-cache scales (model/kv_cache_scales.h): the
  // checkpoint must then hold them.
  KVCacheScheme kv_cache_scheme;
};

// Config fields several families read alike: attention_bias (q/k/v and o_proj biases) and
// tie_word_embeddings (default `tie_default`).
void read_bias_and_tying(const ConfigReader& c, DecoderSpec& spec, bool tie_default);
// Which layers slide and the window: parse_sliding_window with the family's defaults.
void read_sliding_layers(const ConfigReader& c, DecoderSpec& spec, int64_t default_pattern, int64_t default_window);

std::unique_ptr<Model> build_decoder(const DecoderSpec& spec, const SafeTensors& weights, const LoadOptions& options);

}  // namespace osprey
