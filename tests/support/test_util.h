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

// `osprey <args>` (a --json run) with OSPREY_KV_INPLACE_WRITE=1 and =0: both must exit 0 and
// give the same n_tokens tokens. Sets `on` and `off` to the two runs' JSON reports.
void expect_kv_write_switch_keeps_tokens(const std::string& args, size_t n_tokens, nlohmann::json& on,
                                         nlohmann::json& off);

// The error code of an OpenAI-style error body, or a note that names the body where it has none.
std::string error_code(const std::string& body);

// The sorted names of the visible files in dir/auto (a prompt cache folder's own entries);
// throws where that folder is missing.
std::vector<std::string> prompt_cache_files(const std::filesystem::path& dir);

// A CPU int32 array of `ids`, and back.
Array tokens_of(const std::vector<int32_t>& ids);
std::vector<int32_t> ints(const Array& a);
// max |ours - ref| over a row of `vocab` logits, relative to the reference row's range.
double relative_row_error(const float* ours, const float* ref, int64_t vocab);

// The message of the E that `f` throws; `none` when it throws nothing (another exception type
// propagates, failing the test).
template <class E = Error>
std::string error_of(const std::function<void()>& f, const std::string& none = "") {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return none;
}

}  // namespace osprey::testing
