#include "server/structured_output.h"

#include "core/error.h"
#include "grammar/json_schema.h"
#include "server/api_error.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A schema's rules renamed under `prefix`, its root becoming `prefix` itself.
std::string prefixed_rules(const std::string& gbnf, const std::string& prefix) {
  // Rule names are [a-zA-Z0-9-]; every name outside literals and classes gets the prefix.
  std::string out;
  for (size_t i = 0; i < gbnf.size();) {
    const char c = gbnf[i];
    if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < gbnf.size() && gbnf[j] != close) j += gbnf[j] == '\\' ? 2 : 1;
      out.append(gbnf, i, j + 1 - i);
      i = j + 1;
    } else if (std::isalpha(uint8_t(c))) {
      size_t j = i;
      while (j < gbnf.size() && (std::isalnum(uint8_t(gbnf[j])) || gbnf[j] == '-')) ++j;
      const std::string name = gbnf.substr(i, j - i);
      out += name == "root" ? prefix : prefix + "-" + name;
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string literal(const std::string& s) {
  std::string out;
  grammar::append_gbnf_literal(out, s);
  return out;
}

}  // namespace

std::string tool_call_gbnf(const ToolChoice& tools, ToolCallFormat format) {
  if (format != ToolCallFormat::hermes && format != ToolCallFormat::llama3_json)
    throw InvalidInput(std::string("forcing a call is not supported for this model's call format (") + format_name(format) +
                       "): its markers are special tokens; use tool_choice \"auto\"");
  const char* args_key = format == ToolCallFormat::hermes ? "arguments" : "parameters";
  std::string rules, calls;
  for (size_t i = 0; i < tools.names.size(); ++i) {
    if (tools.mode == "function" && tools.names[i] != tools.function) continue;
    const json& params = tools.schemas[i];
    const ordered_json schema =
        params.is_null() ? ordered_json{{"type", "object"}} : ordered_json::parse(params.dump());
    std::string args;
    try {
      args = grammar::schema_to_gbnf(schema);
    } catch (const InvalidInput& e) {
      throw InvalidInput("tools[" + std::to_string(i) + "].function.parameters: " + e.what());
    }
    const std::string prefix = "args" + std::to_string(i);
    rules += prefixed_rules(args, prefix);
    if (!calls.empty()) calls += " | ";
    calls += "\"{\\\"name\\\": \" " + literal(json(tools.names[i]).dump()) + " \", \\\"" + args_key + "\\\": \" " + prefix +
             " \"}\"";
  }
  const std::string call = "call ::= " + calls + "\n";
  const std::string more = tools.parallel ? "{0,7}" : "{0,0}";
  if (format == ToolCallFormat::hermes)
    return "root ::= block ( \"\\n\" block )" + more + "\nblock ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n" + call +
           rules;
  return "root ::= call ( \"; \" call )" + more + "\n" + call + rules;
}

std::optional<RequestGrammar> request_grammar(const json& body, const ToolChoice& tools, ToolCallFormat format) {
  std::optional<RequestGrammar> out;
  std::string text;
  auto take = [&](const char* field, std::string gbnf) {
    if (out)
      throw bad_request(std::string("'") + field + "' and '" + out->field +
                            "' both constrain the output; send one of them",
                        field);
    out.emplace();
    out->field = field;
    text = std::move(gbnf);
  };
  auto schema_gbnf = [](const json& schema, const char* field) {
    try {
      return grammar::schema_to_gbnf(ordered_json::parse(schema.dump()));
    } catch (const InvalidInput& e) {
      throw bad_request(std::string("'") + field + "': " + e.what(), field);
    }
  };
  auto set = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };
  if (set("grammar")) {
    if (!body["grammar"].is_string()) throw bad_request("'grammar' must be a string of GBNF rules", "grammar");
    take("grammar", body["grammar"].get<std::string>());
  }
  if (set("json_schema")) {
    if (!body["json_schema"].is_object() && !body["json_schema"].is_boolean())
      throw bad_request("'json_schema' must be a JSON Schema object", "json_schema");
    take("json_schema", schema_gbnf(body["json_schema"], "json_schema"));
  }
  if (set("response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      throw bad_request("'response_format' must be an object with a string 'type'", "response_format");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      take("response_format", grammar::json_object_gbnf());
    } else if (type == "json_schema") {
      const json* js = rf.contains("json_schema") && rf["json_schema"].is_object() ? &rf["json_schema"] : nullptr;
      if (!js) throw bad_request("'response_format': type json_schema needs a 'json_schema' object", "response_format");
      if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null())
        throw bad_request("'response_format.json_schema.strict' must be a boolean", "response_format");
      if (!js->contains("schema") || (*js)["schema"].is_null())
        take("response_format", grammar::json_object_gbnf());
      else if (!(*js)["schema"].is_object() && !(*js)["schema"].is_boolean())
        throw bad_request("'response_format.json_schema.schema' must be a JSON Schema object", "response_format");
      else
        take("response_format", schema_gbnf((*js)["schema"], "response_format"));
    } else if (type != "text") {
      throw bad_request("'response_format': type '" + type + "' is not one of text, json_object, json_schema",
                        "response_format");
    }
  }
  if (tools.mode == "required" || tools.mode == "function") {
    try {
      take("tool_choice", tool_call_gbnf(tools, format));
    } catch (const InvalidInput& e) {
      throw bad_request(std::string("'tool_choice': ") + e.what(), "tool_choice");
    }
  }
  if (!out) return out;
  try {
    out->grammar = grammar::parse_gbnf(text);
    out->gbnf = std::move(text);
  } catch (const InvalidInput& e) {
    throw bad_request("'" + out->field + "': " + e.what(), out->field);
  }
  return out;
}

}  // namespace osprey
