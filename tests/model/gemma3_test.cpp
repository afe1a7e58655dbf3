// The Gemma 3 family (model_type gemma3_text, and gemma3's language model) against a plain
// double-precision forward written from the definition (tests/support/family_reference.cpp),
// on tiny random checkpoints the test writes: prompts longer than the sliding window, both
// weight layouts of the conditional-generation checkpoint, activations past float16's range,
// and the config errors. CPU and CUDA (skipped without a device).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "support/family_reference.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::RefWeights;
using testing::TempDir;
using testing::tokens_of;

nlohmann::json tiny_gemma3_config(int64_t head_dim = 64) {
  return {
      {"model_type", "gemma3_text"},
      {"vocab_size", 256},
      {"hidden_size", 64},
      {"intermediate_size", 96},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", head_dim},
      {"rms_norm_eps", 1e-6},
      {"query_pre_attn_scalar", 48},
      {"sliding_window", 8},
      {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
      {"rope_theta", 1e6},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
      {"rope_local_base_freq", 1e4},
      {"final_logit_softcapping", 30.0},
      {"tie_word_embeddings", true},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"bos_token_id", 2},
      {"eos_token_id", 1},
  };
}

std::vector<int32_t> prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 255);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

// max over positions of max |ours - ref| / range(ref).
double worst_error(const Array& ours, const std::vector<std::vector<double>>& ref, int64_t row0 = 0) {
  const int64_t vocab = ours.dim(1);
  double worst = 0;
  for (int64_t t = 0; t < ours.dim(0); ++t) {
    const std::vector<double>& r = ref[size_t(row0 + t)];
    double lo = r[0], hi = r[0], err = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      lo = std::min(lo, r[size_t(j)]);
      hi = std::max(hi, r[size_t(j)]);
      const double o = ours.data<float>()[t * vocab + j];
      err = std::isfinite(o) ? std::max(err, std::fabs(o - r[size_t(j)])) : INFINITY;
    }
    worst = std::max(worst, err / (hi - lo));
  }
  return worst;
}

class Gemma3 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
      lo_.device = Device::cuda(0);
    }
  }
  std::unique_ptr<Model> load(const std::filesystem::path& dir) { return load_model(dir, lo_); }
  Array logits(Model& m, const std::vector<int32_t>& ids, SequenceCache& cache, bool all) {
    return ops::to_device(m.forward(tokens_of(ids), cache, all), Device::cpu());
  }
  // Full forward over `ids`, then the same prompt again one token at a time after a short
  // prefill: both against the reference at every position.
  void expect_matches(Model& m, const std::vector<int32_t>& ids, const std::vector<std::vector<double>>& ref,
                      double tol) {
    SequenceCache full = m.make_cache({});
    const double e_full = worst_error(logits(m, ids, full, true), ref);
    EXPECT_LT(e_full, tol) << "full forward over " << ids.size() << " tokens";
    SequenceCache step = m.make_cache({});
    double e_step = worst_error(logits(m, {ids.begin(), ids.begin() + 3}, step, true), ref);
    for (size_t t = 3; t < ids.size(); ++t)
      e_step = std::max(e_step, worst_error(logits(m, {ids[t]}, step, false), ref, int64_t(t)));
    EXPECT_LT(e_step, tol) << "token-by-token decode";
    RecordProperty("worst_rel_error_full", std::to_string(e_full));
    RecordProperty("worst_rel_error_decode", std::to_string(e_step));
  }
  LoadOptions lo_;
};

// The engine keeps K/V rows in 16 bits and, on CUDA, rounds prefill GEMM inputs to the weights'
// bf16: an fp16-class tolerance (the reference keeps everything in double).
double tolerance(const std::string& device) { return device == "cuda" ? 1e-2 : 3e-3; }

TEST_P(Gemma3, LogitsMatchADoublePrecisionReferencePastTheWindow) {
  TempDir dir;
  const nlohmann::json c = tiny_gemma3_config();
  const RefWeights w = testing::gemma3_weights(c, 31);
  testing::write_checkpoint(dir.path(), c, w);
  auto m = load(dir.path());
  EXPECT_EQ(m->info().model_type, "gemma3_text");
  const std::vector<int32_t> ids = prompt(40, 5);  // five times the window
  expect_matches(*m, ids, testing::gemma3_reference(c, w, ids), tolerance(GetParam()));
}

