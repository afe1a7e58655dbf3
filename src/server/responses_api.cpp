#include "server/responses_api.h"

#include <algorithm>
#include <initializer_list>

#include "server/completion_request.h"
#include "server/request_fields.h"

namespace osprey {
namespace {
// A namespace of its own: the library is built in unity batches, where the anonymous
// namespaces of other server files share this translation unit.
namespace responses {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

using namespace request_fields;  // kind_of, fail, join, get, string_at, only

std::string type_of(const ojson& v, const std::string& at) {
  if (!v.is_object()) fail(at, "must be an object, not " + kind_of(v));
  const ojson* t = get(v, "type");
  if (!t) return "";
  if (!t->is_string()) fail(at + ".type", "must be a string, not " + kind_of(*t));
  return t->get<std::string>();
}

void append(std::string& to, const std::string& text) {
  if (!to.empty()) to += "\n";
  to += text;
}

// Content: a string, or a list of input_text / output_text parts, and where `images` (a user
// message's content) input_image parts whose image_url is a data: URL (read as a chat image
// part: server/image_parts.h). File and audio parts are refused.
void check_content(const ojson& content, const std::string& at, bool images = false) {
  if (content.is_string()) return;
  if (!content.is_array()) fail(at, "must be a string or a list of content parts, not " + kind_of(content));
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string pat = at + "[" + std::to_string(k) + "]";
    const std::string type = type_of(content[k], pat);
    if (type == "input_text") {
      only(content[k], pat, {"type", "text"});
    } else if (type == "output_text") {
      only(content[k], pat, {"type", "text", "annotations", "logprobs"});
    } else if (type == "input_image") {
      if (!images) fail(pat, "is an 'input_image' part: images are read in a user message's content only");
      only(content[k], pat, {"type", "image_url", "file_id", "detail"});
      if (get(content[k], "file_id")) fail(pat + ".file_id", "is not supported: no files are stored here; send the image as image_url, a data: URL");
      const std::string url = string_at(content[k], "image_url", pat, true);
      if (url.rfind("data:", 0) != 0)
        fail(pat + ".image_url", "is not a data: URL: this server fetches nothing; send data:image/png;base64,...");
      const std::string detail = string_at(content[k], "detail", pat, false);
      if (!detail.empty() && detail != "auto" && detail != "low" && detail != "high")
        fail(pat + ".detail", "must be \"auto\", \"low\" or \"high\", not \"" + detail.substr(0, 64) + "\"");
      continue;
    } else if (type == "input_file" || type == "input_audio") {
      fail(pat, "is an '" + type + "' part: this server reads text and images only");
    } else {
      fail(pat + ".type", "must be \"input_text\" or \"output_text\", not \"" + type + "\"");
    }
    string_at(content[k], "text", pat, true);
  }
}

// Checked content as a chat message's: its text (content_text) when it holds no image, else a
// list of text parts (texts in a row joined by newlines) and image_url parts in order.
ojson chat_content(const ojson& content);

// The text of checked content: a string, or its parts' texts joined by newlines.
std::string content_text(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array())
    for (const ojson& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) append(text, part["text"].get<std::string>());
  return text;
}

ojson chat_content(const ojson& content) {
  const bool images = content.is_array() && std::any_of(content.begin(), content.end(), [](const ojson& p) {
                        return p.is_object() && p.value("type", "") == "input_image";
                      });
  if (!images) return content_text(content);
  ojson parts = ojson::array();
  std::string text;
  bool has_text = false;
  for (const ojson& part : content) {
    if (part.value("type", "") == "input_image") {
      if (has_text) parts.push_back({{"type", "text"}, {"text", text}});
      text.clear();
      has_text = false;
      ojson url = {{"url", part.value("image_url", "")}};
      if (part.contains("detail") && part["detail"].is_string()) url["detail"] = part["detail"];
      parts.push_back({{"type", "image_url"}, {"image_url", url}});
    } else if (part.contains("text") && part["text"].is_string()) {
      append(text, part["text"].get<std::string>());
      has_text = true;
    }
  }
  if (has_text) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// Reasoning item text: its reasoning_text content, else its summary's texts.
std::string reasoning_item_text(const ojson& item) {
  std::string text;
  if (const ojson* c = get(item, "content"); c && c->is_array())
    for (const ojson& part : *c)
      if (part.is_object() && part.value("type", "") == "reasoning_text") append(text, part.value("text", ""));
  if (!text.empty()) return text;
  if (const ojson* s = get(item, "summary"); s && s->is_array())
    for (const ojson& part : *s)
      if (part.is_object()) append(text, part.value("text", ""));
  return text;
}

// One input item, checked; returned as it will be kept (a message without "type" gets it).
ojson read_item(const ojson& item, const std::string& at) {
  std::string type = type_of(item, at);
  if (type.empty() && item.contains("role")) type = "message";
  if (type == "message") {
    only(item, at, {"type", "role", "content", "id", "status"});
    const std::string role = string_at(item, "role", at, true);
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      fail(at + ".role", "must be \"user\", \"system\", \"developer\" or \"assistant\", not \"" + role + "\"");
    const ojson* content = get(item, "content");
    if (!content) fail(at + ".content", "is required");
    check_content(*content, at + ".content", role == "user");
    string_at(item, "id", at, false);
    string_at(item, "status", at, false);
    ojson out = item;
    out["type"] = "message";
    return out;
  }
  if (type == "function_call") {
    only(item, at, {"type", "call_id", "name", "arguments", "id", "status"});
    if (string_at(item, "call_id", at, true).empty()) fail(at + ".call_id", "must not be empty");
    if (string_at(item, "name", at, true).empty()) fail(at + ".name", "must not be empty");
    const ojson args = ojson::parse(string_at(item, "arguments", at, true), nullptr, false);
    if (!args.is_object()) fail(at + ".arguments", "must be a string holding a JSON object");
    string_at(item, "id", at, false);
    string_at(item, "status", at, false);
    return item;
  }
  if (type == "function_call_output") {
    only(item, at, {"type", "call_id", "output", "id", "status"});
    if (string_at(item, "call_id", at, true).empty()) fail(at + ".call_id", "must not be empty");
    const ojson* output = get(item, "output");
    if (!output) fail(at + ".output", "is required");
    check_content(*output, at + ".output");
    string_at(item, "id", at, false);
    string_at(item, "status", at, false);
    return item;
  }
  if (type == "reasoning") {
    // Encrypted content is another model's (or OpenAI's) sealed reasoning: accepted and dropped.
    only(item, at, {"type", "id", "summary", "content", "encrypted_content", "status"});
    for (const char* key : {"summary", "content"}) {
      const ojson* parts = get(item, key);
      if (!parts) continue;
      if (!parts->is_array()) fail(join(at, key), "must be a list, not " + kind_of(*parts));
      for (size_t k = 0; k < parts->size(); ++k) {
        const std::string pat = join(at, key) + "[" + std::to_string(k) + "]";
        const std::string t = type_of((*parts)[k], pat);
        const char* want = std::string(key) == "summary" ? "summary_text" : "reasoning_text";
        if (t != want) fail(pat + ".type", std::string("must be \"") + want + "\"");
        only((*parts)[k], pat, {"type", "text"});
        string_at((*parts)[k], "text", pat, true);
      }
    }
    string_at(item, "encrypted_content", at, false);
    return item;
  }
  if (type.empty()) fail(at + ".type", "is required (or a message's \"role\")");
  fail(at, "is a '" + type + "' item, which this server does not support (message, function_call, "
           "function_call_output and reasoning items are)");
}

ojson read_input(const ojson& input) {
  ojson items = ojson::array();
  if (input.is_string()) {
    items.push_back({{"type", "message"}, {"role", "user"}, {"content", input}});
    return items;
  }
  if (!input.is_array()) fail("input", "must be a string or a list of items, not " + kind_of(input));
  for (size_t i = 0; i < input.size(); ++i) items.push_back(read_item(input[i], "input[" + std::to_string(i) + "]"));
  return items;
}

// Hosted tools: nothing runs them here.
bool hosted_tool(const std::string& type) {
  for (const char* t : {"web_search", "web_search_preview", "file_search", "computer_use_preview", "computer_use",
                        "code_interpreter", "image_generation", "mcp", "local_shell", "shell", "apply_patch"})
    if (type == t || type.rfind(std::string(t) + "_20", 0) == 0) return true;
  return false;
}

// tools: function tools, as the chat route's; the echo keeps their Responses shape.
void read_tools(const ojson& tools, ResponsesRequest& r) {
  if (!tools.is_array()) fail("tools", "must be an array, not " + kind_of(tools));
  ojson chat = ojson::array(), echo = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    const std::string type = type_of(t, at);
    if (hosted_tool(type))
      fail(at, "is a '" + type + "' tool, which this server does not run (only function tools are supported)");
    if (type != "function")
      fail(at + ".type", "must be \"function\", not \"" + type + "\" (only function tools are supported)");
    only(t, at, {"type", "name", "description", "parameters", "strict"});
    const std::string name = string_at(t, "name", at, true);
    if (name.empty()) fail(at + ".name", "must not be empty");
    if (const ojson* s = get(t, "strict"); s && !s->is_boolean()) fail(at + ".strict", "must be a boolean");
    const ojson* params = get(t, "parameters");
    if (params && !params->is_object()) fail(at + ".parameters", "must be a JSON Schema object");
    ojson f = {{"name", name}};
    if (get(t, "description")) f["description"] = string_at(t, "description", at, false);
    f["parameters"] = params ? *params : ojson({{"type", "object"}, {"properties", ojson::object()}});
    chat.push_back({{"type", "function"}, {"function", f}});
    echo.push_back({{"type", "function"},
                    {"name", name},
                    {"description", f.contains("description") ? f["description"] : ojson(nullptr)},
                    {"parameters", f["parameters"]},
                    {"strict", get(t, "strict") ? (*get(t, "strict")) : ojson(true)}});
  }
  if (!chat.empty()) r.chat["tools"] = chat;
  r.echo["tools"] = echo;
}

void read_tool_choice(const ojson& tc, ResponsesRequest& r) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s != "auto" && s != "none" && s != "required")
      fail("tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}, not \"" + s + "\"");
    r.chat["tool_choice"] = s;
    r.echo["tool_choice"] = s;
    return;
  }
  const std::string type = type_of(tc, "tool_choice");
  if (type != "function")
    fail("tool_choice.type", "must be \"function\", not \"" + type + "\" (no hosted tools or allowed_tools here)");
  only(tc, "tool_choice", {"type", "name"});
  const std::string name = string_at(tc, "name", "tool_choice", true);
  r.chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
  r.echo["tool_choice"] = {{"type", "function"}, {"name", name}};
}

