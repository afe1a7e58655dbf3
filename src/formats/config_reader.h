#pragma once
// Typed reads from config.json with errors that name the file and the field. Families use
// it to parse their own typed configs; defaults live in the family, next to the field.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace osprey {

class ConfigReader {
 public:
  // Reads and parses `path`; IoError when missing or not a regular file (a FIFO, a directory),
  // InvalidInput when malformed.
  static ConfigReader load(const std::filesystem::path& path);
  ConfigReader(nlohmann::json j, std::string where) : j_(std::move(j)), where_(std::move(where)) {}

  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // An int or a list of ints (eos_token_id), each a token id in [0, 2^31); empty when absent.
  std::vector<int32_t> get_int_list(const std::string& key) const;
  // One token id in [0, 2^31) (bos_token_id).
  int32_t get_token_id(const std::string& key) const;
  // A string among `supported` (`fallback` when absent); Unsupported naming the field and the
  // supported values otherwise (hidden_act).
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& supported) const;
  std::vector<std::string> get_string_list(const std::string& key) const;
  // A nested object, or nullopt when absent or null.
  std::optional<ConfigReader> get_object(const std::string& key) const;

  const nlohmann::json& json() const { return j_; }
  const std::string& where() const { return where_; }
  // InvalidInput("<where>: field <key>: <what>")
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& require(const std::string& key) const;
  nlohmann::json j_;
  std::string where_;
};

}  // namespace osprey
