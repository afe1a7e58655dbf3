#pragma once
// A fixed pool of worker threads for data-parallel loops. parallel_for blocks until every
// chunk is done. It serves one caller at a time (a second thread's call waits until the first
// has returned; a call of one chunk runs on its caller at once, outside the pool) and is not
// re-entrant: a task that calls parallel_for on its own pool, with more than one chunk, gets an
// InvalidInput error.
#include <atomic>
#include <cstdint>
#include <exception>
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

// The NUMA nodes of the CPUs this process may run on (/sys/devices/system/node/nodeN/cpulist);
// 1 where sysfs does not list them.
int numa_nodes();

// How parallel_for hands out the chunks of [0, n).
enum class Schedule {
  // The default: a few chunks per thread (at least min_chunk items each), taken one at a time
  // by whichever thread is free, so a thread that starts late or is preempted delays the call
  // by one small chunk, not by its whole share. Which thread runs a chunk varies from call to
  // call; the chunks' bounds do not (they depend on n, min_chunk and n_threads only), so a
  // kernel whose chunks write disjoint outputs gives the same bits on every call.
  dynamic,
  // One contiguous chunk per thread at most, chunk i on thread i (the caller is thread 0), as
  // n * i / chunks .. n * (i + 1) / chunks: for data that a given thread must touch first (NUMA
  // page placement). The call waits for every thread with a chunk to wake up. (A loop that
  // takes its items from an atomic counter of its own, called as parallel_for(n_threads(), 1),
  // wants dynamic: a thread that comes late finds the items gone and is not waited for.)
  per_thread,
  // per_thread where the process's CPUs span more than one NUMA node, dynamic elsewhere: for a
  // copy written in the split of the kernel that reads it (each thread first touches the pages
  // it will stream), and for that kernel.
  first_touch,
};

class ThreadPool {
 public:
  using Task = std::function<void(int64_t, int64_t, int)>;

  // n_threads: total threads including the caller; <= 0: physical_cores(). Throws InvalidInput
  // above kMaxCpuThreads, and OutOfMemory naming the count when the system refuses a thread
  // (a process limit): the threads already started are stopped and joined first.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end, thread_index) over [0, n) split into contiguous chunks of at least
  // `min_chunk` items (one chunk of all n where n < 2 min_chunk or the pool has one thread).
  // thread_index is in [0, n_threads()), fixed per thread (the caller is 0) and so unique
  // among the calls that run at the same time: an index for per-thread scratch. A thread may
  // run several chunks of one call (dynamic), one after another.
  //
  // An exception thrown by fn is rethrown here once every chunk already started has ended;
  // the chunks not yet started are skipped (the first exception wins).
  //
  // NOTE: the caller takes no lock and makes no system call while the workers are polling
  // for work (for kPoll after their last chunk); it wakes them (a futex) only when some sleep.
  void parallel_for(int64_t n, int64_t min_chunk, const Task& fn, Schedule schedule = Schedule::dynamic);

  // Chunks per thread of a dynamic call (fewer where min_chunk allows fewer): enough that
  // a thread that starts a chunk's time late costs the call about 1/kChunksPerThread of a
  // share, few enough that a chunk stays a long sequential stream and its claim (one
  // compare-and-swap on a shared line) is noise against it.
  static constexpr int kChunksPerThread = 4;

 private:
  void worker_loop(int index);
  void stop_workers();  // wakes every worker with stop_ set and joins it
  // Claims and runs chunks of the dynamic job published as `word` until none is left or that
  // job is gone (a newer ticket).
  void run_chunks(uint64_t word, int index);
  // Runs chunk `chunk` of n_chunks (fn_ unless a chunk threw) and counts it done.
  void run_chunk(int64_t chunk, int64_t n_chunks, int index);
  void wake_sleepers();

  std::vector<std::thread> workers_;
  // The current job, one word: [63:32] its ticket, [31] per_thread, [30:16] the next chunk to
  // claim, [15:0] its chunk count. A thread claims a chunk with a compare-and-swap on the whole
  // word, so a thread that read an older job's word can never claim a chunk of a newer job;
  // and the fields below are read only after a claim succeeded, when the caller is still
  // waiting for that chunk and so has not moved on to the next job.
  alignas(64) std::atomic<uint64_t> job_{0};
  alignas(64) std::atomic<int64_t> n_done_{0};   // chunks of the current job ended
  alignas(64) std::atomic<int> n_sleepers_{0};   // workers asleep on wake_ (or going to sleep)
  std::atomic<uint32_t> wake_{0};                // bumped (and notified) to wake sleepers
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};                // a caller holds the pool
  std::atomic<bool> failed_{false};              // a chunk of the current job threw
  const Task* fn_ = nullptr;
  int64_t n_ = 0;
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception of the current job, under error_mu_
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
