// The engine against HF transformers, on every device: logits at every position and 64-token
// greedy continuations of tiny random-weight checkpoints, computed on the GPU machine by
// tools/make_fixtures.py from the saved files (tests/fixtures/README.md). The CUDA instances
// skip (and say so) without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "engine/generator.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "support/families.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::ints;
using testing::relative_row_error;
using testing::tokens_of;

std::filesystem::path fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/models" / family;
}




struct ReferenceCase {
  std::string family;
  std::string device;  // "cpu" or "cuda"
};

class Reference : public ::testing::TestWithParam<ReferenceCase> {
 protected:
  void SetUp() override {
    const ReferenceCase& c = GetParam();
    LoadOptions lo;
    if (c.device == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
      lo.device = Device::cuda(0);
    }
    model_ = load_model(fixture(c.family), lo);
    ref_ = std::make_unique<SafeTensors>(SafeTensors::open_file(fixture(c.family) / "reference.safetensors"));
  }
  bool on_cuda() const { return GetParam().device == "cuda"; }
  // Logits on the host.
  Array forward(const Array& tokens, SequenceCache& cache, bool all_logits) {
    return ops::to_device(model_->forward(tokens, cache, all_logits), Device::cpu());
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafeTensors> ref_;
};

std::vector<ReferenceCase> reference_cases() {
  std::vector<ReferenceCase> cases;
  for (const char* device : {"cpu", "cuda"})
    for (const std::string& family : testing::kFamilies) cases.push_back({family, device});
  return cases;
}

}  // namespace

TEST_P(Reference, LogitsAtEveryPositionMatchTransformers) {
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> ids = ints(ref_->get("tokens_" + std::to_string(i)));
    Array ref = ref_->get("logits_" + std::to_string(i));
    const int64_t vocab = ref.dim(1);
    SequenceCache cache = model_->make_cache({});
    Array ours = forward(tokens_of(ids), cache, true);
    ASSERT_EQ(ours.shape(), ref.shape());
    double worst = 0;
    for (int64_t t = 0; t < ref.dim(0); ++t)
      worst = std::max(worst, relative_row_error(ours.data<float>() + t * vocab, ref.data<float>() + t * vocab, vocab));
    // CUDA prefill GEMMs round activations to the weights' 16-bit type: fp16-class tolerance.
    EXPECT_LT(worst, on_cuda() ? 1e-2 : 1e-3) << "sequence " << i << " of " << ids.size() << " tokens";
    // The margin, in the XML report (--gtest_output=xml).
    RecordProperty("seq" + std::to_string(i) + "_worst_rel_error", std::to_string(worst));
  }
}

TEST_P(Reference, TokenByTokenDecodeMatchesTransformers) {
  // The decode path (single-token steps over the cache) against the same reference rows.
  const std::vector<int32_t> ids = ints(ref_->get("tokens_1"));
  Array ref = ref_->get("logits_1");
  const int64_t vocab = ref.dim(1);
  SequenceCache cache = model_->make_cache({});
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    Array l = forward(tokens_of({ids[t]}), cache, false);
    worst = std::max(worst, relative_row_error(l.data<float>(), ref.data<float>() + int64_t(t) * vocab, vocab));
  }
  EXPECT_LT(worst, 1e-3);
}

TEST_P(Reference, GreedyContinuationsMatchWhereMarginsAreClear) {
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
    // Compare up to the first step whose reference margin is too small to call.
    size_t checked = 0;
    for (; checked < expected.size() && margins.data<float>()[checked] > 0.05f; ++checked)
      ASSERT_EQ(r.tokens[checked], expected[checked]) << "prompt " << i << ", step " << checked;
    EXPECT_GE(checked, expected.size() / 2) << "too few clear-margin steps to check";
  }
}

TEST_P(Reference, KVWriteSwitchGivesByteIdenticalGreedyOutputFor300Tokens) {
  // Through the CLI, so the environment switch and the JSON counters are covered too.
  const std::string args = "generate -m " + fixture(GetParam().family).string() + " --device " +
                           GetParam().device + " --token-ids 5,99,23,311,8,140,77,3 -n 300 --ignore-eos --json";
  auto on = testing::run_osprey(args, "OSPREY_KV_INPLACE_WRITE=1");
  auto off = testing::run_osprey(args, "OSPREY_KV_INPLACE_WRITE=0");
  ASSERT_EQ(on.exit_code, 0) << on.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  auto jon = nlohmann::json::parse(on.out), joff = nlohmann::json::parse(off.out);
  ASSERT_EQ(jon["tokens"].size(), 300u);
  EXPECT_EQ(jon["tokens"], joff["tokens"]);
  const uint64_t layers = uint64_t(model_->info().n_layers);
  // 299 decode writes at rows 8..306 per layer; the one at row 256 grows the buffer.
  EXPECT_EQ(jon["timings"]["kv_inplace_writes"].get<uint64_t>(), layers * 298);
  EXPECT_EQ(jon["timings"]["kv_copying_writes"].get<uint64_t>(), layers * 2);
  EXPECT_EQ(joff["timings"]["kv_inplace_writes"].get<uint64_t>(), 0u);
  EXPECT_EQ(joff["timings"]["kv_copying_writes"].get<uint64_t>(), layers * 300);
}

INSTANTIATE_TEST_SUITE_P(Families, Reference, ::testing::ValuesIn(reference_cases()),
                         [](const ::testing::TestParamInfo<ReferenceCase>& info) {
                           return info.param.family + "_" + info.param.device;
                         });

}  // namespace osprey
