// What is particular to the Gemma 3 family (model_type gemma3_text, and gemma3's language
// model), against a plain double-precision forward written from the definition
// (tests/support/family_reference.cpp) on tiny random checkpoints the test writes, on every
// device: both weight layouts of the conditional-generation checkpoint, activations past
// float16's range; and the config errors. What every family shares is in family_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "support/device_test.h"
#include "support/family_harness.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::contains;
using testing::load_error;
using testing::random_prompt;
using testing::RefWeights;
using testing::TempDir;
using testing::tiny_gemma3_config;
using testing::worst_error;

class Gemma3 : public testing::DeviceTest {
 protected:
  std::unique_ptr<Model> load(const std::filesystem::path& dir) const { return testing::load_on(dir, device()); }
  // The reference rounds K/V rows as the engine stores them; what remains is f32 arithmetic
  // and, on CUDA, prefill GEMM inputs rounded to the weights' bf16: fp16-class there.
  double tolerance() const { return on_cuda() ? 1e-2 : 3e-3; }
};

TEST_P(Gemma3, ConditionalGenerationCheckpointsLoadTheLanguageModelInEitherLayout) {
  const nlohmann::json text = tiny_gemma3_config();
  const std::vector<int32_t> ids = random_prompt(20, 8);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    RefWeights w = testing::gemma3_weights(text, 34, {}, prefix);
    const auto ref = testing::gemma3_reference(text, w, ids, prefix, nullptr, DType::bf16);
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
    EXPECT_LT(worst_error(testing::host_logits(*m, ids, cache, true), ref), tolerance()) << prefix;
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
  const std::vector<int32_t> ids = random_prompt(24, 9);
  testing::RefStats stats;
  const auto ref = testing::gemma3_reference(c, w, ids, "model.", &stats, DType::bf16);
  ASSERT_GT(stats.max_abs_residual, 65504.0 * 4);
  ASSERT_GT(stats.max_abs_down_proj_input, 65504.0);
  RecordProperty("max_abs_residual", std::to_string(stats.max_abs_residual));
  RecordProperty("max_abs_down_proj_input", std::to_string(stats.max_abs_down_proj_input));
  auto m = load(dir.path());
  ASSERT_EQ(testing::kv_rows(*m), DType::bf16);  // nothing of a bf16 checkpoint is kept in float16
  const testing::FullAndStepErrors e = testing::full_and_step_errors(*m, ids, ref);
  EXPECT_LT(e.full, tolerance()) << "full forward";
  EXPECT_LT(e.step, tolerance()) << "token-by-token decode";
}

INSTANTIATE_TEST_SUITE_P(Devices, Gemma3, OSPREY_DEVICES);

// Config errors name the field.
TEST(Gemma3Config, ErrorsNameTheField) {
  const nlohmann::json c = tiny_gemma3_config();
  const RefWeights w = testing::gemma3_weights(c, 36);
  const std::string e = load_error({{"model_type", "gemma3"}}, w);
  EXPECT_TRUE(contains(e, "\"text_config\": missing"));
  auto with = [&](const char* field, const nlohmann::json& value) { return testing::load_error_with(c, field, value, w); };
  nlohmann::json layers = c["layer_types"];
  layers[1] = "chunked_attention";
  EXPECT_TRUE(contains(with("layer_types", layers), "\"layer_types\": layer 1 is \"chunked_attention\""));
  EXPECT_TRUE(contains(with("layer_types", {"sliding_attention"}), "has 1 entries, but num_hidden_layers is 4"));
  for (const nlohmann::json& v : {nlohmann::json(0), nlohmann::json(-48), nlohmann::json("48")})
    EXPECT_TRUE(contains(with("query_pre_attn_scalar", v), "\"query_pre_attn_scalar\"")) << v.dump();
  EXPECT_TRUE(contains(with("final_logit_softcapping", 0), "\"final_logit_softcapping\": must be positive or null"));
  EXPECT_TRUE(contains(with("hidden_activation", "gelu"), "\"hidden_activation\": \"gelu\" is not supported"));
  EXPECT_TRUE(contains(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}}), "rope type \"yarn\" is not supported"));
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
