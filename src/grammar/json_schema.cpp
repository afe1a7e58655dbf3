#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/grammar.h"

namespace osprey::grammar {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kIntLimit = 999999999999999;  // unbounded integers are generated within +-(10^15 - 1)

// The shared rules, each with the rules it uses.
const std::map<std::string, std::pair<std::string, std::vector<std::string>>>& primitives() {
  static const std::map<std::string, std::pair<std::string, std::vector<std::string>>> p = {
      {"ws", {R"(( " " | "\n" [ \t]{0,12} )?)", {}}},
      {"json-char",
       {R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) ))",
        {}}},
      {"json-string", {R"("\"" json-char* "\"")", {"json-char"}}},
      {"json-int", {R"("-"? ( "0" | [1-9] [0-9]{0,14} ))", {}}},
      {"json-number", {R"(json-int ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,2} )?)", {"json-int"}}},
      {"json-bool", {R"("true" | "false")", {}}},
      {"json-null", {R"("null")", {}}},
      {"json-value",
       {"json-object | json-array | json-string | json-number | json-bool | json-null",
        {"json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"}}},
      {"json-object",
       {R"("{" ws ( json-member ( "," ws json-member )* )? "}")", {"ws", "json-member"}}},
      {"json-member", {R"(json-string ws ":" ws json-value ws)", {"json-string", "ws", "json-value"}}},
      {"json-array", {R"("[" ws ( json-value ws ( "," ws json-value ws )* )? "]")", {"ws", "json-value"}}},
      {"date", {R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ))", {}}},
      {"time",
       {R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
        {}}},
      {"uuid",
       {R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})", {}}},
      {"email-label", {R"([a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )?)", {}}},
      {"email",
       {R"([a-zA-Z0-9_+-]{1,32} ( "." [a-zA-Z0-9_+-]{1,32} ){0,3} "@" email-label ( "." email-label ){1,3})",
        {"email-label"}}},
  };
  return p;
}

std::string lit(const std::string& s) {
  std::string out;
  append_gbnf_literal(out, s);
  return out;
}

