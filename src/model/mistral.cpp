// Mistral: the Llama decoder, optionally with a sliding window over every layer
// (`sliding_window`, null or absent for full attention).
#include "model/llama.h"

namespace osprey {

void register_mistral_family() {
  register_family("mistral", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 10000.0);
    read_every_layer_window(c, spec);
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
