// The shipped demo model (models/demo) against Hugging Face: its tokenizer gives the prompt
// ids and decoded text of the HF tokenizers library, and greedy generation reproduces the
// 64-token continuations that transformers computed from the same files on the GPU machine
// (tests/fixtures/demo/reference.json, written by tools/train_demo_model.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "serve/generate.h"
#include "model/model.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

std::filesystem::path demo_dir() { return testing::source_dir() / "models/demo"; }

nlohmann::json reference() {
  return nlohmann::json::parse(testing::read_file(testing::source_dir() / "tests/fixtures/demo/reference.json"));
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

}  // namespace

TEST(DemoModel, TokenizerEncodesPromptsAsHfTokenizers) {
  const Tokenizer tok = Tokenizer::load(demo_dir());
  const nlohmann::json ref = reference();
  ASSERT_GE(ref["cases"].size(), 4u);
  for (const auto& c : ref["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const std::vector<int32_t> ids = tok.encode(prompt, true);
    EXPECT_EQ(ids, ids_of(c["prompt_ids"])) << prompt;
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(std::optional<int32_t>(ids[0]), tok.bos_id()) << "the post-processor prepends BOS";
  }
}

TEST(DemoModel, TokenizerDecodesReferenceTokensAsHfTokenizers) {
  const Tokenizer tok = Tokenizer::load(demo_dir());
  const nlohmann::json ref = reference();
  ASSERT_GE(ref["cases"].size(), 4u);
  for (const auto& c : ref["cases"])
    EXPECT_EQ(tok.decode(ids_of(c["tokens"])), c["text"].get<std::string>()) << c["prompt"];
}

TEST(DemoModel, ConfigMatchesTokenizer) {
  auto model = load_model(demo_dir());
  const Tokenizer tok = Tokenizer::load(demo_dir());
  EXPECT_EQ(model->info().model_type, "llama");
  EXPECT_EQ(model->info().vocab_size, tok.vocab_size());
  EXPECT_EQ(model->info().bos_id, tok.bos_id());
  EXPECT_EQ(model->info().eos_ids, tok.eos_ids());
}

TEST(DemoModel, GreedyContinuationsMatchTransformers) {
  auto model = load_model(demo_dir());
  const Tokenizer tok = Tokenizer::load(demo_dir());
  const nlohmann::json ref = reference();
  const double threshold = ref["margin_threshold"].get<double>();
  for (const auto& c : ref["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const std::vector<int32_t> expected = ids_of(c["tokens"]);
    const std::vector<double> margins = c["margins"].get<std::vector<double>>();
    ASSERT_EQ(margins.size(), expected.size());
    SequenceCache cache = model->make_cache({});
    GenerateParams gp;
    gp.max_tokens = int(expected.size());  // no stop ids: eos is generated like any token
    const GenerateResult r = generate(*model, cache, ids_of(c["prompt_ids"]), gp);
    ASSERT_EQ(r.tokens.size(), expected.size()) << prompt;
    // Every step must match while the two continuations agree; they may part only at a step
    // whose reference margin is too small to call, and are not compared after that.
    size_t step = 0;
    for (; step < expected.size() && r.tokens[step] == expected[step]; ++step) {
    }
    if (step < expected.size())
      EXPECT_LE(margins[step], threshold) << prompt << ": differs at step " << step << " (reference margin "
                                          << margins[step] << ")";
    else
      EXPECT_EQ(tok.decode(r.tokens), c["text"].get<std::string>()) << prompt;
  }
}

TEST(DemoModel, TeacherForcedArgmaxMatchesTransformersAtEveryClearStep) {
  // The reference continuation fed back in one forward pass: wherever the reference margin
  // is clear, the engine's argmax after the reference prefix is the reference token.
  auto model = load_model(demo_dir());
  const nlohmann::json ref = reference();
  const double threshold = ref["margin_threshold"].get<double>();
  size_t n_checked = 0, n_total = 0;
  for (const auto& c : ref["cases"]) {
    const std::vector<int32_t> prompt = ids_of(c["prompt_ids"]);
    const std::vector<int32_t> expected = ids_of(c["tokens"]);
    const std::vector<double> margins = c["margins"].get<std::vector<double>>();
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), expected.begin(), expected.end() - 1);
    Array tokens = Array::empty({int64_t(ids.size())}, DType::i32);
    std::copy(ids.begin(), ids.end(), tokens.data<int32_t>());
    SequenceCache cache = model->make_cache({});
    const Array logits = model->forward(tokens, cache, true);  // [n, vocab]
    ASSERT_EQ(logits.dim(0), int64_t(ids.size()));
    const int64_t vocab = logits.dim(1);
    for (size_t k = 0; k < expected.size(); ++k) {
      if (margins[k] <= threshold) continue;
      const float* row = logits.data<float>() + (int64_t(prompt.size()) - 1 + int64_t(k)) * vocab;
      const int32_t argmax = int32_t(std::max_element(row, row + vocab) - row);
      EXPECT_EQ(argmax, expected[k]) << c["prompt"] << ", step " << k << " (margin " << margins[k] << ")";
      ++n_checked;
    }
    n_total += expected.size();
  }
  EXPECT_GE(n_checked, n_total * 3 / 4) << "the fixture has too few clear-margin steps";
}

}  // namespace osprey
