// The sampling defaults every command takes from a checkpoint's generation_config.json, here
// over llama.cpp's (osprey chat's fallback): each field the file gives replaces the default,
// "do_sample": false makes it greedy (vLLM's rule).
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/generation_config.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::TempDir;

struct Expected {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float repetition_penalty;
  std::string source;
};

void expect_defaults(const std::string& file, const Expected& want) {
  SCOPED_TRACE(file);
  TempDir d;
  if (!file.empty()) testing::write_file(d / "generation_config.json", file);
  const SamplingDefaults got = file_sampling_defaults(d.path(), llama_cpp_sampling(), "llama.cpp defaults");
  EXPECT_FLOAT_EQ(got.params.temperature, want.temperature);
  EXPECT_EQ(got.params.top_k, want.top_k);
  EXPECT_FLOAT_EQ(got.params.top_p, want.top_p);
  EXPECT_FLOAT_EQ(got.params.min_p, want.min_p);
  EXPECT_FLOAT_EQ(got.params.repetition_penalty, want.repetition_penalty);
  EXPECT_EQ(got.source, want.source);
}

}  // namespace

// llama.cpp's documented defaults (common/common.h: temp 0.80, top_k 40, top_p 0.95,
// min_p 0.05, penalty_repeat 1.00).
TEST(GenerationConfig, WithoutSamplingFieldsTheDefaultsAreLlamaCpps) {
  const Expected llama{0.8f, 40, 0.95f, 0.05f, 1.0f, "llama.cpp defaults"};
  expect_defaults("", llama);  // no file
  expect_defaults(R"({"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.51.0"})", llama);
  expect_defaults(R"({"eos_token_id": 2, "min_p": null})", llama);  // null is absent
}

// The file's values over llama.cpp's; "do_sample": true alone changes nothing.
TEST(GenerationConfig, TheFilesValuesReplaceTheDefaults) {
  expect_defaults(R"({"do_sample": true})", {0.8f, 40, 0.95f, 0.05f, 1.0f, "llama.cpp defaults"});
  // Llama 3.1 Instruct's file.
  expect_defaults(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "bos_token_id": 128000})",
                  {0.6f, 40, 0.9f, 0.05f, 1.0f, "generation_config.json (temperature, top_p)"});
  // Qwen2.5 Instruct's file.
  expect_defaults(R"({"do_sample": true, "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20})",
                  {0.7f, 20, 0.8f, 0.05f, 1.05f, "generation_config.json (temperature, top_k, top_p, repetition_penalty)"});
  expect_defaults(R"({"do_sample": true, "min_p": 0.1, "top_k": 0})",
                  {0.8f, 0, 0.95f, 0.1f, 1.0f, "generation_config.json (top_k, min_p)"});
}

TEST(GenerationConfig, GreedyOnlyWhenTheFileSaysSo) {
  // do_sample false: greedy, whatever temperature the file also names; its penalty applies.
  expect_defaults(R"({"do_sample": false, "temperature": 0.7, "repetition_penalty": 1.2})",
                  {0.0f, 40, 0.95f, 0.05f, 1.2f, "generation_config.json (temperature, repetition_penalty, do_sample)"});
  // Temperature 0 is greedy too.
  expect_defaults(R"({"temperature": 0})", {0.0f, 40, 0.95f, 0.05f, 1.0f, "generation_config.json (temperature)"});
  // No do_sample but a temperature: the checkpoint means to sample at it.
  expect_defaults(R"({"temperature": 0.5, "top_k": 10})",
                  {0.5f, 10, 0.95f, 0.05f, 1.0f, "generation_config.json (temperature, top_k)"});
}

TEST(GenerationConfig, BadFieldsAreErrorsNamingTheFileAndTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"do_sample": "yes"})", "do_sample"},
      {R"({"temperature": -1})", "temperature"},
      {R"({"temperature": "hot"})", "temperature"},
      {R"({"top_k": -5})", "top_k"},
      {R"({"top_k": 1.5})", "top_k"},
      {R"({"top_p": 0})", "top_p"},
      {R"({"top_p": 1.5})", "top_p"},
      {R"({"min_p": 1})", "min_p"},
      {R"({"repetition_penalty": 0})", "repetition_penalty"},
      {R"({"do_sample": false, "top_p": 7})", "top_p"},  // checked although greedy ignores it
      {R"({"do_sample": true,)", "malformed JSON"},
      {R"([1, 2])", "expected a JSON object"},
  };
  for (const auto& [file, field] : cases) {
    SCOPED_TRACE(file);
    TempDir d;
    testing::write_file(d / "generation_config.json", file);
    try {
      file_sampling_defaults(d.path(), llama_cpp_sampling(), "llama.cpp defaults");
      ADD_FAILURE() << "no error";
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("generation_config.json"), std::string::npos) << what;
      EXPECT_NE(what.find(field), std::string::npos) << what;
    }
  }
}

}  // namespace osprey

namespace osprey {

// generate's and the server's defaults: only the fields the file gives replace the fallback
// (vLLM's rule), do_sample false makes it greedy; the source names the fields taken.
TEST(GenerationConfig, FileDefaultsTakeOnlyTheFieldsTheFileGives) {
  SamplerParams fallback = openai_sampling();
  fallback.top_k = 7;
  {
    testing::TempDir d;
    const SamplingDefaults got = file_sampling_defaults(d.path(), fallback, "fallback");
    EXPECT_EQ(got.source, "fallback");
    EXPECT_FLOAT_EQ(got.params.temperature, 1.0f);
    EXPECT_EQ(got.params.top_k, 7);
  }
  {
    testing::TempDir d;
    testing::write_file(d / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": 2})");
    EXPECT_EQ(file_sampling_defaults(d.path(), fallback, "fallback").source, "fallback");
  }
  {
    testing::TempDir d;
    testing::write_file(d / "generation_config.json",
                        R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "typical_p": 0.8})");
    const SamplingDefaults got = file_sampling_defaults(d.path(), fallback, "fallback");
    EXPECT_EQ(got.source, "generation_config.json (temperature, top_p, typical_p)");
    EXPECT_FLOAT_EQ(got.params.temperature, 0.6f);
    EXPECT_FLOAT_EQ(got.params.top_p, 0.9f);
    EXPECT_FLOAT_EQ(got.params.typical_p, 0.8f);
    EXPECT_EQ(got.params.top_k, 7) << "no top_k in the file: the fallback's, not transformers' 50";
    EXPECT_FLOAT_EQ(got.params.min_p, 0.0f);
  }
  {
    testing::TempDir d;
    testing::write_file(d / "generation_config.json", R"({"do_sample": false, "repetition_penalty": 1.1})");
    const SamplingDefaults got = file_sampling_defaults(d.path(), fallback, "fallback");
    EXPECT_EQ(got.source, "generation_config.json (repetition_penalty, do_sample)");
    EXPECT_FLOAT_EQ(got.params.temperature, 0.0f);
    EXPECT_FLOAT_EQ(got.params.repetition_penalty, 1.1f);
  }
  {
    testing::TempDir d;
    testing::write_file(d / "generation_config.json", R"({"top_p": 1.5})");
    EXPECT_THROW(file_sampling_defaults(d.path(), fallback, "fallback"), InvalidInput);
  }
}

}  // namespace osprey
