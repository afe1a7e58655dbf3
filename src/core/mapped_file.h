#pragma once
// A read-only memory map of a whole file (RAII). Weights point into it; arrays over it hold
// a shared_ptr so the mapping lives as long as any of them.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace osprey {

class MappedFile {
 public:
  // Throws IoError naming the path when it cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace osprey
