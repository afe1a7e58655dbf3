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
