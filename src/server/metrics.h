#pragma once
// The /metrics page in the Prometheus text format (version 0.0.4). Besides Osprey's own
// counters it carries the two gauges the Kubernetes Gateway API Inference Extension's
// model-server protocol asks of a server it balances: queued requests and KV cache
// utilisation (a fraction in [0, 1]).
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "serve/serve_stats.h"

namespace osprey {

class HttpCounters {
 public:
  // Counts one answered request; `route` must come from a fixed set (label cardinality).
  void count(const std::string& route, int status);
  std::map<std::pair<std::string, int>, uint64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;
};

// A Prometheus histogram over fixed bucket bounds (seconds). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bucket, not cumulative; one more for +Inf
    double sum = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
};

// The request latencies, under vLLM's metric names.
struct LatencyHistograms {
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram itl{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram e2e{{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920}};
  Histogram queue{{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920}};
};

struct MetricsInput {
  bool ready = false;
  int n_slots = 0;
  double uptime_seconds = 0;
  ServeStats serve;
  std::map<std::pair<std::string, int>, uint64_t> http;
  const LatencyHistograms* latency = nullptr;
};

std::string render_metrics(const MetricsInput& in);

}  // namespace osprey
