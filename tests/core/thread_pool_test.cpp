#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// The chunks of one call: contiguous, non-empty, covering [0, n) once, at least min_chunk items
// each where there are several, and as many as the contract allows: one per thread
// (per_thread) or kChunksPerThread per thread (dynamic), fewer where min_chunk asks.
TEST(ThreadPool, EveryIndexOnceForManyShapes) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    for (Schedule schedule : {Schedule::dynamic, Schedule::per_thread, Schedule::first_touch})
      for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 31, 100, 1000, 4097})
        for (int64_t min_chunk : {0, 1, 2, 3, 16, 1000}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " schedule " + std::to_string(int(schedule)) + " n " +
                       std::to_string(n) + " min_chunk " + std::to_string(min_chunk));
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::mutex mu;
          std::vector<std::pair<int64_t, int64_t>> chunks;
          pool.parallel_for(
              n, min_chunk,
              [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
                std::lock_guard<std::mutex> lock(mu);
                chunks.push_back({b, e});
              },
              schedule);
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "index " << i;
          if (n == 0) {
            EXPECT_TRUE(chunks.empty());
            continue;
          }
          std::sort(chunks.begin(), chunks.end());
          for (size_t c = 0; c < chunks.size(); ++c) {
            EXPECT_LT(chunks[c].first, chunks[c].second);
            EXPECT_EQ(chunks[c].first, c == 0 ? 0 : chunks[c - 1].second);
            if (chunks.size() > 1) {
              EXPECT_GE(chunks[c].second - chunks[c].first, std::max<int64_t>(1, min_chunk));
            }
          }
          const int64_t per = schedule == Schedule::per_thread ? 1 : ThreadPool::kChunksPerThread;
          const int64_t by_min = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
          const int64_t want = threads == 1 ? 1 : std::min<int64_t>(threads * per, by_min);
          if (schedule != Schedule::first_touch) {
            EXPECT_EQ(int64_t(chunks.size()), want);
          }
          EXPECT_LE(int64_t(chunks.size()), threads * int64_t(ThreadPool::kChunksPerThread));
        }
  }
}

// thread_index is in [0, n_threads), the caller's is 0, each index belongs to one thread for
// the pool's life, and no two chunks that run at the same time share one.
TEST(ThreadPool, ThreadIndexIsStableAndUniqueAmongConcurrentChunks) {
  constexpr int kThreads = 4;
  ThreadPool pool(kThreads);
  std::vector<std::atomic<int>> in_use(kThreads);
  std::mutex mu;
  std::map<int, std::thread::id> owner;
  std::atomic<int> clashes{0}, out_of_range{0}, wrong_owner{0};
  const auto caller = std::this_thread::get_id();
  for (int call = 0; call < 200; ++call)
    for (Schedule schedule : {Schedule::dynamic, Schedule::per_thread})
      pool.parallel_for(
          64, 1,
          [&](int64_t, int64_t, int t) {
            if (t < 0 || t >= kThreads) {
              out_of_range++;
              return;
            }
            if (in_use[size_t(t)].fetch_add(1) != 0) clashes++;
            {
              std::lock_guard<std::mutex> lock(mu);
              const auto [it, fresh] = owner.emplace(t, std::this_thread::get_id());
              if (it->second != std::this_thread::get_id() || (t == 0) != (std::this_thread::get_id() == caller))
                wrong_owner++;
            }
            // Long enough that chunks of other threads overlap this one.
            const auto t0 = std::chrono::steady_clock::now();
            while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(20)) {
            }
            in_use[size_t(t)].fetch_sub(1);
          },
          schedule);
  EXPECT_EQ(out_of_range.load(), 0);
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_EQ(wrong_owner.load(), 0);
}

// per_thread: chunk i is n * i / T .. n * (i + 1) / T and runs on thread i (the caller for
// 0), the same thread on every call: the contract first-touch page placement relies on.
TEST(ThreadPool, PerThreadRunsChunkIOnThreadI) {
  constexpr int kThreads = 4;
  constexpr int64_t kN = 103;
  ThreadPool pool(kThreads);
  std::mutex mu;
  std::vector<std::set<std::thread::id>> threads_of(kThreads);
  std::atomic<int> wrong{0};
  for (int call = 0; call < 100; ++call) {
    std::vector<std::atomic<int>> ran(kThreads);
    pool.parallel_for(
        kN, 1,
        [&](int64_t b, int64_t e, int t) {
          // Chunk t of 4 over 103 items: floor(103 t / 4) = 0, 25, 51, 77, 103.
          static constexpr int64_t kBounds[] = {0, 25, 51, 77, 103};
          if (t < 0 || t >= kThreads || b != kBounds[t] || e != kBounds[t + 1]) wrong++;
          if (t >= 0 && t < kThreads) {
            ran[size_t(t)]++;
            std::lock_guard<std::mutex> lock(mu);
            threads_of[size_t(t)].insert(std::this_thread::get_id());
          }
        },
        Schedule::per_thread);
    for (auto& r : ran) EXPECT_EQ(r.load(), 1);
  }
  EXPECT_EQ(wrong.load(), 0);
  std::set<std::thread::id> all;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(threads_of[size_t(t)].size(), 1u) << "chunk " << t << " ran on several threads";
    all.insert(threads_of[size_t(t)].begin(), threads_of[size_t(t)].end());
  }
  EXPECT_EQ(all.size(), size_t(kThreads));
  EXPECT_EQ(*threads_of[0].begin(), std::this_thread::get_id());
}

