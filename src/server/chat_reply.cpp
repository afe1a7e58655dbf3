#include "server/chat_reply.h"

#include <algorithm>

namespace osprey {

ChatReplyParser::ChatReplyParser(std::optional<ReasoningParser> reasoning, std::optional<ToolCallParser> tools)
    : reasoning_(std::move(reasoning)), tools_(std::move(tools)) {}

void ChatReplyParser::tools_push(ChatReplyDelta& d, const std::string& content, bool at_end) {
  if (!tools_) {
    d.content += content;
    return;
  }
  ToolCallOutput o = tools_->push(content);
  if (at_end) {
    ToolCallOutput e = tools_->finish();
    o.content += e.content;
    for (ToolCall& c : e.calls) o.calls.push_back(std::move(c));
  }
  d.content += o.content;
  for (ToolCall& c : o.calls) d.calls.push_back(std::move(c));
}

ChatReplyDelta ChatReplyParser::push(const std::string& text) {
  ChatReplyDelta d;
  if (!reasoning_) {
    tools_push(d, text, false);
    return d;
  }
  ReasoningOutput r = reasoning_->push(text);
  d.reasoning = std::move(r.reasoning);
  tools_push(d, r.content, false);
  return d;
}

ChatReplyDelta ChatReplyParser::finish() {
  ChatReplyDelta d;
  std::string content;
  if (reasoning_) {
    ReasoningOutput r = reasoning_->finish();
    d.reasoning = std::move(r.reasoning);
    content = std::move(r.content);
  }
  tools_push(d, content, true);
  return d;
}

nlohmann::json chat_message_json(const std::string& content, const std::string& reasoning,
                                 const std::vector<ToolCall>& calls) {
  using nlohmann::json;
  json m = {{"role", "assistant"}, {"content", calls.empty() || !content.empty() ? json(content) : json(nullptr)}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) {
    m["tool_calls"] = json::array();
    for (const ToolCall& t : calls)
      m["tool_calls"].push_back(
          {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
  }
  return m;
}

std::vector<nlohmann::json> chat_stream_deltas(const ChatReplyDelta& d, int& n_calls) {
  using nlohmann::json;
  std::vector<json> out;
  json first = json::object();
  if (!d.reasoning.empty()) first["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) first["content"] = d.content;
  if (!first.empty()) out.push_back(first);
  for (const ToolCall& t : d.calls) {
    n_calls = std::max(n_calls, t.index + 1);
    if (!t.id.empty())
      out.push_back({{"tool_calls", json::array({{{"index", t.index},
                                                  {"id", t.id},
                                                  {"type", "function"},
                                                  {"function", {{"name", t.name}, {"arguments", ""}}}}})}});
    if (!t.arguments.empty())
      out.push_back({{"tool_calls", json::array({{{"index", t.index}, {"function", {{"arguments", t.arguments}}}}})}});
  }
  return out;
}

}  // namespace osprey
