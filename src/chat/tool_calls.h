#pragma once
// Tool calls in a model's reply: the native call syntax of each model family, found in the
// generated text and turned into OpenAI tool_calls; the rest of the text stays content.
//
// Formats (chosen from the chat template, tool_call_format()):
//   llama3_json  Llama 3.x: the whole reply is {"name": F, "parameters": {...}} (several joined
//                by ";"), optionally after <|python_tag|>
//   hermes       Qwen2.5, Qwen3: <tool_call>{"name": F, "arguments": {...}}</tool_call>, one
//                block per call, after optional content
//   command_r7b  Command R7B: <|START_ACTION|>[{"tool_call_id": ..., "tool_name": F,
//                "parameters": {...}}, ...]<|END_ACTION|>
//   mistral      Mistral: [TOOL_CALLS][{"name": F, "arguments": {...}}, ...], or the newer
//                [TOOL_CALLS]F[ARGS]{...} repeated
// Text that only looks like a call (malformed JSON, a function the request did not offer,
// arguments that are not an object) stays content, as the model wrote it.
#include <cstdint>
#include <string>
#include <vector>

namespace osprey {

enum class ToolCallFormat { none, llama3_json, hermes, command_r7b, mistral };

// The format of the model whose chat template this is (none when the template does not
// take tools in a form this parser knows).
ToolCallFormat tool_call_format(const std::string& template_source);
const char* format_name(ToolCallFormat f);
// The markers of a format that tokenizers make special tokens (dropped by a decoder that
// skips special tokens): the server keeps these in the text it parses.
std::vector<std::string> tool_call_markers(ToolCallFormat f);

// A call, or a piece of one as a streaming parser releases it (ToolCallParserOptions::
// stream_arguments): the first piece of call `index` carries its id and name, every piece a
// fragment of its arguments; a call's fragments, concatenated, are its arguments.
struct ToolCall {
  std::string id;         // "" on a piece that continues call `index`
  std::string name;
  std::string arguments;  // a JSON object as the model wrote it, less the whitespace between tokens
  int index = 0;          // the call's place among the reply's calls
};

// Appends `pieces` to `calls`: a piece with an id starts a call, one without extends the
// arguments of the call of its index.
void append_tool_call_pieces(std::vector<ToolCall>& calls, std::vector<ToolCall> pieces);

// What the parser releases: content that can no longer become part of a call, and calls
// (whole, or pieces when streaming arguments).
struct ToolCallOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

struct ToolCallParserOptions {
  ToolCallFormat format = ToolCallFormat::none;
  std::vector<std::string> functions;  // the names the request offered
  bool parallel = true;                // false: the first call only, later ones dropped
  std::string id_prefix = "call_";     // a call's id is id_prefix + its index in the reply
  // Release a call as it is generated: its id and name once the name (an offered function) and
  // the start of its arguments object are read, then the arguments in fragments. A call is
  // then committed: should its block turn out malformed, it keeps what was released, and the
  // block's rest is dropped. Off: a call is released whole once its block is complete and
  // parses (malformed blocks stay content).
  bool stream_arguments = false;
};

// Incremental: push() the reply's text as it is generated, finish() at its end. Text that
// could still be the start of a call (a prefix of a marker, an unfinished call) is held back,
// so no part of a call syntax ever comes out as content. Not thread-safe.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallParserOptions options);
  ToolCallOutput push(const std::string& text);
  ToolCallOutput finish();
  // Whole-reply form: push(text) then finish(), merged.
  ToolCallOutput parse(const std::string& text);

 private:
  enum class State { start, content, call };
  void release_content(ToolCallOutput& out, std::string text);
  void emit_calls(ToolCallOutput& out, const std::string& raw, std::vector<ToolCall> calls);
  void step(ToolCallOutput& out, bool at_end);
  // Streaming: releases the calls of the unfinished block `body` as far as it goes.
  void stream_calls(ToolCallOutput& out, const std::string& body);

  ToolCallParserOptions opt_;
  State state_ = State::start;
  std::string buf_;           // text not yet released
  std::string pending_space_; // whitespace held until content follows (dropped before a call)
  bool after_call_ = false;   // whitespace right after a call is dropped
  bool marked_ = true;        // the call being read opened with the format's marker
  int n_calls_ = 0;
  // The calls of the current block released while streaming: (index, bytes of arguments sent).
  std::vector<std::pair<int, size_t>> streamed_;
};

// Parses a whole call block's text (what lies between the format's markers, or the whole
// reply for llama3_json) into calls. Returns false when it is not a well-formed call of an
// offered function.
bool parse_tool_calls(ToolCallFormat f, const std::string& body, const std::vector<std::string>& functions,
                      std::vector<ToolCall>& calls);

}  // namespace osprey
