#pragma once
// The chat template of a checkpoint or tokenizer folder, rendered as transformers'
// apply_chat_template(tokenize=False) renders it.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace osprey {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Reads the template of a checkpoint or tokenizer folder: chat_template.jinja, else
  // chat_template.json, else tokenizer_config.json's "chat_template" (a string, or a list of
  // {name, template}: "default" is used unless a name is given), and the special-token texts
  // (bos_token, eos_token, unk_token, pad_token, ...: strings or {"content": ...} objects) from
  // tokenizer_config.json. Throws IoError / InvalidInput naming the file and field;
  // InvalidInput "... has no chat template" when there is none.
  static ChatTemplate load(const std::filesystem::path& dir, const std::string& name = "");

  // A template from its source text and the special-token texts (name -> text).
  ChatTemplate(const std::string& source, std::vector<std::pair<std::string, std::string>> special_tokens,
               std::vector<std::string> names = {"default"});

  // request: a JSON object shaped like an OpenAI chat request: "messages" (required; content a
  // string or a list of {"type":"text","text":...} parts), "add_generation_prompt" (default
  // true), "tools", "documents", "chat_template_kwargs" (an object of extra variables).
  // Returns the rendered text exactly as transformers' apply_chat_template(tokenize=False).
  // Throws InvalidInput for a malformed request or the template's raise_exception (its text);
  // Unsupported naming a template feature that is not implemented, with its line.
  std::string render(const nlohmann::json& request) const;
  // The same for a request parsed with its key order kept: `tojson` of tools, arguments and
  // documents then lists keys in the order the client sent them, as Python does (a
  // nlohmann::json object sorts its keys).
  std::string render(const nlohmann::ordered_json& request) const;

  // Names of the templates the folder offers ("default", "tool_use", "rag", ...).
  std::vector<std::string> names() const;

  // The template's source text.
  const std::string& source() const { return source_; }

  // The special-token texts given to the template (bos_token, eos_token, ...).
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const { return special_tokens_; }

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string source_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
  std::vector<std::string> names_;
};

}  // namespace osprey
