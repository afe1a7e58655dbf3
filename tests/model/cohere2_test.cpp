// The Cohere2 family's config errors, each naming the field. Its logits against a forward
// written from the definition, on every device, are in family_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/model.h"
#include "support/family_harness.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::contains;
using testing::load_error;
using testing::RefWeights;
using testing::tiny_cohere2_config;

TEST(Cohere2Config, ErrorsNameTheField) {
  const nlohmann::json c = tiny_cohere2_config();
  const RefWeights w = testing::cohere2_weights(c, 43);
  auto with = [&](const char* field, const nlohmann::json& value) { return testing::load_error_with(c, field, value, w); };
  nlohmann::json layers = c["layer_types"];
  layers[0] = "linear_attention";
  EXPECT_TRUE(contains(with("layer_types", layers), "\"layer_types\": layer 0 is \"linear_attention\""));
  EXPECT_TRUE(contains(with("logit_scale", 0), "\"logit_scale\""));
  EXPECT_TRUE(contains(with("head_dim", 32), "\"head_dim\": Cohere2's head size is hidden_size / num_attention_heads = 16"));
  nlohmann::json by_pattern = c;
  by_pattern.erase("layer_types");
  by_pattern["sliding_window_pattern"] = 0;
  EXPECT_TRUE(contains(load_error(by_pattern, w), "\"sliding_window_pattern\": must be at least 1"));
  EXPECT_TRUE(contains(with("sliding_window", 0), "\"sliding_window\": must be positive"));
  EXPECT_TRUE(contains(with("hidden_act", "gelu"), "\"hidden_act\": \"gelu\" is not supported"));
}

TEST(Cohere2Config, AnUntiedHeadMustBeInTheCheckpoint) {
  nlohmann::json c = tiny_cohere2_config();
  c["tie_word_embeddings"] = false;
  EXPECT_TRUE(contains(load_error(c, testing::cohere2_weights(c, 44)), "lm_head.weight"));
}

}  // namespace
}  // namespace osprey