TEST_P(Gemma3, HeadDim256) {
  TempDir dir;
  nlohmann::json c = tiny_gemma3_config(256);
  c["num_hidden_layers"] = 2;
  c["layer_types"] = {"sliding_attention", "full_attention"};
  c["query_pre_attn_scalar"] = 256;
  const RefWeights w = testing::gemma3_weights(c, 32);
  testing::write_checkpoint(dir.path(), c, w);
  auto m = load(dir.path());
  const std::vector<int32_t> ids = prompt(24, 6);
  expect_matches(*m, ids, testing::gemma3_reference(c, w, ids), tolerance(GetParam()));
}

TEST_P(Gemma3, OlderConfigFormsGiveTheSameModel) {
  // sliding_window_pattern instead of layer_types; transformers 5's rope_parameters by layer
  // type instead of rope_theta / rope_scaling / rope_local_base_freq.
  nlohmann::json c = tiny_gemma3_config();
  c["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"};
  const RefWeights w = testing::gemma3_weights(c, 33);
  const std::vector<int32_t> ids = prompt(20, 7);
  const auto ref = testing::gemma3_reference(c, w, ids);
  nlohmann::json pattern = c;
  pattern.erase("layer_types");
  pattern["sliding_window_pattern"] = 3;
  nlohmann::json v5 = c;
  for (const char* k : {"rope_theta", "rope_scaling", "rope_local_base_freq"}) v5.erase(k);
  v5["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  for (const nlohmann::json& form : {pattern, v5}) {
    TempDir dir;
    testing::write_checkpoint(dir.path(), form, w);
    auto m = load(dir.path());
    SequenceCache cache = m->make_cache({});
    EXPECT_LT(worst_error(logits(*m, ids, cache, true), ref), tolerance(GetParam())) << form.dump();
  }
}

TEST_P(Gemma3, ConditionalGenerationCheckpointsLoadTheLanguageModelInEitherLayout) {
  const nlohmann::json text = tiny_gemma3_config();
  const std::vector<int32_t> ids = prompt(20, 8);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    RefWeights w = testing::gemma3_weights(text, 34, {}, prefix);
    const auto ref = testing::gemma3_reference(text, w, ids, prefix);
    // A vision tower and projector, which the engine must skip.
    const std::string outer = prefix == "model.language_model." ? "model." : "";
    std::mt19937 rng(1);
    testing::add_random(w, rng, outer + "vision_tower.vision_model.embeddings.patch_embedding.weight", {8, 3, 2, 2}, 0.1);
    testing::add_random(w, rng, outer + "multi_modal_projector.mm_input_projection_weight", {8, 64}, 0.1);
    nlohmann::json c = {{"model_type", "gemma3"}, {"text_config", text}, {"eos_token_id", {1, 106}}};
    c["text_config"].erase("model_type");
    TempDir dir;
    testing::write_checkpoint(dir.path(), c, w);
    auto m = load(dir.path());
    EXPECT_EQ(m->info().model_type, "gemma3");
    EXPECT_EQ(m->info().n_layers, 4);
    EXPECT_EQ(m->info().eos_ids, (std::vector<int32_t>{1, 106})) << prefix;
    SequenceCache cache = m->make_cache({});
    EXPECT_LT(worst_error(logits(*m, ids, cache, true), ref), tolerance(GetParam())) << prefix;
  }
}

