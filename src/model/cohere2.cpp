// Cohere2 (model_type cohere2, Command R7B).
//
// Per layer, a parallel block: h = LayerNorm(x) (no bias); x += attn(h) + mlp(h). Sliding-window
// layers rotate q and k with interleaved (GPT-J) pairs; full-attention layers have no position
// encoding at all. Tied head; logits times logit_scale. All of it is a DecoderSpec
// (model/decoder.h): this file reads the config.
#include <cmath>
#include <string>

#include "core/error.h"
#include "formats/config_reader.h"
#include "model/decoder.h"
#include "model/layer_types.h"

namespace osprey {
namespace {

// With Cohere2Config's defaults for omitted keys.
DecoderSpec parse_cohere2_config(const ConfigReader& c) {
  DecoderSpec cfg;
  cfg.model_type = "cohere2";
  cfg.norm = DecoderNorm::layer_norm;
  cfg.block = DecoderBlock::parallel;
  cfg.rope_full_layers = false;
  cfg.rope_interleaved = true;
  cfg.kv_rows_follow_weights = true;
  cfg.require_all_read = true;
  const DecoderDefaults defaults{.vocab_size = 256000, .hidden_size = 8192, .intermediate_size = 22528,
                                 .n_layers = 40, .n_heads = 64, .max_position_embeddings = 8192};  // Cohere2Config's
  static_cast<DecoderDims&>(cfg) = parse_decoder_dims(c, defaults);
  cfg.norm_eps = c.get_float("layer_norm_eps", 1e-5);
  cfg.logit_scale = c.get_float("logit_scale", 0.0625);
  read_bias_and_tying(c, cfg, /*tie_default=*/true);
  if (cfg.hidden_size % cfg.n_heads != 0 || cfg.head_dim != cfg.hidden_size / cfg.n_heads)
    c.fail("head_dim", "Cohere2's head size is hidden_size / num_attention_heads = " +
                           std::to_string(cfg.hidden_size / cfg.n_heads) + ", got " + std::to_string(cfg.head_dim));
  if (!(cfg.norm_eps > 0)) c.fail("layer_norm_eps", "must be positive");
  if (!std::isfinite(cfg.logit_scale) || cfg.logit_scale == 0)
    c.fail("logit_scale", "must be a finite non-zero number, got " + c.json()["logit_scale"].dump());
  c.get_choice("hidden_act", "silu", {"silu"});
  if (c.get_bool("use_qk_norm", false))
    throw Unsupported(c.where() + ": field \"use_qk_norm\": q/k LayerNorm is not supported for cohere2");
  read_sliding_layers(c, cfg, 4, 4096);
  cfg.rope = parse_rope(c, 10000.0, "sliding_attention");
  cfg.quant = parse_quant_config(c);
  cfg.kv_cache_scheme = parse_kv_cache_scheme(c);
  return cfg;
}

}  // namespace

void register_cohere2_family() {
  register_family("cohere2", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    return build_decoder(parse_cohere2_config(c), st, o);
  });
}

}  // namespace osprey
