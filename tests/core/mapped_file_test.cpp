#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "support/test_util.h"

namespace osprey {

using testing::TempDir;

TEST(MappedFile, FifoIsRefusedWithoutBlocking) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d / "pipe").c_str(), 0644), 0);
  try {
    MappedFile::open(d / "pipe");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("expected a regular file, found a FIFO"), std::string::npos) << e.what();
  }
}

// A file that shrinks under the process: reading a mapped page past its new end raises
// SIGBUS; with the handler installed the process ends with exit code 1 and a message naming
// the file. In a child process, whose stderr goes to a file.
TEST(MappedFile, ShrinkingFileEndsWithAMessageNamingIt) {
  TempDir d;
  const auto path = d / "weights.bin";
  testing::write_file(path, std::string(1 << 16, 'x'));
  const auto err = d / "stderr.txt";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDERR_FILENO);
    ::alarm(20);
    install_mapped_file_fault_handler();
    auto f = MappedFile::open(path);
    if (::truncate(path.c_str(), 0) != 0) ::_exit(3);
    volatile uint8_t sink = f->data()[40000];
    (void)sink;
    ::_exit(0);  // no fault: the test fails on the exit code
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string msg = testing::read_file(err);
  EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("shrank or became unreadable"), std::string::npos) << msg;
}

// Whether the page holding p is mapped in this process now (/proc/self/pagemap's present bit).
bool page_present(const void* p) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  uint64_t entry = 0;
  const ssize_t got = ::pread(fd, &entry, 8, off_t(reinterpret_cast<uintptr_t>(p) / page * 8));
  ::close(fd);
  return got == 8 && (entry >> 63) != 0;
}

// release_mapped_pages drops the whole pages of a range inside a mapped file from the process
// (they read back from the file unchanged), leaves the partial pages at its ends, and does
// nothing to memory that is no mapped file's.
TEST(MappedFile, ReleasedPagesLeaveTheProcessAndReadBackUnchanged) {
  TempDir d;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE)), n_pages = 16;
  std::string bytes(n_pages * page, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 131 + i / page) & 0xff);
  testing::write_file(d / "weights.bin", bytes);
  auto f = MappedFile::open(d / "weights.bin");
  const volatile uint8_t* v = f->data();
  uint8_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += page) sum ^= v[i];
  (void)sum;
  for (size_t p = 0; p < n_pages; ++p) ASSERT_TRUE(page_present(f->data() + p * page)) << "page " << p << " not touched";
  // From inside page 0 to inside page 15: pages 1 .. 14 go.
  const size_t released = release_mapped_pages(f->data() + 100, bytes.size() - 200);
  EXPECT_EQ(released, (n_pages - 2) * page);
  EXPECT_TRUE(page_present(f->data()));
  EXPECT_TRUE(page_present(f->data() + (n_pages - 1) * page));
  for (size_t p = 1; p + 1 < n_pages; ++p) EXPECT_FALSE(page_present(f->data() + p * page)) << "page " << p;
  EXPECT_EQ(std::memcmp(f->data(), bytes.data(), bytes.size()), 0) << "released pages did not read back";
  // Heap memory is no mapped file's: untouched.
  std::vector<uint8_t> heap(4 * page, 7);
  EXPECT_EQ(release_mapped_pages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap[2 * page], 7);
}

}  // namespace osprey
