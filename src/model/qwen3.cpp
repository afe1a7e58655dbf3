// Qwen3 (dense): the Llama decoder with a per-head RMSNorm of q and k before RoPE, optional
// q/k/v/o biases, head_dim given by the config (not hidden_size / heads), rope_theta 1e6.
#include "core/error.h"
#include "model/llama.h"

namespace osprey {

void register_qwen3_family() {
  register_family("qwen3", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 1000000.0);
    spec.attention_bias = c.get_bool("attention_bias", false);
    spec.o_proj_bias = spec.attention_bias;  // Qwen3Attention's o_proj takes it too
    spec.qk_norm = true;
    if (c.get_bool("use_sliding_window", false))
      throw Unsupported(c.where() + ": use_sliding_window=true is not supported for qwen3");
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
