#pragma once
// Reading small files (configs, indexes, tokenizers, templates) that a model folder holds.
// A model folder is downloaded from strangers: whatever stands at a path that should be a
// regular file (a FIFO that would block the open, a directory, a device) is refused by name.
#include <filesystem>
#include <string>

namespace osprey {

// Whether `path` exists (following symlinks). Throws IoError "<path>: expected a regular
// file, found a FIFO" (a directory, a socket, a device) when it exists but is not a regular
// file, or when it cannot be examined.
bool regular_file_exists(const std::filesystem::path& path);

// The whole file. Throws IoError naming the path when it does not exist, is not a regular
// file, or cannot be read.
std::string read_regular_file(const std::filesystem::path& path);

}  // namespace osprey
