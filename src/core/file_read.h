#pragma once
// Reading small files (configs, indexes, tokenizers, templates) that a model folder holds.
// A model folder is downloaded from strangers: whatever stands at a path that should be a
// regular file (a FIFO that would block the open, a directory, a device) is refused by name.
#include <filesystem>
#include <map>
#include <set>
#include <string>

namespace osprey {

// Whether `path` exists (following symlinks). Throws IoError "<path>: expected a regular
// file, found a FIFO" (a directory, a socket, a device) when it exists but is not a regular
// file, or when it cannot be examined.
bool regular_file_exists(const std::filesystem::path& path);

// The whole file. Throws IoError naming the path when it does not exist, is not a regular
// file, or cannot be read.
std::string read_regular_file(const std::filesystem::path& path);

// The weight_map of a model.safetensors.index.json: tensor name -> shard file name. Throws
// InvalidInput naming the index when it is not JSON, has no "weight_map" object or maps a
// tensor to something other than a string; IoError as read_regular_file does.
std::map<std::string, std::string> read_safetensors_index(const std::filesystem::path& index);

// The distinct shard file names of a weight_map, in name order.
std::set<std::string> index_shards(const std::map<std::string, std::string>& weight_map);

}  // namespace osprey
