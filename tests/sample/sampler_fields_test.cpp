// The sampler's settings read the same from every source: a request (OpenAI's and llama.cpp's
// field names), generation_config.json (transformers' names) and the CLI's flags (llama.cpp's
// names). The names and ranges below are written from those projects' documentation, not
// from the table under test (sample/sampler_fields.h): OpenAI documents temperature in
// [0, 2], top_p in [0, 1] and both penalties in [-2, 2]; transformers' GenerationConfig reads
// temperature, top_k, top_p, min_p, typical_p and repetition_penalty; llama.cpp's flags are
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty and
// --frequency-penalty.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generation_config.h"
#include "server/api_error.h"
#include "server/completion_request.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using namespace testing;

struct Setting {
  std::string key;                                 // the request's name
  bool in_generation_config;                       // transformers reads it from the file
  std::function<double(const SamplerParams&)> of;  // where the value lands
  double good;                                     // in range
  std::vector<double> bad;                         // out of range
  json value(double v) const {                     // as a client writes it: whole numbers as integers
    return key == "top_k" || key == "repeat_last_n" ? json(int64_t(v)) : json(v);
  }
};

std::vector<Setting> settings() {
  return {
      {"temperature", true, [](const SamplerParams& p) { return p.temperature; }, 0.7, {-0.1}},
      {"top_k", true, [](const SamplerParams& p) { return p.top_k; }, 17, {-1}},
      {"top_p", true, [](const SamplerParams& p) { return p.top_p; }, 0.5, {0.0, 1.5}},
      {"min_p", true, [](const SamplerParams& p) { return p.min_p; }, 0.25, {-0.5, 1.0}},
      {"typical_p", true, [](const SamplerParams& p) { return p.typical_p; }, 0.75, {0.0, 1.25}},
      {"repetition_penalty", true, [](const SamplerParams& p) { return p.repetition_penalty; }, 1.25, {0.0, -1.0}},
      {"repeat_last_n", false, [](const SamplerParams& p) { return p.repeat_last_n; }, 32, {-2}},
      {"presence_penalty", false, [](const SamplerParams& p) { return p.presence_penalty; }, 0.5, {-2.5, 2.5}},
      {"frequency_penalty", false, [](const SamplerParams& p) { return p.frequency_penalty; }, -0.5, {-2.5, 2.5}},
  };
}

TEST(SamplerFields, EveryRequestFieldLandsInItsSettingAndOutOfRangeIsA400NamingIt) {
  for (const Setting& s : settings()) {
    SCOPED_TRACE(s.key);
    const CompletionRequest r = read_completion_fields({{"prompt", "x"}, {s.key, s.value(s.good)}}, false, SamplerParams{});
    EXPECT_FLOAT_EQ(float(s.of(r.params.sampler)), float(s.good));
    for (double v : s.bad) {
      try {
        read_completion_fields({{"prompt", "x"}, {s.key, s.value(v)}}, false, SamplerParams{});
        ADD_FAILURE() << s.key << " = " << v << " was accepted";
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, s.key) << e.message;
      }
    }
  }
  // OpenAI's documented ceiling on a request's temperature.
  EXPECT_THROW(read_completion_fields({{"prompt", "x"}, {"temperature", 2.5}}, false, SamplerParams{}), ApiError);
  EXPECT_NO_THROW(read_completion_fields({{"prompt", "x"}, {"temperature", 2.0}}, false, SamplerParams{}));
  // llama.cpp's name of the repetition penalty, alone or agreeing with vLLM's.
  EXPECT_FLOAT_EQ(read_completion_fields({{"prompt", "x"}, {"repeat_penalty", 1.5}}, false, SamplerParams{})
                      .params.sampler.repetition_penalty,
                  1.5f);
  EXPECT_THROW(read_completion_fields({{"prompt", "x"}, {"repeat_penalty", 1.5}, {"repetition_penalty", 1.2}}, false,
                                      SamplerParams{}),
               ApiError);
}

TEST(SamplerFields, AFieldLeftOutTakesTheGivenDefaults) {
  const SamplerParams d{
      .temperature = 0.3f, .top_k = 9, .top_p = 0.8f, .min_p = 0.1f, .typical_p = 0.9f, .repetition_penalty = 1.1f, .logit_bias = {}};
  const SamplerParams got = read_completion_fields({{"prompt", "x"}}, false, d).params.sampler;
  EXPECT_FLOAT_EQ(got.temperature, 0.3f);
  EXPECT_EQ(got.top_k, 9);
  EXPECT_FLOAT_EQ(got.top_p, 0.8f);
  EXPECT_FLOAT_EQ(got.min_p, 0.1f);
  EXPECT_FLOAT_EQ(got.typical_p, 0.9f);
  EXPECT_FLOAT_EQ(got.repetition_penalty, 1.1f);
  EXPECT_EQ(got.repeat_last_n, 64);  // llama.cpp's default window
  EXPECT_FLOAT_EQ(got.presence_penalty, 0.0f);
}

TEST(SamplerFields, GenerationConfigGivesTransformersFieldsAndNamesABadOne) {
  for (const Setting& s : settings()) {
    SCOPED_TRACE(s.key);
    TempDir d;
    write_file(d.path() / "generation_config.json", json{{s.key, s.value(s.good)}}.dump());
    const SamplingDefaults got = file_sampling_defaults(d.path(), SamplerParams{}, "fallback");
    if (!s.in_generation_config) {
      // Not a transformers setting: the file's value is not taken.
      EXPECT_FLOAT_EQ(float(s.of(got.params)), float(s.of(SamplerParams{})));
      EXPECT_EQ(got.source, "fallback");
      continue;
    }
    EXPECT_FLOAT_EQ(float(s.of(got.params)), float(s.good));
    EXPECT_NE(got.source.find(s.key), std::string::npos) << got.source;
    for (double v : s.bad) {
      write_file(d.path() / "generation_config.json", json{{s.key, s.value(v)}}.dump());
      try {
        file_sampling_defaults(d.path(), SamplerParams{}, "fallback");
        ADD_FAILURE() << s.key << " = " << v << " was accepted";
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(s.key), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(SamplerFields, TheCliTakesLlamaCppsPenaltyFlags) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const std::string gen = "generate -m " + d.path().string() + " --token-ids 1,2,3 -n 2 --temp 0.8 ";
  for (const char* flag : {"--presence-penalty", "--frequency-penalty"}) {
    SCOPED_TRACE(flag);
    const CommandResult ok = run_osprey(gen + flag + " 0.5");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    const CommandResult bad = run_osprey(gen + flag + " 2.5");
    EXPECT_EQ(bad.exit_code, 2) << bad.err;
    EXPECT_NE(bad.err.find(flag), std::string::npos) << bad.err;
  }
}

}  // namespace
}  // namespace osprey
