#include "engine/generation_config.h"

#include <cmath>
#include <cstdint>

#include "core/file_read.h"
#include "formats/config_reader.h"
#include "sample/sampler_fields.h"

namespace osprey {
namespace {

// Sampler settings with these filters and no repetition penalty.
SamplerParams sampling_preset(float temperature, int top_k, float top_p, float min_p) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = 1.0f;
  return p;
}

// The file's values over `p`: every setting of the sampler's table that a checkpoint may
// give (SamplerField::from_config), each checked against the table's range.
void apply(const ConfigReader& c, SamplerParams& p) {
  for (const SamplerField& f : sampler_fields()) {
    if (!f.from_config || !c.has(f.key)) continue;
    const double v = f.integer ? double(c.get_int(f.key)) : c.get_float(f.key);
    if (!f.accepts(v))
      c.fail(f.key, std::string("expected ") + (f.integer ? "an integer" : "a number") + " in " + f.range_text() +
                        ", got " + c.json()[f.key].dump());
    f.set(p, v);
  }
}

// Whether the file names any setting it may give.
bool names_any_setting(const ConfigReader& c, std::string* taken = nullptr) {
  bool any = false;
  for (const SamplerField& f : sampler_fields()) {
    if (!f.from_config || !c.has(f.key)) continue;
    any = true;
    if (taken) *taken += std::string(taken->empty() ? "" : ", ") + f.key;
  }
  return any;
}

}  // namespace

SamplerParams llama_cpp_sampling() { return sampling_preset(0.8f, 40, 0.95f, 0.05f); }

SamplerParams openai_sampling() { return sampling_preset(1.0f, 0, 1.0f, 0.0f); }

SamplingDefaults file_sampling_defaults(const std::filesystem::path& dir, const SamplerParams& fallback,
                                        const std::string& fallback_name) {
  const std::filesystem::path path = dir / "generation_config.json";
  SamplingDefaults d{fallback, fallback_name};
  if (!regular_file_exists(path)) return d;
  const ConfigReader c = ConfigReader::load(path);
  apply(c, d.params);  // only the fields the file gives; checks each
  std::string taken;
  names_any_setting(c, &taken);
  if (c.has("do_sample") && !c.get_bool("do_sample", true)) {
    d.params.temperature = 0.0f;
    taken += std::string(taken.empty() ? "" : ", ") + "do_sample";
  }
  if (!taken.empty()) d.source = "generation_config.json (" + taken + ")";
  return d;
}

}  // namespace osprey
