#pragma once
// The model fixtures every family-wide test runs over (tests/fixtures/models/): one list, so
// a new family joins every suite at once.
#include <string>
#include <vector>

namespace osprey::testing {

// Checkpoints of every registered family, each with reference.safetensors (the mixtures of
// experts: qwen3-moe, its 128-expert top-8 routing in qwen3-moe-128, mixtral).
inline const std::vector<std::string> kFamilies = {"llama",   "qwen2", "gemma3",    "gemma3-mm",     "cohere2",
                                                    "qwen3",   "mistral", "qwen3-moe", "qwen3-moe-128", "mixtral"};

// MLX affine-quantized checkpoints.
inline const std::vector<std::string> kQuantFixtures = {"llama-q4", "llama-q8", "qwen2-q4"};

}  // namespace osprey::testing
