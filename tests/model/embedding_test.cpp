// Bare base models (Qwen3Model, LlamaModel) as embedding models: Model::forward_hidden and the
// pooling that modules.json declares (model/pooling.h), against reference.json of the
// fixtures that tools/make_embedding_fixtures.py writes. That reference is an independent
// float64 numpy forward written from the architectures' definitions and sentence-transformers'
// Pooling and Normalize modules, not from this code.
//
// Tolerances (max absolute error over an embedding's values):
//   CPU:  1e-4 against embedding_kv_f16 (the reference with its K/V rounded to f16, as the
//         cache keeps them), 2e-3 against embedding (f32 K/V, what sentence-transformers
//         computes; f16 rows alone move it by up to reference.json's kv_f16_vs_f32, 6e-4);
//   CUDA: 2e-3 against embedding (its kernels round elsewhere too).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"
#include "model/pooling.h"
#include "support/device_test.h"
#include "support/family_harness.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;

const std::vector<std::string> kEmbeddingFixtures = {"qwen3-embedding", "llama-embedding"};

json reference(const std::string& model) {
  return json::parse(testing::read_file(testing::fixture_dir(model) / "reference.json"));
}

double max_abs_error(const std::vector<float>& ours, const json& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ours.size() && i < ref.size(); ++i) {
    const double d = std::abs(double(ours[i]) - ref[i].get<double>());
    worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
  }
  return worst;
}

double max_abs(const json& ref) {
  double m = 0;
  for (const json& v : ref) m = std::max(m, std::abs(v.get<double>()));
  return m;
}

std::vector<int32_t> tokens_of(const json& input) { return input["tokens"].get<std::vector<int32_t>>(); }

class EmbeddingModel : public testing::DeviceTestOf<testing::ModelCase> {
 protected:
  void SetUp() override {
    DeviceTestOf::SetUp();
    if (IsSkipped()) return;
    dir_ = testing::fixture_dir(GetParam().model);
    model_ = testing::load_on(dir_, device());
    ref_ = reference(GetParam().model);
  }
  std::filesystem::path dir_;
  std::unique_ptr<Model> model_;
  json ref_;
};

TEST_P(EmbeddingModel, LoadsABareBaseModelAsEmbeddingOnly) {
  EXPECT_TRUE(model_->info().embedding_only);
  EXPECT_EQ(model_->info().hidden_size, 64);
  SequenceCache cache = model_->make_cache({});
  Array ids = Array::empty({2}, DType::i32);
  ids.data<int32_t>()[0] = 5;
  ids.data<int32_t>()[1] = 6;
  try {
    model_->forward(ids, cache, false);
    FAIL() << "forward() gave logits without a head";
  } catch (const Unsupported& e) {
    EXPECT_TRUE(testing::contains(e.what(), "no lm_head"));
  }
}

TEST_P(EmbeddingModel, DeclaredPoolingMatchesTheReference) {
  const std::optional<PoolingConfig> pooling = read_pooling_config(dir_);
  ASSERT_TRUE(pooling.has_value());
  EXPECT_EQ(pooling_mode_name(pooling->mode), ref_["pooling"].get<std::string>());
  EXPECT_EQ(pooling->normalize, ref_["normalize"].get<bool>());
  for (const json& input : ref_["inputs"]) {
    SCOPED_TRACE(input["text"].is_null() ? std::string("token ids") : input["text"].get<std::string>());
    const std::vector<float> e = embed_tokens(*model_, tokens_of(input), *pooling);
    if (on_cuda()) {
      EXPECT_LE(max_abs_error(e, input["embedding"]), 2e-3);
    } else {
      EXPECT_LE(max_abs_error(e, input["embedding_kv_f16"]), 1e-4);
      EXPECT_LE(max_abs_error(e, input["embedding"]), 2e-3);
    }
    if (pooling->normalize) {
      double ss = 0;
      for (float v : e) ss += double(v) * v;
      EXPECT_NEAR(std::sqrt(ss), 1.0, 1e-5);
    }
  }
}

