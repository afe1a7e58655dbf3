#pragma once
// The sampling settings a checkpoint asks for in its generation_config.json: the values every
// command and the server give the sampling fields a command or request leaves out
// (file_sampling_defaults, one rule; the model bundle reads them, bundle/model_bundle.h).
#include <filesystem>
#include <string>

#include "sample/sampler.h"

namespace osprey {

// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition
// penalty. The other fields are SamplerParams' own.
SamplerParams llama_cpp_sampling();

struct SamplingDefaults {
  SamplerParams params;  // temperature, top_k, top_p, min_p, repetition_penalty as chosen
  std::string source;    // "generation_config.json (<the fields taken>)", or the fallback's name
};

// OpenAI's sampling defaults: temperature 1, top_p 1, no other cut, no penalty.
SamplerParams openai_sampling();

// What a request or command that omits a sampling field gets (vLLM's rule for the model's
// generation_config.json): each of `temperature`, `top_k`, `top_p`, `min_p`, `typical_p` and
// `repetition_penalty` the file gives replaces the fallback's value, and "do_sample": false
// makes it greedy (temperature 0); every other value is the fallback's. source:
// "generation_config.json (<the fields taken>)", or `fallback_name` when the file (or its
// absence) gives none. A field of the wrong type or out of the sampler's range
// (sample/sampler_fields.h) is InvalidInput naming the file and the field; a malformed file
// likewise.
SamplingDefaults file_sampling_defaults(const std::filesystem::path& dir, const SamplerParams& fallback,
                                        const std::string& fallback_name);

}  // namespace osprey
