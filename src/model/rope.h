#pragma once
// Rotary embedding configuration, read from either config form: the Hub's
// (`rope_theta` + `rope_scaling`) or transformers 5's (`rope_parameters`).
#include <string>
#include <vector>

#include "formats/config_reader.h"

namespace osprey {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | factors
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // type "factors": inv_freq[i] is divided by factors[i] (head_dim / 2 of them). GGUF files
  // state llama3-style scaling this way (the rope_freqs tensor); a config may too, as
  // {"rope_type": "factors", "factors": [...]}.
  std::vector<double> factors;
};

// `default_theta` applies when the config names none. With transformers 5's per-layer-type
// form ({"full_attention": {...}, "sliding_attention": {...}}), `layer_type` picks one.
RopeConfig parse_rope(const ConfigReader& config, double default_theta, const std::string& layer_type = "");

// inv_freq [head_dim / 2] for `rotary_dim` = head_dim, with the scaling applied.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

}  // namespace osprey