// text: format through the chat route's response_format; verbosity "medium" (the default)
// only.
void read_text(const ojson& text, ResponsesRequest& r) {
  if (!text.is_object()) fail("text", "must be an object, not " + kind_of(text));
  only(text, "text", {"format", "verbosity"});
  ojson echo = {{"format", {{"type", "text"}}}};
  if (const ojson* v = get(text, "verbosity")) {
    if (*v != "medium") fail("text.verbosity", "must be \"medium\": the reply's length is the model's");
    echo["verbosity"] = "medium";
  }
  if (const ojson* f = get(text, "format")) {
    const std::string type = type_of(*f, "text.format");
    if (type == "text") {
      only(*f, "text.format", {"type"});
    } else if (type == "json_object") {
      only(*f, "text.format", {"type"});
      r.chat["response_format"] = {{"type", "json_object"}};
    } else if (type == "json_schema") {
      only(*f, "text.format", {"type", "name", "schema", "strict", "description"});
      const std::string name = string_at(*f, "name", "text.format", true);
      string_at(*f, "description", "text.format", false);
      const ojson* schema = get(*f, "schema");
      if (!schema || !schema->is_object()) fail("text.format.schema", "is required and must be a JSON Schema object");
      ojson js = {{"name", name}, {"schema", *schema}};
      if (const ojson* s = get(*f, "strict")) {
        if (!s->is_boolean()) fail("text.format.strict", "must be a boolean");
        js["strict"] = *s;
      }
      r.chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
    } else {
      fail("text.format.type", "must be \"text\", \"json_schema\" or \"json_object\", not \"" + type + "\"");
    }
    echo["format"] = *f;
  }
  r.echo["text"] = echo;
}

