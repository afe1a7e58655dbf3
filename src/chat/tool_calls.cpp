#include "chat/tool_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace osprey {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kPythonTag = "<|python_tag|>";

struct Markers {
  std::string open, close;  // close "": the call runs to the end of the reply
};

Markers markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::command_r7b: return {"<|START_ACTION|>", "<|END_ACTION|>"};
    case ToolCallFormat::mistral: return {"[TOOL_CALLS]", ""};
    case ToolCallFormat::llama3_json: return {kPythonTag, ""};
    case ToolCallFormat::none: break;
  }
  return {};
}

bool tc_is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string tc_trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && tc_is_space(s[b])) ++b;
  while (e > b && tc_is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The length of the longest suffix of s that is a proper prefix of marker.
size_t tc_partial_marker(const std::string& s, const std::string& marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, marker, 0, n) == 0) return n;
  return 0;
}

// The end (one past the closing brace) of the JSON object that starts at s[start] == '{',
// strings and escapes respected; npos when it does not close.
size_t object_end(const std::string& s, size_t start) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string::npos;
}

bool parse_json(const std::string& text, ojson& out) {
  try {
    out = ojson::parse(text);
    return true;
  } catch (const ojson::exception&) {
    return false;
  }
}

// One call from its name and arguments values; false unless the name is an offered function
// and the arguments an object (or a string holding one).
bool make_call(const ojson* name, const ojson* args, const std::vector<std::string>& functions,
               std::vector<ToolCall>& calls) {
  if (!name || !name->is_string()) return false;
  const std::string n = name->get<std::string>();
  if (std::find(functions.begin(), functions.end(), n) == functions.end()) return false;
  ojson a = ojson::object();
  if (args && args->is_string()) {
    if (!parse_json(args->get<std::string>(), a)) return false;
  } else if (args) {
    a = *args;
  }
  if (!a.is_object()) return false;
  calls.push_back({"", n, a.dump(-1, ' ', false, ojson::error_handler_t::replace)});
  return true;
}

const ojson* member(const ojson& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

// {"name": F, "arguments" | "parameters": {...}}
bool name_args_object(const ojson& o, const std::vector<std::string>& functions, std::vector<ToolCall>& calls) {
  if (!o.is_object()) return false;
  const ojson* args = member(o, "arguments");
  if (!args) args = member(o, "parameters");
  return make_call(member(o, "name"), args, functions, calls);
}

bool parse_llama3(const std::string& body, const std::vector<std::string>& functions, std::vector<ToolCall>& calls) {
  size_t i = 0;
  while (true) {
    while (i < body.size() && tc_is_space(body[i])) ++i;
    if (i >= body.size() || body[i] != '{') return false;
    const size_t end = object_end(body, i);
    if (end == std::string::npos) return false;
    ojson o;
    if (!parse_json(body.substr(i, end - i), o) || !name_args_object(o, functions, calls)) return false;
    i = end;
    while (i < body.size() && tc_is_space(body[i])) ++i;
    if (i == body.size()) return true;
    if (body[i] != ';') return false;
    ++i;
  }
}

bool parse_mistral(const std::string& body, const std::vector<std::string>& functions, std::vector<ToolCall>& calls) {
  const std::string t = tc_trim(body);
  if (!t.empty() && t[0] == '[') {
    ojson a;
    if (!parse_json(t, a) || !a.is_array() || a.empty()) return false;
    for (const ojson& o : a)
      if (!name_args_object(o, functions, calls)) return false;
    return true;
  }
  // F[ARGS]{...}, the calls after the first each behind another [TOOL_CALLS].
  const std::string sep = "[TOOL_CALLS]", args_tag = "[ARGS]";
  size_t i = 0;
  while (i <= t.size()) {
    size_t next = t.find(sep, i);
    const std::string piece = t.substr(i, next == std::string::npos ? std::string::npos : next - i);
    const size_t a = piece.find(args_tag);
    if (a == std::string::npos) return false;
    ojson name = tc_trim(piece.substr(0, a)), args;
    if (!parse_json(piece.substr(a + args_tag.size()), args) || !make_call(&name, &args, functions, calls))
      return false;
    if (next == std::string::npos) return true;
    i = next + sep.size();
  }
  return false;
}

bool parse_command_r7b(const std::string& body, const std::vector<std::string>& functions,
                       std::vector<ToolCall>& calls) {
  ojson a;
  if (!parse_json(tc_trim(body), a) || !a.is_array() || a.empty()) return false;
  for (const ojson& o : a)
    if (!o.is_object() || !make_call(member(o, "tool_name"), member(o, "parameters"), functions, calls)) return false;
  return true;
}

// JSON text without the whitespace between its tokens (strings kept as written). The result
// for a prefix of a text is a prefix of the result for the whole.
std::string tc_minify(const std::string& s) {
  std::string out;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (tc_is_space(c)) {
      continue;
    }
    out += c;
  }
  return out;
}

