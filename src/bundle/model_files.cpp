#include "bundle/model_files.h"

#include "core/error.h"
#include "core/file_read.h"
#include "formats/gguf.h"
#include "formats/gguf_model.h"
#include "formats/gguf_tokenizer.h"

namespace osprey {

bool model_has_tokenizer(const std::filesystem::path& model) {
  if (is_gguf_path(model)) return GgufFile::open(model).has("tokenizer.ggml.tokens");
  return regular_file_exists(model / "tokenizer.json");
}

Tokenizer load_model_tokenizer(const std::filesystem::path& model) {
  if (!is_gguf_path(model)) return Tokenizer::load(model);
  const GgufFile g = GgufFile::open(model);
  const GgufTokenizerJson files = gguf_tokenizer_json(g);
  return Tokenizer::from_json(files.tokenizer_json, files.config_json, model.string());
}

ChatTemplate load_model_chat_template(const std::filesystem::path& model, const std::string& name) {
  if (!is_gguf_path(model)) return ChatTemplate::load(model, name);
  if (!name.empty() && name != "default")
    throw InvalidInput(model.string() + ": a GGUF file holds one chat template, so there is none named \"" + name + "\"");
  const GgufFile g = GgufFile::open(model);
  if (!g.has("tokenizer.chat_template"))
    throw InvalidInput(model.string() + " has no chat template (no tokenizer.chat_template in its metadata)");
  std::vector<std::pair<std::string, std::string>> special;
  const std::vector<std::string_view> tokens =
      g.has("tokenizer.ggml.tokens") ? g.get_string_array("tokenizer.ggml.tokens") : std::vector<std::string_view>{};
  for (const char* which : {"bos", "eos"}) {
    const std::string key = std::string("tokenizer.ggml.") + which + "_token_id";
    if (!g.has(key)) continue;
    const uint64_t id = g.get_uint(key);
    if (id >= tokens.size())
      throw InvalidInput(model.string() + ": " + key + " is " + std::to_string(id) + ", past the " +
                         std::to_string(tokens.size()) + " tokens");
    special.emplace_back(std::string(which) + "_token", std::string(tokens[size_t(id)]));
  }
  return ChatTemplate(g.get_string("tokenizer.chat_template"), std::move(special));
}

}  // namespace osprey