// reasoning: effort turns the template's thinking on or off (Qwen3's enable_thinking); summary
// returns the thinking as summary_text instead of reasoning_text.
void read_reasoning(const ojson& reasoning, ResponsesRequest& r) {
  if (!reasoning.is_object()) fail("reasoning", "must be an object, not " + kind_of(reasoning));
  only(reasoning, "reasoning", {"effort", "summary", "generate_summary"});
  ojson echo = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* e = get(reasoning, "effort")) {
    const std::string effort = e->is_string() ? e->get<std::string>() : "";
    const bool off = effort == "none" || effort == "minimal";
    if (!off && effort != "low" && effort != "medium" && effort != "high" && effort != "xhigh")
      fail("reasoning.effort", "must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
    r.chat["chat_template_kwargs"] = {{"enable_thinking", !off}};
    echo["effort"] = effort;
  }
  for (const char* key : {"summary", "generate_summary"}) {
    const ojson* s = get(reasoning, key);
    if (!s) continue;
    const std::string v = s->is_string() ? s->get<std::string>() : "";
    if (v != "auto" && v != "concise" && v != "detailed")
      fail(std::string("reasoning.") + key, "must be \"auto\", \"concise\" or \"detailed\"");
    r.reasoning_summary = true;
    echo["summary"] = v;
  }
  r.echo["reasoning"] = echo;
}