// Where the calls of a (possibly unfinished) call block lie: each call's name, once read
// whole, and its arguments object's text.
struct ToolCallSpan {
  std::string name;  // "" until read
  size_t args_begin = std::string::npos, args_end = std::string::npos;  // end: npos while open
};

// The mistral F[ARGS]{...} form: calls separated by [TOOL_CALLS].
std::vector<ToolCallSpan> scan_name_args(const std::string& body) {
  std::vector<ToolCallSpan> spans;
  const std::string sep = "[TOOL_CALLS]", args_tag = "[ARGS]";
  size_t i = 0;
  while (i <= body.size()) {
    const size_t next = body.find(sep, i);
    const size_t stop = next == std::string::npos ? body.size() : next;
    const size_t a = body.find(args_tag, i);
    if (a == std::string::npos || a >= stop) break;
    ToolCallSpan c;
    c.name = tc_trim(body.substr(i, a - i));
    size_t b = a + args_tag.size();
    while (b < stop && tc_is_space(body[b])) ++b;
    if (b < stop && body[b] == '{') {
      c.args_begin = b;
      const size_t e = object_end(body.substr(0, stop), b);
      c.args_end = e;
    }
    spans.push_back(std::move(c));
    if (next == std::string::npos) break;
    i = next + sep.size();
  }
  return spans;
}

// The JSON forms: a call is an object at the top level (llama3_json's objects joined by ";",
// hermes) or in a top-level array (command_r7b, mistral); its name is the string value of
// "name" or "tool_name", its arguments the object value of "arguments" or "parameters".
std::vector<ToolCallSpan> scan_call_spans(ToolCallFormat f, const std::string& body) {
  if (f == ToolCallFormat::mistral) {
    const std::string t = tc_trim(body);
    if (!t.empty() && t[0] != '[') return scan_name_args(body);
  }
  std::vector<ToolCallSpan> spans;
  std::string stack;            // open containers, '{' or '['
  size_t call_depth = 0;        // stack size inside the current call object; 0: none
  bool expect_key = false;      // directly in the call object, a key comes next
  std::string key;              // the call object's key whose value comes next
  size_t string_begin = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        if (call_depth && stack.size() == call_depth) {
          const std::string literal = body.substr(string_begin, i + 1 - string_begin);
          ojson v;
          const std::string text = parse_json(literal, v) && v.is_string() ? v.get<std::string>() : "";
          if (expect_key) {
            key = text;
            expect_key = false;
          } else if (key == "name" || key == "tool_name") {
            spans.back().name = text;
          }
        }
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_begin = i;
    } else if (c == '{' || c == '[') {
      if (c == '{' && call_depth && stack.size() == call_depth && (key == "arguments" || key == "parameters") &&
          spans.back().args_begin == std::string::npos)
        spans.back().args_begin = i;
      stack += c;
      if (c == '{' && !call_depth && (stack.size() == 1 || (stack.size() == 2 && stack[0] == '['))) {
        call_depth = stack.size();
        expect_key = true;
        key.clear();
        spans.emplace_back();
      }
    } else if (c == '}' || c == ']') {
      if (stack.empty()) break;
      stack.pop_back();
      if (call_depth && stack.size() + 1 == call_depth) {
        call_depth = 0;
      } else if (call_depth && stack.size() == call_depth && spans.back().args_begin != std::string::npos &&
                 spans.back().args_end == std::string::npos && (key == "arguments" || key == "parameters")) {
        spans.back().args_end = i + 1;
      }
    } else if (c == ',' && call_depth && stack.size() == call_depth) {
      expect_key = true;
      key.clear();
    }
  }
  return spans;
}

}  // namespace

