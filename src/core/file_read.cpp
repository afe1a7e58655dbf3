#include "core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey {
namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

[[noreturn]] void not_regular(const std::filesystem::path& path, mode_t mode) {
  throw IoError(path.string() + ": expected a regular file, found " + file_kind(mode));
}

}  // namespace

bool regular_file_exists(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    throw IoError(path.string() + ": cannot examine file: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
  return true;
}

std::string read_regular_file(const std::filesystem::path& path) {
  if (!regular_file_exists(path)) throw IoError(path.string() + ": cannot open file: it does not exist");
  // O_NONBLOCK: should the path have become a FIFO since the check, the open returns at
  // once and fstat refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IoError(path.string() + ": cannot open file: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(path.string() + ": cannot examine file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
  std::string text(std::size_t(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(path.string() + ": read failed: " + std::strerror(errno));
    if (n == 0) throw IoError(path.string() + ": read failed: the file shrank while being read");
    done += std::size_t(n);
  }
  return text;
}

std::map<std::string, std::string> read_safetensors_index(const std::filesystem::path& index) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_regular_file(index));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(index.string() + ": malformed JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InvalidInput(index.string() + ": missing object field \"weight_map\"");
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw InvalidInput(index.string() + ": weight_map[\"" + tensor + "\"] is not a string");
    weight_map.emplace(tensor, file.get<std::string>());
  }
  return weight_map;
}

std::set<std::string> index_shards(const std::map<std::string, std::string>& weight_map) {
  std::set<std::string> shards;
  for (const auto& [tensor, file] : weight_map) shards.insert(file);
  return shards;
}

}  // namespace osprey