void read_metadata(const ojson& m, ResponsesRequest& r) {
  if (!m.is_object()) fail("metadata", "must be an object of strings, not " + kind_of(m));
  if (m.size() > 16) fail("metadata", "may hold at most 16 keys");
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string at = "metadata." + it.key();
    if (it.key().size() > 64) fail(at, "is a key longer than 64 characters");
    if (!it->is_string()) fail(at, "must be a string, not " + kind_of(*it));
    if (it->get<std::string>().size() > 512) fail(at, "must be at most 512 characters");
  }
  r.echo["metadata"] = m;
}

}  // namespace responses
}  // namespace

ResponsesRequest read_responses_request(const nlohmann::ordered_json& body) {
  using namespace responses;
  if (!body.is_object()) throw bad_request("the request body must be a JSON object, not " + kind_of(body));
  only(body, "", {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
                  "temperature", "top_p", "text", "reasoning", "stream", "store", "previous_response_id", "metadata",
                  "user", "safety_identifier", "prompt_cache_key", "truncation", "include", "background",
                  "stream_options"});
  // Scalars are checked by the chat route's readers, under the Responses names.
  const json plain = json::parse(body.dump());
  ResponsesRequest r;
  ojson& echo = r.echo;
  echo = {{"instructions", nullptr},
          {"max_output_tokens", nullptr},
          {"parallel_tool_calls", true},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", true},
          {"temperature", nullptr},
          {"text", {{"format", {{"type", "text"}}}}},
          {"tool_choice", "auto"},
          {"tools", ojson::array()},
          {"top_p", nullptr},
          {"truncation", "disabled"},
          {"user", nullptr},
          {"metadata", ojson::object()}};
  if (auto model = string_field(plain, "model")) r.chat["model"] = *model;
  const ojson* input = get(body, "input");
  if (!input) fail("input", "is required (a string, or a list of items)");
  r.input = read_input(*input);
  if (const ojson* i = get(body, "instructions")) {
    if (!i->is_string()) fail("instructions", "must be a string, not " + kind_of(*i));
    r.instructions = i->get<std::string>();
    echo["instructions"] = r.instructions;
  }
  if (const ojson* t = get(body, "tools")) read_tools(*t, r);
  if (const ojson* tc = get(body, "tool_choice")) read_tool_choice(*tc, r);
  if (auto p = bool_field(plain, "parallel_tool_calls")) {
    r.chat["parallel_tool_calls"] = *p;
    echo["parallel_tool_calls"] = *p;
  }
  if (auto m = int_field(plain, "max_output_tokens", 1, int64_t(1) << 31)) {
    r.chat["max_tokens"] = *m;
    echo["max_output_tokens"] = *m;
  }
  if (auto t = number_field(plain, "temperature", 0, 2)) r.chat["temperature"] = *t;
  if (auto p = number_field(plain, "top_p", 0, 1)) {
    if (*p <= 0) fail("top_p", "must be in (0, 1]");
    r.chat["top_p"] = *p;
  }
  if (const ojson* t = get(body, "text")) read_text(*t, r);
  if (const ojson* rs = get(body, "reasoning")) read_reasoning(*rs, r);
  r.stream = bool_field(plain, "stream").value_or(false);
  if (r.stream) r.chat["stream"] = true;
  if (const ojson* so = get(body, "stream_options")) {
    // include_obfuscation pads delta events against length side channels; nothing is padded here.
    if (!so->is_object()) fail("stream_options", "must be an object, not " + kind_of(*so));
    only(*so, "stream_options", {"include_obfuscation"});
    bool_field(json::parse(so->dump()), "include_obfuscation");
  }
  r.store = bool_field(plain, "store").value_or(true);
  echo["store"] = r.store;
  if (auto prev = string_field(plain, "previous_response_id")) {
    if (prev->empty()) fail("previous_response_id", "must not be empty");
    r.previous_response_id = *prev;
    echo["previous_response_id"] = *prev;
  }
  if (const ojson* m = get(body, "metadata")) read_metadata(*m, r);
  if (auto user = string_field(plain, "user")) echo["user"] = *user;
  string_field(plain, "safety_identifier");
  string_field(plain, "prompt_cache_key");
  if (auto t = string_field(plain, "truncation"); t && *t != "disabled")
    fail("truncation", "must be \"disabled\": a conversation longer than the context is a 400, never cut");
  if (const ojson* inc = get(body, "include")) {
    if (!inc->is_array()) fail("include", "must be a list of strings, not " + kind_of(*inc));
    for (const ojson& v : *inc)
      if (v != "reasoning.encrypted_content")
        fail("include", "may hold only \"reasoning.encrypted_content\" (which adds nothing here), not " + v.dump());
  }
  if (auto b = bool_field(plain, "background"); b && *b)
    fail("background", "is not supported: a response runs while its request waits");
  return r;
}

