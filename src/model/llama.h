#pragma once
// The config of the Llama decoder (Llama 3.x) and of its close relatives that differ only in
// typed fields (Qwen2: q/k/v biases, tied embeddings; Qwen3: q/k norms; Mistral: a sliding
// window), read into the shared DecoderSpec (model/decoder.h).
#include "formats/config_reader.h"
#include "model/decoder.h"

namespace osprey {

// The fields every Llama-like config.json has; errors name the field.
DecoderSpec parse_llama_config(const ConfigReader& config, double default_rope_theta);

// Mistral's (and Mixtral's) `sliding_window`: when set, every layer attends to that many
// positions; null or absent, full attention.
void read_every_layer_window(const ConfigReader& config, DecoderSpec& spec);

}  // namespace osprey
