#pragma once
// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the chat
// completions machinery: a Messages request is read into the OpenAI-shaped chat request the
// chat route runs (messages, tools, tool_choice, sampling fields), and the reply, whole or
// streamed, is written back as Anthropic's message object and event stream. See docs/server.md,
// "Anthropic Messages", for every field.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "chat/tool_calls.h"

namespace osprey {

enum class AnthropicRoute { messages, count_tokens };

// Reads a Messages (or count_tokens) request body into an OpenAI chat request: "messages"
// (system, user, assistant with tool_calls and reasoning_content, tool), and as given "model",
// "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "stop", "temperature", "top_p",
// "top_k", "stream", "chat_template_kwargs" (thinking) and "response_format"
// (output_config.format). Keys keep the client's order. Throws ApiError (400) naming the field
// (its place in the request, e.g. messages[2].content[0].source) for a missing max_tokens, a
// value of the wrong type or range, a document block, an image block outside a user turn or
// not base64 (its data is read as a chat image part: server/image_parts.h), and every field
// this server does not honour (docs/server.md lists the few accepted without effect).
nlohmann::ordered_json read_anthropic_request(const nlohmann::ordered_json& body, AnthropicRoute route);

// Anthropic's error body, {"type": "error", "error": {"type", "message"}}, its type from the
// status: 400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
// not_found_error, 413 request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error,
// other 5xx api_error.
nlohmann::ordered_json anthropic_error_body(const ApiError& e);

struct AnthropicUsage {
  int64_t n_prompt = 0;  // the whole prompt; input_tokens are those not read from the cache
  int64_t n_cached = 0;  // cache_read_input_tokens
  int64_t n_output = 0;
};

// Why a reply ended, as Anthropic names it.
struct AnthropicStop {
  std::string finish_reason;  // the engine's: "stop" or "length"
  std::string stop_sequence;  // the stop string that ended it ("" : none)
  bool context_full = false;  // "length" came from the context, not max_tokens
  bool called = false;        // the reply made tool calls
};

// end_turn, max_tokens, model_context_window_exceeded, stop_sequence or tool_use.
std::string anthropic_stop_reason(const AnthropicStop& s);

// The message object of a whole reply (keys in Anthropic's order): content blocks thinking (when there is reasoning),
// text (when there is text), then one tool_use block per call (its input the arguments
// object).
nlohmann::ordered_json anthropic_message_json(const std::string& id, const std::string& model, const std::string& text,
                                      const std::string& thinking, const std::vector<ToolCall>& calls,
                                      const AnthropicStop& stop, const AnthropicUsage& usage);

// The server-sent events of a streamed reply ("event: NAME\ndata: JSON\n\n"): message_start,
// then each content block's content_block_start, deltas (thinking_delta, text_delta,
// input_json_delta) and content_block_stop in index order, then message_delta and
// message_stop. Not thread-safe.
class AnthropicEventStream {
 public:
  AnthropicEventStream(std::string id, std::string model);
  // message_start (the message with empty content and the usage so far), then a ping.
  std::string start(const AnthropicUsage& usage);
  // The events of one step's output: thinking, then text, then tool call pieces
  // (ToolCallParserOptions::stream_arguments: a piece with an id opens a tool_use block, the
  // others carry its arguments' fragments).
  std::string push(const std::string& thinking, const std::string& text, const std::vector<ToolCall>& calls);
  // Closes the open block, then message_delta and message_stop.
  std::string finish(const AnthropicStop& stop, const AnthropicUsage& usage);

 private:
  enum class Block { none, thinking, text, tool_use };
  std::string open(Block kind, const nlohmann::ordered_json& content_block);
  std::string close();

  std::string id_, model_;
  Block open_ = Block::none;
  int index_ = -1;  // the open (or last) block's index
  int call_ = -1;   // the tool call of the open tool_use block
};

// One server-sent event.
std::string anthropic_event(const std::string& name, const nlohmann::ordered_json& data);

}  // namespace osprey
