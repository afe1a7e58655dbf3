#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <filesystem>
#include <string>

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

}  // namespace osprey
