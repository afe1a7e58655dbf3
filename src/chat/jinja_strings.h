#pragma once
// Python str operations and jinja2 string filters, shared by the str methods and the filters
// of the chat-template interpreter. Those taking `line` name it in their messages.
#include <cstdint>
#include <string>

#include "chat/jinja_value.h"

namespace osprey::jinja {

// Python's str.isspace() for one ASCII character.
bool is_ws(char c);
// Python str.strip family; chars null or not a string means whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
// ASCII case mapping; other code points are left as they are.
std::string upper(std::string s);
std::string lower(std::string s);
// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string py_title(const std::string& s);
// jinja2's title filter: words split at runs of "-", whitespace, "(", "{", "[", "<".
std::string jinja_title(const std::string& s);
// Python str.capitalize() on ASCII letters.
std::string capitalize(const std::string& s);
// Python str.split(sep, maxsplit); sep null or None splits at whitespace runs.
List split(const std::string& s, const Value* sep, int64_t maxsplit, int line);
// Python str.rsplit(sep, maxsplit); a maxsplit without a separator is refused.
List rsplit(const std::string& s, const Value* sep, int64_t maxsplit, int line);
// Python str.replace(old, with, count); count < 0 replaces all.
std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);

}  // namespace osprey::jinja
