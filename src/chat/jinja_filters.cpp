// The filters and tests of the chat-template interpreter: one table of named filters and one
// of named tests; apply_filter and apply_test look the name up and refuse unknown ones by name.
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>

#include "chat/jinja_strings.h"
#include "tokenizer/utf8.h"

namespace osprey::jinja {

namespace {

// jinja2's indent: lines of s + "\n" (str.splitlines), the first padded only with `first`,
// blank lines only with `blank`.
std::string indent_filter(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string t = s + "\n";
  std::vector<std::string> lines;
  std::size_t i = 0;
  while (i < t.size()) {
    std::size_t j = t.find('\n', i);
    lines.push_back(t.substr(i, j - i));
    i = j + 1;
  }
  std::string rv = lines[0];
  for (std::size_t k = 1; k < lines.size(); ++k) rv += "\n" + ((blank || !lines[k].empty()) ? pad + lines[k] : lines[k]);
  return first ? pad + rv : rv;
}

double as_double(const Value& v) { return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kInt ? double(v.i) : double(v.b); }

// Python < on values of one comparable kind.
bool less(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat)
      return (a.kind == Value::Kind::kInt ? a.i : a.b) < (b.kind == Value::Kind::kInt ? b.i : b.b);
    return as_double(a) < as_double(b);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_list() && b.is_list()) {
    std::size_t n = std::min(a.list->size(), b.list->size());
    for (std::size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return less((*a.list)[k], (*b.list)[k], line);
    }
    return a.list->size() < b.list->size();
  }
  fail(line, std::string("'<' not supported between instances of '") + a.type_name() + "' and '" + b.type_name() + "'");
}

