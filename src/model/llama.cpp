#include "model/llama.h"

#include <cmath>
#include <cstdint>

#include "formats/config_reader.h"

namespace osprey {

DecoderSpec parse_llama_config(const ConfigReader& c, double default_rope_theta) {
  DecoderSpec spec;
  static_cast<DecoderDims&>(spec) = parse_decoder_dims(c, DecoderDefaults{});
  spec.model_type = c.get_string("model_type");
  spec.norm_eps = c.get_float("rms_norm_eps", 1e-6);
  spec.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  if (!(spec.norm_eps > 0) || !std::isfinite(spec.norm_eps))
    c.fail("rms_norm_eps", "must be positive, got " + c.json()["rms_norm_eps"].dump());
  spec.rope = parse_rope(c, default_rope_theta);
  spec.quant = parse_quant_config(c);
  spec.kv_cache_scheme = parse_kv_cache_scheme(c);
  c.get_choice("hidden_act", "silu", {"silu"});
  return spec;
}

void read_every_layer_window(const ConfigReader& c, DecoderSpec& spec) {
  if (!c.has("sliding_window")) return;  // null: full attention, as absent
  spec.sliding_window = c.get_int("sliding_window");
  if (spec.sliding_window <= 0 || spec.sliding_window > INT32_MAX)
    c.fail("sliding_window", "must be null or a positive integer below 2^31");
  spec.sliding.assign(size_t(spec.n_layers), true);
}

void register_llama_family() {
  register_family("llama", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 10000.0);
    spec.attention_bias = c.get_bool("attention_bias", false);
    spec.o_proj_bias = spec.attention_bias;
    spec.mlp_bias = c.get_bool("mlp_bias", false);
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
