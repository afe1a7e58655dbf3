// The CPU pool's cost per parallel_for call with nothing to do (core/thread_pool.h): what a
// decode step pays per op on top of the op's work.
// Usage: osprey_thread_pool_bench [THREADS] [ROUNDS]   (defaults: one per physical core, 7)
// Cases, each ROUNDS rounds (median, min and max of the rounds' ns per call):
//   hot  n=1024  back-to-back calls of parallel_for(1024, 1, empty): the workers poll;
//   hot  n=T     back-to-back calls of parallel_for(T, 1, empty), one item per thread (a pool
//                may run them all on the caller: nothing forces a hand-off);
//   hot  5us     back-to-back calls of parallel_for(T, 1, 5 us of spinning per item): the time
//                past 5 us is the hand-off (10 us or more: the caller ran two items);
//   cold n=T     one call after 5 ms of idleness (longer than the workers' poll): they sleep
//                and the call pays the wake-up.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) { return std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }

void report(const char* name, int threads, std::vector<double> ns) {
  std::sort(ns.begin(), ns.end());
  std::printf("threads %d  %-12s  ns/call median %9.0f  min %9.0f  max %9.0f\n", threads, name, ns[ns.size() / 2],
              ns.front(), ns.back());
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  if (threads < 0 || rounds < 1) {
    std::fprintf(stderr, "usage: osprey_thread_pool_bench [THREADS >= 0] [ROUNDS >= 1]\n");
    return 2;
  }
  osprey::ThreadPool pool(threads);
  const int t = pool.n_threads();
  std::vector<int64_t> sink(size_t(t) * 16);
  const auto empty = [&](int64_t b, int64_t, int i) { sink[size_t(i) * 16] += b; };
  const std::function<void(int64_t, int64_t, int)> task = empty;
  const auto spin_5us = [&](int64_t b, int64_t, int i) {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::microseconds(5)) sink[size_t(i) * 16] += b;
  };
  const std::function<void(int64_t, int64_t, int)> work = spin_5us;
  constexpr int kHotCalls = 20000, kColdCalls = 100;
  std::vector<double> hot_many, hot_t, hot_work, cold_t;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    for (int c = 0; c < kHotCalls; ++c) pool.parallel_for(1024, 1, task);
    hot_many.push_back(ns_since(t0) / kHotCalls);
    t0 = Clock::now();
    for (int c = 0; c < kHotCalls; ++c) pool.parallel_for(t, 1, task);
    hot_t.push_back(ns_since(t0) / kHotCalls);
    t0 = Clock::now();
    for (int c = 0; c < kHotCalls / 4; ++c) pool.parallel_for(t, 1, work);
    hot_work.push_back(ns_since(t0) / (kHotCalls / 4));
    double cold = 0;
    for (int c = 0; c < kColdCalls; ++c) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      t0 = Clock::now();
      pool.parallel_for(t, 1, task);
      cold += ns_since(t0);
    }
    cold_t.push_back(cold / kColdCalls);
  }
  report("hot n=1024", t, hot_many);
  report("hot n=T", t, hot_t);
  report("hot 5us", t, hot_work);
  report("cold n=T", t, cold_t);
  return 0;
}
