// The model families on CUDA against the same HF references as the CPU, and against the
// CPU engine; skipped (and saying so) on machines without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "engine/generator.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::ints;
using testing::relative_row_error;
using testing::tokens_of;

std::filesystem::path fixture(const std::string& family) { return testing::source_dir() / "tests/fixtures/models" / family; }




class CudaReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
    LoadOptions lo;
    lo.device = Device::cuda(0);
    model_ = load_model(fixture(GetParam()), lo);
    ref_ = std::make_unique<SafeTensors>(SafeTensors::open_file(fixture(GetParam()) / "reference.safetensors"));
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafeTensors> ref_;
};

}  // namespace

TEST_P(CudaReference, PrefillLogitsMatchTransformers) {
  // Prefill GEMMs round activations to the weights' 16-bit type: fp16-class tolerance.
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> ids = ints(ref_->get("tokens_" + std::to_string(i)));
    Array ref = ref_->get("logits_" + std::to_string(i));
    SequenceCache cache = model_->make_cache({});
    Array ours = ops::to_device(model_->forward(tokens_of(ids), cache, true), Device::cpu());
    ASSERT_EQ(ours.shape(), ref.shape());
    double worst = 0;
    for (int64_t t = 0; t < ref.dim(0); ++t)
      worst = std::max(worst, relative_row_error(ours.data<float>() + t * ref.dim(1), ref.data<float>() + t * ref.dim(1), ref.dim(1)));
    EXPECT_LT(worst, 1e-2) << "sequence " << i;
  }
}

TEST_P(CudaReference, DecodeLogitsMatchTransformers) {
  const std::vector<int32_t> ids = ints(ref_->get("tokens_1"));
  Array ref = ref_->get("logits_1");
  SequenceCache cache = model_->make_cache({});
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    Array l = ops::to_device(model_->forward(tokens_of({ids[t]}), cache, false), Device::cpu());
    worst = std::max(worst, relative_row_error(l.data<float>(), ref.data<float>() + int64_t(t) * ref.dim(1), ref.dim(1)));
  }
  EXPECT_LT(worst, 1e-3);
}

TEST_P(CudaReference, GreedyContinuationsMatchTransformers) {
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    const std::vector<int32_t> prompt = ints(ref_->get("greedy_prompt_" + n));
    const std::vector<int32_t> expected = ints(ref_->get("greedy_tokens_" + n));
    Array margins = ref_->get("greedy_margins_" + n);
    SequenceCache cache = model_->make_cache({});
    GenerateParams gp;
    gp.max_tokens = int(expected.size());
    GenerateResult r = generate(*model_, cache, prompt, gp);
    ASSERT_EQ(r.tokens.size(), expected.size());
    for (size_t s = 0; s < expected.size() && margins.data<float>()[s] > 0.05f; ++s)
      ASSERT_EQ(r.tokens[s], expected[s]) << "prompt " << i << ", step " << s;
  }
}

TEST_P(CudaReference, KVWritePathsGiveIdenticalGreedyOutputFor300Tokens) {
  const std::vector<int32_t> prompt = {5, 99, 23, 311, 8, 140, 77, 3};
  std::vector<int32_t> out[2];
  for (int arm = 0; arm < 2; ++arm) {
    KVCacheParams co;
    co.inplace = arm == 0;
    SequenceCache cache = model_->make_cache(co);
    GenerateParams gp;
    gp.max_tokens = 300;
    GenerateResult r = generate(*model_, cache, prompt, gp);
    out[arm] = r.tokens;
    const uint64_t layers = uint64_t(model_->info().n_layers);
    if (arm == 0) {
      EXPECT_EQ(r.stats.kv.n_inplace_writes, layers * 298);
    } else {
      EXPECT_EQ(r.stats.kv.n_inplace_writes, 0u);
    }
  }
  ASSERT_EQ(out[0].size(), 300u);
  EXPECT_EQ(out[0], out[1]);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaReference, ::testing::Values("llama", "qwen2"));

TEST(CudaDevice, AskingForCudaWithoutOneIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  auto r = testing::run_osprey("generate -m " + fixture("llama").string() + " --token-ids 1,2 -n 2 --device cuda");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cuda"), std::string::npos) << r.err;
  r = testing::run_osprey("generate -m " + fixture("llama").string() + " --token-ids 1,2 -n 2 --device tpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected cpu, cuda or cuda:N"), std::string::npos) << r.err;
}

}  // namespace osprey
