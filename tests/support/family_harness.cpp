#include "support/family_harness.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/ops.h"
#include "core/error.h"
#include "support/test_util.h"

namespace osprey::testing {

nlohmann::json tiny_gemma3_config(int64_t head_dim) {
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

std::unique_ptr<Model> load_on(const std::filesystem::path& dir, const Device& device) {
  LoadOptions lo;
  lo.device = device;
  return load_model(dir, lo);
}

Array host_logits(Model& m, const std::vector<int32_t>& ids, SequenceCache& cache, bool all) {
  return ops::to_device(m.forward(tokens_of(ids), cache, all), Device::cpu());
}

DType kv_rows(Model& m) {
  SequenceCache c = m.make_cache({});
  m.forward(tokens_of({3}), c, false);
  return c.snapshot()[0].keys.dtype();
}

std::vector<int32_t> random_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 255);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

double worst_error(const Array& ours, const std::vector<std::vector<double>>& ref, int64_t row0) {
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

FullAndStepErrors full_and_step_errors(Model& m, const std::vector<int32_t>& ids,
                                       const std::vector<std::vector<double>>& ref) {
  FullAndStepErrors e;
  SequenceCache full = m.make_cache({});
  e.full = worst_error(host_logits(m, ids, full, true), ref);
  SequenceCache step = m.make_cache({});
  e.step = worst_error(host_logits(m, {ids.begin(), ids.begin() + 3}, step, true), ref);
  for (size_t t = 3; t < ids.size(); ++t)
    e.step = std::max(e.step, worst_error(host_logits(m, {ids[t]}, step, false), ref, int64_t(t)));
  return e;
}

std::string load_error(const nlohmann::json& config, const RefWeights& w) {
  TempDir dir;
  write_checkpoint(dir.path(), config, w);
  return error_of([&] { load_model(dir.path()); }, "(loaded)");
}

std::string load_error_with(nlohmann::json config, const std::string& field, const nlohmann::json& value,
                            const RefWeights& w) {
  config[field] = value;
  return load_error(config, w);
}

::testing::AssertionResult contains(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\" does not contain \"" << part << "\"";
}

std::filesystem::path fixture_dir(const std::string& name) { return source_dir() / "tests/fixtures/models" / name; }

}  // namespace osprey::testing