nlohmann::ordered_json responses_chat_messages(const std::string& instructions, const nlohmann::ordered_json& items) {
  using namespace responses;
  ojson out = ojson::array();
  if (!instructions.empty()) out.push_back({{"role", "system"}, {"content", instructions}});
  std::string reasoning;  // a reasoning item's text, for the next assistant message
  auto assistant = [&](std::string content) {
    ojson m = {{"role", "assistant"}, {"content", std::move(content)}};
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    reasoning.clear();
    out.push_back(std::move(m));
  };
  for (const ojson& item : items) {
    const std::string type = item.value("type", "message");
    if (type == "message") {
      std::string role = item.value("role", "user");
      if (role == "assistant") {
        assistant(content_text(item.value("content", ojson(""))));
        continue;
      }
      reasoning.clear();
      out.push_back({{"role", role == "developer" ? "system" : role}, {"content", chat_content(item.value("content", ojson("")))}});
    } else if (type == "function_call") {
      if (out.empty() || out.back()["role"] != "assistant" || !reasoning.empty()) assistant("");
      ojson& m = out.back();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back({{"id", item.value("call_id", "")},
                                 {"type", "function"},
                                 {"function", {{"name", item.value("name", "")}, {"arguments", item.value("arguments", "{}")}}}});
    } else if (type == "function_call_output") {
      reasoning.clear();
      out.push_back({{"role", "tool"},
                     {"tool_call_id", item.value("call_id", "")},
                     {"content", content_text(item.value("output", ojson("")))}});
    } else if (type == "reasoning") {
      append(reasoning, reasoning_item_text(item));
    }
  }
  return out;
}

nlohmann::ordered_json responses_conversation(const ResponsesRequest& r, const StoredResponse* previous) {
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  if (previous) {
    items = previous->input;
    if (auto it = previous->response.find("output"); it != previous->response.end())
      for (const auto& item : *it) items.push_back(item);
  }
  for (const auto& item : r.input) items.push_back(item);
  return items;
}

ApiError response_not_found(const std::string& id, const std::string& param) {
  ApiError e;
  e.status = 404;
  e.message = "Response with id '" + id + "' not found.";
  e.param = param;
  e.code = param == "previous_response_id" ? "previous_response_not_found" : "response_not_found";
  return e;
}

nlohmann::ordered_json responses_chat_request(const ResponsesRequest& r, const nlohmann::ordered_json& items) {
  nlohmann::ordered_json chat = {{"messages", responses_chat_messages(r.instructions, items)}};
  for (auto it = r.chat.begin(); it != r.chat.end(); ++it) chat[it.key()] = *it;
  return chat;
}

