#include "chat/jinja_strings.h"

#include <algorithm>
#include <cctype>

#include "chat/jinja_builtins.h"
#include "tokenizer/utf8.h"

namespace osprey::jinja {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

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

}  // namespace osprey::jinja
