#include "model/layer_types.h"

#include "core/error.h"

namespace osprey {

std::vector<bool> parse_sliding_layers(const ConfigReader& c, int64_t n_layers, int64_t default_pattern) {
  std::vector<bool> sliding;
  if (c.has("layer_types")) {
    const std::vector<std::string> types = c.get_string_list("layer_types");
    if (int64_t(types.size()) != n_layers)
      c.fail("layer_types", "has " + std::to_string(types.size()) + " entries, but num_hidden_layers is " +
                                std::to_string(n_layers));
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "sliding_attention" && types[i] != "full_attention")
        throw Unsupported(c.where() + ": field \"layer_types\": layer " + std::to_string(i) + " is \"" + types[i] +
                          "\"; supported layer types are \"sliding_attention\" and \"full_attention\"");
      sliding.push_back(types[i] == "sliding_attention");
    }
    return sliding;
  }
  const int64_t pattern = c.get_int("sliding_window_pattern", default_pattern);
  if (pattern < 1) c.fail("sliding_window_pattern", "must be at least 1, got " + std::to_string(pattern));
  for (int64_t i = 0; i < n_layers; ++i) sliding.push_back((i + 1) % pattern != 0);
  return sliding;
}

SlidingLayers parse_sliding_window(const ConfigReader& c, int64_t n_layers, int64_t default_pattern,
                                   int64_t default_window) {
  SlidingLayers out;
  out.window = c.get_int("sliding_window", default_window);
  out.sliding = parse_sliding_layers(c, n_layers, default_pattern);
  bool any_sliding = false;
  for (bool s : out.sliding) any_sliding = any_sliding || s;
  if (any_sliding && out.window <= 0) c.fail("sliding_window", "must be positive, got " + std::to_string(out.window));
  if (out.window > INT32_MAX) c.fail("sliding_window", "is too large");
  return out;
}

}  // namespace osprey
