#include "bundle/model_bundle.h"

#include <algorithm>

#include "bundle/model_files.h"
#include "core/error.h"

namespace osprey {

std::vector<int32_t> ModelBundle::stop_ids(std::span<const int32_t> model_eos) const {
  std::vector<int32_t> ids;
  auto add = [&](int32_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  for (int32_t id : model_eos) add(id);
  if (tokenizer)
    for (int32_t id : tokenizer->eos_ids()) add(id);
  return ids;
}

ModelBundle load_model_bundle(const std::filesystem::path& model, const BundleOptions& options) {
  ModelBundle b;
  b.path = model;
  if (model_has_tokenizer(model)) b.tokenizer = load_model_tokenizer(model);
  b.sampling = file_sampling_defaults(model, options.sampling_fallback, options.sampling_fallback_name);
  if (options.chat_template || options.require_chat_template) {
    try {
      b.chat_template = load_model_chat_template(model, options.template_name);
      b.tool_format = tool_call_format(b.chat_template->source());
      b.reasoning = reasoning_format(b.chat_template->source());
      if (b.tokenizer)
        for (const std::string& marker : tool_call_markers(b.tool_format))
          if (auto id = b.tokenizer->token_id(marker); id && b.tokenizer->is_special(*id))
            b.tool_marker_ids.push_back(*id);
    } catch (const Error& e) {
      if (options.require_chat_template) throw;
      b.chat_template.reset();
      b.tool_format = ToolCallFormat::none;
      b.reasoning = ReasoningFormat::none;
      b.tool_marker_ids.clear();
      b.chat_template_error = e.what();
    }
  }
  return b;
}

}  // namespace osprey
