// The Llama family on checkpoints written by the tests: tied embeddings load (and a cached
// decode over them equals a full forward pass), and the end-of-sequence ids merge.
// What every family shares is in family_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "model/model.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::TempDir;
using testing::tokens_of;

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

void expect_cached_decode_matches_full_forward(Model& model) {
  const std::vector<int32_t> ids = {5, 17, 3, 42, 8, 9, 60, 1, 33, 21, 2, 7};
  const int64_t vocab = model.info().vocab_size;
  SequenceCache full_cache = model.make_cache({});
  Array full = model.forward(tokens_of(ids), full_cache, true);  // [n, vocab]
  ASSERT_EQ(full.shape(), (Shape{int64_t(ids.size()), vocab}));

  // Prefill 5, then one token at a time; each step's logits must equal the full pass's row.
  SequenceCache cache = model.make_cache({});
  Array l = model.forward(tokens_of({ids.begin(), ids.begin() + 5}), cache, false);
  EXPECT_LT(max_abs_diff(l.data<float>(), full.data<float>() + 4 * vocab, vocab), 1e-4);
  for (size_t i = 5; i < ids.size(); ++i) {
    l = model.forward(tokens_of({ids[i]}), cache, false);
    EXPECT_LT(max_abs_diff(l.data<float>(), full.data<float>() + int64_t(i) * vocab, vocab), 1e-4) << "position " << i;
  }
  EXPECT_EQ(cache.offset(), int64_t(ids.size()));
}

}  // namespace

TEST(Llama, TiedEmbeddingsLoadWithoutLmHead) {
  TempDir d;
  auto cfg = testing::tiny_llama_config();
  cfg["tie_word_embeddings"] = true;
  testing::write_tiny_llama(d.path(), cfg);
  auto model = load_model(d.path());
  expect_cached_decode_matches_full_forward(*model);
}

TEST(Llama, EosIdsMergeConfigAndGenerationConfig) {
  TempDir d;
  testing::write_tiny_llama(d.path(), testing::tiny_llama_config());
  testing::write_file(d / "generation_config.json", R"({"eos_token_id": [2, 7, 9]})");
  auto model = load_model(d.path());
  EXPECT_EQ(model->info().eos_ids, (std::vector<int32_t>{2, 7, 9}));
  EXPECT_EQ(model->info().bos_id, 1);
}

}  // namespace osprey
