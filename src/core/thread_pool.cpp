#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
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

namespace {

// The job word's fields (thread_pool.h, ThreadPool::job_).
constexpr uint64_t kPerThreadBit = uint64_t(1) << 31;
constexpr int kNextShift = 16;
constexpr uint64_t kFieldMask = 0x7fff;
constexpr int64_t kMaxChunks = int64_t(kFieldMask);
static_assert(int64_t(kMaxCpuThreads) * ThreadPool::kChunksPerThread <= kMaxChunks, "the chunk count fits its field");

// The pool whose chunk the calling thread is running (null: none).
thread_local const ThreadPool* t_running = nullptr;

uint64_t ticket_of(uint64_t word) { return word >> 32; }
int64_t next_of(uint64_t word) { return int64_t((word >> kNextShift) & kFieldMask); }
int64_t count_of(uint64_t word) { return int64_t(word & kFieldMask); }

// A spinning thread's pause: the x86 PAUSE hint (lets an SMT sibling run, saves power, and
// avoids the memory-order flush when the line changes); elsewhere a compiler barrier.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  asm volatile("" ::: "memory");
#endif
}

// NOTE: a worker polls for the next job for up to kPoll after its last one before it sleeps:
// decode runs hundreds of ops per token back to back, and a futex wake-up costs the caller a
// system call and the worker several microseconds of scheduling per op. The first kPauseSpins
// polls only pause (a job issued within a few microseconds is seen at once); later ones yield
// the core to anyone runnable between polls. An idle pool sleeps, costing no CPU.
constexpr auto kPoll = std::chrono::milliseconds(2);
constexpr int kPauseSpins = 4096;

// The entries of a sysfs CPU or node list ("0-3,8,10-11"); empty where it does not parse.
std::vector<int> parse_list(const std::string& list) {
  std::vector<int> out;
  size_t i = 0;
  while (i < list.size()) {
    const size_t comma = list.find(',', i);
    const std::string part = list.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    const size_t dash = part.find('-');
    try {
      const int lo = std::stoi(part.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo < 0 || hi < lo || hi >= (1 << 16)) return {};
      for (int v = lo; v <= hi; ++v) out.push_back(v);
    } catch (const std::exception&) {
      return {};
    }
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  return out;
}

}  // namespace

int numa_nodes() {
  static const int n = [] {
    std::ifstream online("/sys/devices/system/node/online");
    std::string list;
    if (!(online && std::getline(online, list))) return 1;
    const std::vector<int> nodes = parse_list(list);
    if (nodes.size() <= 1) return 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return int(nodes.size());
    // The nodes that hold a CPU of the affinity mask (a process pinned to one node is local).
    int used = 0;
    for (int node : nodes) {
      std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
      std::string cpus;
      if (!(f && std::getline(f, cpus))) continue;
      for (int cpu : parse_list(cpus))
        if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set)) {
          ++used;
          break;
        }
    }
    return std::max(1, used);
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
      // The started workers poll or sleep: stop and join them before the members go.
      stop_workers();
      throw OutOfMemory("cannot start CPU thread " + std::to_string(i + 1) + " of " + std::to_string(n_threads) +
                        " (" + e.what() + "): ask for fewer threads");
    }
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  stop_.store(true);
  // A new ticket with no chunks: pollers see it, sleepers are woken.
  job_.store((ticket_of(job_.load()) + 1) << 32);
  wake_sleepers();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::wake_sleepers() {
  wake_.fetch_add(1);
  wake_.notify_all();
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const Task& fn, Schedule schedule) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  if (schedule == Schedule::first_touch)
    schedule = numa_nodes() > 1 ? Schedule::per_thread : Schedule::dynamic;
  const bool per_thread = schedule == Schedule::per_thread;
  const int64_t per = per_thread ? 1 : kChunksPerThread;
  const int64_t chunks = n_threads() == 1 ? 1 : std::min<int64_t>(int64_t(n_threads()) * per, max_chunks);
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  if (t_running == this)
    throw InvalidInput("parallel_for: called from a task of the same pool (it is not re-entrant: run the inner loop "
                       "in the task, or on a pool of its own)");
  // NOTE: another thread's call holds the pool: wait for it (a thread that runs ops beside
  // another for long wants a pool of its own: ScopedCpuPool).
  for (bool idle = false; !busy_.compare_exchange_weak(idle, true, std::memory_order_acquire); idle = false)
    std::this_thread::yield();
  // The fields are read by a thread only after it claimed a chunk of this job (the job word
  // below, published after them), and not written again before every chunk is done.
  fn_ = &fn;
  n_ = n;
  n_done_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  const uint64_t word = ((ticket_of(job_.load(std::memory_order_relaxed)) + 1) << 32) |
                        (per_thread ? kPerThreadBit : 0) | uint64_t(chunks);
  // seq_cst against a worker going to sleep: it counts itself in n_sleepers_ and then reads the
  // job word; either it sees this job or this sees it counted.
  job_.store(word);
  if (n_sleepers_.load() > 0) wake_sleepers();
  if (per_thread)
    run_chunk(0, chunks, 0);
  else
    run_chunks(word, 0);
  // Only the chunks that other threads took are left: wait for those alone.
  for (int spin = 0; n_done_.load(std::memory_order_acquire) < chunks; ++spin) {
    if (spin < kPauseSpins)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  std::exception_ptr error = std::move(error_);
  error_ = nullptr;
  busy_.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::run_chunks(uint64_t word, int index) {
  const uint64_t ticket = ticket_of(word);
  for (;;) {
    if (ticket_of(word) != ticket) return;  // that job is done; a newer one is the poll's
    const int64_t next = next_of(word), count = count_of(word);
    if (next >= count) return;
    // The compare-and-swap compares the whole word: it fails, and reloads `word`, if any
    // thread claimed a chunk since, or the job is no longer the one this thread saw.
    if (job_.compare_exchange_weak(word, word + (uint64_t(1) << kNextShift), std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
      run_chunk(next, count, index);
      word = job_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::run_chunk(int64_t chunk, int64_t n_chunks, int index) {
  if (!failed_.load(std::memory_order_relaxed)) {
    const ThreadPool* outer = t_running;  // a pool whose task called this one's parallel_for
    t_running = this;
    try {
      (*fn_)(n_ * chunk / n_chunks, n_ * (chunk + 1) / n_chunks, index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
    t_running = outer;
  }
  // After this the thread touches none of the job's fields: the caller may return.
  n_done_.fetch_add(1, std::memory_order_acq_rel);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;  // the ticket of the last job this worker looked at
  for (;;) {
    uint64_t word = job_.load(std::memory_order_acquire);
    if (ticket_of(word) == seen) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int spin = 0; ticket_of(word) == seen; ++spin) {
        if (spin < kPauseSpins)
          cpu_relax();
        else
          std::this_thread::yield();
        if (spin % 64 == 63 && std::chrono::steady_clock::now() - t0 > kPoll) {
          const uint32_t wake = wake_.load();
          n_sleepers_.fetch_add(1);
          if (ticket_of(job_.load()) == seen) wake_.wait(wake);
          n_sleepers_.fetch_sub(1);
          spin = -1;
        }
        word = job_.load(std::memory_order_acquire);
      }
    }
    if (stop_.load()) return;
    seen = ticket_of(word);
    if (!(word & kPerThreadBit))
      run_chunks(word, index);
    else if (index < count_of(word))
      // Chunk `index` of this job is this thread's alone, and the job cannot end before it
      // is done: the job is still the caller's current one.
      run_chunk(index, count_of(word), index);
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
