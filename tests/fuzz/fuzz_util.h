#pragma once
// Shared by the libFuzzer targets (tests/fuzz/*_fuzz.cpp): inputs as files, and the rule
// that an input may end in an osprey error but in nothing else.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"
#include "server/api_error.h"

namespace osprey::fuzz {

// Runs f(); an osprey error (or the server's ApiError) is an expected outcome of bad input.
// Any other exception is a finding: it would reach the CLI as "internal error" or the server
// as a 500, so the target aborts with its text.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const ApiError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: unexpected exception: %s\n", e.what());
    std::abort();
  }
}

// A folder under the temp dir, made once per process, for targets that read files by path.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("osprey-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// The folder of a source-tree fixture (OSPREY_SOURCE_DIR is set by CMake).
inline std::filesystem::path source_path(const std::string& rel) { return std::filesystem::path(OSPREY_SOURCE_DIR) / rel; }

}  // namespace osprey::fuzz
