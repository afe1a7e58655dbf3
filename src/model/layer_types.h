#pragma once
// Which layers attend through a sliding window, from either config form: `layer_types` (one
// "sliding_attention" or "full_attention" per layer) or, in older configs,
// `sliding_window_pattern` P (layer i slides unless (i + 1) is a multiple of P).
#include <cstdint>
#include <vector>

#include "formats/config_reader.h"

namespace osprey {

// One entry per layer, true for a sliding-window layer. `default_pattern` applies when the
// config has neither key. Throws InvalidInput naming the field (a list of the wrong length, a
// pattern below 1) and Unsupported for a layer type other than the two.
std::vector<bool> parse_sliding_layers(const ConfigReader& config, int64_t n_layers, int64_t default_pattern);

// The layers that slide (parse_sliding_layers) and their window (`sliding_window`, else
// `default_window`), which must be positive when a layer slides and below 2^31.
struct SlidingLayers {
  std::vector<bool> sliding;
  int64_t window = 0;
};
SlidingLayers parse_sliding_window(const ConfigReader& config, int64_t n_layers, int64_t default_pattern,
                                   int64_t default_window);

}  // namespace osprey
