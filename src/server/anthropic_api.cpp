#include "server/anthropic_api.h"

#include <algorithm>
#include <initializer_list>

#include "server/completion_request.h"
#include "server/request_fields.h"

namespace osprey {
namespace {
// A namespace of its own: the library is built in unity batches, where the anonymous
// namespaces of other server files share this translation unit.
namespace anthropic {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

using namespace request_fields;  // kind_of, fail, join, get, string_at, only

std::string block_type(const ojson& b, const std::string& at) {
  if (!b.is_object()) fail(at, "must be a content block object, not " + kind_of(b));
  const ojson* t = get(b, "type");
  if (!t || !t->is_string()) fail(at + ".type", "is required and must be a string");
  return t->get<std::string>();
}

// Blocks that carry documents or server-side tool results, and images outside a user turn's
// content: no server tool runs here.
[[noreturn]] void refuse_block(const std::string& type, const std::string& at) {
  if (type == "image") fail(at, "is an 'image' block: images are read in a user message's content only");
  if (type == "document" || type == "search_result" || type == "container_upload")
    fail(at, "is a '" + type + "' block: this server reads text and images only");
  fail(at, "is a '" + type + "' block, which this server does not support");
}

// A text block's text: cache_control is accepted without effect; citations are refused.
std::string text_block(const ojson& b, const std::string& at) {
  only(b, at, {"type", "text", "cache_control", "citations"});
  if (const ojson* c = get(b, "citations"); c && !(c->is_array() && c->empty()))
    fail(at + ".citations", "is not supported (no documents are cited here)");
  return string_at(b, "text", at, true);
}

void append(std::string& to, const std::string& text) {
  if (!to.empty()) to += "\n";
  to += text;
}

// An image block as the chat route's image_url part, its base64 as a data: URL; the part keeps
// the block's place, which the image's errors name (server/image_parts.h, `converted`).
ojson image_block(const ojson& b, const std::string& at) {
  only(b, at, {"type", "source", "cache_control"});
  const ojson* src = get(b, "source");
  if (!src) fail(at + ".source", "is required");
  if (!src->is_object()) fail(at + ".source", "must be an object, not " + kind_of(*src));
  const std::string type = string_at(*src, "type", at + ".source", true);
  if (type == "url" || type == "file")
    fail(at + ".source.type", "is \"" + type + "\": this server fetches nothing; send the image as {\"type\": \"base64\", "
                              "\"media_type\", \"data\"}");
  if (type != "base64") fail(at + ".source.type", "must be \"base64\", not \"" + type + "\"");
  only(*src, at + ".source", {"type", "media_type", "data"});
  const std::string media = string_at(*src, "media_type", at + ".source", true);
  const std::string data = string_at(*src, "data", at + ".source", true);
  return {{"type", "image_url"}, {"image_url", {{"url", "data:" + media + ";base64," + data}}}, {"at", at}};
}

// A string, or a list of text blocks joined by newlines (as the chat route joins text parts).
std::string text_content(const ojson& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) fail(at, "must be a string or a list of text blocks, not " + kind_of(content));
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string bat = at + "[" + std::to_string(k) + "]";
    const std::string type = block_type(content[k], bat);
    if (type != "text") refuse_block(type, bat);
    append(text, text_block(content[k], bat));
  }
  return text;
}

// A user turn: its text blocks become user messages, each tool_result block a tool message, in
// the order sent.
void read_user(const ojson& content, const std::string& at, ojson& out) {
  if (content.is_string()) {
    out.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  // Text blocks in a row join into one text (by newlines); with images among them, the message's
  // content is a list of text and image parts in the order sent.
  std::string text;
  bool has_text = false, any = false;
  ojson parts = ojson::array();
  auto end_text = [&] {
    if (has_text) parts.push_back({{"type", "text"}, {"text", text}});
    text.clear();
    has_text = false;
  };
  auto flush = [&] {
    const bool images = !parts.empty();
    if (!has_text && !images) return;
    if (images) {
      end_text();
      out.push_back({{"role", "user"}, {"content", parts}});
    } else {
      out.push_back({{"role", "user"}, {"content", text}});
    }
    parts = ojson::array();
    text.clear();
    has_text = false;
    any = true;
  };
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& b = content[k];
    const std::string bat = at + "[" + std::to_string(k) + "]";
    const std::string type = block_type(b, bat);
    if (type == "text") {
      append(text, text_block(b, bat));
      has_text = true;
    } else if (type == "image") {
      end_text();
      parts.push_back(image_block(b, bat));
    } else if (type == "tool_result") {
      only(b, bat, {"type", "tool_use_id", "content", "is_error", "cache_control"});
      const std::string id = string_at(b, "tool_use_id", bat, true);
      std::string result;
      if (const ojson* c = get(b, "content")) result = text_content(*c, bat + ".content");
      if (const ojson* e = get(b, "is_error")) {
        if (!e->is_boolean()) fail(bat + ".is_error", "must be a boolean, not " + kind_of(*e));
        // Chat templates have no place for the flag: the result says it.
        if (e->get<bool>()) result = result.empty() ? "Error" : "Error: " + result;
      }
      flush();
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      any = true;
    } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      fail(bat, "is a '" + type + "' block, which only an assistant message may hold");
    } else {
      refuse_block(type, bat);
    }
  }
  flush();
  if (!any) out.push_back({{"role", "user"}, {"content", ""}});
}

