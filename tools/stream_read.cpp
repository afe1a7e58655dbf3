// osprey_stream_read: the machine's memory read bandwidth, STREAM-style, for comparing a
// memory-bound decode against (docs/benchmarks.md, "CPU decode").
//
// Each of T threads owns one contiguous slice of an array of --mib MiB (written by that thread
// first, so its pages sit on that thread's node), and each repetition every thread sums its
// slice once as 64-bit integers (a read-only kernel: no stores, one accumulator chain per
// vector lane). A repetition's time runs from the barrier that releases the threads to the
// last one done; bandwidth = bytes / time. The best and the median of --repetitions are
// reported, after one unmeasured pass.
//
// Usage: osprey_stream_read [-t THREADS[,THREADS...]] [--mib MIB] [-r REPS] [--json]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  std::vector<int> threads;
  int64_t mib = 2048;
  int repetitions = 10;
  bool json = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "osprey_stream_read: %s\nusage: osprey_stream_read [-t THREADS[,THREADS...]] [--mib MIB] "
                       "[-r REPS] [--json]\n", what.c_str());
  std::exit(2);
}

int64_t parse_positive(const char* flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0) usage_error(std::string(flag) + ": '" + text + "' is not a positive integer");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-t" || a == "--threads") {
      const std::string list = value();
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        o.threads.push_back(int(parse_positive("-t", list.substr(pos, comma - pos))));
        pos = comma + 1;
      }
    } else if (a == "--mib") {
      o.mib = parse_positive("--mib", value());
    } else if (a == "-r" || a == "--repetitions") {
      o.repetitions = int(parse_positive("-r", value()));
    } else if (a == "--json") {
      o.json = true;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (o.threads.empty()) o.threads.push_back(int(std::max(1u, std::thread::hardware_concurrency())));
  return o;
}

// The sum of p[0, n) as 64-bit integers; the compiler vectorises it (integer adds reassociate).
__attribute__((noinline)) uint64_t sum_words(const uint64_t* p, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

struct Result {
  int threads;
  double best_gbs, median_gbs;
};

Result measure(uint64_t* data, int64_t n_words, int n_threads, int repetitions) {
  using Clock = std::chrono::steady_clock;
  const int64_t per = n_words / n_threads;
  std::vector<uint64_t> sums(size_t(n_threads) * 8);  // one cache line per thread
  std::barrier start(n_threads + 1), done(n_threads + 1);
  const int passes = repetitions + 1;  // the first is unmeasured
  std::vector<std::thread> workers;
  for (int t = 0; t < n_threads; ++t)
    workers.emplace_back([&, t] {
      uint64_t* slice = data + t * per;
      for (int64_t i = 0; i < per; ++i) slice[i] = uint64_t(i) * 0x9e3779b97f4a7c15ull + uint64_t(t);
      start.arrive_and_wait();  // pages placed
      for (int r = 0; r < passes; ++r) {
        start.arrive_and_wait();
        sums[size_t(t) * 8] += sum_words(slice, per);
        done.arrive_and_wait();
      }
    });
  start.arrive_and_wait();
  std::vector<double> gbs;
  for (int r = 0; r < passes; ++r) {
    const auto t0 = Clock::now();
    start.arrive_and_wait();
    done.arrive_and_wait();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) gbs.push_back(double(per) * n_threads * 8 / s / 1e9);
  }
  for (auto& w : workers) w.join();
  uint64_t check = 0;
  for (int t = 0; t < n_threads; ++t) check ^= sums[size_t(t) * 8];
  if (check == 0x12345) std::fprintf(stderr, " ");  // keeps the sums live
  std::sort(gbs.begin(), gbs.end());
  return {n_threads, gbs.back(), gbs[gbs.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int64_t n_words = o.mib * (int64_t(1) << 20) / 8;
  // Untouched until each thread writes its slice (first touch places the pages).
  std::unique_ptr<uint64_t[]> data(new (std::nothrow) uint64_t[size_t(n_words)]);
  if (!data) {
    std::fprintf(stderr, "osprey_stream_read: cannot allocate %lld MiB\n", static_cast<long long>(o.mib));
    return 1;
  }
  std::vector<Result> results;
  for (int t : o.threads) results.push_back(measure(data.get(), n_words, t, o.repetitions));
  if (o.json) {
    std::printf("[");
    for (size_t i = 0; i < results.size(); ++i)
      std::printf("%s\n  {\"threads\": %d, \"mib\": %lld, \"repetitions\": %d, \"read_gbs_best\": %.2f, "
                  "\"read_gbs_median\": %.2f}",
                  i ? "," : "", results[i].threads, static_cast<long long>(o.mib), o.repetitions,
                  results[i].best_gbs, results[i].median_gbs);
    std::printf("\n]\n");
  } else {
    std::printf("| threads | array MiB | read GB/s (best) | read GB/s (median) |\n|---|---|---|---|\n");
    for (const Result& r : results)
      std::printf("| %d | %lld | %.2f | %.2f |\n", r.threads, static_cast<long long>(o.mib), r.best_gbs,
                  r.median_gbs);
  }
  return 0;
}
