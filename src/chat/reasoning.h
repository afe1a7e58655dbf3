#pragma once
// Reasoning in a model's reply: the <think>...</think> block of Qwen3-style models, split from
// the answer so that it is returned as reasoning_content (vLLM's reasoning parsers,
// llama.cpp's --reasoning-format).
#include <string>

namespace osprey {

enum class ReasoningFormat { none, think };  // none: the reply is all content, tags included

// The format of the model whose chat template this is: think when the template speaks of
// <think> blocks, else none.
ReasoningFormat reasoning_format(const std::string& template_source);

struct ReasoningOutput {
  std::string reasoning, content;
};

// Incremental: push() the reply's text as it is generated, finish() at its end. A reply that
// opens with <think> (leading whitespace allowed), or whose prompt ended inside an open
// <think>, is reasoning up to </think>; the newlines after </think> are dropped; the rest is
// content. A reply cut before </think> is all reasoning. Text that could still be a tag is
// held back. Not thread-safe.
class ReasoningParser {
 public:
  // prompt_opens: the rendered prompt ends with an open <think> (the template started the
  // block), so the reply begins inside it.
  explicit ReasoningParser(bool prompt_opens = false);
  ReasoningOutput push(const std::string& text);
  ReasoningOutput finish();

 private:
  enum class State { start, reasoning, after_close, content };
  void step(ReasoningOutput& out, bool at_end);

  State state_;
  std::string buf_;
};

// Whether a rendered prompt ends inside an open <think> block.
bool prompt_opens_think(const std::string& prompt);

}  // namespace osprey