void append_tool_call_pieces(std::vector<ToolCall>& calls, std::vector<ToolCall> pieces) {
  for (ToolCall& p : pieces) {
    if (!p.id.empty()) {
      calls.push_back(std::move(p));
      continue;
    }
    for (auto it = calls.rbegin(); it != calls.rend(); ++it)
      if (it->index == p.index) {
        it->arguments += p.arguments;
        break;
      }
  }
}

ToolCallFormat tool_call_format(const std::string& src) {
  auto has = [&](const char* s) { return src.find(s) != std::string::npos; };
  if (has("<tool_call>")) return ToolCallFormat::hermes;
  if (has("<|START_ACTION|>")) return ToolCallFormat::command_r7b;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::mistral;
  if (has(kPythonTag) || (has("<|start_header_id|>") && has("\"parameters\": "))) return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

const char* format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::command_r7b: return "command_r7b";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::none: break;
  }
  return "none";
}

std::vector<std::string> tool_call_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::llama3_json: return {kPythonTag};
    case ToolCallFormat::hermes: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::command_r7b: return {"<|START_ACTION|>", "<|END_ACTION|>"};
    case ToolCallFormat::mistral: return {"[TOOL_CALLS]", "[ARGS]"};
    case ToolCallFormat::none: break;
  }
  return {};
}

bool parse_tool_calls(ToolCallFormat f, const std::string& body, const std::vector<std::string>& functions,
                      std::vector<ToolCall>& calls) {
  std::vector<ToolCall> found;
  bool ok = false;
  switch (f) {
    case ToolCallFormat::llama3_json: ok = parse_llama3(body, functions, found); break;
    case ToolCallFormat::hermes: {
      ojson o;
      ok = parse_json(tc_trim(body), o) && name_args_object(o, functions, found);
      break;
    }
    case ToolCallFormat::command_r7b: ok = parse_command_r7b(body, functions, found); break;
    case ToolCallFormat::mistral: ok = parse_mistral(body, functions, found); break;
    case ToolCallFormat::none: break;
  }
  if (ok) calls.insert(calls.end(), found.begin(), found.end());
  return ok;
}

ToolCallParser::ToolCallParser(ToolCallParserOptions options) : opt_(std::move(options)) {
  if (opt_.format != ToolCallFormat::llama3_json) state_ = State::content;
}

void ToolCallParser::release_content(ToolCallOutput& out, std::string text) {
  if (after_call_) {
    size_t b = 0;
    while (b < text.size() && tc_is_space(text[b])) ++b;
    text.erase(0, b);
    if (text.empty()) return;
    after_call_ = false;
  }
  text = pending_space_ + text;
  size_t e = text.size();
  while (e > 0 && tc_is_space(text[e - 1])) --e;
  pending_space_ = text.substr(e);
  out.content += text.substr(0, e);
}

void ToolCallParser::emit_calls(ToolCallOutput& out, const std::string& raw, std::vector<ToolCall> calls) {
  std::vector<std::pair<int, size_t>> streamed;
  streamed.swap(streamed_);
  if (calls.empty() && streamed.empty()) {
    release_content(out, raw);
    return;
  }
  pending_space_.clear();
  after_call_ = true;
  // Calls already released while streaming get the rest of their arguments; a malformed block
  // (no calls) leaves them as released.
  for (size_t k = 0; k < calls.size(); ++k) {
    ToolCall& c = calls[k];
    if (k < streamed.size()) {
      if (c.arguments.size() > streamed[k].second)
        out.calls.push_back({"", "", c.arguments.substr(streamed[k].second), streamed[k].first});
      continue;
    }
    if (!opt_.parallel && n_calls_ >= 1) break;
    c.index = n_calls_;
    c.id = opt_.id_prefix + std::to_string(n_calls_++);
    out.calls.push_back(std::move(c));
  }
}

