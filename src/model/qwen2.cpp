// Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases (no o_proj bias), usually tied
// embeddings, rope_theta 1e6.
#include "core/error.h"
#include "model/llama.h"

namespace osprey {

void register_qwen2_family() {
  register_family("qwen2", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 10000.0);
    spec.attention_bias = true;
    if (c.get_bool("use_sliding_window", false))
      throw Unsupported(c.where() + ": use_sliding_window=true is not supported for qwen2");
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
