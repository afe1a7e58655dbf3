#pragma once
// What the family tests share: the fixture checkpoints on a device, the tiny configs of the
// families whose reference forward tests/support/family_reference.cpp writes, random prompts,
// the error of engine logits against such a reference, and the message a checkpoint fails to
// load with.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/array.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "support/device_test.h"
#include "support/family_reference.h"

namespace osprey::testing {

// config.json of a tiny Gemma 3 (gemma3_text: 4 layers alternating sliding (window 8) and
// full attention, linear rope scaling, a final softcap, tied embeddings).
nlohmann::json tiny_gemma3_config(int64_t head_dim = 64);
// config.json of a tiny Cohere2 (4 layers, the last one full attention, window 8).
nlohmann::json tiny_cohere2_config();

// The checkpoint in `dir` loaded onto `device`.
std::unique_ptr<Model> load_on(const std::filesystem::path& dir, const Device& device);
// The model's logits for `ids` (every position's, or the last one's) on the host.
Array host_logits(Model& m, const std::vector<int32_t>& ids, SequenceCache& cache, bool all);

// The element type of the K/V rows `m`'s cache keeps (the references round their K/V alike).
DType kv_rows(Model& m);

// n token ids drawn uniformly from [3, 255] (a tiny config's vocabulary past its specials).
std::vector<int32_t> random_prompt(size_t n, uint32_t seed);

// max over the rows of `ours` [T, vocab] (row t against ref[row0 + t]) of
// max |ours - ref| / range(ref); a non-finite value of ours is an infinite error.
double worst_error(const Array& ours, const std::vector<std::vector<double>>& ref, int64_t row0 = 0);

// Logits of one full forward pass over `ids`, and of the same prompt again one token at a
// time after a 3-token prefill, each against `ref` at every position (worst_error).
struct FullAndStepErrors {
  double full = 0, step = 0;
};
FullAndStepErrors full_and_step_errors(Model& m, const std::vector<int32_t>& ids,
                                       const std::vector<std::vector<double>>& ref);

// The message of the Error that loading `config` with weights `w` throws, or "(loaded)".
std::string load_error(const nlohmann::json& config, const RefWeights& w);

// load_error of `config` with `field` set to `value`.
std::string load_error_with(nlohmann::json config, const std::string& field, const nlohmann::json& value,
                            const RefWeights& w);

// Whether `s` contains `part`, saying both where not.
::testing::AssertionResult contains(const std::string& s, const std::string& part);

// tests/fixtures/models/<name>.
std::filesystem::path fixture_dir(const std::string& name);

// A fixture checkpoint (the ModelCase's model) loaded on its device, and the reference tensors
// saved beside it (reference.safetensors).
class FixtureModelTest : public DeviceTestOf<ModelCase> {
 protected:
  void SetUp() override {
    DeviceTestOf::SetUp();
    if (IsSkipped()) return;
    model_ = load_on(fixture_dir(GetParam().model), device());
    ref_ = std::make_unique<SafeTensors>(SafeTensors::open_file(fixture_dir(GetParam().model) / "reference.safetensors"));
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafeTensors> ref_;
};

}  // namespace osprey::testing
