#pragma once
// The sampler's settings, one row each: the name a request and generation_config.json give
// it, its command-line flag, the range the sampler accepts, and where it lives in
// SamplerParams. The CLI's flags (cli/flags.cpp), the request reader
// (server/completion_request.cpp) and generation_config.json's reader
// (engine/generation_config.cpp) all read this table, so a setting is named, ranged and
// defaulted once.
#include <span>
#include <string>
#include <string_view>

#include "sample/sampler.h"

namespace osprey {

struct SamplerField {
  const char* key;    // "top_p": the request's and generation_config.json's name
  const char* alias;  // another request name of the same setting ("repeat_penalty"), or nullptr
  const char* flag;   // "--top-p"
  const char* help;   // the flag's help
  bool integer;       // a whole number (top_k, repeat_last_n)
  double lo, hi;      // the range; an open end excludes its bound
  bool lo_open, hi_open;
  // The highest value a request may give where its API documents a lower one than the
  // sampler's (OpenAI's temperature: 2); 0: `hi`.
  double request_hi;
  bool from_config;   // generation_config.json may set it (the model's defaults)
  float SamplerParams::*real;  // where a real setting lives, or nullptr
  int SamplerParams::*whole;   // where an integer one lives, or nullptr

  double get(const SamplerParams& p) const { return real ? double(p.*real) : double(p.*whole); }
  void set(SamplerParams& p, double v) const {
    if (real)
      p.*real = float(v);
    else
      p.*whole = int(v);
  }
  // Whether `v` is finite and in the range (integers: also whole).
  bool accepts(double v) const;
  // The range as an interval: "(0, 1]", "[0, inf)", "[0, 2147483647]".
  std::string range_text() const;
};

// Every setting, in the chain's order (docs/server.md): temperature, top_k, top_p, min_p,
// typical_p, repetition_penalty, repeat_last_n, presence_penalty, frequency_penalty. The seed
// and the logit bias are not here: their readers differ by source (a random seed by default,
// a map of ids).
std::span<const SamplerField> sampler_fields();

}  // namespace osprey
