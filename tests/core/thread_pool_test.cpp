#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"

#if defined(__SANITIZE_ADDRESS__)
#define OSPREY_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OSPREY_TEST_ASAN 1
#endif
#endif

namespace osprey {

TEST(ThreadPool, RunsEveryChunkOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, DefaultsToThePhysicalCoresLscpuCounts) {
  // util-linux's lscpu: the (core, socket) of every CPU; the pool counts each core of the
  // CPUs this process may run on once.
  FILE* p = popen("lscpu -p=CPU,CORE,SOCKET 2>/dev/null", "r");
  if (!p) GTEST_SKIP() << "no lscpu";
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<std::pair<int, int>> cores;
  char line[256];
  while (std::fgets(line, sizeof(line), p)) {
    int cpu = 0, core = 0, socket = 0;
    if (line[0] == '#' || std::sscanf(line, "%d,%d,%d", &cpu, &core, &socket) != 3) continue;
    if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set)) cores.insert({core, socket});
  }
  if (pclose(p) != 0 || cores.empty()) GTEST_SKIP() << "lscpu did not list the CPUs";
  EXPECT_EQ(physical_cores(), int(cores.size()));
  ThreadPool pool(0);
  EXPECT_EQ(pool.n_threads(), std::min(kMaxCpuThreads, int(cores.size())));
}

TEST(ThreadPool, CountAboveTheBoundIsAnError) {
  try {
    ThreadPool pool(kMaxCpuThreads + 1);
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("at most " + std::to_string(kMaxCpuThreads)), std::string::npos) << e.what();
  }
}

// When the system refuses a thread part way (here: an address-space limit that leaves room for
// a few thread stacks only), the constructor must stop the workers it started and throw, not
// deadlock or terminate. Runs in a child process (the limit is process-wide) with an alarm
// that turns a hang into a failure.
TEST(ThreadPool, ThreadCreationFailureIsAnErrorNotADeadlock) {
#ifdef OSPREY_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit allows";
#else
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(20);
    rlimit cur{};
    ::getrlimit(RLIMIT_AS, &cur);
    // Current usage plus about six 8 MiB stacks.
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(48) << 20);
    rlimit lim{limit, cur.rlim_max};
    ::setrlimit(RLIMIT_AS, &lim);
    std::string msg = "no error";
    int code = 3;
    try {
      ThreadPool pool(200);
    } catch (const OutOfMemory& e) {
      msg = e.what();
      code = 0;
    } catch (const std::exception& e) {
      msg = std::string("other exception: ") + e.what();
      code = 4;
    }
    if (::write(fds[1], msg.data(), msg.size()) < 0) code = 5;
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status) << " (SIGALRM: a deadlock)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << msg;
  EXPECT_NE(msg.find("cannot start CPU thread"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of 200"), std::string::npos) << msg;
#endif
}

}  // namespace osprey
