// Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases (no o_proj bias), usually tied
// embeddings, rope_theta 1e6.
#include "model/config_reader.h"
#include "core/error.h"
#include "model/llama.h"

namespace osprey {

void register_qwen2_family() {
  register_family("qwen2", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    LlamaConfig cfg = parse_llama_config(c, 10000.0);
    c.get_choice("hidden_act", "silu", {"silu"});
    cfg.attention_bias = true;
    cfg.o_proj_bias = false;
    if (c.has("use_sliding_window") && c.get_bool("use_sliding_window", false))
      throw Unsupported(c.where() + ": use_sliding_window=true is not supported for qwen2");
    return build_llama_model(cfg, st, o);
  });
}

}  // namespace osprey
