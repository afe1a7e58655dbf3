#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace osprey::jinja {

void fail(int line, const std::string& what) {
  throw InvalidInput("chat template line " + std::to_string(line) + ": " + what);
}

void fail_unsupported(int line, const std::string& what) {
  throw Unsupported("chat template line " + std::to_string(line) + ": " + what + " is not supported");
}

void fail_undefined(int line, const Value& v) {
  fail(line, v.s.empty() ? "undefined value used" : v.s + " is undefined");
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python str.strip family; chars empty means whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  if (chars && chars->is_string()) {
    std::vector<std::string> set = utf8_chars(chars->s);
    std::vector<std::string> cs = utf8_chars(s);
    auto in = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
    std::size_t b = 0, e = cs.size();
    if (left)
      while (b < e && in(cs[b])) ++b;
    if (right)
      while (e > b && in(cs[e - 1])) --e;
    std::string out;
    for (std::size_t k = b; k < e; ++k) out += cs[k];
    return out;
  }
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e && is_ws(s[b])) ++b;
  if (right)
    while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// ASCII case mapping; other code points are left as they are.
std::string upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 32);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return s;
}

// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = prev_letter ? char(std::tolower(u)) : char(std::toupper(u));
      prev_letter = true;
    } else {
      prev_letter = u >= 0x80 ? prev_letter : false;
    }
  }
  return out;
}

