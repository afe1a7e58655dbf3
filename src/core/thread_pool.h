#pragma once
// A fixed pool of worker threads for data-parallel loops. parallel_for blocks until every
// chunk is done; it is not re-entrant (a task must not call parallel_for on the same pool).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace osprey {

// The most threads a pool may have (the CLI's -t and OSPREY_THREADS are bounded by it).
inline constexpr int kMaxCpuThreads = 1024;

// The physical cores this process may run on: the CPUs of its affinity mask, SMT siblings
// (/sys/devices/system/cpu/cpuN/topology/thread_siblings_list) counted once. Where sysfs does
// not list a CPU's siblings, that CPU counts as a core of its own. At least 1.
int physical_cores();

class ThreadPool {
 public:
  // n_threads: total threads including the caller; <= 0: physical_cores(). Throws InvalidInput
  // above kMaxCpuThreads, and OutOfMemory naming the count when the system refuses a thread
  // (a process limit): the threads already started are stopped and joined first.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end, thread_index) over [0, n) split into contiguous chunks of at least
  // `min_chunk` items, one chunk per thread.
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker_loop(int index);
  void stop_workers();  // wakes every worker with stop_ set and joins it

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
};

// The process-wide CPU pool, made on first use with the count of the last set_cpu_threads
// call before it (0, the default: one per physical core). The CLI passes OSPREY_THREADS or -t.
ThreadPool& cpu_pool();
void set_cpu_threads(int n_threads);

// Makes `pool` what cpu_pool() returns on the calling thread, until destroyed: threads that
// run ops concurrently (tensor-parallel ranks) each need a pool of their own, since
// parallel_for is not re-entrant.
class ScopedCpuPool {
 public:
  explicit ScopedCpuPool(ThreadPool& pool);
  ~ScopedCpuPool();
  ScopedCpuPool(const ScopedCpuPool&) = delete;
  ScopedCpuPool& operator=(const ScopedCpuPool&) = delete;

 private:
  ThreadPool* previous_;
};

}  // namespace osprey