// sentence-transformers' own output (tools/st_embedding_reference.py, run where torch is:
// scripts/device_refs.sh): its tokenizer's ids for each text and SentenceTransformer's
// embedding, float32 with f32 K/V. The same bounds as against the numpy reference's f32
// embedding: 2e-3 (f16 K/V rows alone move an embedding by up to kv_f16_vs_f32, 6e-4).
TEST_P(EmbeddingModel, SentenceTransformersOwnOutput) {
  const std::filesystem::path path = dir_ / "reference_st.json";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " is not made yet (scripts/device_refs.sh on a machine with sentence-transformers)";
  const json st = json::parse(testing::read_file(path));
  const std::optional<PoolingConfig> pooling = read_pooling_config(dir_);
  ASSERT_TRUE(pooling.has_value());
  ASSERT_EQ(st["inputs"].size(), ref_["inputs"].size());
  for (size_t i = 0; i < st["inputs"].size(); ++i) {
    const json& input = st["inputs"][i];
    SCOPED_TRACE(st["generator"].get<std::string>() + ": input " + std::to_string(i));
    // Its tokenizer and the one the numpy reference used (@lenml/tokenizers) agree.
    EXPECT_EQ(tokens_of(input), tokens_of(ref_["inputs"][i]));
    const std::vector<float> e = embed_tokens(*model_, tokens_of(input), *pooling);
    EXPECT_LE(max_abs_error(e, input["embedding"]), 2e-3);
  }
}

// Every mode sentence-transformers' Pooling defines that Osprey computes, over one model's
// hidden states, before normalization. The error is relative to the largest value (the
// states are RMS-normed times the norm's weight, a few units): 2e-4 on the CPU (its kernels'
// approximate exp and summation order; the normalized embeddings above stay within 1e-4
// absolute), 2e-3 on CUDA.
TEST_P(EmbeddingModel, EveryPoolingModeMatchesTheReference) {
  for (PoolingMode mode : {PoolingMode::mean, PoolingMode::cls, PoolingMode::last_token}) {
    PoolingConfig p;
    p.mode = mode;
    for (const json& input : ref_["inputs"]) {
      SCOPED_TRACE(std::string(pooling_mode_name(mode)) + ": " + input["tokens"].dump());
      const json& want = input["pooled_kv_f16"][pooling_mode_name(mode)];
      const std::vector<float> e = embed_tokens(*model_, tokens_of(input), p);
      EXPECT_LE(max_abs_error(e, want) / max_abs(want), on_cuda() ? 2e-3 : 2e-4);
    }
  }
}

// A long input in chunks through one cache: the same embedding as one forward (relative to
// the largest value: 1e-4 on the CPU, whose attention sums the keys in another order).
TEST_P(EmbeddingModel, ChunkedInputEqualsOneForward) {
  const std::optional<PoolingConfig> declared = read_pooling_config(dir_);
  ASSERT_TRUE(declared);
  const json* longest = nullptr;
  for (const json& input : ref_["inputs"])
    if (!longest || input["tokens"].size() > (*longest)["tokens"].size()) longest = &input;
  const std::vector<int32_t> ids = tokens_of(*longest);
  ASSERT_GT(ids.size(), 50u);
  for (PoolingMode mode : {PoolingMode::mean, PoolingMode::cls, PoolingMode::last_token}) {
    PoolingConfig p = *declared;
    p.mode = mode;
    const std::vector<float> whole = embed_tokens(*model_, ids, p, 4096);
    const std::vector<float> chunked = embed_tokens(*model_, ids, p, 7);
    ASSERT_EQ(whole.size(), chunked.size());
    double worst = 0, largest = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      worst = std::max(worst, double(std::abs(whole[i] - chunked[i])));
      largest = std::max(largest, double(std::abs(whole[i])));
    }
    EXPECT_LE(worst / largest, on_cuda() ? 2e-3 : 1e-4) << pooling_mode_name(mode);
  }
}

TEST_P(EmbeddingModel, RefusesNoTokens) { EXPECT_THROW(embed_tokens(*model_, {}, PoolingConfig{}), InvalidInput); }

INSTANTIATE_TEST_SUITE_P(Embeddings, EmbeddingModel, OSPREY_MODELS_ON_DEVICES(kEmbeddingFixtures));

// ---- the declaration (modules.json, the Pooling module's config.json) ----

// A folder with modules.json of `types` (module 1's folder 1_Pooling with `pooling`).
void write_declaration(const std::filesystem::path& dir, const std::vector<std::string>& types, const json& pooling) {
  json modules = json::array();
  for (size_t i = 0; i < types.size(); ++i)
    modules.push_back({{"idx", i}, {"name", std::to_string(i)}, {"path", i == 1 ? "1_Pooling" : i == 0 ? "" : "x"},
                       {"type", "sentence_transformers.models." + types[i]}});
  testing::write_file(dir / "modules.json", modules.dump());
  std::filesystem::create_directories(dir / "1_Pooling");
  testing::write_file(dir / "1_Pooling" / "config.json", pooling.dump());
}

