#include "model/config_reader.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace osprey {

ConfigReader ConfigReader::load(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw IoError(path.string() + ": cannot open (is this a model folder?)");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
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
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))) return int64_t(v.get<double>());
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
  if (v.is_number_integer()) {
    out.push_back(v.get<int32_t>());
  } else if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(key, "expected integers, got " + e.dump());
      out.push_back(e.get<int32_t>());
    }
  } else {
    fail(key, "expected an integer or a list of integers, got " + v.dump());
  }
  return out;
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
