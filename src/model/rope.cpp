#include "model/rope.h"

#include <cmath>

#include "core/error.h"

namespace osprey {
namespace {

void read_scaling(const ConfigReader& s, RopeConfig& r) {
  r.type = s.get_string("rope_type", s.get_string("type", "default"));
  if (r.type == "default") return;
  auto positive = [&](const char* key) {
    const double v = s.get_float(key);
    if (!(v > 0) || !std::isfinite(v)) s.fail(key, "must be positive, got " + s.json()[key].dump());
    return v;
  };
  if (r.type == "linear") {
    r.factor = positive("factor");
    return;
  }
  if (r.type == "llama3") {
    r.factor = positive("factor");
    r.low_freq_factor = positive("low_freq_factor");
    r.high_freq_factor = positive("high_freq_factor");
    r.original_max_position_embeddings = s.get_int("original_max_position_embeddings");
    if (r.original_max_position_embeddings <= 0)
      s.fail("original_max_position_embeddings", "must be positive, got " + std::to_string(r.original_max_position_embeddings));
    if (r.high_freq_factor <= r.low_freq_factor) s.fail("high_freq_factor", "must exceed low_freq_factor");
    return;
  }
  if (r.type == "factors") {
    if (!s.has("factors") || !s.json()["factors"].is_array()) s.fail("factors", "must be an array of positive numbers");
    for (const auto& v : s.json()["factors"]) {
      if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
        s.fail("factors", "must be an array of positive numbers, got an element " + v.dump());
      r.factors.push_back(v.get<double>());
    }
    return;
  }
  throw Unsupported(s.where() + ": rope type \"" + r.type + "\" is not supported (default, linear, llama3, factors are)");
}

}  // namespace

RopeConfig parse_rope(const ConfigReader& config, double default_theta, const std::string& layer_type) {
  RopeConfig r;
  r.theta = default_theta;
  if (auto params = config.get_object("rope_parameters")) {
    if (!layer_type.empty() && params->has(layer_type)) params = params->get_object(layer_type);
    r.theta = params->get_float("rope_theta", default_theta);
    read_scaling(*params, r);
  } else {
    r.theta = config.get_float("rope_theta", default_theta);
    if (auto s = config.get_object("rope_scaling")) read_scaling(*s, r);
  }
  if (!(r.theta > 0) || !std::isfinite(r.theta)) config.fail("rope_theta", "must be positive");
  return r;
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  std::vector<float> inv(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // As the reference computes it: float32 exponent, then the power.
    float expo = float(2 * i) / float(head_dim);
    inv[size_t(i)] = float(1.0 / std::pow(rope.theta, double(expo)));
  }
  if (rope.type == "linear") {
    for (float& f : inv) f = float(f / rope.factor);
  } else if (rope.type == "factors") {
    if (rope.factors.size() != inv.size())
      throw InvalidInput("rope factors: " + std::to_string(rope.factors.size()) + " given, but head_dim / 2 = " +
                         std::to_string(inv.size()) + " are needed");
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = float(inv[i] / rope.factors[i]);
  } else if (rope.type == "llama3") {
    const double old_len = double(rope.original_max_position_embeddings);
    const double low_wavelen = old_len / rope.low_freq_factor;
    const double high_wavelen = old_len / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_wavelen) continue;  // high frequency: unchanged
      if (wavelen > low_wavelen) {
        f = float(f / rope.factor);
        continue;
      }
      const double smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
      f = float((1.0 - smooth) * f / rope.factor + smooth * f);
    }
  }
  return inv;
}

}  // namespace osprey
