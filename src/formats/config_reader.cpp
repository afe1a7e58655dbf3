#include "formats/config_reader.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/file_read.h"

namespace osprey {

ConfigReader ConfigReader::load(const std::filesystem::path& path) {
  if (!regular_file_exists(path)) throw IoError(path.string() + ": cannot open: it does not exist (is this a model folder?)");
  const std::string text = read_regular_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(path.string() + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw InvalidInput(path.string() + ": expected a JSON object");
  return ConfigReader(std::move(j), path.string());
}

void ConfigReader::fail(const std::string& key, const std::string& what) const {
  throw InvalidInput(where_ + ": field \"" + key + "\": " + what);
}

const nlohmann::json& ConfigReader::require(const std::string& key) const {
  if (!has(key)) fail(key, "missing");
  return j_[key];
}

int64_t ConfigReader::get_int(const std::string& key) const {
  const auto& v = require(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) fail(key, "out of range: " + v.dump());
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    // 2^63 is the first double past int64's range: check before converting.
    const double d = v.get<double>();
    if (std::isfinite(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == std::trunc(d))
      return int64_t(d);
  }
  fail(key, "expected an integer, got " + v.dump());
}

int64_t ConfigReader::get_int(const std::string& key, int64_t fallback) const { return has(key) ? get_int(key) : fallback; }

double ConfigReader::get_float(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
  return v.get<double>();
}

double ConfigReader::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool ConfigReader::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
  return v.get<bool>();
}

std::string ConfigReader::get_string(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
  return v.get<std::string>();
}

std::string ConfigReader::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<int32_t> ConfigReader::get_int_list(const std::string& key) const {
  std::vector<int32_t> out;
  if (!has(key)) return out;
  const auto& v = j_[key];
  auto id = [&](const nlohmann::json& e) {
    if (!e.is_number_integer()) fail(key, "expected integers, got " + e.dump());
    if (e.is_number_unsigned() ? e.get<uint64_t>() > uint64_t(INT32_MAX) : (e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX))
      fail(key, e.dump() + " is not a token id (0 to 2^31 - 1)");
    return int32_t(e.get<int64_t>());
  };
  if (v.is_number_integer()) {
    out.push_back(id(v));
  } else if (v.is_array()) {
    for (const auto& e : v) out.push_back(id(e));
  } else {
    fail(key, "expected an integer or a list of integers, got " + v.dump());
  }
  return out;
}

int32_t ConfigReader::get_token_id(const std::string& key) const {
  const int64_t v = get_int(key);
  if (v < 0 || v > INT32_MAX) fail(key, std::to_string(v) + " is not a token id (0 to 2^31 - 1)");
  return int32_t(v);
}

std::string ConfigReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& supported) const {
  const std::string v = get_string(key, fallback);
  for (const auto& s : supported)
    if (v == s) return v;
  std::string list;
  for (const auto& s : supported) list += (list.empty() ? "" : ", ") + s;
  throw Unsupported(where_ + ": field \"" + key + "\": \"" + v + "\" is not supported (" + list + ")");
}

std::vector<std::string> ConfigReader::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const auto& v = j_[key];
  if (!v.is_array()) fail(key, "expected a list of strings, got " + v.dump());
  for (const auto& e : v) {
    if (!e.is_string()) fail(key, "expected strings, got " + e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<ConfigReader> ConfigReader::get_object(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const auto& v = j_[key];
  if (!v.is_object()) fail(key, "expected an object, got " + v.dump());
  return ConfigReader(v, where_ + ": " + key);
}

}  // namespace osprey
