#pragma once
// Constrained decoding requests: the grammar a completion or chat request asks for, from
// llama-server's `grammar` (GBNF) and `json_schema`, OpenAI's response_format (json_object,
// json_schema) or a tool_choice that forces a call.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "chat/tool_calls.h"

namespace osprey {

struct ToolChoice {
  std::string mode = "auto";           // none, auto, required, function
  std::string function;                // mode function: its name
  std::vector<std::string> names;      // every offered function
  std::vector<nlohmann::json> schemas; // their parameters (null: none given)
  bool parallel = true;
};

struct RequestGrammar {
  grammar::Grammar grammar;
  std::string gbnf;   // its text (requests with the same text may share an automaton)
  std::string field;  // the request field it came from
};

// The grammar of `body`, or nullopt when it asks for none. Throws ApiError (400) naming the
// field: two constraining fields at once, a malformed value, a grammar syntax error, a
// schema keyword that is not supported, a forced tool call in a format that has no grammar.
std::optional<RequestGrammar> request_grammar(const nlohmann::json& body, const ToolChoice& tools,
                                              ToolCallFormat format);

// GBNF for one forced call (or, with tools.parallel, up to 8) in `format`'s syntax: the name
// of an offered function (the named one, for mode function) and arguments that match its
// parameters schema. Throws InvalidInput for a format whose markers are special tokens.
std::string tool_call_gbnf(const ToolChoice& tools, ToolCallFormat format);

}  // namespace osprey
