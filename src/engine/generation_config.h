#pragma once
// The sampling settings a checkpoint asks for in its generation_config.json, for front ends
// that sample by default (osprey chat). generate and the server do not read them.
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

}  // namespace osprey
