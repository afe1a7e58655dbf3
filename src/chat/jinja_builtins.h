#pragma once
// Filters, tests, attributes and methods of the chat-template interpreter: what jinja2 and
// Python provide for str, list and dict values. Each takes the template line for its messages.
#include <functional>
#include <string>

#include "chat/jinja_value.h"

namespace osprey::jinja {

// Throws InvalidInput "chat template line N: what".
[[noreturn]] void fail(int line, const std::string& what);
// Throws Unsupported "chat template line N: what is not supported".
[[noreturn]] void fail_unsupported(int line, const std::string& what);
// jinja2's UndefinedError for using an undefined value where it raises.
[[noreturn]] void fail_undefined(int line, const Value& v);

// obj.name: a str/list/dict method (bound), a dict key or namespace attribute, else Undefined.
Value get_attr(const Value& obj, const std::string& name, int line);
// obj[key]: list/str index, dict key, else Undefined.
Value get_item(const Value& obj, const Value& key, int line);
// obj[start:stop:step] on a list or str (null parts are omitted ones).
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line);

// The items a for loop visits: a list's items, a dict's keys, a str's characters.
List iterate(const Value& v, int line);

// value | name(args).
Value apply_filter(const std::string& name, const Value& v, CallArgs& args, int line);
// value is name(args).
bool apply_test(const std::string& name, const Value& v, CallArgs& args, int line);

// json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators=..., sort_keys=...).
std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, int line);

}  // namespace osprey::jinja
