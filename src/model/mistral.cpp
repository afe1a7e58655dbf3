// Mistral: the Llama decoder, optionally with a sliding window over every layer
// (`sliding_window`, null or absent for full attention).
#include <cstdint>

#include "model/llama.h"

namespace osprey {

void register_mistral_family() {
  register_family("mistral", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 10000.0);
    if (c.has("sliding_window")) {  // null: full attention, as absent
      spec.sliding_window = c.get_int("sliding_window");
      if (spec.sliding_window <= 0 || spec.sliding_window > INT32_MAX)
        c.fail("sliding_window", "must be null or a positive integer below 2^31");
      spec.sliding.assign(size_t(spec.n_layers), true);
    }
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
