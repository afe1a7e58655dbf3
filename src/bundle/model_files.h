#pragma once
// The tokenizer and chat template of what -m resolved to (hub::resolve_model): a model
// folder's tokenizer.json, tokenizer_config.json and chat template files, or the metadata of a
// GGUF file (formats/gguf_tokenizer.h). The CLI's commands and the server read them here.
#include <filesystem>
#include <string>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

// Whether `model` carries a tokenizer: a folder with tokenizer.json, or a GGUF file with
// tokenizer.ggml.tokens.
bool model_has_tokenizer(const std::filesystem::path& model);
// Tokenizer::load for a folder; the GGUF file's tokenizer otherwise (errors as theirs).
Tokenizer load_model_tokenizer(const std::filesystem::path& model);
// ChatTemplate::load for a folder; for a GGUF file its tokenizer.chat_template, with the
// bos and eos token texts (InvalidInput "... has no chat template" when the file holds none;
// a GGUF file holds one template, so `name` must be empty or "default").
ChatTemplate load_model_chat_template(const std::filesystem::path& model, const std::string& name = "");

}  // namespace osprey
