#pragma once
// The model fixtures every family-wide test runs over (tests/fixtures/models/): one list, so
// a new family joins every suite at once.
#include <string>
#include <vector>

namespace osprey::testing {

// Dense checkpoints, one per registered family, each with reference.safetensors.
inline const std::vector<std::string> kFamilies = {"llama",   "qwen2",   "gemma3", "gemma3-mm",
                                                    "cohere2", "qwen3", "mistral"};

// MLX affine-quantized checkpoints.
inline const std::vector<std::string> kQuantFixtures = {"llama-q4", "llama-q8", "qwen2-q4"};

}  // namespace osprey::testing
