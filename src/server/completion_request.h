#pragma once
// The fields of an OpenAI completion or chat completion request, read and checked. Every
// check throws ApiError (400) naming the field at fault.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generation_config.h"
#include "serve/scheduler.h"
#include "server/structured_output.h"

namespace osprey {

class Tokenizer;

struct CompletionRequest {
  bool chat = false;
  std::string model;                          // as sent ("" when absent)
  std::vector<std::vector<int32_t>> prompts;  // one sequence each (completions may send several)
  int64_t n = 1;                              // choices per prompt (each its own seed stream)
  std::optional<int64_t> max_tokens;          // max_tokens / max_completion_tokens
  SequenceParams params;                      // max_tokens filled per prompt by the server
  std::vector<std::string> stop;
  bool ignore_eos = false;                    // generate past end-of-sequence tokens (benchmarks)
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  bool logprobs = false;                      // completions: logprobs given; chat: logprobs true
  int top_logprobs = 0;
  std::string cache_salt;                     // "" : none; keys the prompt cache
  // Chat: the functions "tools" offers; tool calls are parsed out of the reply when some are
  // offered and tool_choice is not "none"; parallel_tool_calls false keeps the first call.
  std::vector<std::string> tool_names;
  bool parse_tool_calls = false;
  bool parallel_tool_calls = true;
  ToolChoice tool_choice;  // with every offered function's parameters (structured_output.h)
  std::string tool_call_id_prefix = "call_";  // the API's: OpenAI's "call_", Anthropic's "toolu_"
};

// Reads the sampling, stop, stream and logprobs fields common to both routes (not the
// prompt or messages). A sampling field left out takes its value in `defaults` (the server's:
// the model's generation_config.json over OpenAI's temperature 1, top_p 1).
CompletionRequest read_completion_fields(const nlohmann::json& body, bool chat,
                                         const SamplerParams& defaults = openai_sampling());

// logit_bias: {"token id": bias in [-100, 100]} into the sampler parameters; ids must lie in
// [0, vocab_size).
void read_logit_bias(const nlohmann::json& body, int64_t vocab_size, SamplerParams& params);

// Makes a chat request's messages what chat templates expect, as vLLM and transformers
// callers do: a content list of text parts becomes one string (the parts joined by newlines),
// an assistant tool call's "arguments" JSON string becomes the object it holds. Throws ApiError
// (400) for an audio, file or unread image part (take_image_parts, server/image_parts.h, turns
// image parts into {"type": "image"} before) and for arguments that are not a JSON object,
// naming the message.
void prepare_chat_messages(nlohmann::ordered_json& request);

// The prompt of /v1/completions: a string, an array of token ids, or an array of either.
// Strings are tokenized with special tokens parsed and the post-processor's BOS added.
std::vector<std::vector<int32_t>> read_prompts(const nlohmann::json& prompt, const Tokenizer& tokenizer,
                                               int64_t vocab_size);

// Checked field access: the field's value, or nullopt when absent or null.
std::optional<double> number_field(const nlohmann::json& body, const char* name, double min, double max);
std::optional<int64_t> int_field(const nlohmann::json& body, const char* name, int64_t min, int64_t max);
std::optional<bool> bool_field(const nlohmann::json& body, const char* name);
std::optional<std::string> string_field(const nlohmann::json& body, const char* name);

}  // namespace osprey
