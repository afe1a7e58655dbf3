#include "server/chat_reply.h"

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

}  // namespace osprey
