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

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as compact text with the model's key order
};

// What the parser releases: content that can no longer become part of a call, and calls
// found complete.
struct ToolCallOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

struct ToolCallParserOptions {
  ToolCallFormat format = ToolCallFormat::none;
  std::vector<std::string> functions;  // the names the request offered
  bool parallel = true;                // false: the first call only, later ones dropped
  std::string id_prefix = "call_";     // a call's id is id_prefix + its index in the reply
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

  ToolCallParserOptions opt_;
  State state_ = State::start;
  std::string buf_;           // text not yet released
  std::string pending_space_; // whitespace held until content follows (dropped before a call)
  bool after_call_ = false;   // whitespace right after a call is dropped
  bool marked_ = true;        // the call being read opened with the format's marker
  int n_calls_ = 0;
};

// Parses a whole call block's text (what lies between the format's markers, or the whole
// reply for llama3_json) into calls. Returns false when it is not a well-formed call of an
// offered function.
bool parse_tool_calls(ToolCallFormat f, const std::string& body, const std::vector<std::string>& functions,
                      std::vector<ToolCall>& calls);

}  // namespace osprey