bool is_annotation(const std::string& k) {
  static const std::set<std::string> a = {"title",    "description", "$schema",  "$id",       "$comment",
                                          "default",  "examples",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",    "definitions", "strict",   "name",      "$anchor"};
  return a.count(k) > 0;
}

bool is_supported(const std::string& k) {
  static const std::set<std::string> s = {
      "type",      "const",      "enum",          "anyOf",           "oneOf",           "allOf",
      "$ref",      "properties", "required",      "additionalProperties", "items",   "minItems",
      "maxItems",  "minLength",  "maxLength",     "format",          "pattern",         "minimum",
      "maximum",   "exclusiveMinimum", "exclusiveMaximum", "uniqueItems"};
  return s.count(k) > 0;
}

std::string hex8(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto x : r) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

Ranges negate(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto x : normalize(r)) {
    if (x.first > next) out.emplace_back(next, x.first - 1);
    next = x.second + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

// The code points a JSON string holds unescaped: no quote, backslash or control character.
Ranges json_safe(const Ranges& r) {
  Ranges forbidden = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  Ranges allowed = negate(forbidden);
  Ranges out;
  for (auto a : normalize(r))
    for (auto b : allowed) {
      const uint32_t lo = std::max(a.first, b.first), hi = std::min(a.second, b.second);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return out;
}

std::string class_of(const Ranges& r) {
  std::string out = "[";
  for (auto [lo, hi] : r) {
    out += hex8(lo);
    if (hi != lo) {
      out += '-';
      out += hex8(hi);
    }
  }
  return out + "]";
}

// A regular expression (JSON Schema "pattern", ECMA-262 syntax subset) as a GBNF expression over
// the characters of a JSON string.
class RegexTranslator {
 public:
  RegexTranslator(const std::string& re, const std::string& path) : re_(re), path_(path) {}

  // prefix/suffix free: whether the pattern is unanchored at that end.
  std::string translate(bool& free_start, bool& free_end) {
    free_start = true;
    free_end = true;
    if (!re_.empty() && re_[0] == '^') {
      free_start = false;
      ++pos_;
    }
    size_t end = re_.size();
    if (end > pos_ && re_[end - 1] == '$' && (end < 2 || re_[end - 2] != '\\')) {
      free_end = false;
      re_.pop_back();
    }
    std::string out = alternation();
    if (pos_ != re_.size()) fail(std::string("unexpected '") + re_[pos_] + "'");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidInput("json_schema: " + path_ + ": 'pattern' \"" + re_ + "\" is not supported: " + what);
  }
  bool more() const { return pos_ < re_.size(); }

  std::string alternation() {
    std::string out = "( " + sequence();
    while (more() && re_[pos_] == '|') {
      ++pos_;
      out += " | " + sequence();
    }
    return out + " )";
  }

  std::string sequence() {
    std::string out;
    while (more() && re_[pos_] != '|' && re_[pos_] != ')') {
      std::string atom = this->atom();
      if (more() && std::string("*+?{").find(re_[pos_]) != std::string::npos) {
        const char q = re_[pos_++];
        if (q == '{') {
          const size_t close = re_.find('}', pos_);
          if (close == std::string::npos) fail("unterminated '{'");
          atom += '{';
          atom.append(re_, pos_, close - pos_);
          atom += '}';
          pos_ = close + 1;
        } else {
          atom += q;
        }
        if (more() && re_[pos_] == '?') ++pos_;  // lazy: the same language
      }
      out += (out.empty() ? "" : " ") + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  uint32_t utf8_char() {
    const auto c = uint8_t(re_[pos_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n && pos_ + size_t(i) < re_.size(); ++i) cp = (cp << 6) | (uint8_t(re_[pos_ + size_t(i)]) & 0x3F);
    pos_ += size_t(n);
    return cp;
  }

  // An escape after '\': a class (\d \w \s and negations) or one character.
  Ranges escape() {
    if (!more()) fail("a trailing backslash");
    const char e = re_[pos_++];
    const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}, space = {{' ', ' '}};
    switch (e) {
      case 'd': return digit;
      case 'D': return negate(digit);
      case 'w': return word;
      case 'W': return negate(word);
      case 's': return space;
      case 'S': return negate({{'\t', '\r'}, {' ', ' '}});
      case 'n': case 'r': case 't': case 'f': case 'v': fail("a pattern that matches a control character");
      case 'b': case 'B': fail("word boundaries");
      default: break;
    }
    if (e >= '0' && e <= '9') fail("back references");
    if (std::string(".^$|?*+()[]{}/-\\\"").find(e) == std::string::npos) fail(std::string("the escape \\") + e);
    return {{uint32_t(uint8_t(e)), uint32_t(uint8_t(e))}};
  }

  std::string emit(const Ranges& r) {
    Ranges safe = json_safe(r);
    if (safe.empty()) fail("a part that matches only quotes, backslashes or control characters");
    return class_of(safe);
  }

  std::string atom() {
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (re_.compare(pos_, 2, "?:") == 0) pos_ += 2;
      else if (more() && re_[pos_] == '?') fail("lookaround and named groups");
      std::string inner = alternation();
      if (!more() || re_[pos_] != ')') fail("an unclosed group");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      ++pos_;
      bool neg = false;
      if (more() && re_[pos_] == '^') {
        neg = true;
        ++pos_;
      }
      Ranges r;
      bool first = true;
      while (more() && (re_[pos_] != ']' || first)) {
        first = false;
        Ranges item;
        if (re_[pos_] == '\\') {
          ++pos_;
          item = escape();
        } else {
          const uint32_t cp = utf8_char();
          item = {{cp, cp}};
        }
        if (item.size() == 1 && item[0].first == item[0].second && more() && re_[pos_] == '-' &&
            pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
          ++pos_;
          uint32_t hi;
          if (re_[pos_] == '\\') {
            ++pos_;
            Ranges h = escape();
            if (h.size() != 1 || h[0].first != h[0].second) fail("a range ending in a class");
            hi = h[0].first;
          } else {
            hi = utf8_char();
          }
          if (hi < item[0].first) fail("a range that ends before it starts");
          item[0].second = hi;
        }
        r.insert(r.end(), item.begin(), item.end());
      }
      if (!more()) fail("an unclosed class");
      ++pos_;
      return emit(neg ? negate(r) : r);
    }
    if (c == '.') {
      ++pos_;
      return emit(negate({{'\n', '\n'}, {'\r', '\r'}}));
    }
    if (c == '\\') {
      ++pos_;
      return emit(escape());
    }
    if (c == '^' || c == '$') fail("anchors other than at the ends");
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')') fail(std::string("a misplaced '") + c + "'");
    const uint32_t cp = utf8_char();
    return emit({{cp, cp}});
  }

  std::string re_;
  std::string path_;
  size_t pos_ = 0;
};

class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root) {}

  std::string run() {
    const std::string body = visit(root_, "", "root");
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw InvalidInput("json_schema: " + (path.empty() ? std::string("/") : path) + ": " + what);
  }

  std::string use(const std::string& name) {
    if (used_.insert(name).second) {
      const auto& [body, deps] = primitives().at(name);
      rules_.emplace_back(name, body);
      for (const std::string& d : deps) use(d);
    }
    return name;
  }

  std::string fresh(const std::string& hint) {
    std::string base;
    for (char c : hint) base += std::isalnum(uint8_t(c)) ? c : '-';
    if (base.empty() || !std::isalpha(uint8_t(base[0]))) base = "r-" + base;
    std::string name = base;
    for (int k = 1; used_.count(name) || primitives().count(name) || name == "root"; ++k) name = base + "-" + std::to_string(k);
    used_.insert(name);
    return name;
  }

  std::string rule(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_.emplace_back(name, body);
    return name;
  }

  static std::string join(const std::vector<std::string>& alts) {
    if (alts.size() == 1) return alts[0];
    std::string out = "( ";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + " )";
  }

  const ojson& resolve(const std::string& ref, const std::string& path) {
    if (ref == "#") return root_;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.compare(0, p.size(), p) != 0) continue;
      const std::string section = p.substr(2, p.size() - 3);
      // JSON Pointer escapes: ~1 is '/', ~0 is '~'.
      std::string key;
      for (size_t i = p.size(); i < ref.size(); ++i) {
        if (ref[i] == '~' && i + 1 < ref.size() && (ref[i + 1] == '0' || ref[i + 1] == '1')) {
          key += ref[++i] == '1' ? '/' : '~';
        } else {
          key += ref[i];
        }
      }
      if (root_.is_object() && root_.contains(section) && root_[section].is_object() && root_[section].contains(key))
        return root_[section][key];
      fail(path, "'$ref' \"" + ref + "\" names no definition");
    }
    fail(path, "'$ref' \"" + ref + "\" is not supported (only #, #/$defs/... and #/definitions/...)");
  }

  static bool matches_type(const ojson& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    return false;
  }

  std::vector<std::string> types_of(const ojson& s, const std::string& path) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& x : t) {
          if (!x.is_string()) fail(path, "'type' must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(path, "'type' must be a string or a non-empty list of strings");
      }
      for (const std::string& x : types)
        if (x != "null" && x != "boolean" && x != "integer" && x != "number" && x != "string" && x != "array" &&
            x != "object")
          fail(path, "'type' \"" + x + "\" is not a JSON Schema type");
    }
    return types;
  }

  std::string visit(const ojson& s, const std::string& path, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema false matches nothing");
      return use("json-value");
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!is_annotation(it.key()) && !is_supported(it.key())) fail(path, "'" + it.key() + "' is not supported");
    if (s.contains("$ref")) {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (!is_annotation(it.key()) && it.key() != "$ref") fail(path, "'" + it.key() + "' beside '$ref' is not supported");
      if (!s["$ref"].is_string()) fail(path, "'$ref' must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      auto known = refs_.find(ref);
      if (known != refs_.end()) return known->second;
      const std::string name = fresh(ref.substr(ref.rfind('/') + 1));
      refs_[ref] = name;
      const std::string body = visit(resolve(ref, path), ref.substr(1), name);
      rules_.emplace_back(name, body);
      return name;
    }
    const std::vector<std::string> types = types_of(s, path);
    if (s.contains("const")) return lit(s["const"].dump());
    if (s.contains("enum")) {
      const ojson& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(path, "'enum' must be a non-empty array");
      std::vector<std::string> alts;
      for (const ojson& v : e) {
        bool ok = types.empty();
        for (const std::string& t : types) ok |= matches_type(v, t);
        if (ok) alts.push_back(lit(v.dump()));
      }
      if (alts.empty()) fail(path, "no value of 'enum' has the schema's 'type'");
      return join(alts);
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      const ojson& list = s[key];
      if (!list.is_array() || list.empty()) fail(path, std::string("'") + key + "' must be a non-empty array");
      for (auto it = s.begin(); it != s.end(); ++it)
        if (!is_annotation(it.key()) && it.key() != key)
          fail(path, "'" + it.key() + "' beside '" + key + "' is not supported (move it into each branch)");
      if (std::string(key) == "allOf" && list.size() != 1) fail(path, "'allOf' with more than one schema is not supported");
      std::vector<std::string> alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back(visit(list[i], path + "/" + key + "/" + std::to_string(i), hint + "-" + std::to_string(i)));
      return rule(hint, join(alts));
    }
    std::vector<std::string> ts = types;
    if (ts.empty()) {
      auto has = [&](std::initializer_list<const char*> keys) {
        for (const char* k : keys)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) ts.push_back("object");
      if (has({"items", "minItems", "maxItems", "uniqueItems"})) ts.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) ts.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) ts.push_back("number");
      if (ts.empty()) return use("json-value");
    }
    std::vector<std::string> alts;
    for (const std::string& t : ts) {
      if (t == "null") alts.push_back(lit("null"));
      else if (t == "boolean") alts.push_back(use("json-bool"));
      else if (t == "integer" || t == "number") alts.push_back(number(s, path, t == "integer"));
      else if (t == "string") alts.push_back(string(s, path));
      else if (t == "array") alts.push_back(array(s, path, hint));
      else alts.push_back(object(s, path, hint));
    }
    return rule(hint, join(alts));
  }

  std::optional<int64_t> count(const ojson& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(path, std::string("'") + key + "' must be a non-negative integer");
    if (v.get<int64_t>() > 10000) fail(path, std::string("'") + key + "' above 10000 is not supported");
    return v.get<int64_t>();
  }

  std::optional<double> bound(const ojson& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (s[key].is_boolean()) fail(path, std::string("a boolean '") + key + "' (draft 4) is not supported; give the bound");
    if (!s[key].is_number()) fail(path, std::string("'") + key + "' must be a number");
    return s[key].get<double>();
  }

  // Decimal strings of one length, from x to y (x <= y), as a GBNF expression.
  static std::string same_length(const std::string& x, const std::string& y) {
    if (x == y) return lit(x);
    const size_t n = x.size();
    if (n == 1) return std::string("[") + x + "-" + y + "]";
    const std::string xr = x.substr(1), yr = y.substr(1);
    if (x[0] == y[0]) return lit(x.substr(0, 1)) + " " + same_length(xr, yr);
    const std::string zeros(n - 1, '0'), nines(n - 1, '9');
    const std::string any = "[0-9]{" + std::to_string(n - 1) + "}";
    if (xr == zeros && yr == nines) return std::string("[") + x[0] + "-" + y[0] + "] " + any;
    std::vector<std::string> alts;
    alts.push_back(lit(x.substr(0, 1)) + " " + same_length(xr, nines));
    if (x[0] + 1 <= y[0] - 1) alts.push_back(std::string("[") + char(x[0] + 1) + "-" + char(y[0] - 1) + "] " + any);
    alts.push_back(lit(y.substr(0, 1)) + " " + same_length(zeros, yr));
    return join(alts);
  }

  // The decimal forms of the integers in [a, b], 0 <= a <= b.
  static std::string unsigned_range(int64_t a, int64_t b) {
    std::vector<std::string> alts;
    int64_t p = 1;  // 10^(len - 1)
    for (int len = 1; len <= 16 && a <= b; ++len, p *= 10) {
      const int64_t lo = std::max(a, len == 1 ? int64_t(0) : p), hi = std::min(b, p * 10 - 1);
      if (lo <= hi) alts.push_back(same_length(std::to_string(lo), std::to_string(hi)));
    }
    return join(alts);
  }

  static std::string int_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back("\"-\" " + unsigned_range(std::max<int64_t>(1, -hi), -lo));
    if (hi >= 0) alts.push_back(unsigned_range(std::max<int64_t>(lo, 0), hi));
    return join(alts);
  }

  std::string number(const ojson& s, const std::string& path, bool integer) {
    const auto mn = bound(s, "minimum", path), mx = bound(s, "maximum", path);
    const auto xmn = bound(s, "exclusiveMinimum", path), xmx = bound(s, "exclusiveMaximum", path);
    if (!mn && !mx && !xmn && !xmx) return use(integer ? "json-int" : "json-number");
    int64_t lo = -kIntLimit, hi = kIntLimit;
    auto clamp = [](double v) { return int64_t(std::max(-double(kIntLimit), std::min(double(kIntLimit), v))); };
    if (mn) lo = std::max(lo, clamp(std::ceil(*mn)));
    if (xmn) lo = std::max(lo, clamp(std::floor(*xmn) + 1));
    if (mx) hi = std::min(hi, clamp(std::floor(*mx)));
    if (xmx) hi = std::min(hi, clamp(std::ceil(*xmx) - 1));
    if (lo > hi)
      fail(path, integer ? "no integer lies within 'minimum'/'maximum'"
                         : "a number range that holds no integer is not supported");
    const std::string whole = int_range(lo, hi);
    if (integer || hi - lo < 2) return whole;
    // A fraction only on integers strictly inside the bounds keeps the value within them.
    return "( " + whole + " | " + int_range(lo + 1, hi - 1) + " \".\" [0-9]{1,6} )";
  }

  std::string string(const ojson& s, const std::string& path) {
    const auto mn = count(s, "minLength", path), mx = count(s, "maxLength", path);
    const std::string q = R"("\"")";
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail(path, "'format' must be a string");
      const std::string f = s["format"].get<std::string>();
      if (mn || mx || s.contains("pattern")) fail(path, "'format' with 'minLength', 'maxLength' or 'pattern' is not supported");
      if (f == "date" || f == "time" || f == "uuid" || f == "email") return q + " " + use(f) + " " + q;
      if (f == "date-time") return q + " " + use("date") + " \"T\" " + use("time") + " " + q;
      fail(path, "'format' \"" + f + "\" is not supported (date, time, date-time, uuid, email are)");
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(path, "'pattern' must be a string");
      if (mn || mx) fail(path, "'pattern' with 'minLength' or 'maxLength' is not supported");
      bool free_start = false, free_end = false;
      const std::string body = RegexTranslator(s["pattern"].get<std::string>(), path.empty() ? "/" : path)
                                   .translate(free_start, free_end);
      const std::string any = use("json-char") + "{0,32}";
      return q + " " + (free_start ? any + " " : "") + body + (free_end ? " " + any : "") + " " + q;
    }
    const int64_t lo = mn.value_or(0);
    if (mx && *mx < lo) fail(path, "'maxLength' is below 'minLength'");
    return q + " " + use("json-char") + "{" + std::to_string(lo) + "," + (mx ? std::to_string(*mx) : "") + "} " + q;
  }

  std::string array(const ojson& s, const std::string& path, const std::string& hint) {
    if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
      fail(path, "'uniqueItems' is not supported");
    std::string item;
    if (!s.contains("items")) item = use("json-value");
    else if (s["items"].is_array()) fail(path, "'items' as a list (tuple) is not supported");
    else item = visit(s["items"], path + "/items", hint + "-item");
    const int64_t lo = count(s, "minItems", path).value_or(0);
    const auto hi = count(s, "maxItems", path);
    if (hi && *hi < lo) fail(path, "'maxItems' is below 'minItems'");
    const std::string ws = use("ws");
    if (hi && *hi == 0) return "\"[\" " + ws + " \"]\"";
    const std::string more = "( \",\" " + ws + " " + item + " " + ws + " ){" + std::to_string(std::max<int64_t>(lo - 1, 0)) +
                             "," + (hi ? std::to_string(*hi - 1) : "") + "}";
    const std::string list = item + " " + ws + " " + more;
    return "\"[\" " + ws + " " + (lo > 0 ? list : "( " + list + " )?") + " \"]\"";
  }

  std::string object(const ojson& s, const std::string& path, const std::string& hint) {
    const std::string ws = use("ws");
    std::vector<std::pair<std::string, std::string>> props;  // key, value expression
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path, "'required' must be an array of strings");
      for (const ojson& r : s["required"]) {
        if (!r.is_string()) fail(path, "'required' must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail(path, "'properties' must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
        props.emplace_back(it.key(), visit(it.value(), path + "/properties/" + it.key(), hint + "-" + it.key()));
    }
    for (const std::string& r : required)
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; }))
        props.emplace_back(r, use("json-value"));
    if (props.empty()) {
      const ojson ap = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
      if (ap.is_boolean() && !ap.get<bool>()) return "\"{\" " + ws + " \"}\"";
      const std::string value = visit(ap, path + "/additionalProperties", hint + "-value");
      const std::string member = use("json-string") + " " + ws + " \":\" " + ws + " " + value + " " + ws;
      return "\"{\" " + ws + " ( " + member + " ( \",\" " + ws + " " + member + " )* )? \"}\"";
    }
    // rest(i, first): properties i.. where `first` says none has been written yet.
    std::map<std::pair<size_t, bool>, std::string> memo;
    std::function<std::string(size_t, bool)> rest = [&](size_t i, bool first) -> std::string {
      if (i == props.size()) return "";
      auto key = std::make_pair(i, first);
      if (auto it = memo.find(key); it != memo.end()) return it->second;
      const std::string kv = (first ? "" : "\",\" " + ws + " ") + lit(nlohmann::json(props[i].first).dump()) + " " + ws +
                             " \":\" " + ws + " " + props[i].second + " " + ws;
      const std::string after = rest(i + 1, false);
      std::string body = kv + (after.empty() ? "" : " " + after);
      if (!required.count(props[i].first)) {
        const std::string skip = rest(i + 1, first);
        body = "( " + body + " )" + (skip.empty() ? "?" : " | " + skip);
      }
      return memo[key] = rule(hint + "-" + std::to_string(i) + (first ? "-first" : ""), body);
    };
    const std::string body = rest(0, true);
    return "\"{\" " + ws + " " + (body.empty() ? "" : body + " ") + "\"}\"";
  }

  const ojson& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> used_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string schema_to_gbnf(const ojson& schema) { return Compiler(schema).run(); }

std::string json_object_gbnf() { return Compiler(ojson::object({{"type", "object"}})).run(); }

}  // namespace osprey::grammar
