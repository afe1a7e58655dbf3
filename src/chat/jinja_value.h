#pragma once
// Values of the chat-template interpreter, with Python's semantics as jinja2 sees them:
// None, bool, int, float, str (UTF-8, indexed by code point), list and tuple, dict (string
// keys, insertion order), callables, and jinja2's Undefined. Lists and dicts are shared by
// reference, as in Python; templates cannot mutate them (transformers' sandbox is immutable)
// except through a namespace().
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace osprey::jinja {

struct Value;
struct Dict;
using List = std::vector<Value>;

// Arguments of a call: positional, then keyword in source order.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// A function value (a global, a bound method, a macro). Throws osprey errors.
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for Undefined, the name that was not found (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;
  bool tuple = false;      // a list that prints as (a, b)
  bool namespace_ = false; // a dict made by namespace(): attribute assignment allowed

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(List items, bool is_tuple = false);
  static Value make_dict();
  static Value function(Function fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }

  // Python truthiness; Undefined is false.
  bool truthy() const;
  // Python type name, for messages ("str", "int", "dict", ...).
  const char* type_name() const;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;

  // The value under key, or nullptr.
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  // Sets key, appending it when new (Python dict order).
  void set(const std::string& key, Value v);
};

// str(v) as jinja2 prints it: Undefined is empty, None is "None", floats as Python repr,
// lists and dicts as Python repr.
std::string to_str(const Value& v);
// Python repr(v).
std::string repr(const Value& v);
// Python's float repr ("1.0", "1e+20", "0.30000000000000004", "inf").
std::string float_repr(double v);

// Python ==, with 1 == 1.0 == True; Undefined equals only Undefined.
bool equals(const Value& a, const Value& b);

// Number of code points of valid UTF-8.
std::size_t utf8_length(const std::string& s);
// Splits valid UTF-8 into its code points, each as a string.
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace osprey::jinja
