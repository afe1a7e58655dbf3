// Mistral: the Llama decoder, optionally with a sliding window over every layer
// (`sliding_window`, null or absent for full attention).
#include <cstdint>

#include "model/config_reader.h"
#include "model/llama.h"

namespace osprey {

void register_mistral_family() {
  register_family("mistral", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    LlamaConfig cfg = parse_llama_config(c, 10000.0);
    c.get_choice("hidden_act", "silu", {"silu"});
    if (c.has("sliding_window")) {  // null: full attention, as absent
      cfg.sliding_window = c.get_int("sliding_window");
      if (cfg.sliding_window <= 0 || cfg.sliding_window > INT32_MAX)
        c.fail("sliding_window", "must be null or a positive integer below 2^31");
    }
    return build_llama_model(cfg, st, o);
  });
}

}  // namespace osprey