// Many tiny jobs back to back, dynamic and per_thread mixed: each job's items are all run once,
// and no chunk of an ended job runs after it (a late worker running an old job's task would
// see another job's number in `current`, or add to a finished job's count).
TEST(ThreadPool, BackToBackJobsRunOnlyTheirOwnTask) {
  constexpr int kThreads = 3;
  ThreadPool pool(kThreads);
  std::atomic<int64_t> current{-1};
  std::atomic<int64_t> stale{0}, miscounted{0};
  for (int64_t job = 0; job < 100000; ++job) {
    const int64_t n = 1 + job % (4 * kThreads + 3);
    std::atomic<int64_t> items{0};
    current.store(job);
    pool.parallel_for(
        n, 1,
        [&items, &current, &stale, job](int64_t b, int64_t e, int) {
          if (current.load() != job) stale++;
          items += e - b;
        },
        job % 8 == 7 ? Schedule::per_thread : Schedule::dynamic);
    current.store(-1);
    if (items.load() != n) miscounted++;
  }
  EXPECT_EQ(stale.load(), 0);
  EXPECT_EQ(miscounted.load(), 0);
}

// Jobs spaced by more than the workers' poll (2 ms): each finds them asleep and must wake
// them (per_thread: every thread's chunk is its own, so the job ends only when all woke).
TEST(ThreadPool, WakesSleepingWorkers) {
  constexpr int kThreads = 3;
  ThreadPool pool(kThreads);
  for (int job = 0; job < 20; ++job) {
    std::this_thread::sleep_for(std::chrono::milliseconds(6));
    std::vector<std::atomic<int>> hits(100);
    std::atomic<int> chunks{0};
    pool.parallel_for(
        100, 1,
        [&](int64_t b, int64_t e, int) {
          chunks++;
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        },
        job % 2 ? Schedule::per_thread : Schedule::dynamic);
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    EXPECT_EQ(chunks.load(), job % 2 ? kThreads : kThreads * ThreadPool::kChunksPerThread);
  }
}

// An exception from a task, on the caller's chunk or a worker's, comes out of parallel_for
// only after every chunk that started has ended; the pool then runs the next job whole.
TEST(ThreadPool, TaskExceptionIsRethrownAfterTheRunningChunksEnd) {
  constexpr int kThreads = 4;
  ThreadPool pool(kThreads);
  for (int thrower : {0, 2}) {
    std::atomic<int> running{0};
    try {
      pool.parallel_for(
          kThreads, 1,
          [&](int64_t, int64_t, int t) {
            running++;
            std::this_thread::sleep_for(std::chrono::milliseconds(t == thrower ? 1 : 20));
            running--;
            if (t == thrower) throw std::runtime_error("chunk of thread " + std::to_string(t));
          },
          Schedule::per_thread);
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk of thread " + std::to_string(thrower));
      EXPECT_EQ(running.load(), 0) << "parallel_for returned while a chunk ran";
    }
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, NestedCallOnTheSamePoolIsAnError) {
  ThreadPool pool(2);
  try {
    pool.parallel_for(100, 1, [&](int64_t, int64_t, int) { pool.parallel_for(100, 1, [](int64_t, int64_t, int) {}); });
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("called from a task of the same pool"), std::string::npos) << e.what();
  }
  // Still usable.
  std::atomic<int64_t> items{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e, int) { items += e - b; });
  EXPECT_EQ(items.load(), 100);
}

// Two threads calling one pool at once: each call waits for the pool and runs whole, with
// its own task only.
TEST(ThreadPool, ConcurrentCallersAreServedOneAtATime) {
  ThreadPool pool(3);
  std::atomic<int> running[2] = {0, 0};  // chunks of each caller's job running now
  std::atomic<int> overlaps{0}, miscounted{0};
  const auto caller = [&](int me) {
    for (int job = 0; job < 2000; ++job) {
      // At least 2 items: a call of one chunk runs on its caller alone, outside the pool.
      const int64_t n = 2 + job % 40;
      std::atomic<int64_t> items{0};
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
        running[me]++;
        if (running[1 - me].load() != 0) overlaps++;
        items += e - b;
        // Long enough that the other caller's call comes while this one runs.
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(2)) {
        }
        running[me]--;
      });
      if (items.load() != n) miscounted++;
    }
  };
  std::thread other(caller, 1);
  caller(0);
  other.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(miscounted.load(), 0);
}

TEST(ThreadPool, NumaNodesIsAtLeastOne) { EXPECT_GE(numa_nodes(), 1); }

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
