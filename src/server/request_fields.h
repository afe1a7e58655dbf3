#pragma once
// Field access shared by the request readers of the Anthropic and Responses routes
// (anthropic_api.cpp, responses_api.cpp): each failure is a 400 (bad_request) naming the place
// in the request, `at` ("messages[0].content[1]"), a dotted path from the body.
#include <algorithm>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace osprey::request_fields {

using ojson = nlohmann::ordered_json;

// "an integer", "a number", "a string", "an object", ... for messages.
inline std::string kind_of(const ojson& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  return std::string("a") + (v.is_object() || v.is_array() ? "n " : " ") + v.type_name();
}

// A 400 naming the field at `at` (its place in the request).
[[noreturn]] inline void fail(const std::string& at, const std::string& what) {
  throw bad_request("'" + at + "' " + what, at);
}

// `at`.`key` (just `key` at the top level).
inline std::string join(const std::string& at, const char* key) { return at.empty() ? key : at + "." + key; }

// The value of `key`, or nullptr when absent or null.
inline const ojson* get(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// The string at `key` ("" when absent and not required).
inline std::string string_at(const ojson& obj, const char* key, const std::string& at, bool required) {
  const ojson* v = get(obj, key);
  if (!v) {
    if (required) fail(join(at, key), "is required");
    return "";
  }
  if (!v->is_string()) fail(join(at, key), "must be a string, not " + kind_of(*v));
  return v->get<std::string>();
}

// Refuses every key of `obj` that `allowed` does not name (a null value counts as absent).
inline void only(const ojson& obj, const std::string& at, std::initializer_list<const char*> allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->is_null()) continue;
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; }) == allowed.end())
      fail(join(at, it.key().c_str()), "is not supported by this server");
  }
}

}  // namespace osprey::request_fields
