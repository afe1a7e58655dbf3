#pragma once
// A model family for server tests, "osprey_test_script": a real tokenizer and chat template
// with a reply fixed in advance (one a real model of that family wrote), so that the server's
// reply handling (tool calls, reasoning) is tested end to end without the model's weights.
// Its logits choose, for the token at position p, script[p - script_start] while p lies in
// the script, and eos_token_id after it (and before it).
#include <cstdint>
#include <filesystem>
#include <vector>

namespace osprey::testing {

// Registers the family (idempotent).
void register_scripted_family();

// Writes a model folder in `dir`: the tokenizer files of `tokenizer_dir`, config.json naming
// the script, and a one-tensor model.safetensors. With device_lost_at >= 0, a forward pass
// that reaches that position throws DeviceLost, as a failed GPU would.
void write_scripted_model(const std::filesystem::path& dir, const std::filesystem::path& tokenizer_dir,
                          int64_t vocab_size, int32_t eos_id, int64_t script_start, const std::vector<int32_t>& script,
                          int64_t device_lost_at = -1);

}  // namespace osprey::testing
