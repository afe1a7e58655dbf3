#include "core/thread_pool.h"

#include <sched.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <system_error>

#include "core/error.h"

namespace osprey {

int physical_cores() {
  static const int n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
      return int(std::max(1u, std::thread::hardware_concurrency()));
    // A core is named by its sibling list (the same text for every CPU of the core).
    std::set<std::string> cores;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
      std::string siblings;
      if (!(f && std::getline(f, siblings)) || siblings.empty()) siblings = "cpu " + std::to_string(cpu);
      cores.insert(siblings);
    }
    return std::max(1, int(cores.size()));
  }();
  return n;
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::min(kMaxCpuThreads, physical_cores());
  if (n_threads > kMaxCpuThreads)
    throw InvalidInput("a thread pool of " + std::to_string(n_threads) + " threads: at most " +
                       std::to_string(kMaxCpuThreads) + " are supported");
  workers_.reserve(size_t(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error& e) {
      // The started workers wait on cv_: stop and join them before the members go.
      stop_workers();
      throw OutOfMemory("cannot start CPU thread " + std::to_string(i + 1) + " of " + std::to_string(n_threads) +
                        " (" + e.what() + "): ask for fewer threads");
    }
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  int chunks = int(std::min<int64_t>(n_threads(), max_chunks));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    n_chunks_ = chunks;
    // Every worker checks in, with a chunk or without: the job's fields are not written again
    // until all of them have read these.
    pending_.store(int(workers_.size()));
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  fn(0, n / chunks, 0);
  // Spin briefly, then yield: decode-step loops are short.
  while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
}

void ThreadPool::worker_loop(int index) {
  // NOTE: a worker polls for the next job (yielding the core to anyone runnable) for up to
  // kPoll after its last one before it sleeps on the condition variable: decode runs its ops
  // back to back, and a wake-up through the condition variable (each worker taking the mutex
  // in turn) costs tens of microseconds per op; an idle pool still sleeps.
  constexpr auto kPoll = std::chrono::milliseconds(2);
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int spin = 1; g == seen; ++spin) {
        std::this_thread::yield();
        if (spin % 64 == 0 && std::chrono::steady_clock::now() - t0 > kPoll) break;
        g = generation_.load(std::memory_order_acquire);
      }
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      g = generation_.load();
    }
    seen = g;
    // The job's fields were written before the generation moved, and are not written again
    // until this worker checks in (pending_).
    if (stop_) return;
    const std::function<void(int64_t, int64_t, int)>* fn = fn_;
    const int64_t n = n_;
    const int chunks = n_chunks_;
    if (index < chunks) (*fn)(n * index / chunks, n * (index + 1) / chunks, index);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

namespace {
int g_requested_threads = 0;
thread_local ThreadPool* t_pool = nullptr;  // ScopedCpuPool's, on its thread
}  // namespace

ScopedCpuPool::ScopedCpuPool(ThreadPool& pool) : previous_(t_pool) { t_pool = &pool; }
ScopedCpuPool::~ScopedCpuPool() { t_pool = previous_; }

void set_cpu_threads(int n_threads) { g_requested_threads = n_threads; }

ThreadPool& cpu_pool() {
  if (t_pool) return *t_pool;
  static std::unique_ptr<ThreadPool> pool =
      std::make_unique<ThreadPool>(g_requested_threads);
  return *pool;
}

}  // namespace osprey