void ToolCallParser::stream_calls(ToolCallOutput& out, const std::string& body) {
  const std::vector<ToolCallSpan> spans = scan_call_spans(opt_.format, body);
  for (size_t k = 0; k < spans.size(); ++k) {
    const ToolCallSpan& s = spans[k];
    if (k == streamed_.size()) {
      // Released in order, once the name is an offered function and the arguments have begun.
      if (s.name.empty() || s.args_begin == std::string::npos ||
          std::find(opt_.functions.begin(), opt_.functions.end(), s.name) == opt_.functions.end() ||
          (!opt_.parallel && n_calls_ >= 1))
        return;
      pending_space_.clear();
      streamed_.emplace_back(n_calls_, 0);
      out.calls.push_back({opt_.id_prefix + std::to_string(n_calls_), s.name, "", n_calls_});
      ++n_calls_;
    }
    const size_t end = s.args_end == std::string::npos ? body.size() : s.args_end;
    const std::string args = tc_minify(body.substr(s.args_begin, end - s.args_begin));
    auto& [index, sent] = streamed_[k];
    if (args.size() > sent) {
      if (!out.calls.empty() && out.calls.back().index == index)
        out.calls.back().arguments += args.substr(sent);
      else
        out.calls.push_back({"", "", args.substr(sent), index});
      sent = args.size();
    }
  }
}

void ToolCallParser::step(ToolCallOutput& out, bool at_end) {
  const Markers m = markers(opt_.format);
  while (true) {
    if (state_ == State::start) {
      // llama3_json: the reply is a call when it opens with '{' or <|python_tag|>.
      size_t i = 0;
      while (i < buf_.size() && tc_is_space(buf_[i])) ++i;
      const std::string rest = buf_.substr(i);
      if (rest.empty() || (m.open.compare(0, rest.size(), rest) == 0 && rest.size() < m.open.size())) {
        if (!at_end) return;
        state_ = State::content;
        continue;
      }
      if (rest[0] == '{') {
        state_ = State::call;
        marked_ = false;
        continue;
      }
      state_ = State::content;
      continue;
    }
    if (state_ == State::content) {
      const size_t p = buf_.find(m.open);
      if (p != std::string::npos) {
        release_content(out, buf_.substr(0, p));
        buf_.erase(0, p + m.open.size());
        state_ = State::call;
        marked_ = true;
        continue;
      }
      const size_t hold = at_end ? 0 : tc_partial_marker(buf_, m.open);
      release_content(out, buf_.substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      if (at_end) {
        out.content += pending_space_;
        pending_space_.clear();
      }
      return;
    }
    if (state_ == State::call) {
      size_t q = m.close.empty() ? std::string::npos : buf_.find(m.close);
      if (q == std::string::npos && !at_end) {
        if (opt_.stream_arguments)
          stream_calls(out, buf_.substr(0, buf_.size() - (m.close.empty() ? 0 : tc_partial_marker(buf_, m.close))));
        return;
      }
      const std::string body = buf_.substr(0, q);
      // The text as the model wrote it, for a block that turns out not to be a call.
      std::string raw = (marked_ ? m.open : "") + body + (q == std::string::npos ? "" : m.close);
      std::vector<ToolCall> calls;
      if (!parse_tool_calls(opt_.format, body, opt_.functions, calls)) calls.clear();
      // Arguments written as an object are sent as written (streamed or not, the same text).
      const std::vector<ToolCallSpan> spans = scan_call_spans(opt_.format, body);
      if (spans.size() == calls.size())
        for (size_t k = 0; k < calls.size(); ++k)
          if (spans[k].args_end != std::string::npos)
            calls[k].arguments = tc_minify(body.substr(spans[k].args_begin, spans[k].args_end - spans[k].args_begin));
      emit_calls(out, raw, std::move(calls));
      buf_.erase(0, q == std::string::npos ? buf_.size() : q + m.close.size());
      state_ = State::content;
      continue;
    }
    return;
  }
}

ToolCallOutput ToolCallParser::push(const std::string& text) {
  ToolCallOutput out;
  buf_ += text;
  step(out, false);
  return out;
}

ToolCallOutput ToolCallParser::finish() {
  ToolCallOutput out;
  step(out, true);
  return out;
}

ToolCallOutput ToolCallParser::parse(const std::string& text) {
  ToolCallOutput out = push(text), end = finish();
  out.content += end.content;
  std::vector<ToolCall> calls;
  append_tool_call_pieces(calls, std::move(out.calls));
  append_tool_call_pieces(calls, std::move(end.calls));
  out.calls = std::move(calls);
  return out;
}

}  // namespace osprey
