#include "server/metrics.h"

#include <cstdio>

namespace osprey {
namespace {

class Page {
 public:
  void metric(const char* name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, "", value);
  }
  void header(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const char* name, const std::string& labels, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    out_ += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  }
  std::string str() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

void HttpCounters::count(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[{route, status}];
}

std::map<std::pair<std::string, int>, uint64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

Histogram::Histogram(std::vector<double> bounds) {
  s_.bounds = std::move(bounds);
  s_.counts.assign(s_.bounds.size() + 1, 0);
}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < s_.bounds.size() && value > s_.bounds[i]) ++i;
  ++s_.counts[i];
  s_.sum += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

namespace {

void histogram(Page& p, const char* name, const char* help, const Histogram& h) {
  const Histogram::Snapshot s = h.snapshot();
  p.header(name, "histogram", help);
  const std::string base = name;
  uint64_t total = 0;
  for (size_t i = 0; i <= s.bounds.size(); ++i) {
    total += s.counts[i];
    char le[32];
    if (i < s.bounds.size())
      std::snprintf(le, sizeof le, "%g", s.bounds[i]);
    else
      std::snprintf(le, sizeof le, "+Inf");
    p.sample((base + "_bucket").c_str(), std::string("le=\"") + le + "\"", double(total));
  }
  p.sample((base + "_sum").c_str(), "", s.sum);
  p.sample((base + "_count").c_str(), "", double(total));
}

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  const SchedulerStats& s = in.serve.scheduler;
  const PromptCacheStats& pc = in.serve.prompt_cache;
  Page p;
  p.header("osprey:http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, n] : in.http)
    p.sample("osprey:http_requests_total", "route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"",
             double(n));
  p.metric("osprey:ready", "gauge", "1 once the model is loaded, 0 while loading.", in.ready ? 1 : 0);
  p.metric("osprey:uptime_seconds", "gauge", "Seconds since the server started.", in.uptime_seconds);
  p.metric("osprey:slots", "gauge", "Sequences that may run at once (--parallel).", in.n_slots);
  p.metric("osprey:requests_finished_total", "counter", "Sequences that ended normally (stop or length).", double(s.n_finished));
  p.metric("osprey:requests_cancelled_total", "counter", "Sequences ended early: client gone or stop string matched.",
           double(s.n_cancelled));
  p.metric("osprey:requests_failed_total", "counter", "Sequences that failed.", double(s.n_failed));
  p.metric("osprey:num_requests_running", "gauge", "Sequences running now.", double(s.n_running));
  p.metric("osprey:num_requests_waiting", "gauge",
           "Requests waiting in the queue (the inference gateway's TotalQueuedRequests).", double(s.n_waiting));
  p.metric("osprey:kv_cache_usage_perc", "gauge",
           "Fraction of the KV cache capacity in use, 0 to 1 (the inference gateway's KVCacheUtilization).", s.kv_usage);
  p.metric("osprey:prompt_tokens_total", "counter", "Prompt tokens prefilled (not counting those from the prompt cache).",
           double(s.n_prompt_tokens));
  p.metric("osprey:prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prompt cache.",
           double(s.n_cached_tokens));
  p.metric("osprey:generation_tokens_total", "counter", "Tokens generated.", double(s.n_generated_tokens));
  p.metric("osprey:prompt_seconds_total", "counter", "Seconds spent prefilling prompts.", s.prefill_seconds);
  p.metric("osprey:generation_seconds_total", "counter", "Seconds spent in decode steps.", s.decode_seconds);
  p.metric("osprey:prompt_tokens_per_second", "gauge", "Prompt tokens per second of prefill, since start.",
           s.prefill_seconds > 0 ? double(s.n_prompt_tokens) / s.prefill_seconds : 0);
  p.metric("osprey:generation_tokens_per_second", "gauge", "Generated tokens per second of decode steps, since start.",
           s.decode_seconds > 0 ? double(s.n_generated_tokens) / s.decode_seconds : 0);
  p.metric("osprey:kv_inplace_writes_total", "counter", "KV cache writes that went in place (per layer).",
           double(s.kv.n_inplace_writes));
  p.metric("osprey:kv_copying_writes_total", "counter", "KV cache writes that copied the cache (per layer).",
           double(s.kv.n_copying_writes));
  p.metric("osprey:kv_bytes_copied_total", "counter", "Bytes carried over by copying KV writes.", double(s.kv.bytes_copied));
  p.metric("osprey:prompt_cache_hits_total", "counter", "Prompt cache lookups that restored a common prefix.",
           double(pc.n_hits));
  p.metric("osprey:prompt_cache_misses_total", "counter", "Prompt cache lookups that found nothing to restore.",
           double(pc.n_misses));
  p.metric("osprey:prompt_cache_unusable_total", "counter",
           "Prompt cache lookups whose match could not be used: a sliding-window layer could not rewind to the "
           "common prefix, so the prompt was computed from the start.",
           double(pc.n_unusable));
  p.metric("osprey:prompt_cache_restored_tokens_total", "counter", "Tokens restored from the prompt cache.",
           double(pc.n_restored_tokens));
  p.metric("osprey:prompt_cache_stores_total", "counter", "Snapshots stored in the prompt cache.", double(pc.n_stored));
  p.metric("osprey:prompt_cache_evictions_total", "counter", "Prompt cache entries evicted (or too large to keep).",
           double(pc.n_evictions));
  p.metric("osprey:prompt_cache_entries", "gauge", "Prompt cache entries held.", double(pc.n_entries));
  p.metric("osprey:prompt_cache_bytes", "gauge", "Bytes of KV buffers the prompt cache holds.", double(pc.bytes));
  p.metric("osprey:prompt_cache_budget_bytes", "gauge", "The prompt cache's byte budget (--prompt-cache-mib).",
           double(pc.budget_bytes));
  p.metric("osprey:preemptions_total", "counter",
           "Running sequences sent back to the queue because the KV pool was full (computed again on admission).",
           double(s.n_preempted));
  p.metric("osprey:spec_drafted_tokens_total", "counter",
           "Tokens drafted by speculative decoding (--spec-ngram or --model-draft) and verified.", double(s.n_drafted_tokens));
  p.metric("osprey:spec_accepted_tokens_total", "counter", "Drafted tokens the model accepted.",
           double(s.n_accepted_tokens));
  p.metric("osprey:spec_verify_steps_total", "counter", "Speculative verifies, one per drafting sequence and step (with the paged layout a step's verifies share one forward).",
           double(s.n_verify_steps));
  p.metric("osprey:spec_draft_stops_total", "counter",
           "Times a sequence stopped drafting because too few of its drafts were accepted (--spec-min-acceptance); "
           "it drafts again after a back-off.",
           double(s.n_draft_stops));
  p.metric("osprey:spec_paused_steps_total", "counter",
           "Steps that drafted for no sequence because the decoding batch was larger than --spec-max-batch.",
           double(s.n_draft_paused_steps));
  if (in.serve.pool) {
    const PagedPoolStats& kp = *in.serve.pool;
    p.metric("osprey:kv_pool_blocks", "gauge", "Blocks in the paged KV pool.", double(kp.n_blocks));
    p.metric("osprey:kv_pool_blocks_in_use", "gauge", "Blocks held by running sequences.", double(kp.n_in_use));
    p.metric("osprey:kv_pool_blocks_cached", "gauge", "Blocks held by the prefix cache alone (evictable).",
             double(kp.n_cached));
    p.metric("osprey:kv_pool_blocks_free", "gauge", "Blocks held by nothing.", double(kp.n_free));
    p.metric("osprey:kv_pool_cow_copies_total", "counter", "Shared blocks copied before a write (copy-on-write).",
             double(kp.n_cow));
  }
  if (in.serve.prompt_store) {
    const PromptStoreStats& ps = *in.serve.prompt_store;
    p.metric("osprey:prompt_cache_disk_files", "gauge", "Files in the prompt cache folder's auto/ (--prompt-cache-dir).",
             double(ps.n_files));
    p.metric("osprey:prompt_cache_disk_bytes", "gauge", "Bytes of those files (bounded by --prompt-cache-max-gib).",
             double(ps.bytes));
    p.metric("osprey:prompt_cache_disk_writes_total", "counter", "Cached prompts written to the folder.",
             double(ps.n_written));
    p.metric("osprey:prompt_cache_disk_written_bytes_total", "counter", "Bytes written to the folder.",
             double(ps.bytes_written));
    p.metric("osprey:prompt_cache_disk_write_failures_total", "counter",
             "Writes that failed (a full disk, an unwritable folder; each logged naming the file).",
             double(ps.n_write_failures));
    p.metric("osprey:prompt_cache_disk_writes_dropped_total", "counter",
             "Writes dropped: the writer's queue was full, or the file alone passed --prompt-cache-max-gib.",
             double(ps.n_dropped));
    p.metric("osprey:prompt_cache_disk_evictions_total", "counter",
             "Files removed to stay within --prompt-cache-max-gib (least recently used first).", double(ps.n_evicted));
    p.metric("osprey:prompt_cache_disk_restored_files_total", "counter", "Files restored into the cache at start.",
             double(ps.n_restored));
    p.metric("osprey:prompt_cache_disk_restored_tokens_total", "counter",
             "Tokens whose rows the restored files brought.", double(ps.n_restored_tokens));
    p.metric("osprey:prompt_cache_disk_skipped_files_total", "counter",
             "Files skipped: another model, corrupted, truncated or unreadable (each logged naming the file).",
             double(ps.n_skipped));
  }
  // The names an inference gateway's endpoint picker scrapes by default.
  p.metric("vllm:num_requests_waiting", "gauge", "Alias of osprey:num_requests_waiting.", double(s.n_waiting));
  p.metric("vllm:kv_cache_usage_perc", "gauge", "Alias of osprey:kv_cache_usage_perc.", s.kv_usage);
  p.metric("vllm:gpu_cache_usage_perc", "gauge", "Alias of osprey:kv_cache_usage_perc (the older name).", s.kv_usage);
  if (in.latency) {
    histogram(p, "vllm:time_to_first_token_seconds", "Seconds from a request's arrival to its first token.",
              in.latency->ttft);
    histogram(p, "vllm:inter_token_latency_seconds", "Seconds between consecutive tokens of a request.",
              in.latency->itl);
    histogram(p, "vllm:time_per_output_token_seconds", "Alias of vllm:inter_token_latency_seconds (the older name).",
              in.latency->itl);
    histogram(p, "vllm:e2e_request_latency_seconds", "Seconds from a request's arrival to its last token.",
              in.latency->e2e);
    histogram(p, "vllm:request_queue_time_seconds",
              "Seconds a request waited (for a thread or in the engine's queue) before the engine admitted it.",
              in.latency->queue);
  }
  return p.str();
}

}  // namespace osprey
