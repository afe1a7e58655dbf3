#pragma once
// The sampling settings a checkpoint asks for in its generation_config.json: osprey chat's
// defaults (read_sampling_defaults), and the values generate and the server give the sampling
// fields a command or request leaves out (file_sampling_defaults).
#include <filesystem>
#include <string>

#include "sample/sampler.h"

namespace osprey {

// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition
// penalty. The other fields are SamplerParams' own.
SamplerParams llama_cpp_sampling();

struct SamplingDefaults {
  SamplerParams params;  // temperature, top_k, top_p, min_p, repetition_penalty as chosen
  std::string source;    // "generation_config.json", or "llama.cpp defaults" when it names none
};

// Reads <dir>/generation_config.json's `do_sample`, `temperature`, `top_k`, `top_p`, `min_p` and
// `repetition_penalty` (transformers' names):
// - "do_sample": true: the file's values, transformers' GenerationConfig defaults for the
//   ones it leaves out (temperature 1.0, top-k 50, top-p 1.0, no min-p, no penalty);
// - "do_sample": false, or "temperature": 0: greedy, as the file says (its
//   repetition_penalty still applies);
// - no do_sample: the values the file gives over llama.cpp's defaults (a file that names a
//   temperature means to sample with it, although transformers would decode greedily);
// - no file, or none of these fields: llama.cpp's defaults.
// Never greedy unless the file says so. A field of the wrong type or out of the sampler's
// range is InvalidInput naming the file and the field; a malformed file likewise.
SamplingDefaults read_sampling_defaults(const std::filesystem::path& dir);

// OpenAI's sampling defaults: temperature 1, top_p 1, no other cut, no penalty.
SamplerParams openai_sampling();

// What a request or command that omits a sampling field gets (vLLM's rule for the model's
// generation_config.json): each of `temperature`, `top_k`, `top_p`, `min_p`, `typical_p` and
// `repetition_penalty` the file gives replaces the fallback's value, and "do_sample": false
// makes it greedy (temperature 0); every other value is the fallback's. source:
// "generation_config.json (<the fields taken>)", or `fallback_name` when the file (or its
// absence) gives none. Errors as read_sampling_defaults'.
SamplingDefaults file_sampling_defaults(const std::filesystem::path& dir, const SamplerParams& fallback,
                                        const std::string& fallback_name);

}  // namespace osprey
