#pragma once
// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) over the chat
// completions machinery: a Responses request is read into the chat request the chat route runs
// (its input items as chat messages, function tools, tool_choice, text.format as
// response_format, reasoning.effort as the template's enable_thinking), and the reply, whole or
// streamed, is written back as a response object with output items and as the Responses event
// stream. See docs/server.md, "OpenAI Responses", for every field.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/response_store.h"
#include "chat/tool_calls.h"

namespace osprey {

struct ResponsesRequest {
  // The chat completions request it amounts to, without "messages" (responses_chat_request
  // adds them): model, tools, tool_choice, parallel_tool_calls, max_tokens, temperature, top_p,
  // stream, response_format, chat_template_kwargs.
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
  nlohmann::ordered_json input = nlohmann::ordered_json::array();  // its input as items (a string: one user message)
  std::string instructions;  // "" : none
  std::string previous_response_id;
  bool store = true;
  bool stream = false;
  bool reasoning_summary = false;  // reasoning.summary asked: the thinking comes back as summary_text
  // The settings a response object repeats (instructions, max_output_tokens, parallel_tool_calls,
  // previous_response_id, reasoning, store, temperature, text, tool_choice, tools, top_p,
  // truncation, user, metadata): as sent, or their defaults (temperature and top_p null: the
  // server fills in the values it samples with).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
};

// Reads a Responses request body. Throws ApiError (400) naming the field (its place in the
// request, e.g. input[2].content[0]) for a value of the wrong type or range, a file or audio
// part, an image part outside a user message or whose image_url is not a data: URL, a hosted tool (web_search, file_search, ...), and every field this server does not
// honour (docs/server.md lists the few accepted without effect).
ResponsesRequest read_responses_request(const nlohmann::ordered_json& body);

// The chat messages of a conversation: `instructions` as a system message (when not empty),
// then the items in order: a message item becomes a message (developer as system, text parts
// joined by newlines); function_call items become the tool_calls of the assistant message they
// follow (or of a new one); a function_call_output item a tool message; a reasoning item the
// reasoning_content of the next assistant message. `items` are ones read_responses_request
// accepted, or a stored response's output items.
nlohmann::ordered_json responses_chat_messages(const std::string& instructions, const nlohmann::ordered_json& items);

// The conversation `r` continues: the previous response's input and output items (when it
// names one), then its own input.
nlohmann::ordered_json responses_conversation(const ResponsesRequest& r, const StoredResponse* previous);

// The 404 of a response id the store does not hold; `param`: the field that named it.
ApiError response_not_found(const std::string& id, const std::string& param);

// The chat request of `r` over the conversation `items` (a previous response's input and
// output, then r.input).
nlohmann::ordered_json responses_chat_request(const ResponsesRequest& r, const nlohmann::ordered_json& items);

struct ResponsesUsage {
  int64_t n_prompt = 0;     // the whole prompt (input_tokens)
  int64_t n_cached = 0;     // of which reused from the prefix cache
  int64_t n_output = 0;
  int64_t n_reasoning = 0;  // of the output, the reasoning's tokens
};

// A response's output items, built from the reply's pieces as they come (streaming) or at once
// (whole: one push), with the server-sent events that announce them. Output items come in the
// reply's order: a reasoning item, a message item, then one function_call item per call. Not
// thread-safe.
class ResponsesReply {
 public:
  // id: the response's ("resp_..."); its items' ids end with what follows "resp_".
  ResponsesReply(std::string id, int64_t created_at, std::string model, nlohmann::ordered_json echo,
                 bool reasoning_summary);

  // response.created and response.in_progress (the response with empty output).
  std::string start();
  // The events of one step's output: reasoning, then text, then tool call pieces
  // (ToolCallParserOptions::stream_arguments: a piece with an id opens a function_call item,
  // the others carry its arguments' fragments).
  std::string push(const std::string& reasoning, const std::string& text, const std::vector<ToolCall>& calls);
  // Closes the open item, then response.completed, or response.incomplete (incomplete_details
  // max_output_tokens) when `cut` (the reply ran out of tokens).
  std::string finish(bool cut, const ResponsesUsage& usage);
  // An error event (a sequence that failed mid-stream).
  std::string error(const ApiError& e);

  // The response object: in progress until finish().
  nlohmann::ordered_json response() const;
  const std::string& reasoning() const { return reasoning_text_; }

 private:
  enum class Item { none, reasoning, message, function_call };
  std::string event(const char* type, nlohmann::ordered_json data);
  std::string open(Item kind, nlohmann::ordered_json item);
  std::string close(bool cut);

  std::string id_, suffix_, model_;
  int64_t created_at_;
  nlohmann::ordered_json echo_;
  bool summary_;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Item open_ = Item::none;
  int call_ = -1;  // the tool call of the open function_call item
  std::string part_;  // the open item's text (message, reasoning) or arguments (function_call)
  std::string reasoning_text_;
  std::string status_ = "in_progress";
  nlohmann::ordered_json incomplete_ = nullptr, usage_ = nullptr;
  int64_t sequence_ = 0;
};

// One server-sent event of the Responses stream: "event: TYPE\ndata: JSON\n\n".
std::string responses_event(const nlohmann::ordered_json& data);

}  // namespace osprey
