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
  // Throws IoError naming the path when it cannot be opened or mapped, or is not a regular
  // file (a FIFO, which would block the open, a directory, a device).
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

// Drops this process's resident copies of the whole pages inside [data, data + size) when the
// range lies in one live MappedFile: the next read of them faults them in from the file again
// (the mappings are private and read-only, so no page is ever dirty and nothing is lost).
// Returns the bytes released; 0 for memory that is not a mapped file's. For weights whose
// repacked copy is what the kernels read: resident memory, never correctness.
size_t release_mapped_pages(const void* data, size_t size);

// Installs a SIGBUS handler for the process: a read of a mapped page that no longer exists
// (the file shrank under the running process) ends it with exit code 1 and
// "osprey: error: <path>: the mapped file shrank or became unreadable while in use"
// on stderr, instead of a bare SIGBUS. A SIGBUS elsewhere keeps its default action.
// For programs (the CLI calls it); the library never installs handlers itself.
void install_mapped_file_fault_handler();

}  // namespace osprey
