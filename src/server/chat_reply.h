#pragma once
// A chat reply as its client reads it: the generated text split into reasoning, content and
// tool calls, incrementally (for streaming) or whole.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/reasoning.h"
#include "chat/tool_calls.h"

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

// The assistant message of a whole reply: content (null when empty beside calls),
// reasoning_content when there is reasoning, tool_calls when there are calls.
nlohmann::json chat_message_json(const std::string& content, const std::string& reasoning,
                                 const std::vector<ToolCall>& calls);

// A chat stream's deltas for one step's output: reasoning and content first, then the calls'
// pieces as OpenAI streams them: a call's first piece as its index, id, type and name with empty
// arguments, every arguments fragment as its index and the fragment. n_calls: the calls begun
// before, advanced past these.
std::vector<nlohmann::json> chat_stream_deltas(const ChatReplyDelta& d, int& n_calls);

}  // namespace osprey
