#pragma once
// Filters, tests, attributes and methods of the chat-template interpreter: what jinja2 and
// Python provide for str, list and dict values. Each takes the template line for its messages.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace osprey::jinja {

// Throws InvalidInput "chat template line N: what".
[[noreturn]] void fail(int line, const std::string& what);
// Throws Unsupported "chat template line N: what is not supported".
[[noreturn]] void fail_unsupported(int line, const std::string& what);
// jinja2's UndefinedError for using an undefined value where it raises.
[[noreturn]] void fail_undefined(int line, const Value& v);

// Arguments bound by name or position, as a Python signature binds them; `fn` names the
// callable in messages. Holds a reference to the CallArgs it binds.
class Args {
 public:
  Args(CallArgs& a, std::string fn, std::vector<std::string> names, int line)
      : a_(a), fn_(std::move(fn)), names_(std::move(names)), line_(line) {
    if (a_.pos.size() > names_.size())
      fail(line_, fn_ + "() takes at most " + std::to_string(names_.size()) + " argument(s), " +
                      std::to_string(a_.pos.size()) + " given");
    for (const auto& [k, v] : a_.kw)
      if (std::find(names_.begin(), names_.end(), k) == names_.end())
        fail(line_, fn_ + "() got an unexpected keyword argument '" + k + "'");
  }
  const Value* get(std::size_t idx) const {
    if (idx < a_.pos.size()) return &a_.pos[idx];
    for (const auto& [k, v] : a_.kw)
      if (k == names_[idx]) return &v;
    return nullptr;
  }
  const Value& need(std::size_t idx) const {
    const Value* v = get(idx);
    if (!v) fail(line_, fn_ + "() missing required argument '" + names_[idx] + "'");
    return *v;
  }
  std::string str(std::size_t idx) const {
    const Value& v = need(idx);
    if (!v.is_string()) fail(line_, fn_ + "() argument '" + names_[idx] + "' must be str, not " + v.type_name());
    return v.s;
  }
  int64_t integer(std::size_t idx, int64_t dflt) const {
    const Value* v = get(idx);
    if (!v || v->is_none()) return dflt;
    if (v->kind == Value::Kind::kInt) return v->i;
    if (v->kind == Value::Kind::kBool) return v->b;
    fail(line_, fn_ + "() argument '" + names_[idx] + "' must be int, not " + v->type_name());
  }
  bool flag(std::size_t idx, bool dflt) const {
    const Value* v = get(idx);
    return v ? v->truthy() : dflt;
  }

 private:
  CallArgs& a_;
  std::string fn_;
  std::vector<std::string> names_;
  int line_;
};

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
