#include "core/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace osprey {
namespace {

// The live mappings, for the SIGBUS handler. The handler reads the table without a lock (it
// may not take one): an entry is published by storing its `end` last and retired by zeroing
// `end` first, so the handler sees either a whole entry or none.
struct MappingEntry {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char path[512] = {};
};
constexpr size_t kMaxTracked = 256;
std::array<MappingEntry, kMaxTracked> g_mappings;
std::mutex g_mappings_mu;

void track(const void* data, size_t size, const std::filesystem::path& path) {
  std::lock_guard<std::mutex> lock(g_mappings_mu);
  for (auto& e : g_mappings) {
    if (e.end.load() != 0) continue;
    const std::string p = path.string();
    const size_t n = std::min(p.size(), sizeof(e.path) - 1);
    std::memcpy(e.path, p.data(), n);
    e.path[n] = '\0';
    e.begin.store(reinterpret_cast<uintptr_t>(data));
    e.end.store(reinterpret_cast<uintptr_t>(data) + size);
    return;
  }
  // More mappings than tracked: a fault in this one ends with the plain SIGBUS.
}

void untrack(const void* data) {
  std::lock_guard<std::mutex> lock(g_mappings_mu);
  for (auto& e : g_mappings)
    if (e.end.load() != 0 && e.begin.load() == reinterpret_cast<uintptr_t>(data)) {
      e.end.store(0);
      e.begin.store(0);
    }
}

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const auto& e : g_mappings) {
    const uintptr_t end = e.end.load();
    if (end != 0 && addr >= e.begin.load() && addr < end) {
      write_all("osprey: error: ");
      write_all(e.path);
      write_all(": the mapped file shrank or became unreadable while in use (was it changed or truncated?)\n");
      ::_exit(1);
    }
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  // O_NONBLOCK: a FIFO in place of the file must not block the open; fstat refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IoError(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw IoError(path.string() + ": cannot stat: " + std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw IoError(path.string() + ": is a directory, not a file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(path.string() + ": expected a regular file, found " +
                  (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device"));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw IoError(path.string() + ": cannot map: " + std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    track(p, f->size_, path);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) {
    untrack(data_);
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

size_t release_mapped_pages(const void* data, size_t size) {
  if (data == nullptr || size == 0) return 0;
  const uintptr_t b = reinterpret_cast<uintptr_t>(data), e = b + size;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (b + page - 1) / page * page, last = e / page * page;
  if (last <= first) return 0;
  // NOTE: under the table's lock, so the mapping cannot be unmapped meanwhile.
  std::lock_guard<std::mutex> lock(g_mappings_mu);
  for (const auto& m : g_mappings) {
    const uintptr_t end = m.end.load();
    if (end == 0 || b < m.begin.load() || e > end) continue;
    if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
    return size_t(last - first);
  }
  return 0;
}

void install_mapped_file_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace osprey
