#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/utf8.h"

namespace osprey::jinja {

namespace {

Value of_kind(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}

}  // namespace

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() { return of_kind(Kind::kNone); }
Value Value::boolean(bool x) {
  Value v = of_kind(Kind::kBool);
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v = of_kind(Kind::kInt);
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v = of_kind(Kind::kFloat);
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v = of_kind(Kind::kString);
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List items, bool is_tuple) {
  Value v = of_kind(Kind::kList);
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = is_tuple;
  return v;
}
Value Value::make_dict() {
  Value v = of_kind(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::function(Function f) {
  Value v = of_kind(Kind::kFunction);
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0;
    case Kind::kString: return !s.empty();
    case Kind::kList: return !list->empty();
    case Kind::kDict: return !dict->items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple ? "tuple" : "list";
    case Kind::kDict: return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
Value* Dict::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
void Dict::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's 'r' layout: positional when -4 <= exp < 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  std::size_t e = sci.find('e');
  int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (std::size_t k = 0; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(std::size_t(-exp - 1), '0') + digits;
    } else if (std::size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(std::size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, std::size_t(exp) + 1) + "." + digits.substr(std::size_t(exp) + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

namespace {

// Python str.isprintable() for the code points that matter in chat text: controls, C1,
// NBSP-like separators and the line/paragraph separators are not printable.
bool printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;
  if (cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
      (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF)
    return false;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  if (cp >= 0xE000 && cp <= 0xF8FF) return false;
  return true;
}

std::string repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  std::size_t i = 0;
  while (i < s.size()) {
    char buf[16];
    // A template's own bytes need not be UTF-8: a byte that starts no complete sequence is
    // written as \xNN, never read past.
    const utf8::Scan sc = utf8::scan(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
    if (sc.kind != utf8::Scan::kComplete) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(static_cast<unsigned char>(s[i])));
      out += buf;
      ++i;
      continue;
    }
    const uint32_t cp = sc.cp;
    i += sc.len;
    if (cp == '\\') out += "\\\\";
    else if (cp == uint32_t(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (printable(cp)) utf8::append(out, cp);
    else {
      if (cp < 0x100) std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      else std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return repr_string(v.s);
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      if (v.namespace_) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(x);
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: return float_repr(v.f);
    case Value::Kind::kString: return v.s;
    case Value::Kind::kFunction: return "<function>";
    default: return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    auto num = [](const Value& x) { return x.kind == K::kFloat ? x.f : x.kind == K::kInt ? double(x.i) : double(x.b); };
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      int64_t x = a.kind == K::kInt ? a.i : a.b, y = b.kind == K::kInt ? b.i : b.b;
      return x == y;
    }
    return num(a) == num(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.s == b.s;
    case K::kList:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::kDict:
      if (a.dict == b.dict) return true;
      if (a.namespace_ || b.namespace_ || a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equals(x, *y)) return false;
      }
      return true;
    case K::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

std::size_t utf8_length(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = utf8::seq_len(static_cast<unsigned char>(s[i]));
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace osprey::jinja