std::string declaration_error(const std::vector<std::string>& types, const json& pooling) {
  testing::TempDir dir;
  write_declaration(dir.path(), types, pooling);
  return testing::error_of([&] { read_pooling_config(dir.path()); }, "(read)");
}

TEST(EmbeddingDeclaration, ReadsTheFixturesPooling) {
  const auto qwen = read_pooling_config(testing::fixture_dir("qwen3-embedding"));
  ASSERT_TRUE(qwen);
  EXPECT_EQ(qwen->mode, PoolingMode::last_token);
  EXPECT_TRUE(qwen->normalize);
  EXPECT_EQ(qwen->dimension, 64);
  const auto llama = read_pooling_config(testing::fixture_dir("llama-embedding"));
  ASSERT_TRUE(llama);
  EXPECT_EQ(llama->mode, PoolingMode::mean);
  EXPECT_FALSE(llama->normalize);
}

TEST(EmbeddingDeclaration, NoModulesJsonDeclaresNoPooling) {
  EXPECT_FALSE(read_pooling_config(testing::fixture_dir("llama")).has_value());
}

TEST(EmbeddingDeclaration, ClsModeIsRead) {
  testing::TempDir dir;
  write_declaration(dir.path(), {"Transformer", "Pooling"}, {{"pooling_mode_cls_token", true}});
  const auto p = read_pooling_config(dir.path());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->mode, PoolingMode::cls);
  EXPECT_FALSE(p->normalize);
}

TEST(EmbeddingDeclaration, RefusesWhatItDoesNotComputeByName) {
  EXPECT_TRUE(testing::contains(declaration_error({"Transformer", "Pooling"}, {{"pooling_mode_max_tokens", true}}),
                                "pooling_mode_max_tokens is not supported"));
  EXPECT_TRUE(testing::contains(
      declaration_error({"Transformer", "Pooling"}, {{"pooling_mode_weightedmean_tokens", true}}),
      "pooling_mode_weightedmean_tokens"));
  EXPECT_TRUE(testing::contains(
      declaration_error({"Transformer", "Pooling"}, {{"pooling_mode_mean_tokens", true}, {"pooling_mode_cls_token", true}}),
      "concatenated poolings are not supported"));
  EXPECT_TRUE(testing::contains(declaration_error({"Transformer", "Pooling"}, {{"pooling_mode_mean_tokens", false}}),
                                "no pooling mode is true"));
  EXPECT_TRUE(testing::contains(
      declaration_error({"Transformer", "Pooling", "Dense", "Normalize"}, {{"pooling_mode_mean_tokens", true}}),
      "sentence_transformers.models.Dense) is not supported"));
  EXPECT_TRUE(testing::contains(declaration_error({"Transformer"}, {{"pooling_mode_mean_tokens", true}}),
                                "module 1 must be sentence_transformers.models.Pooling"));
  EXPECT_TRUE(testing::contains(declaration_error({"StaticEmbedding", "Pooling"}, {{"pooling_mode_mean_tokens", true}}),
                                "the first module must be sentence_transformers.models.Transformer"));
}

TEST(EmbeddingDeclaration, RefusesAMalformedModulesList) {
  for (const std::string& text : {std::string("{}"), std::string("[]"), std::string("[1, 2")}) {
    testing::TempDir dir;
    testing::write_file(dir.path() / "modules.json", text);
    EXPECT_THROW(read_pooling_config(dir.path()), InvalidInput) << text;
  }
}

TEST(EmbeddingTruncation, KeepsTheFirstValuesAndNormalizesAgain) {
  std::vector<float> v = {3, 4, 12};
  truncate_embedding(v, 2, /*normalize=*/true);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0], 0.6, 1e-7);
  EXPECT_NEAR(v[1], 0.8, 1e-7);
  std::vector<float> w = {3, 4, 12};
  truncate_embedding(w, 2, /*normalize=*/false);
  EXPECT_EQ(w, (std::vector<float>{3, 4}));
  std::vector<float> u = {1, 2};
  EXPECT_THROW(truncate_embedding(u, 0, true), InvalidInput);
  EXPECT_THROW(truncate_embedding(u, 3, true), InvalidInput);
}

}  // namespace
}  // namespace osprey