// jinja2's title filter: words split at runs of "-", whitespace, "(", "{", "[", "<".
std::string jinja_title(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    bool sep = c == '-' || is_ws(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      start = true;
    } else {
      out += start ? char(std::toupper(static_cast<unsigned char>(c))) : char(std::tolower(static_cast<unsigned char>(c)));
      start = false;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

List split(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  List out;
  if (!sep || sep->is_none()) {
    std::size_t i = 0;
    while (true) {
      while (i < s.size() && is_ws(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::size_t e = s.size();
        while (e > i && is_ws(s[e - 1])) --e;
        out.push_back(Value::string(s.substr(i, e - i)));
        break;
      }
      std::size_t j = i;
      while (j < s.size() && !is_ws(s[j])) ++j;
      out.push_back(Value::string(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) fail(line, std::string("split() separator must be str, not ") + sep->type_name());
  if (sep->s.empty()) fail(line, "split(): empty separator");
  std::size_t i = 0;
  while (true) {
    std::size_t j = s.find(sep->s, i);
    if (j == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(i)));
      return out;
    }
    out.push_back(Value::string(s.substr(i, j - i)));
    i = j + sep->s.size();
  }
}

List rsplit(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  if (maxsplit < 0) return split(s, sep, -1, line);
  if (!sep || !sep->is_string() || sep->s.empty()) fail_unsupported(line, "rsplit() with a maxsplit and no separator");
  List out;
  std::size_t end = s.size();
  while (int64_t(out.size()) < maxsplit) {
    if (end < sep->s.size()) break;
    std::size_t j = s.rfind(sep->s, end - sep->s.size());
    if (j == std::string::npos) break;
    out.insert(out.begin(), Value::string(s.substr(j + sep->s.size(), end - j - sep->s.size())));
    end = j;
  }
  out.insert(out.begin(), Value::string(s.substr(0, end)));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` between every character and at both ends.
    std::vector<std::string> cs = utf8_chars(s);
    int64_t n = 0;
    for (std::size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      if (k < cs.size()) out += cs[k];
    }
    return out;
  }
  std::size_t i = 0;
  int64_t n = 0;
  while (true) {
    std::size_t j = s.find(old, i);
    if (j == std::string::npos || (count >= 0 && n == count)) break;
    out += s.substr(i, j - i) + with;
    i = j + old.size();
    ++n;
  }
  return out + s.substr(i);
}

// Arguments bound by name or position, as a Python signature binds them.
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

bool starts_or_ends(const std::string& s, const Value& what, bool at_start, int line, const char* fn) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail(line, std::string(fn) + "() argument must be str or a tuple of str, not " + p.type_name());
    if (p.s.size() > s.size()) return false;
    return at_start ? s.compare(0, p.s.size(), p.s) == 0 : s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
  };
  if (what.is_list() && what.tuple) {
    for (const Value& p : *what.list)
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

int64_t char_index(const std::string& s, std::size_t byte_pos) {
  return int64_t(utf8_length(s.substr(0, byte_pos)));
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a, int line) {
  std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Args args(a, fn, {"chars"}, line);
    return Value::string(strip(s, args.get(0), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Args args(a, fn, {"sep", "maxsplit"}, line);
    int64_t maxsplit = args.integer(1, -1);
    return Value::make_list(name == "split" ? split(s, args.get(0), maxsplit, line) : rsplit(s, args.get(0), maxsplit, line));
  }
  if (name == "splitlines") {
    Args args(a, fn, {"keepends"}, line);
    List out;
    std::size_t i = 0;
    while (i < s.size()) {
      std::size_t j = i;
      while (j < s.size() && s[j] != '\n' && s[j] != '\r') ++j;
      std::size_t e = j;
      if (j < s.size()) j += (s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ? 2 : 1;
      out.push_back(Value::string(s.substr(i, (args.flag(0, false) ? j : e) - i)));
      i = j;
    }
    return Value::make_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Args args(a, fn, {"prefix"}, line);
    return Value::boolean(starts_or_ends(s, args.need(0), name == "startswith", line, fn.c_str()));
  }
  if (name == "replace") {
    Args args(a, fn, {"old", "new", "count"}, line);
    return Value::string(replace(s, args.str(0), args.str(1), args.integer(2, -1)));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Args args(a, fn, {"affix"}, line);
    std::string x = args.str(0);
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
    if (name == "removesuffix" && x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::string(s.substr(0, s.size() - x.size()));
    return Value::string(s);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    Args args(a, fn, {}, line);
    if (name == "upper") return Value::string(upper(s));
    if (name == "lower") return Value::string(lower(s));
    if (name == "title") return Value::string(py_title(s));
    return Value::string(capitalize(s));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Args args(a, fn, {"sub"}, line);
    std::string sub = args.str(0);
    if (name == "count") {
      if (sub.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      int64_t n = 0;
      for (std::size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
      return Value::integer(n);
    }
    std::size_t p = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") fail(line, "substring not found");
      return Value::integer(-1);
    }
    return Value::integer(char_index(s, p));
  }
  if (name == "join") {
    Args args(a, fn, {"iterable"}, line);
    std::string out;
    bool first = true;
    for (const Value& v : iterate(args.need(0), line)) {
      if (!v.is_string()) fail(line, std::string("str.join() expected str items, found ") + v.type_name());
      if (!first) out += s;
      first = false;
      out += v.s;
    }
    return Value::string(out);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    Args args(a, fn, {}, line);
    if (s.empty()) return Value::boolean(false);
    bool any_cased = false, ok = true;
    for (unsigned char c : s) {
      if (c >= 0x80) fail_unsupported(line, fn + "() on non-ASCII text");
      if (name == "isdigit") ok &= bool(std::isdigit(c));
      else if (name == "isalpha") ok &= bool(std::isalpha(c));
      else if (name == "isalnum") ok &= bool(std::isalnum(c));
      else if (name == "isspace") ok &= is_ws(c);
      else if (name == "isupper") { ok &= !std::islower(c); any_cased |= bool(std::isupper(c)); }
      else { ok &= !std::isupper(c); any_cased |= bool(std::islower(c)); }
    }
    return Value::boolean(ok && (name != "isupper" && name != "islower" ? true : any_cased));
  }
  fail_unsupported(line, "method " + fn);
}

const std::set<std::string>& python_methods(const Value& v) {
  static const std::set<std::string> kStr = {
      "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
      "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
      "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
      "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
      "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
      "translate", "upper", "zfill"};
  static const std::set<std::string> kList = {"append", "clear", "copy", "count", "extend", "index",
                                              "insert", "pop", "remove", "reverse", "sort"};
  static const std::set<std::string> kDict = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop",
                                              "popitem", "setdefault", "update", "values"};
  static const std::set<std::string> kNone;
  if (v.is_string()) return kStr;
  if (v.is_list()) return kList;
  if (v.is_dict() && !v.namespace_) return kDict;
  return kNone;
}

Value bound_method(const Value& obj, const std::string& name, int line) {
  Value self = obj;
  if (obj.is_string())
    return Value::function([self, name, line](CallArgs& a) { return string_method(self.s, name, a, line); });
  std::string fn = std::string(obj.type_name()) + "." + name;
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values") {
      return Value::function([self, name, fn, line](CallArgs& a) {
        Args args(a, fn, {}, line);
        List out;
        for (const auto& [k, v] : self.dict->items) {
          if (name == "items") out.push_back(Value::make_list({Value::string(k), v}, true));
          else out.push_back(name == "keys" ? Value::string(k) : v);
        }
        return Value::make_list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::function([self, fn, line](CallArgs& a) {
        Args args(a, fn, {"key", "default"}, line);
        const Value& key = args.need(0);
        const Value* v = key.is_string() ? self.dict->find(key.s) : nullptr;
        if (v) return *v;
        const Value* d = args.get(1);
        return d ? *d : Value::none();
      });
    }
  }
  if (obj.is_list() && (name == "index" || name == "count")) {
    return Value::function([self, name, fn, line](CallArgs& a) {
      Args args(a, fn, {"value"}, line);
      const Value& x = args.need(0);
      int64_t n = 0;
      for (std::size_t k = 0; k < self.list->size(); ++k) {
        if (equals((*self.list)[k], x)) {
          if (name == "index") return Value::integer(int64_t(k));
          ++n;
        }
      }
      if (name == "index") fail(line, repr(x) + " is not in list");
      return Value::integer(n);
    });
  }
  static const std::set<std::string> kMutating = {"append", "clear", "extend", "insert", "pop", "remove",
                                                  "reverse", "sort", "popitem", "setdefault", "update"};
  if (kMutating.count(name))
    return Value::function([fn, line](CallArgs&) -> Value {
      fail(line, fn + "() is not allowed: template values are immutable");
    });
  return Value::function([fn, line](CallArgs&) -> Value { fail_unsupported(line, "method " + fn); });
}

int64_t to_index(const Value& v, int line) {
  if (v.kind == Value::Kind::kInt) return v.i;
  if (v.kind == Value::Kind::kBool) return v.b;
  fail(line, std::string("indices must be integers, not ") + v.type_name());
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail(line, (obj.s.empty() ? std::string("undefined value") : obj.s) + " is undefined (reading ." + name + ")");
  if (python_methods(obj).count(name)) return bound_method(obj, name, line);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute '" + name + "'; it");
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail(line, (obj.s.empty() ? std::string("undefined value") : obj.s) + " is undefined (subscripted)");
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      if (python_methods(obj).count(key.s)) return bound_method(obj, key.s, line);
    }
    return Value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute " + repr(key) + "; it");
  }
  if (obj.is_list() || obj.is_string()) {
    if (key.is_string()) return get_attr(obj, key.s, line);
    int64_t i = to_index(key, line);
    if (obj.is_list()) {
      int64_t n = int64_t(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(std::string(obj.type_name()) + " index out of range; it");
      return (*obj.list)[std::size_t(i)];
    }
    std::vector<std::string> cs = utf8_chars(obj.s);
    int64_t n = int64_t(cs.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("string index out of range; it");
    return Value::string(cs[std::size_t(i)]);
  }
  return Value::undefined("'" + std::string(obj.type_name()) + " object' has no item " + repr(key) + "; it");
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
  if (obj.is_undefined()) fail_undefined(line, obj);
  auto opt = [&](const Value* v) -> const Value* { return v && !v->is_none() ? v : nullptr; };
  start = opt(start);
  stop = opt(stop);
  step = opt(step);
  int64_t st = step ? to_index(*step, line) : 1;
  if (st == 0) fail(line, "slice step cannot be zero");
  std::vector<std::string> cs;
  int64_t n;
  if (obj.is_list()) {
    n = int64_t(obj.list->size());
  } else if (obj.is_string()) {
    cs = utf8_chars(obj.s);
    n = int64_t(cs.size());
  } else {
    fail(line, std::string("'") + obj.type_name() + "' object is not subscriptable");
  }
  // Python's slice.indices().
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = to_index(*v, line);
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  int64_t e = clamp(stop, st > 0 ? n : -1);
  List items;
  std::string s;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) {
    if (obj.is_list()) items.push_back((*obj.list)[std::size_t(k)]);
    else s += cs[std::size_t(k)];
  }
  if (obj.is_list()) return Value::make_list(std::move(items), obj.tuple);
  return Value::string(s);
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      if (v.namespace_) fail(line, "'Namespace' object is not iterable");
      List out;
      for (const auto& [k, x] : v.dict->items) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::kString: {
      List out;
      for (auto& c : utf8_chars(v.s)) out.push_back(Value::string(std::move(c)));
      return out;
    }
    default: fail(line, std::string("'") + v.type_name() + "' object is not iterable");
  }
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int level, const std::string& item_sep,
                const std::string& key_sep, bool sort_keys, int line) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out += std::string(std::size_t(indent * lvl), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::kString: json_string(out, v.s); return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_value(out, (*v.list)[k], indent, level + 1, item_sep, key_sep, sort_keys, line);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.namespace_) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_string(out, items[k]->first);
        out += key_sep;
        json_value(out, items[k]->second, indent, level + 1, item_sep, key_sep, sort_keys, line);
      }
      newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  fail(line, std::string("tojson: object of type ") + v.type_name() + " is not JSON serializable");
}

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

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, int line) {
  std::string out;
  json_value(out, v, indent, 0, item_sep, key_sep, sort_keys, line);
  return out;
}

Value apply_filter(const std::string& name, const Value& v, CallArgs& a, int line) {
  const std::string fn = "filter " + name;
  if (name == "trim") {
    Args args(a, fn, {"chars"}, line);
    return Value::string(strip(to_str(v), args.get(0), true, true));
  }
  if (name == "length" || name == "count") {
    Args args(a, fn, {}, line);
    switch (v.kind) {
      case Value::Kind::kUndefined: return Value::integer(0);
      case Value::Kind::kString: return Value::integer(int64_t(utf8_length(v.s)));
      case Value::Kind::kList: return Value::integer(int64_t(v.list->size()));
      case Value::Kind::kDict:
        if (!v.namespace_) return Value::integer(int64_t(v.dict->items.size()));
        [[fallthrough]];
      default: fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
    }
  }
  if (name == "tojson") {
    Args args(a, fn, {"ensure_ascii", "indent", "separators", "sort_keys"}, line);
    if (args.flag(0, false)) fail_unsupported(line, "tojson(ensure_ascii=true)");
    int indent = -1;
    if (const Value* iv = args.get(1); iv && !iv->is_none()) {
      if (iv->kind != Value::Kind::kInt) fail_unsupported(line, "tojson indent that is not an integer");
      indent = int(std::max<int64_t>(iv->i, 0));
    }
    std::string item_sep = indent < 0 ? ", " : ",", key_sep = ": ";
    if (const Value* sv = args.get(2); sv && !sv->is_none()) {
      if (!sv->is_list() || sv->list->size() != 2 || !(*sv->list)[0].is_string() || !(*sv->list)[1].is_string())
        fail(line, "tojson separators must be a pair of strings");
      item_sep = (*sv->list)[0].s;
      key_sep = (*sv->list)[1].s;
    }
    return Value::string(to_json(v, indent, item_sep, key_sep, args.flag(3, false), line));
  }
  if (name == "join") {
    Args args(a, fn, {"d", "attribute"}, line);
    std::string sep = args.get(0) ? to_str(*args.get(0)) : "";
    std::string out;
    bool first = true;
    for (Value item : iterate(v, line)) {
      if (const Value* at = args.get(1)) item = attr_path(item, *at, line);
      if (!first) out += sep;
      first = false;
      out += to_str(item);
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    Args args(a, fn, {"default_value", "boolean"}, line);
    bool use = v.is_undefined() || (args.flag(1, false) && !v.truthy());
    if (!use) return v;
    const Value* d = args.get(0);
    return d ? *d : Value::string("");
  }
  if (name == "first" || name == "last") {
    Args args(a, fn, {}, line);
    List items = iterate(v, line);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty; it");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    Args args(a, fn, {}, line);
    return Value::make_list(iterate(v, line));
  }
  if (name == "string") {
    Args args(a, fn, {}, line);
    return Value::string(to_str(v));
  }
  if (name == "int") {
    Args args(a, fn, {"default", "base"}, line);
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
  if (name == "float") {
    Args args(a, fn, {"default"}, line);
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
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    Args args(a, fn, {}, line);
    std::string s = to_str(v);
    if (name == "upper") return Value::string(upper(s));
    if (name == "lower") return Value::string(lower(s));
    if (name == "capitalize") return Value::string(capitalize(s));
    return Value::string(jinja_title(s));
  }
  if (name == "replace") {
    Args args(a, fn, {"old", "new", "count"}, line);
    return Value::string(replace(to_str(v), to_str(args.need(0)), to_str(args.need(1)), args.integer(2, -1)));
  }
  if (name == "indent") {
    Args args(a, fn, {"width", "first", "blank"}, line);
    std::string pad;
    const Value* w = args.get(0);
    if (w && w->is_string()) pad = w->s;
    else pad = std::string(std::size_t(std::max<int64_t>(args.integer(0, 4), 0)), ' ');
    return Value::string(indent_filter(to_str(v), pad, args.flag(1, false), args.flag(2, false)));
  }
  if (name == "safe") {
    Args args(a, fn, {}, line);
    return v;
  }
  if (name == "items") {
    Args args(a, fn, {}, line);
    if (v.is_undefined()) return Value::make_list({});
    if (!v.is_dict() || v.namespace_) fail(line, std::string("items filter needs a mapping, got ") + v.type_name());
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({Value::string(k), x}, true));
    return Value::make_list(std::move(out));
  }
  if (name == "reverse") {
    Args args(a, fn, {}, line);
    if (v.is_string()) {
      std::vector<std::string> cs = utf8_chars(v.s);
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value::string(out);
    }
    List items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    bool is_sort = name == "sort";
    Args args(a, fn, is_sort ? std::vector<std::string>{"reverse", "case_sensitive", "attribute"}
                              : std::vector<std::string>{"case_sensitive", "attribute"},
              line);
    bool reverse = is_sort && args.flag(0, false);
    bool case_sensitive = args.flag(is_sort ? 1 : 0, false);
    const Value* attribute = args.get(is_sort ? 2 : 1);
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
  if (name == "sum") {
    Args args(a, fn, {"attribute", "start"}, line);
    List items = iterate(v, line);
    if (const Value* at = args.get(0))
      for (Value& x : items) x = attr_path(x, *at, line);
    return sum_values(items, args.get(1) ? *args.get(1) : Value::integer(0), line);
  }
  if (name == "abs") {
    Args args(a, fn, {}, line);
    if (v.kind == Value::Kind::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.kind == Value::Kind::kBool) return Value::integer(v.b);
    if (v.kind == Value::Kind::kFloat) return Value::floating(std::fabs(v.f));
    fail(line, std::string("bad operand type for abs(): '") + v.type_name() + "'");
  }
  if (name == "wordcount") {
    Args args(a, fn, {}, line);
    return Value::integer(int64_t(split(to_str(v), nullptr, -1, line).size()));
  }
  if (name == "map") {
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
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
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
  if (name == "round") {
    Args args(a, fn, {"precision", "method"}, line);
    int64_t precision = args.integer(0, 0);
    std::string method = args.get(1) ? to_str(*args.get(1)) : "common";
    double x = as_double(v), p = std::pow(10.0, double(precision));
    // Python's round() rounds half to even.
    double r = method == "ceil" ? std::ceil(x * p) / p : method == "floor" ? std::floor(x * p) / p : std::nearbyint(x * p) / p;
    return Value::floating(r);
  }
  if (name == "dictsort") fail_unsupported(line, "filter dictsort");
  fail_unsupported(line, "filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, CallArgs& a, int line) {
  const std::string fn = "test " + name;
  using K = Value::Kind;
  auto no_args = [&] { Args args(a, fn, {}, line); };
  if (name == "defined") return no_args(), !v.is_undefined();
  if (name == "undefined") return no_args(), v.is_undefined();
  if (name == "none") return no_args(), v.is_none();
  if (name == "string") return no_args(), v.is_string();
  if (name == "number") return no_args(), v.is_number();
  if (name == "integer") return no_args(), v.kind == K::kInt;
  if (name == "float") return no_args(), v.kind == K::kFloat;
  if (name == "boolean") return no_args(), v.kind == K::kBool;
  if (name == "true") return no_args(), v.kind == K::kBool && v.b;
  if (name == "false") return no_args(), v.kind == K::kBool && !v.b;
  if (name == "mapping") return no_args(), v.is_dict() && !v.namespace_;
  if (name == "iterable") return no_args(), v.is_list() || v.is_string() || (v.is_dict() && !v.namespace_) || v.is_undefined();
  if (name == "sequence") return no_args(), v.is_list() || v.is_string() || (v.is_dict() && !v.namespace_) || v.is_undefined();
  if (name == "callable") return no_args(), v.kind == K::kFunction;
  if (name == "lower" || name == "upper") {
    no_args();
    std::string s = to_str(v);
    return name == "lower" ? lower(s) == s : upper(s) == s;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Args args(a, fn, name == "divisibleby" ? std::vector<std::string>{"num"} : std::vector<std::string>{}, line);
    if (v.kind != K::kInt && v.kind != K::kBool) fail_unsupported(line, fn + " on a " + v.type_name());
    int64_t x = v.kind == K::kInt ? v.i : v.b;
    if (name == "divisibleby") {
      int64_t d = args.integer(0, 1);
      if (d == 0) fail(line, "divisibleby(0)");
      return ((x % d) + d) % d == 0;
    }
    return (((x % 2) + 2) % 2 == 1) == (name == "odd");
  }
  static const std::set<std::string> kCompare = {"eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<",
                                                 "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas", "in"};
  if (kCompare.count(name)) {
    Args args(a, fn, {"other"}, line);
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
  fail_unsupported(line, "test '" + name + "'");
}

}  // namespace osprey::jinja