// jinja2's attribute lookup for filters: "a.b.0" walks dicts and lists.
Value attr_path(const Value& v, const Value& attribute, int line) {
  if (attribute.kind == Value::Kind::kInt) return get_item(v, attribute, line);
  if (!attribute.is_string()) fail(line, "attribute must be a string");
  Value cur = v;
  std::size_t i = 0;
  const std::string& path = attribute.s;
  while (true) {
    std::size_t j = path.find('.', i);
    std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? get_item(cur, Value::integer(std::stoll(part)), line) : get_item(cur, Value::string(part), line);
    if (j == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    i = j + 1;
  }
}

Value sum_values(const List& items, Value start, int line) {
  Value acc = std::move(start);
  for (const Value& v : items) {
    if (!acc.is_number() || !v.is_number()) fail(line, std::string("sum: unsupported operand types ") + acc.type_name() + " and " + v.type_name());
    if (acc.kind == Value::Kind::kFloat || v.kind == Value::Kind::kFloat) acc = Value::floating(as_double(acc) + as_double(v));
    else acc = Value::integer((acc.kind == Value::Kind::kInt ? acc.i : acc.b) + (v.kind == Value::Kind::kInt ? v.i : v.b));
  }
  return acc;
}

// One call of a filter or test: the name it was called by, its arguments and the template line.
struct Call {
  const std::string& name;
  CallArgs& args;
  int line;
  std::string fn;  // "filter <name>" or "test <name>", for messages

  // Binds the arguments to these parameter names; refuses extra or unknown ones.
  Args bind(std::vector<std::string> names) const { return Args(args, fn, std::move(names), line); }
};

using FilterFn = Value (*)(const Call&, const Value&);

Value filter_length(const Call& c, const Value& v) {
  c.bind({});
  switch (v.kind) {
    case Value::Kind::kUndefined: return Value::integer(0);
    case Value::Kind::kString: return Value::integer(int64_t(utf8_length(v.s)));
    case Value::Kind::kList: return Value::integer(int64_t(v.list->size()));
    case Value::Kind::kDict:
      if (!v.namespace_) return Value::integer(int64_t(v.dict->items.size()));
      [[fallthrough]];
    default: fail(c.line, std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

Value filter_tojson(const Call& c, const Value& v) {
  Args args = c.bind({"ensure_ascii", "indent", "separators", "sort_keys"});
  if (args.flag(0, false)) fail_unsupported(c.line, "tojson(ensure_ascii=true)");
  int indent = -1;
  if (const Value* iv = args.get(1); iv && !iv->is_none()) {
    if (iv->kind != Value::Kind::kInt) fail_unsupported(c.line, "tojson indent that is not an integer");
    indent = int(std::max<int64_t>(iv->i, 0));
  }
  std::string item_sep = indent < 0 ? ", " : ",", key_sep = ": ";
  if (const Value* sv = args.get(2); sv && !sv->is_none()) {
    if (!sv->is_list() || sv->list->size() != 2 || !(*sv->list)[0].is_string() || !(*sv->list)[1].is_string())
      fail(c.line, "tojson separators must be a pair of strings");
    item_sep = (*sv->list)[0].s;
    key_sep = (*sv->list)[1].s;
  }
  return Value::string(to_json(v, indent, item_sep, key_sep, args.flag(3, false), c.line));
}

Value filter_join(const Call& c, const Value& v) {
  Args args = c.bind({"d", "attribute"});
  std::string sep = args.get(0) ? to_str(*args.get(0)) : "";
  std::string out;
  bool first = true;
  for (Value item : iterate(v, c.line)) {
    if (const Value* at = args.get(1)) item = attr_path(item, *at, c.line);
    if (!first) out += sep;
    first = false;
    out += to_str(item);
  }
  return Value::string(out);
}

Value filter_default(const Call& c, const Value& v) {
  Args args = c.bind({"default_value", "boolean"});
  bool use = v.is_undefined() || (args.flag(1, false) && !v.truthy());
  if (!use) return v;
  const Value* d = args.get(0);
  return d ? *d : Value::string("");
}

// first, last.
Value filter_end_item(const Call& c, const Value& v) {
  c.bind({});
  List items = iterate(v, c.line);
  if (items.empty()) return Value::undefined("No " + c.name + " item, sequence was empty; it");
  return c.name == "first" ? items.front() : items.back();
}

Value filter_int(const Call& c, const Value& v) {
  Args args = c.bind({"default", "base"});
  Value dflt = args.get(0) ? *args.get(0) : Value::integer(0);
  if (v.kind == Value::Kind::kInt) return v;
  if (v.kind == Value::Kind::kBool) return Value::integer(v.b);
  if (v.kind == Value::Kind::kFloat) return std::isfinite(v.f) ? Value::integer(int64_t(v.f)) : dflt;
  if (v.is_string()) {
    std::string t = strip(v.s, nullptr, true, true);
    std::size_t used = 0;
    try {
      long long x = std::stoll(t, &used, int(args.integer(1, 10)));
      if (used == t.size()) return Value::integer(x);
    } catch (const std::exception&) {
    }
    try {
      double x = std::stod(t, &used);
      if (used == t.size() && std::isfinite(x)) return Value::integer(int64_t(x));
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value filter_float(const Call& c, const Value& v) {
  Args args = c.bind({"default"});
  Value dflt = args.get(0) ? *args.get(0) : Value::floating(0.0);
  if (v.is_number()) return Value::floating(as_double(v));
  if (v.is_string()) {
    std::string t = strip(v.s, nullptr, true, true);
    std::size_t used = 0;
    try {
      double x = std::stod(t, &used);
      if (used == t.size()) return Value::floating(x);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value filter_indent(const Call& c, const Value& v) {
  Args args = c.bind({"width", "first", "blank"});
  std::string pad;
  const Value* w = args.get(0);
  if (w && w->is_string()) pad = w->s;
  else pad = std::string(std::size_t(std::max<int64_t>(args.integer(0, 4), 0)), ' ');
  return Value::string(indent_filter(to_str(v), pad, args.flag(1, false), args.flag(2, false)));
}

Value filter_items(const Call& c, const Value& v) {
  c.bind({});
  if (v.is_undefined()) return Value::make_list({});
  if (!v.is_dict() || v.namespace_) fail(c.line, std::string("items filter needs a mapping, got ") + v.type_name());
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({Value::string(k), x}, true));
  return Value::make_list(std::move(out));
}

Value filter_reverse(const Call& c, const Value& v) {
  c.bind({});
  if (v.is_string()) {
    std::vector<std::string> cs = utf8_chars(v.s);
    std::string out;
    for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
    return Value::string(out);
  }
  List items = iterate(v, c.line);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}

// sort, unique, min, max: each orders items by a key (an attribute path, case-folded unless
// case_sensitive).
Value filter_ordered(const Call& c, const Value& v) {
  const std::string& name = c.name;
  bool is_sort = name == "sort";
  Args args = c.bind(is_sort ? std::vector<std::string>{"reverse", "case_sensitive", "attribute"}
                             : std::vector<std::string>{"case_sensitive", "attribute"});
  bool reverse = is_sort && args.flag(0, false);
  bool case_sensitive = args.flag(is_sort ? 1 : 0, false);
  const Value* attribute = args.get(is_sort ? 2 : 1);
  int line = c.line;
  List items = iterate(v, line);
  auto key = [&](const Value& x) {
    Value k = attribute ? attr_path(x, *attribute, line) : x;
    if (!case_sensitive && k.is_string()) k = Value::string(lower(k.s));
    return k;
  };
  if (name == "unique") {
    List out, keys;
    for (const Value& x : items) {
      Value k = key(x);
      if (std::none_of(keys.begin(), keys.end(), [&](const Value& y) { return equals(k, y); })) {
        keys.push_back(k);
        out.push_back(x);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "min" || name == "max") {
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty; it");
    std::size_t best = 0;
    for (std::size_t k = 1; k < items.size(); ++k) {
      bool better = name == "min" ? less(key(items[k]), key(items[best]), line) : less(key(items[best]), key(items[k]), line);
      if (better) best = k;
    }
    return items[best];
  }
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x), line) : less(key(x), key(y), line);
  });
  return Value::make_list(std::move(items));
}

Value filter_sum(const Call& c, const Value& v) {
  Args args = c.bind({"attribute", "start"});
  List items = iterate(v, c.line);
  if (const Value* at = args.get(0))
    for (Value& x : items) x = attr_path(x, *at, c.line);
  return sum_values(items, args.get(1) ? *args.get(1) : Value::integer(0), c.line);
}

Value filter_abs(const Call& c, const Value& v) {
  c.bind({});
  if (v.kind == Value::Kind::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
  if (v.kind == Value::Kind::kBool) return Value::integer(v.b);
  if (v.kind == Value::Kind::kFloat) return Value::floating(std::fabs(v.f));
  fail(c.line, std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

// map(attribute=..., default=...) or map("filter", args...).
Value filter_map(const Call& c, const Value& v) {
  const CallArgs& a = c.args;
  int line = c.line;
  if (a.pos.empty()) {
    Value attribute;
    Value dflt;
    bool has_default = false;
    for (const auto& [k, x] : a.kw) {
      if (k == "attribute") attribute = x;
      else if (k == "default") { dflt = x; has_default = true; }
      else fail(line, "map() got an unexpected keyword argument '" + k + "'");
    }
    if (attribute.is_undefined()) fail(line, "map() needs a filter name or attribute=");
    List out;
    for (const Value& x : iterate(v, line)) {
      Value y = attr_path(x, attribute, line);
      out.push_back(y.is_undefined() && has_default ? dflt : y);
    }
    return Value::make_list(std::move(out));
  }
  if (!a.pos[0].is_string()) fail(line, "map() filter name must be a string");
  std::string filter = a.pos[0].s;
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  List out;
  for (const Value& x : iterate(v, line)) {
    CallArgs copy = rest;
    out.push_back(apply_filter(filter, x, copy, line));
  }
  return Value::make_list(std::move(out));
}

// select, reject, selectattr, rejectattr: keep the items whose subject passes (or fails) a test.
Value filter_select(const Call& c, const Value& v) {
  const std::string& name = c.name;
  const CallArgs& a = c.args;
  int line = c.line;
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool keep_if = name == "select" || name == "selectattr";
  std::size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) fail(line, name + "() needs an attribute name");
    attribute = a.pos[k++];
  }
  std::string test;
  if (k < a.pos.size()) {
    if (!a.pos[k].is_string()) fail(line, name + "() test name must be a string");
    test = a.pos[k++].s;
  }
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + std::ptrdiff_t(k), a.pos.end());
  rest.kw = a.kw;
  List out;
  for (const Value& x : iterate(v, line)) {
    Value subject = by_attr ? attr_path(x, attribute, line) : x;
    CallArgs copy = rest;
    bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, copy, line);
    if (ok == keep_if) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}

Value filter_round(const Call& c, const Value& v) {
  Args args = c.bind({"precision", "method"});
  int64_t precision = args.integer(0, 0);
  std::string method = args.get(1) ? to_str(*args.get(1)) : "common";
  double x = as_double(v), p = std::pow(10.0, double(precision));
  // Python's round() rounds half to even.
  double r = method == "ceil" ? std::ceil(x * p) / p : method == "floor" ? std::floor(x * p) / p : std::nearbyint(x * p) / p;
  return Value::floating(r);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"abs", filter_abs},
      {"capitalize", [](const Call& c, const Value& v) { return c.bind({}), Value::string(capitalize(to_str(v))); }},
      {"count", filter_length},
      {"d", filter_default},
      {"default", filter_default},
      {"first", filter_end_item},
      {"float", filter_float},
      {"indent", filter_indent},
      {"int", filter_int},
      {"items", filter_items},
      {"join", filter_join},
      {"last", filter_end_item},
      {"length", filter_length},
      {"list", [](const Call& c, const Value& v) { return c.bind({}), Value::make_list(iterate(v, c.line)); }},
      {"lower", [](const Call& c, const Value& v) { return c.bind({}), Value::string(lower(to_str(v))); }},
      {"map", filter_map},
      {"max", filter_ordered},
      {"min", filter_ordered},
      {"reject", filter_select},
      {"rejectattr", filter_select},
      {"replace",
       [](const Call& c, const Value& v) {
         Args args = c.bind({"old", "new", "count"});
         return Value::string(replace(to_str(v), to_str(args.need(0)), to_str(args.need(1)), args.integer(2, -1)));
       }},
      {"reverse", filter_reverse},
      {"round", filter_round},
      {"safe", [](const Call& c, const Value& v) { return c.bind({}), v; }},
      {"select", filter_select},
      {"selectattr", filter_select},
      {"sort", filter_ordered},
      {"string", [](const Call& c, const Value& v) { return c.bind({}), Value::string(to_str(v)); }},
      {"sum", filter_sum},
      {"title", [](const Call& c, const Value& v) { return c.bind({}), Value::string(jinja_title(to_str(v))); }},
      {"tojson", filter_tojson},
      {"trim",
       [](const Call& c, const Value& v) {
         return Value::string(strip(to_str(v), c.bind({"chars"}).get(0), true, true));
       }},
      {"unique", filter_ordered},
      {"upper", [](const Call& c, const Value& v) { return c.bind({}), Value::string(upper(to_str(v))); }},
      {"wordcount",
       [](const Call& c, const Value& v) {
         return c.bind({}), Value::integer(int64_t(split(to_str(v), nullptr, -1, c.line).size()));
       }},
  };
  return kFilters;
}

// Tests that take no arguments: a predicate on the value alone.
using Predicate = bool (*)(const Value&);

const std::unordered_map<std::string_view, Predicate>& predicate_tests() {
  using K = Value::Kind;
  static const std::unordered_map<std::string_view, Predicate> kTests = {
      {"boolean", [](const Value& v) { return v.kind == K::kBool; }},
      {"callable", [](const Value& v) { return v.kind == K::kFunction; }},
      {"defined", [](const Value& v) { return !v.is_undefined(); }},
      {"false", [](const Value& v) { return v.kind == K::kBool && !v.b; }},
      {"float", [](const Value& v) { return v.kind == K::kFloat; }},
      {"integer", [](const Value& v) { return v.kind == K::kInt; }},
      {"iterable", [](const Value& v) { return v.is_list() || v.is_string() || (v.is_dict() && !v.namespace_) || v.is_undefined(); }},
      {"lower", [](const Value& v) { std::string s = to_str(v); return lower(s) == s; }},
      {"mapping", [](const Value& v) { return v.is_dict() && !v.namespace_; }},
      {"none", [](const Value& v) { return v.is_none(); }},
      {"number", [](const Value& v) { return v.is_number(); }},
      {"sequence", [](const Value& v) { return v.is_list() || v.is_string() || (v.is_dict() && !v.namespace_) || v.is_undefined(); }},
      {"string", [](const Value& v) { return v.is_string(); }},
      {"true", [](const Value& v) { return v.kind == K::kBool && v.b; }},
      {"undefined", [](const Value& v) { return v.is_undefined(); }},
      {"upper", [](const Value& v) { std::string s = to_str(v); return upper(s) == s; }},
  };
  return kTests;
}

using TestFn = bool (*)(const Call&, const Value&);

// odd, even, divisibleby(num) on an integer.
bool test_parity(const Call& c, const Value& v) {
  using K = Value::Kind;
  Args args = c.bind(c.name == "divisibleby" ? std::vector<std::string>{"num"} : std::vector<std::string>{});
  if (v.kind != K::kInt && v.kind != K::kBool) fail_unsupported(c.line, c.fn + " on a " + v.type_name());
  int64_t x = v.kind == K::kInt ? v.i : v.b;
  if (c.name == "divisibleby") {
    int64_t d = args.integer(0, 1);
    if (d == 0) fail(c.line, "divisibleby(0)");
    return ((x % d) + d) % d == 0;
  }
  return (((x % 2) + 2) % 2 == 1) == (c.name == "odd");
}

// The comparison tests (eq, lt, sameas, in, ...) against one argument `other`.
bool test_compare(const Call& c, const Value& v) {
  const std::string& name = c.name;
  int line = c.line;
  Args args = c.bind({"other"});
  const Value& o = args.need(0);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, o);
  if (name == "ne" || name == "!=") return !equals(v, o);
  if (name == "sameas") {
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    if (v.is_string()) return false;  // distinct str objects are not the same
    return equals(v, o);
  }
  if (name == "in") {
    if (o.is_string()) {
      if (!v.is_string()) fail(line, "'in <string>' requires string as left operand");
      return o.s.find(v.s) != std::string::npos;
    }
    for (const Value& x : iterate(o, line))
      if (equals(v, x)) return true;
    return false;
  }
  if (v.is_undefined() || o.is_undefined()) fail_undefined(line, v.is_undefined() ? v : o);
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, o, line);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(o, v, line);
  if (name == "le" || name == "<=") return !less(o, v, line);
  return !less(v, o, line);
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"divisibleby", test_parity}, {"even", test_parity},    {"odd", test_parity},
      {"eq", test_compare},         {"equalto", test_compare}, {"==", test_compare},
      {"ne", test_compare},         {"!=", test_compare},      {"lt", test_compare},
      {"lessthan", test_compare},   {"<", test_compare},       {"le", test_compare},
      {"<=", test_compare},         {"gt", test_compare},      {"greaterthan", test_compare},
      {">", test_compare},          {"ge", test_compare},      {">=", test_compare},
      {"sameas", test_compare},     {"in", test_compare},
  };
  return kTests;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, CallArgs& a, int line) {
  auto it = filters().find(name);
  if (it == filters().end()) fail_unsupported(line, name == "dictsort" ? "filter dictsort" : "filter '" + name + "'");
  return it->second(Call{name, a, line, "filter " + name}, v);
}

bool apply_test(const std::string& name, const Value& v, CallArgs& a, int line) {
  Call call{name, a, line, "test " + name};
  if (auto it = predicate_tests().find(name); it != predicate_tests().end()) {
    call.bind({});
    return it->second(v);
  }
  auto it = tests().find(name);
  if (it == tests().end()) fail_unsupported(line, "test '" + name + "'");
  return it->second(call, v);
}

}  // namespace osprey::jinja