// An assistant turn: text blocks become its content, thinking blocks its reasoning_content
// (where a chat template reads it), tool_use blocks its tool_calls. redacted_thinking is
// dropped (its data is another model's encrypted reasoning).
void read_assistant(const ojson& content, const std::string& at, ojson& out) {
  if (content.is_string()) {
    out.push_back({{"role", "assistant"}, {"content", content}});
    return;
  }
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& b = content[k];
    const std::string bat = at + "[" + std::to_string(k) + "]";
    const std::string type = block_type(b, bat);
    if (type == "text") {
      append(text, text_block(b, bat));
    } else if (type == "thinking") {
      only(b, bat, {"type", "thinking", "signature"});
      string_at(b, "signature", bat, false);
      append(reasoning, string_at(b, "thinking", bat, true));
    } else if (type == "redacted_thinking") {
      only(b, bat, {"type", "data"});
      string_at(b, "data", bat, false);
    } else if (type == "tool_use") {
      only(b, bat, {"type", "id", "name", "input", "cache_control", "caller"});
      if (const ojson* c = get(b, "caller"); c && !(c->is_object() && c->value("type", ojson()) == "direct"))
        fail(bat + ".caller", "must be {\"type\": \"direct\"}: no server tool calls tools here");
      const std::string id = string_at(b, "id", bat, true);
      const std::string name = string_at(b, "name", bat, true);
      const ojson* input = get(b, "input");
      if (!input || !input->is_object()) fail(bat + ".input", "is required and must be an object");
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *input}}}});
    } else if (type == "tool_result") {
      fail(bat, "is a 'tool_result' block, which only a user message may hold");
    } else {
      refuse_block(type, bat);
    }
  }
  ojson m = {{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = calls;
  out.push_back(m);
}

ojson read_messages(const ojson& body) {
  ojson out = ojson::array();
  if (const ojson* system = get(body, "system")) {
    const std::string text = text_content(*system, "system");
    if (!text.empty()) out.push_back({{"role", "system"}, {"content", text}});
  }
  const ojson* msgs = get(body, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty()) fail("messages", "is required and must be a non-empty array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) fail(at, "must be an object, not " + kind_of(m));
    only(m, at, {"role", "content"});
    const std::string role = string_at(m, "role", at, true);
    const ojson* content = get(m, "content");
    if (!content) fail(at + ".content", "is required");
    if (!content->is_string() && !content->is_array())
      fail(at + ".content", "must be a string or a list of content blocks, not " + kind_of(*content));
    if (role == "user") {
      read_user(*content, at + ".content", out);
    } else if (role == "assistant") {
      if (i + 1 == msgs->size())
        fail(at, "is an assistant message at the end of 'messages' (a prefilled reply), which this server does not "
                 "continue; end with a user message");
      read_assistant(*content, at + ".content", out);
    } else if (role == "system") {
      out.push_back({{"role", "system"}, {"content", text_content(*content, at + ".content")}});
    } else {
      fail(at + ".role", "must be \"user\" or \"assistant\", not \"" + role + "\"");
    }
  }
  return out;
}

// tools: custom tools only, as OpenAI function tools.
ojson read_tools(const ojson& tools) {
  if (!tools.is_array()) fail("tools", "must be an array, not " + kind_of(tools));
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) fail(at, "must be an object, not " + kind_of(t));
    if (const ojson* type = get(t, "type"); type && *type != "custom")
      fail(at + ".type", "is " + type->dump() + ": only custom tools (name, description, input_schema) run here");
    only(t, at, {"type", "name", "description", "input_schema", "cache_control", "strict", "eager_input_streaming"});
    if (const ojson* s = get(t, "strict"); s && *s != false)
      fail(at + ".strict", "is not supported: a call's input follows input_schema exactly only when tool_choice is "
                           "\"any\" or \"tool\"");
    if (const ojson* e = get(t, "eager_input_streaming"); e && !e->is_boolean())
      fail(at + ".eager_input_streaming", "must be a boolean");
    const std::string name = string_at(t, "name", at, true);
    if (name.empty()) fail(at + ".name", "must not be empty");
    const ojson* schema = get(t, "input_schema");
    if (!schema || !schema->is_object()) fail(at + ".input_schema", "is required and must be a JSON Schema object");
    ojson f = {{"name", name}};
    if (get(t, "description")) f["description"] = string_at(t, "description", at, false);
    f["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

// tool_choice into the chat route's tool_choice and parallel_tool_calls.
void read_tool_choice(const ojson& tc, ojson& out) {
  if (!tc.is_object()) fail("tool_choice", "must be an object {\"type\": ...}, not " + kind_of(tc));
  const std::string type = string_at(tc, "type", "tool_choice", true);
  if (type == "none") {
    only(tc, "tool_choice", {"type"});
    out["tool_choice"] = "none";
    return;
  }
  if (type == "tool")
    only(tc, "tool_choice", {"type", "name", "disable_parallel_tool_use"});
  else
    only(tc, "tool_choice", {"type", "disable_parallel_tool_use"});
  if (type == "auto")
    out["tool_choice"] = "auto";
  else if (type == "any")
    out["tool_choice"] = "required";
  else if (type == "tool")
    out["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_at(tc, "name", "tool_choice", true)}}}};
  else
    fail("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", not \"" + type + "\"");
  if (const ojson* d = get(tc, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) fail("tool_choice.disable_parallel_tool_use", "must be a boolean");
    if (d->get<bool>()) out["parallel_tool_calls"] = false;
  }
}

// thinking: on or off through the template's enable_thinking (Qwen3's switch); the reply's
// reasoning comes back as thinking blocks either way.
void read_thinking(const ojson& t, const ojson* max_tokens, ojson& out) {
  if (!t.is_object()) fail("thinking", "must be an object {\"type\": ...}, not " + kind_of(t));
  const std::string type = string_at(t, "type", "thinking", true);
  if (type == "disabled") {
    only(t, "thinking", {"type"});
    out["chat_template_kwargs"] = {{"enable_thinking", false}};
    return;
  }
  if (type != "enabled" && type != "adaptive")
    fail("thinking.type", "must be \"enabled\", \"adaptive\" or \"disabled\", not \"" + type + "\"");
  if (type == "enabled") {
    only(t, "thinking", {"type", "budget_tokens", "display"});
    const ojson* b = get(t, "budget_tokens");
    if (!b || !b->is_number_integer()) fail("thinking.budget_tokens", "is required and must be an integer");
    if (b->get<int64_t>() < 1024) fail("thinking.budget_tokens", "must be at least 1024");
    if (max_tokens && max_tokens->is_number_integer() && b->get<int64_t>() >= max_tokens->get<int64_t>())
      fail("thinking.budget_tokens", "must be less than max_tokens");
  } else {
    only(t, "thinking", {"type", "display"});
  }
  if (const ojson* d = get(t, "display"); d && *d != "summarized")
    fail("thinking.display", "must be \"summarized\" (the thinking is returned whole)");
  out["chat_template_kwargs"] = {{"enable_thinking", true}};
}

// output_config.format: JSON matching a schema, through the chat route's response_format.
void read_output_config(const ojson& oc, ojson& out) {
  if (!oc.is_object()) fail("output_config", "must be an object, not " + kind_of(oc));
  only(oc, "output_config", {"format"});
  const ojson* f = get(oc, "format");
  if (!f) return;
  if (!f->is_object()) fail("output_config.format", "must be an object, not " + kind_of(*f));
  only(*f, "output_config.format", {"type", "schema"});
  if (string_at(*f, "type", "output_config.format", true) != "json_schema")
    fail("output_config.format.type", "must be \"json_schema\"");
  const ojson* schema = get(*f, "schema");
  if (!schema || !schema->is_object()) fail("output_config.format.schema", "is required and must be an object");
  out["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
}

}  // namespace anthropic
}  // namespace

nlohmann::ordered_json read_anthropic_request(const nlohmann::ordered_json& body, AnthropicRoute route) {
  using namespace anthropic;
  if (!body.is_object()) throw bad_request("the request body must be a JSON object, not " + kind_of(body));
  const bool generate = route == AnthropicRoute::messages;
  if (generate)
    only(body, "", {"model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature",
                    "top_p", "top_k", "tools", "tool_choice", "thinking", "cache_control", "output_config"});
  else
    only(body, "", {"model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control", "output_config"});
  // Scalars are checked by the chat route's readers, under Anthropic's names and ranges.
  const json plain = json::parse(body.dump());
  ojson out = ojson::object();
  if (auto model = string_field(plain, "model")) out["model"] = *model;
  out["messages"] = read_messages(body);
  if (generate) {
    const std::optional<int64_t> max_tokens = int_field(plain, "max_tokens", 1, int64_t(1) << 31);
    if (!max_tokens) throw bad_request("'max_tokens' is required (an integer >= 1)", "max_tokens");
    out["max_tokens"] = *max_tokens;
    if (const ojson* m = get(body, "metadata")) {
      if (!m->is_object()) fail("metadata", "must be an object, not " + kind_of(*m));
      only(*m, "metadata", {"user_id"});
      string_at(*m, "user_id", "metadata", false);
    }
    if (const ojson* s = get(body, "stop_sequences")) {
      if (!s->is_array()) fail("stop_sequences", "must be a list of strings, not " + kind_of(*s));
      if (s->size() > 16) fail("stop_sequences", "may hold at most 16 strings");
      for (const ojson& x : *s)
        if (!x.is_string() || x.get<std::string>().empty()) fail("stop_sequences", "must hold non-empty strings");
      if (!s->empty()) out["stop"] = *s;
    }
    if (auto stream = bool_field(plain, "stream")) out["stream"] = *stream;
    if (auto t = number_field(plain, "temperature", 0, 1)) out["temperature"] = *t;
    if (auto p = number_field(plain, "top_p", 0, 1)) {
      if (*p <= 0) fail("top_p", "must be in (0, 1]");
      out["top_p"] = *p;
    }
    if (auto k = int_field(plain, "top_k", 0, 1 << 30)) out["top_k"] = *k;
  }
  if (const ojson* c = get(body, "cache_control"); c && !c->is_object())
    fail("cache_control", "must be an object, not " + kind_of(*c));
  if (const ojson* t = get(body, "tools")) {
    ojson tools = read_tools(*t);
    if (!tools.empty()) out["tools"] = tools;
  }
  if (const ojson* tc = get(body, "tool_choice")) read_tool_choice(*tc, out);
  if (const ojson* t = get(body, "thinking")) read_thinking(*t, get(body, "max_tokens"), out);
  if (const ojson* oc = get(body, "output_config")) read_output_config(*oc, out);
  return out;
}

nlohmann::ordered_json anthropic_error_body(const ApiError& e) {
  const char* type = "api_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default:
      if (e.status >= 400 && e.status < 500) type = "invalid_request_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

std::string anthropic_stop_reason(const AnthropicStop& s) {
  if (s.finish_reason == "length") return s.context_full ? "model_context_window_exceeded" : "max_tokens";
  if (!s.stop_sequence.empty()) return "stop_sequence";
  if (s.called) return "tool_use";
  return "end_turn";
}

namespace {
namespace anthropic {

ojson usage_json(const AnthropicUsage& u) {
  return {{"input_tokens", u.n_prompt - u.n_cached},
          {"output_tokens", u.n_output},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.n_cached}};
}

ojson stop_sequence_json(const AnthropicStop& s) {
  return s.stop_sequence.empty() || s.finish_reason != "stop" ? ojson(nullptr) : ojson(s.stop_sequence);
}

// A call's arguments (a JSON object as the model wrote it) as its input object.
ojson call_input(const std::string& arguments) {
  ojson input = ojson::parse(arguments, nullptr, false);
  return input.is_object() ? input : ojson::object();
}

}  // namespace anthropic
}  // namespace

nlohmann::ordered_json anthropic_message_json(const std::string& id, const std::string& model, const std::string& text,
                                              const std::string& thinking, const std::vector<ToolCall>& calls,
                                              const AnthropicStop& stop, const AnthropicUsage& usage) {
  using namespace anthropic;
  ojson content = ojson::array();
  if (!thinking.empty()) content.push_back({{"type", "thinking"}, {"thinking", thinking}, {"signature", ""}});
  if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
  for (const ToolCall& c : calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", call_input(c.arguments)}});
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", content},
          {"stop_reason", anthropic_stop_reason(stop)},
          {"stop_sequence", stop_sequence_json(stop)},
          {"usage", usage_json(usage)}};
}

std::string anthropic_event(const std::string& name, const nlohmann::ordered_json& data) {
  return "event: " + name + "\ndata: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

AnthropicEventStream::AnthropicEventStream(std::string id, std::string model)
    : id_(std::move(id)), model_(std::move(model)) {}

std::string AnthropicEventStream::start(const AnthropicUsage& usage) {
  using namespace anthropic;
  ojson message = {{"id", id_},
                   {"type", "message"},
                   {"role", "assistant"},
                   {"model", model_},
                   {"content", ojson::array()},
                   {"stop_reason", nullptr},
                   {"stop_sequence", nullptr},
                   {"usage", usage_json(usage)}};
  return anthropic_event("message_start", {{"type", "message_start"}, {"message", message}}) +
         anthropic_event("ping", {{"type", "ping"}});
}

std::string AnthropicEventStream::close() {
  if (open_ == Block::none) return "";
  open_ = Block::none;
  return anthropic_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicEventStream::open(Block kind, const nlohmann::ordered_json& content_block) {
  std::string out = close();
  open_ = kind;
  ++index_;
  return out + anthropic_event("content_block_start",
                               {{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
}

std::string AnthropicEventStream::push(const std::string& thinking, const std::string& text,
                                       const std::vector<ToolCall>& calls) {
  using namespace anthropic;
  std::string out;
  auto delta = [&](ojson d) {
    out += anthropic_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  };
  if (!thinking.empty()) {
    if (open_ != Block::thinking) out += open(Block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    delta({{"type", "thinking_delta"}, {"thinking", thinking}});
  }
  if (!text.empty()) {
    if (open_ != Block::text) out += open(Block::text, {{"type", "text"}, {"text", ""}});
    delta({{"type", "text_delta"}, {"text", text}});
  }
  for (const ToolCall& c : calls) {
    if (!c.id.empty()) {
      out += open(Block::tool_use, {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", ojson::object()}});
      call_ = c.index;
    }
    // A call's pieces follow its start, before the next call's (the reply's text is in order).
    if (!c.arguments.empty() && open_ == Block::tool_use && c.index == call_)
      delta({{"type", "input_json_delta"}, {"partial_json", c.arguments}});
  }
  return out;
}

std::string AnthropicEventStream::finish(const AnthropicStop& stop, const AnthropicUsage& usage) {
  using namespace anthropic;
  std::string out = close();
  ojson u = usage_json(usage);
  out += anthropic_event("message_delta", {{"type", "message_delta"},
                                           {"delta", {{"stop_reason", anthropic_stop_reason(stop)},
                                                      {"stop_sequence", stop_sequence_json(stop)}}},
                                           {"usage", u}});
  out += anthropic_event("message_stop", {{"type", "message_stop"}});
  return out;
}

}  // namespace osprey
