#include "engine/generation_config.h"

#include <cmath>
#include <cstdint>

#include "core/file_read.h"
#include "model/config_reader.h"

namespace osprey {
namespace {

constexpr const char* kSamplingFields[] = {"temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty"};

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

// transformers' GenerationConfig defaults for a sampling checkpoint.
SamplerParams transformers_sampling() { return sampling_preset(1.0f, 50, 1.0f, 0.0f); }

// A real number field in the sampler's range; `ok` says whether `v` is in it.
float real_field(const ConfigReader& c, const char* key, bool (*ok)(double), const char* range) {
  const double v = c.get_float(key);
  if (!std::isfinite(v) || !ok(v)) c.fail(key, "expected a number in " + std::string(range) + ", got " + c.json()[key].dump());
  return float(v);
}

// The file's values over `p`.
void apply(const ConfigReader& c, SamplerParams& p) {
  if (c.has("temperature"))
    p.temperature = real_field(c, "temperature", [](double v) { return v >= 0; }, "[0, inf)");
  if (c.has("top_k")) {
    const int64_t k = c.get_int("top_k");
    if (k < 0 || k > INT32_MAX) c.fail("top_k", "expected an integer in [0, 2^31 - 1], got " + std::to_string(k));
    p.top_k = int(k);
  }
  if (c.has("top_p")) p.top_p = real_field(c, "top_p", [](double v) { return v > 0 && v <= 1; }, "(0, 1]");
  if (c.has("min_p")) p.min_p = real_field(c, "min_p", [](double v) { return v >= 0 && v < 1; }, "[0, 1)");
  if (c.has("typical_p"))
    p.typical_p = real_field(c, "typical_p", [](double v) { return v > 0 && v <= 1; }, "(0, 1]");
  if (c.has("repetition_penalty"))
    p.repetition_penalty = real_field(c, "repetition_penalty", [](double v) { return v > 0; }, "(0, inf)");
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
  for (const char* f : kSamplingFields)
    if (c.has(f)) taken += std::string(taken.empty() ? "" : ", ") + f;
  if (c.has("do_sample") && !c.get_bool("do_sample", true)) {
    d.params.temperature = 0.0f;
    taken += std::string(taken.empty() ? "" : ", ") + "do_sample";
  }
  if (!taken.empty()) d.source = "generation_config.json (" + taken + ")";
  return d;
}

SamplingDefaults read_sampling_defaults(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "generation_config.json";
  SamplingDefaults d{llama_cpp_sampling(), "llama.cpp defaults"};
  if (!regular_file_exists(path)) return d;
  const ConfigReader c = ConfigReader::load(path);
  bool names_any = c.has("do_sample");
  for (const char* f : kSamplingFields) names_any |= c.has(f);
  if (!names_any) return d;
  d.source = "generation_config.json";
  const bool do_sample_given = c.has("do_sample");
  const bool do_sample = c.get_bool("do_sample", false);
  if (do_sample_given && !do_sample) {
    // The checkpoint asks for greedy decoding; only its penalty still applies.
    d.params = SamplerParams{};
    d.params.temperature = 0.0f;
    SamplerParams read = d.params;
    apply(c, read);  // checks every field, also the ones greedy decoding ignores
    d.params.repetition_penalty = read.repetition_penalty;
    return d;
  }
  if (do_sample) d.params = transformers_sampling();
  apply(c, d.params);
  return d;
}

}  // namespace osprey
