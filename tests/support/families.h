#pragma once
// The model fixtures every family-wide test runs over (tests/fixtures/models/): one list, so
// a new family joins every suite at once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace osprey::testing {

// Checkpoints of every registered family, each with reference.safetensors (the mixtures of
// experts: qwen3-moe, its 128-expert top-8 routing in qwen3-moe-128, mixtral).
inline const std::vector<std::string> kFamilies = {"llama",   "qwen2", "gemma3",    "gemma3-mm",     "cohere2",
                                                    "qwen3",   "mistral", "qwen3-moe", "qwen3-moe-128", "mixtral"};

// The families the speculative suites draft for: one of each kind of layer stack (gemma3-mm's
// language model is gemma3's; qwen3-moe-128 routes as qwen3-moe does, only wider).
inline const std::vector<std::string> kDraftFamilies = {"llama",   "qwen2",     "qwen3",  "gemma3",
                                                        "cohere2", "mistral", "qwen3-moe", "mixtral"};

// A fixture's name as a test name: '-' as '_' (qwen3_moe).
inline std::string family_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// MLX affine-quantized checkpoints.
inline const std::vector<std::string> kQuantFixtures = {"llama-q4", "llama-q8", "qwen2-q4"};

}  // namespace osprey::testing
