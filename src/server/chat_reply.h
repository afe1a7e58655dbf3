#pragma once
// A chat reply as its client reads it: the generated text split into reasoning, content and
// tool calls, incrementally (for streaming) or whole.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/reasoning.h"
#include "server/tool_calls.h"

namespace osprey {

struct ChatReplyDelta {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

// The text runs through the reasoning split first (when on), then the tool-call parser over
// what is content (when on): a call written after the reasoning block parses; one written
// inside it stays reasoning. Not thread-safe.
class ChatReplyParser {
 public:
  ChatReplyParser(std::optional<ReasoningParser> reasoning, std::optional<ToolCallParser> tools);
  ChatReplyDelta push(const std::string& text);
  ChatReplyDelta finish();

 private:
  void tools_push(ChatReplyDelta& d, const std::string& content, bool at_end);

  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tools_;
};

}  // namespace osprey