std::string responses_event(const nlohmann::ordered_json& data) {
  return "event: " + data.value("type", std::string("error")) + "\ndata: " +
         data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

ResponsesReply::ResponsesReply(std::string id, int64_t created_at, std::string model, nlohmann::ordered_json echo,
                               bool reasoning_summary)
    : id_(std::move(id)),
      suffix_(id_.rfind("resp_", 0) == 0 ? id_.substr(5) : id_),
      model_(std::move(model)),
      created_at_(created_at),
      echo_(std::move(echo)),
      summary_(reasoning_summary) {}

nlohmann::ordered_json ResponsesReply::response() const {
  using ojson = nlohmann::ordered_json;
  auto e = [&](const char* key) { return echo_.contains(key) ? echo_[key] : ojson(nullptr); };
  return {{"id", id_},
          {"object", "response"},
          {"created_at", created_at_},
          {"status", status_},
          {"background", false},
          {"error", nullptr},
          {"incomplete_details", incomplete_},
          {"instructions", e("instructions")},
          {"max_output_tokens", e("max_output_tokens")},
          {"max_tool_calls", nullptr},
          {"model", model_},
          {"output", output_},
          {"parallel_tool_calls", e("parallel_tool_calls")},
          {"previous_response_id", e("previous_response_id")},
          {"reasoning", e("reasoning")},
          {"store", e("store")},
          {"temperature", e("temperature")},
          {"text", e("text")},
          {"tool_choice", e("tool_choice")},
          {"tools", e("tools")},
          {"top_p", e("top_p")},
          {"truncation", e("truncation")},
          {"usage", usage_},
          {"user", e("user")},
          {"metadata", e("metadata")}};
}

std::string ResponsesReply::event(const char* type, nlohmann::ordered_json data) {
  nlohmann::ordered_json e = {{"type", type}};
  for (auto it = data.begin(); it != data.end(); ++it) e[it.key()] = std::move(*it);
  e["sequence_number"] = sequence_++;
  return responses_event(e);
}

std::string ResponsesReply::start() {
  std::string out = event("response.created", {{"response", response()}});  // numbered first
  return out + event("response.in_progress", {{"response", response()}});
}

std::string ResponsesReply::open(Item kind, nlohmann::ordered_json item) {
  using ojson = nlohmann::ordered_json;
  std::string out = close(false);
  open_ = kind;
  part_.clear();
  const int64_t index = int64_t(output_.size());
  const std::string item_id = item["id"];
  output_.push_back(item);
  out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  if (kind == Item::message)
    out += event("response.content_part.added",
                 {{"item_id", item_id},
                  {"output_index", index},
                  {"content_index", 0},
                  {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
  else if (kind == Item::reasoning && summary_)
    out += event("response.reasoning_summary_part.added",
                 {{"item_id", item_id},
                  {"output_index", index},
                  {"summary_index", 0},
                  {"part", {{"type", "summary_text"}, {"text", ""}}}});
  else if (kind == Item::reasoning)
    out += event("response.content_part.added", {{"item_id", item_id},
                                                 {"output_index", index},
                                                 {"content_index", 0},
                                                 {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  return out;
}

std::string ResponsesReply::close(bool cut) {
  using ojson = nlohmann::ordered_json;
  if (open_ == Item::none) return "";
  const int64_t index = int64_t(output_.size()) - 1;
  ojson& item = output_.back();
  const std::string item_id = item["id"];
  std::string out;
  if (open_ == Item::message) {
    const ojson part = {{"type", "output_text"}, {"text", part_}, {"annotations", ojson::array()}};
    out += event("response.output_text.done", {{"item_id", item_id},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"text", part_},
                                               {"logprobs", ojson::array()}});
    out += event("response.content_part.done",
                 {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = ojson::array({part});
    item["status"] = cut ? "incomplete" : "completed";
  } else if (open_ == Item::reasoning && summary_) {
    const ojson part = {{"type", "summary_text"}, {"text", part_}};
    out += event("response.reasoning_summary_text.done",
                 {{"item_id", item_id}, {"output_index", index}, {"summary_index", 0}, {"text", part_}});
    out += event("response.reasoning_summary_part.done",
                 {{"item_id", item_id}, {"output_index", index}, {"summary_index", 0}, {"part", part}});
    item["summary"] = ojson::array({part});
  } else if (open_ == Item::reasoning) {
    const ojson part = {{"type", "reasoning_text"}, {"text", part_}};
    out += event("response.reasoning_text.done",
                 {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", part_}});
    out += event("response.content_part.done",
                 {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = ojson::array({part});
  } else {
    // A call's arguments are a JSON object; one cut short is returned as it stands.
    out += event("response.function_call_arguments.done",
                 {{"item_id", item_id}, {"output_index", index}, {"name", item["name"]}, {"arguments", part_}});
    item["arguments"] = part_;
    item["status"] = cut ? "incomplete" : "completed";
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Item::none;
  part_.clear();
  return out;
}

std::string ResponsesReply::push(const std::string& reasoning, const std::string& text,
                                 const std::vector<ToolCall>& calls) {
  using ojson = nlohmann::ordered_json;
  std::string out;
  auto index = [&] { return int64_t(output_.size()) - 1; };
  auto item_id = [&]() -> std::string { return output_.back()["id"]; };
  if (!reasoning.empty()) {
    if (open_ != Item::reasoning) {
      ojson item = {{"id", "rs_" + suffix_ + "_" + std::to_string(output_.size())}, {"type", "reasoning"},
                    {"summary", ojson::array()}};
      if (!summary_) item["content"] = ojson::array();
      out += open(Item::reasoning, item);
    }
    part_ += reasoning;
    reasoning_text_ += reasoning;
    if (summary_)
      out += event("response.reasoning_summary_text.delta",
                   {{"item_id", item_id()}, {"output_index", index()}, {"summary_index", 0}, {"delta", reasoning}});
    else
      out += event("response.reasoning_text.delta",
                   {{"item_id", item_id()}, {"output_index", index()}, {"content_index", 0}, {"delta", reasoning}});
  }
  if (!text.empty()) {
    if (open_ != Item::message)
      out += open(Item::message, {{"id", "msg_" + suffix_ + "_" + std::to_string(output_.size())},
                                  {"type", "message"},
                                  {"status", "in_progress"},
                                  {"role", "assistant"},
                                  {"content", ojson::array()}});
    part_ += text;
    out += event("response.output_text.delta", {{"item_id", item_id()},
                                                {"output_index", index()},
                                                {"content_index", 0},
                                                {"delta", text},
                                                {"logprobs", ojson::array()}});
  }
  for (const ToolCall& c : calls) {
    if (!c.id.empty()) {
      const std::string tail = c.id.rfind("call_", 0) == 0 ? c.id.substr(5) : c.id;
      out += open(Item::function_call, {{"id", "fc_" + tail},
                                        {"type", "function_call"},
                                        {"status", "in_progress"},
                                        {"arguments", ""},
                                        {"call_id", c.id},
                                        {"name", c.name}});
      call_ = c.index;
    }
    // A call's pieces follow its start, before the next call's (the reply's text is in order).
    if (!c.arguments.empty() && open_ == Item::function_call && c.index == call_) {
      part_ += c.arguments;
      out += event("response.function_call_arguments.delta",
                   {{"item_id", item_id()}, {"output_index", index()}, {"delta", c.arguments}});
    }
  }
  return out;
}

std::string ResponsesReply::finish(bool cut, const ResponsesUsage& usage) {
  std::string out = close(cut);
  status_ = cut ? "incomplete" : "completed";
  if (cut) incomplete_ = {{"reason", "max_output_tokens"}};
  usage_ = {{"input_tokens", usage.n_prompt},
            {"input_tokens_details", {{"cached_tokens", usage.n_cached}}},
            {"output_tokens", usage.n_output},
            {"output_tokens_details", {{"reasoning_tokens", usage.n_reasoning}}},
            {"total_tokens", usage.n_prompt + usage.n_output}};
  return out + event(cut ? "response.incomplete" : "response.completed", {{"response", response()}});
}

std::string ResponsesReply::error(const ApiError& e) {
  return event("error", {{"code", e.code.empty() ? nlohmann::ordered_json(e.type) : nlohmann::ordered_json(e.code)},
                         {"message", e.message},
                         {"param", e.param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.param)}});
}

}  // namespace osprey
