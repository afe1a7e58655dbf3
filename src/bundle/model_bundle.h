#pragma once
// What -m resolved to besides the weights: the tokenizer, the chat template and the formats
// it implies (how the model writes tool calls, whether it writes <think> blocks), the stop
// ids and the sampling defaults. One type loads and owns them; the server and every CLI
// command take it (docs/design.md, "The model bundle").
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "engine/generation_config.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

struct BundleOptions {
  // Load the chat template; a model without a usable one keeps the reason
  // (ModelBundle::chat_template_error) rather than failing, unless `require_chat_template`.
  bool chat_template = false;
  bool require_chat_template = false;
  std::string template_name;  // a named template of tokenizer_config.json ("" : the default)
  // The sampling settings a command or request gets for the fields it leaves out: each one the
  // model's generation_config.json gives replaces the fallback's (vLLM's rule,
  // file_sampling_defaults), "do_sample": false makes them greedy.
  SamplerParams sampling_fallback{};
  std::string sampling_fallback_name = "the defaults";
};

struct ModelBundle {
  std::filesystem::path path;           // the folder or GGUF file
  std::optional<Tokenizer> tokenizer;   // none when the model carries no tokenizer
  std::optional<ChatTemplate> chat_template;
  std::string chat_template_error;      // why there is none (when one was asked for)
  ToolCallFormat tool_format = ToolCallFormat::none;  // how the template's model writes calls
  std::vector<int32_t> tool_marker_ids;  // its markers that are special tokens of the vocabulary
  ReasoningFormat reasoning = ReasoningFormat::none;  // whether the template writes <think> blocks
  SamplingDefaults sampling;             // the values and where they came from

  // The ids a generation stops at: the model's EOS ids (config.json and
  // generation_config.json, ModelInfo::eos_ids) and then the tokenizer's
  // (tokenizer_config.json's eos_token), each once, in that order.
  std::vector<int32_t> stop_ids(std::span<const int32_t> model_eos) const;
};

// Loads the bundle of `model` (a folder or a GGUF file). Errors name the file at fault: a
// malformed tokenizer, generation_config.json or (when required) chat template.
ModelBundle load_model_bundle(const std::filesystem::path& model, const BundleOptions& options = {});

}  // namespace osprey
