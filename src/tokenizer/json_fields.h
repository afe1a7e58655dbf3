#pragma once
// Typed field access for tokenizer.json / tokenizer_config.json. Every error is an
// InvalidInput naming the file and the field path ("where"), e.g.
// "models/tokenizer.json: model.merges[12]: expected a string or a pair of strings".
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace osprey::tok {

using Json = nlohmann::json;

// "file: path.key" for error messages; where is "file: path" or just "file".
inline std::string child(const std::string& where, std::string_view key) {
  const bool has_path = where.find(": ") != std::string::npos;
  return where + (has_path ? "." : ": ") + std::string(key);
}
inline std::string child(const std::string& where, std::size_t index) {
  const bool has_path = where.find(": ") != std::string::npos;
  return where + (has_path ? "" : ": ") + "[" + std::to_string(index) + "]";
}

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw InvalidInput(where + ": " + what);
}

inline const Json& require(const Json& j, std::string_view key, const std::string& where) {
  if (!j.is_object()) fail(where, "expected an object");
  const auto it = j.find(key);
  if (it == j.end()) throw InvalidInput(where + ": missing field \"" + std::string(key) + "\"");
  return *it;
}

inline const Json* optional(const Json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

inline std::string as_string(const Json& v, const std::string& where) {
  if (!v.is_string()) fail(where, "expected a string");
  return v.get<std::string>();
}

inline std::string string_field(const Json& j, std::string_view key, const std::string& where) {
  return as_string(require(j, key, where), child(where, key));
}

inline bool bool_field(const Json& j, std::string_view key, bool fallback, const std::string& where) {
  const Json* v = optional(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail(child(where, key), "expected true or false");
  return v->get<bool>();
}

// Token ids are below 2^24: larger ids (or a few very sparse ones) would make the id-indexed
// tables huge, and ids must stay exact in float32 samplers. Loading also requires ids below
// 2 * (number of tokens) + 1024, so the tables are sized by what the file holds.
inline constexpr int64_t kMaxTokenId = int64_t(1) << 24;

// Throws InvalidInput "where: token "token" has id N, outside [0, 16777216)" unless
// 0 <= id < kMaxTokenId; id_text is the id as written (it may not fit in int64).
inline void check_token_id(int64_t id, const std::string& id_text, const std::string& where,
                           std::string_view token) {
  if (id >= 0 && id < kMaxTokenId) return;
  fail(where, "token " + Json(std::string(token)).dump() + " has id " + id_text + ", outside [0, " +
                  std::to_string(kMaxTokenId) + ")");
}

// An id that is not a token's own (a post-processor's, a config's): an integer in
// [0, kMaxTokenId).
inline int32_t as_id(const Json& v, const std::string& where) {
  if (!v.is_number_integer()) fail(where, "expected an integer token id");
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kMaxTokenId)
                                           : v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId;
  if (!fits) fail(where, "token id " + v.dump() + " out of range [0, " + std::to_string(kMaxTokenId) + ")");
  return int32_t(v.get<int64_t>());
}

// The "type" field of a component, for dispatch and Unsupported messages.
inline std::string type_of(const Json& j, const std::string& where) {
  return string_field(j, "type", where);
}

}  // namespace osprey::tok
