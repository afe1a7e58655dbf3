#pragma once
// Helpers shared by the tests: temporary folders, a tiny random Llama checkpoint writer,
// and running the osprey binary.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/array.h"
#include "core/error.h"

#include <nlohmann/json.hpp>

namespace osprey::testing {

// A fresh empty folder under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, const std::string& bytes);
std::string read_file(const std::filesystem::path& path);

// config.json of a tiny Llama (vocab 64, hidden 32, 2 layers, 4 heads, 2 kv heads).
nlohmann::json tiny_llama_config();
// Writes config.json and model.safetensors (bf16 random weights, seeded) for `config`.
void write_tiny_llama(const std::filesystem::path& dir, const nlohmann::json& config, uint32_t seed = 1);

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs OSPREY_BINARY with `args` (a shell-quoted string), capturing stdout and stderr.
CommandResult run_osprey(const std::string& args, const std::string& env = "");

std::filesystem::path source_dir();

// A CPU int32 array of `ids`, and back.
Array tokens_of(const std::vector<int32_t>& ids);
std::vector<int32_t> ints(const Array& a);
// max |ours - ref| over a row of `vocab` logits, relative to the reference row's range.
double relative_row_error(const float* ours, const float* ref, int64_t vocab);

// The message of the E that `f` throws; "" when it throws nothing (another exception type
// propagates, failing the test).
template <class E = Error>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace osprey::testing
