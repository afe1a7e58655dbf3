// The Cohere2 family against a plain double-precision forward written from the definition
// (tests/support/family_reference.cpp), on tiny random checkpoints the test writes, with
// prompts longer than the sliding window; and its config errors. CPU and CUDA (skipped
// without a device).
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

nlohmann::json tiny_cohere2_config() {
  return {
      {"model_type", "cohere2"},
      {"vocab_size", 256},
      {"hidden_size", 64},
      {"intermediate_size", 128},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"layer_norm_eps", 1e-5},
      {"logit_scale", 0.25},
      {"sliding_window", 8},
      {"layer_types", {"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}},
      {"rope_theta", 50000.0},
      {"tie_word_embeddings", true},
      {"hidden_act", "silu"},
      {"bos_token_id", 5},
      {"eos_token_id", 2},
  };
}

std::vector<int32_t> prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 255);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

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

class Cohere2 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
      lo_.device = Device::cuda(0);
    }
  }
  Array logits(Model& m, const std::vector<int32_t>& ids, SequenceCache& cache, bool all) {
    return ops::to_device(m.forward(tokens_of(ids), cache, all), Device::cpu());
  }
  LoadOptions lo_;
};

double tolerance(const std::string& device) { return device == "cuda" ? 1e-2 : 3e-3; }

TEST_P(Cohere2, LogitsMatchADoublePrecisionReferencePastTheWindow) {
  TempDir dir;
  const nlohmann::json c = tiny_cohere2_config();
  const RefWeights w = testing::cohere2_weights(c, 41);
  testing::write_checkpoint(dir.path(), c, w);
  auto m = load_model(dir.path(), lo_);
  EXPECT_EQ(m->info().model_type, "cohere2");
  const std::vector<int32_t> ids = prompt(40, 5);
  const auto ref = testing::cohere2_reference(c, w, ids);
  SequenceCache full = m->make_cache({});
  const double e_full = worst_error(logits(*m, ids, full, true), ref);
  EXPECT_LT(e_full, tolerance(GetParam()));
  SequenceCache step = m->make_cache({});
  double e_step = worst_error(logits(*m, {ids.begin(), ids.begin() + 3}, step, true), ref);
  for (size_t t = 3; t < ids.size(); ++t)
    e_step = std::max(e_step, worst_error(logits(*m, {ids[t]}, step, false), ref, int64_t(t)));
  EXPECT_LT(e_step, tolerance(GetParam()));
  RecordProperty("worst_rel_error_full", std::to_string(e_full));
  RecordProperty("worst_rel_error_decode", std::to_string(e_step));
}

TEST_P(Cohere2, SlidingWindowPatternAndRopeParametersForms) {
  const nlohmann::json c = tiny_cohere2_config();
  const RefWeights w = testing::cohere2_weights(c, 42);
  const std::vector<int32_t> ids = prompt(24, 6);
  const auto ref = testing::cohere2_reference(c, w, ids);
  nlohmann::json pattern = c;
  pattern.erase("layer_types");
  pattern["sliding_window_pattern"] = 4;
  nlohmann::json v5 = c;
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  for (const nlohmann::json& form : {pattern, v5}) {
    TempDir dir;
    testing::write_checkpoint(dir.path(), form, w);
    auto m = load_model(dir.path(), lo_);
    SequenceCache cache = m->make_cache({});
    EXPECT_LT(worst_error(logits(*m, ids, cache, true), ref), tolerance(GetParam())) << form.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Cohere2, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

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

TEST(Cohere2Config, ErrorsNameTheField) {
  const nlohmann::json c = tiny_cohere2_config();
  const RefWeights w = testing::cohere2_weights(c, 43);
  nlohmann::json bad = c;
  bad["layer_types"][0] = "linear_attention";
  EXPECT_TRUE(contains(load_error(bad, w), "\"layer_types\": layer 0 is \"linear_attention\""));
  bad = c;
  bad["logit_scale"] = 0;
  EXPECT_TRUE(contains(load_error(bad, w), "\"logit_scale\""));
  bad = c;
  bad["head_dim"] = 32;
  EXPECT_TRUE(contains(load_error(bad, w), "\"head_dim\": Cohere2's head size is hidden_size / num_attention_heads = 16"));
  bad = c;
  bad.erase("layer_types");
  bad["sliding_window_pattern"] = 0;
  EXPECT_TRUE(contains(load_error(bad, w), "\"sliding_window_pattern\": must be at least 1"));
  bad = c;
  bad["sliding_window"] = 0;
  EXPECT_TRUE(contains(load_error(bad, w), "\"sliding_window\": must be positive"));
  bad = c;
  bad["hidden_act"] = "gelu";
  EXPECT_TRUE(contains(load_error(bad, w), "\"hidden_act\": \"gelu\" is not supported"));
}

TEST(Cohere2Config, AnUntiedHeadMustBeInTheCheckpoint) {
  nlohmann::json c = tiny_cohere2_config();
  c["tie_word_embeddings"] = false;
  EXPECT_TRUE(contains(load_error(c, testing::cohere2_weights(c, 44)), "lm_head.weight"));
}

}  // namespace
}  // namespace osprey
