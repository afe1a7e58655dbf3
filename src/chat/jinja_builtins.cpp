#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "chat/jinja_strings.h"
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

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, int line) {
  std::string out;
  json_value(out, v, indent, 0, item_sep, key_sep, sort_keys, line);
  return out;
}

}  // namespace osprey::jinja
