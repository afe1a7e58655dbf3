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

struct MetricsInput {
  bool ready = false;
  int n_slots = 0;
  double uptime_seconds = 0;
  ServeStats serve;
  std::map<std::pair<std::string, int>, uint64_t> http;
};

std::string render_metrics(const MetricsInput& in);

}  // namespace osprey