TEST_P(Gemma3, ActivationsPastFloat16RangeStayExact) {
  // Embeddings of std 1e4 (times sqrt(64) = 8), post-norms of about 3e4 (so that every layer
  // moves the residual stream as much as the embedding does) and pre-feedforward norms of
  // about 100 put the residual stream and the GeGLU product feeding down_proj far past
  // 65504: any rounding of them to float16 (a GEMM input, a cache row) gives inf and fails
  // the comparison.
  nlohmann::json c = tiny_gemma3_config();
  c["tie_word_embeddings"] = false;  // a head of ordinary scale keeps the logits clear of the cap
  testing::Gemma3Scales scales;
  scales.embed_std = 1e4;
  scales.pre_ffn_norm = 100.0;
  scales.post_norm = 3e4;
  const RefWeights w = testing::gemma3_weights(c, 35, scales);
  TempDir dir;
  testing::write_checkpoint(dir.path(), c, w);
  const std::vector<int32_t> ids = prompt(24, 9);
  testing::RefStats stats;
  const auto ref = testing::gemma3_reference(c, w, ids, "model.", &stats);
  ASSERT_GT(stats.max_abs_residual, 65504.0 * 4);
  ASSERT_GT(stats.max_abs_down_proj_input, 65504.0);
  RecordProperty("max_abs_residual", std::to_string(stats.max_abs_residual));
  RecordProperty("max_abs_down_proj_input", std::to_string(stats.max_abs_down_proj_input));
  auto m = load(dir.path());
  expect_matches(*m, ids, ref, tolerance(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Devices, Gemma3, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Config errors name the field.
::testing::AssertionResult contains(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\" does not contain \"" << part << "\"";
}

std::string load_error(const nlohmann::json& config, const RefWeights& w) {
  TempDir dir;
  testing::write_checkpoint(dir.path(), config, w);
  try {
    load_model(dir.path());
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Gemma3Config, ErrorsNameTheField) {
  const nlohmann::json c = tiny_gemma3_config();
  const RefWeights w = testing::gemma3_weights(c, 36);
  const std::string e = load_error({{"model_type", "gemma3"}}, w);
  EXPECT_TRUE(contains(e, "\"text_config\": missing"));
  nlohmann::json bad = c;
  bad["layer_types"][1] = "chunked_attention";
  EXPECT_TRUE(contains(load_error(bad, w), "\"layer_types\": layer 1 is \"chunked_attention\""));
  bad = c;
  bad["layer_types"] = {"sliding_attention"};
  EXPECT_TRUE(contains(load_error(bad, w), "has 1 entries, but num_hidden_layers is 4"));
  for (const nlohmann::json& v : {nlohmann::json(0), nlohmann::json(-48), nlohmann::json("48")}) {
    bad = c;
    bad["query_pre_attn_scalar"] = v;
    EXPECT_TRUE(contains(load_error(bad, w), "\"query_pre_attn_scalar\"")) << v.dump();
  }
  bad = c;
  bad["final_logit_softcapping"] = 0;
  EXPECT_TRUE(contains(load_error(bad, w), "\"final_logit_softcapping\": must be positive or null"));
  bad = c;
  bad["hidden_activation"] = "gelu";
  EXPECT_TRUE(contains(load_error(bad, w), "\"hidden_activation\": \"gelu\" is not supported"));
  bad = c;
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  EXPECT_TRUE(contains(load_error(bad, w), "rope type \"yarn\" is not supported"));
}

TEST(Gemma3Config, UnusedTensorsAreRefused) {
  const nlohmann::json c = tiny_gemma3_config();
  RefWeights w = testing::gemma3_weights(c, 37);
  std::mt19937 rng(2);
  testing::add_random(w, rng, "model.layers.0.self_attn.q_proj.bias", {256}, 0.1);
  EXPECT_TRUE(contains(load_error(c, w),
                       "1 tensor that a gemma3_text model does not use: model.layers.0.self_attn.q_proj.bias"));
  // In a gemma3_text checkpoint a vision tower is not expected either.
  w = testing::gemma3_weights(c, 37);
  testing::add_random(w, rng, "vision_tower.x.weight", {4}, 0.1);
  EXPECT_TRUE(contains(load_error(c, w), "vision_tower.x.weight"));
}

TEST(Gemma3Config, ConditionalCheckpointWithoutALanguageModel) {
  const nlohmann::json text = tiny_gemma3_config();
  const RefWeights w = testing::gemma3_weights(text, 38);  // "model." names: neither layout
  EXPECT_TRUE(contains(load_error({{"model_type", "gemma3"}, {"text_config", text}}, w),
                       "neither language_model.model.embed_tokens.weight"));
}

}  // namespace
}  // namespace osprey
