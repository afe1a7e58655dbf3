#pragma once
// The config of the Llama decoder (Llama 3.x) and of its close relatives that differ only in
// typed fields (Qwen2: q/k/v biases, tied embeddings; Qwen3: q/k norms; Mistral: a sliding
// window), read into the shared DecoderSpec (model/decoder.h).
#include "model/config_reader.h"
#include "model/decoder.h"

namespace osprey {

// The fields every Llama-like config.json has; errors name the field.
DecoderSpec parse_llama_config(const ConfigReader& config, double default_rope_theta);

}  // namespace osprey
