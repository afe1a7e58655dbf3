#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <thread>

#include "backend/device_select.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "server/server.h"

namespace osprey::cli {
namespace fs = std::filesystem;
namespace {

// Upper bounds of the serve flags: each fits its type and what a machine can give.
constexpr int64_t kMaxContext = int64_t(1) << 24;
constexpr int64_t kMaxSlots = 4096;
constexpr int64_t kMaxQueue = 1 << 20;
constexpr int64_t kMaxBodyMib = int64_t(1) << 20;  // 2^40 bytes
constexpr int64_t kMaxTimeout = 86400;
constexpr int64_t kMaxHttpThreads = 4096;
// The KV pool and the prompt cache: 1 TiB, past any device; a size the device cannot hold is
// an out-of-memory error at load.
constexpr int64_t kMaxCacheMib = int64_t(1) << 20;

struct ServeOptions {
  ServerOptions server;
  std::string model;
  bool download = false;
  std::string device;
  std::string cache_type_k, cache_type_v;  // --cache-type-k, --cache-type-v
  int threads = -1;
  int64_t max_body_mib = 8;
  bool no_webui = false;
  int shutdown_timeout_s = 5;
  std::string api_key_file;
  std::string reasoning_format = "auto";
  int parallel = 0;  // -np (>= 1 when given); 0, not given: kAutoParallel* by device and layout
  int spec_max_batch = -1;  // --spec-max-batch (>= 0 when given); -1, not given: auto_spec_max_batch
  double prompt_cache_max_gib = 0;  // --prompt-cache-max-gib (0: no bound)
};

// Sequences running at once when -np is not given: a few on the CPU (its batches share the
// weight reads), a full batch on a GPU; one for the dense layout, whose slots each hold a
// whole context.
constexpr int kAutoParallelCpu = 4;
constexpr int kAutoParallelGpu = 64;
// --spec-max-batch when not given, with the paged layout (auto_spec_max_batch).
constexpr int kAutoSpecBatchCpu = 1;
constexpr int kAutoSpecBatchGpu = 4;

// --spec-max-batch when not given (docs/design.md, "When a sequence drafts"). The dense layout
// decodes its sequences one after another, sharing no weight read between them: drafting pays
// there at any batch (no limit). The paged layout's plain step computes its rows together; on
// the CPU a verify's rows are each their own matvec, and drafting measured slower than plain
// decoding from 2 sequences on (docs/benchmark_results/2026-12-07-cpu-spec-policy.md). On a GPU
// a plain step reads each weight once for the whole batch, a verify's rows in batch-invariant
// mode once per 8 rows: with a accepted of k drafted a sequence, drafting reads the weights
// about B (k + 1) / 8 times for B (1 + a) tokens against once for B, which pays while
// B < 8 (1 + a) / (k + 1): about 5 at the 4.6 accepted of 8 measured on the CPU, 4 with a
// margin (not measured on a GPU).
int auto_spec_max_batch(const ServerOptions& so) {
  if (so.kv_layout == KVLayout::dense) return 0;
  return so.device.is_cpu() ? kAutoSpecBatchCpu : kAutoSpecBatchGpu;
}

// The keys of an --api-key-file: one a line, blank lines and '#' comments skipped.
std::vector<std::string> read_api_keys(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError("--api-key-file: cannot read " + path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(f, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys.push_back(line.substr(start));
  }
  if (keys.empty()) throw UsageError("--api-key-file: " + path + " holds no key");
  return keys;
}

// SIGINT and SIGTERM, whichever thread the kernel delivers them to, as bytes on a pipe (writing
// to a pipe is async-signal-safe); the handlers stay installed until the process ends.
int g_signal_write_fd = -1;

extern "C" void osprey_forward_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_write_fd, &b, 1);
  errno = saved;
}

class SignalPipe {
 public:
  static constexpr int kWake = 0;  // not a signal: the process wakes its own watcher

  SignalPipe() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) throw IoError(std::string("pipe for signals: ") + std::strerror(errno));
    g_signal_write_fd = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = osprey_forward_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Blocks until a signal arrives or wake() is called; the signal's number, or kWake.
  int next() {
    for (;;) {
      unsigned char b = 0;
      const ssize_t n = ::read(fds_[0], &b, 1);
      if (n == 1) return b;
      if (n < 0 && errno == EINTR) continue;
      return kWake;
    }
  }

  void wake() {
    const unsigned char b = kWake;
    [[maybe_unused]] const ssize_t n = ::write(fds_[1], &b, 1);
  }

 private:
  int fds_[2] = {-1, -1};  // left open: a late signal still has somewhere to go
};

int run_serve(ServeOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  ServerOptions& so = o.server;
  if (!o.api_key_file.empty())
    for (std::string& k : read_api_keys(o.api_key_file)) so.api_keys.push_back(std::move(k));
  for (const std::string& k : so.api_keys)
    if (k.empty()) throw UsageError("--api-key: a key must not be empty");
  if (so.cache_salt_by_key && so.api_keys.empty())
    throw UsageError("--cache-salt-by-key needs API keys (--api-key or --api-key-file)");
  if (so.spec.ngram && !so.spec.model_draft.empty())
    throw UsageError("--spec-ngram and --model-draft are two draft sources; give one of them");
  if (!so.spec.model_draft.empty()) so.spec.model_draft = model_folder(so.spec.model_draft, false);
  so.model_dir = model_folder(o.model, o.download);
  if (so.alias.empty() && !o.model.empty() && !fs::exists(o.model)) so.alias = o.model;  // a Hub id names itself
  if (!fs::exists(so.model_dir)) throw IoError("model folder " + so.model_dir.string() + " does not exist");
  so.device = select_device(o.device.empty() ? env_options().device : o.device);
  so.n_slots = o.parallel > 0                     ? o.parallel
               : so.kv_layout == KVLayout::dense ? 1
               : so.device.is_cpu()              ? kAutoParallelCpu
                                                 : kAutoParallelGpu;
  so.spec.max_batch = o.spec_max_batch >= 0 ? o.spec_max_batch : auto_spec_max_batch(so);
  const EnvOptions& env = env_options();
  so.cache.step = env.kv_step;
  so.cache.inplace = env.kv_inplace_write;
  so.cache.k_type = cache_type(o.cache_type_k, "--cache-type-k");
  so.cache.v_type = cache_type(o.cache_type_v, "--cache-type-v");
  so.graphs = env.cuda_graphs;
  so.max_body_bytes = size_t(o.max_body_mib) << 20;
  so.webui.enabled = !o.no_webui;
  if (o.no_webui && !so.webui.dir.empty()) throw UsageError("--no-webui and --webui-dir contradict each other: give one");
  try {
    check_webui_options(so.webui);
  } catch (const InvalidInput& e) {
    throw UsageError(e.what());
  }
  so.split_reasoning = o.reasoning_format == "auto";
  if (!so.prompt_cache_dir.empty() && so.prompt_cache_mib == 0)
    throw UsageError("--prompt-cache-dir keeps the prompt cache on disk, and --prompt-cache-mib 0 turns the cache off: "
                     "give one or the other");
  if (o.prompt_cache_max_gib > 0 && so.prompt_cache_dir.empty())
    throw UsageError("--prompt-cache-max-gib bounds --prompt-cache-dir's folder: give the folder too");
  so.prompt_cache_max_bytes = uint64_t(o.prompt_cache_max_gib * double(uint64_t(1) << 30));
  so.system_fingerprint = std::string("osprey-") + OSPREY_VERSION + "-" + build_commit();

  // SIGINT and SIGTERM reach a handler that writes the signal's number to a pipe, read by one
  // watcher thread. The threads started from here on block both signals, so none of the server's
  // own calls is interrupted; threads that existed before (the CUDA driver's, once the device was
  // selected above, or a tool's injected into the process) keep the default mask, and the handler
  // makes a signal that the kernel hands to one of them drain the server like any other.
  SignalPipe signal_pipe;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  Server server(so);
  const int port = server.bind();
  server.start();
  log_info("listening on http://" + so.host + ":" + std::to_string(port) + ", loading " + so.model_dir.string());
  // The first signal drains (up to --shutdown-timeout), then ends what is left; a second
  // signal during the drain ends it at once.
  std::thread watcher([&] {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    const int sig = signal_pipe.next();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    if (sig == SignalPipe::kWake) {  // the server failed to load or lost its device
      server.stop();
      return;
    }
    log_info(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    std::atomic<bool> draining{true};
    std::thread second([&] {
      pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
      if (signal_pipe.next() == SignalPipe::kWake || !draining) return;
      log_info("received a second signal: ending the requests in progress now");
      server.stop();
    });
    server.drain(o.shutdown_timeout_s * 1000);
    draining = false;
    server.stop();
    signal_pipe.wake();
    second.join();
  });
  try {
    server.load();
  } catch (...) {
    signal_pipe.wake();
    watcher.join();
    throw;
  }
  server.wait();
  if (const std::string lost = server.device_lost(); !lost.empty()) {
    // /health has answered 503 since the failure; the requests in flight got their error.
    server.stop();
    signal_pipe.wake();
    watcher.join();
    throw DeviceLost("serving stopped: " + lost);
  }
  watcher.join();
  log_info("stopped");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  ServerOptions& s = o->server;
  add_model_options(app, o->model, o->download);
  app.add_option("--host", s.host, "Address to listen on")->capture_default_str();
  add_int_option(app, "--port", s.port, "Port to listen on (0: any free port)", 0, 65535);
  add_int_option(app, "-c,--ctx-size", s.ctx_size, "Context per sequence (0: the model's max_position_embeddings)", 0,
                 kMaxContext);
  app.add_option("--parallel", o->parallel,
                 "Sequences running at once (also -np; default: " + std::to_string(kAutoParallelCpu) + " on the CPU, " +
                     std::to_string(kAutoParallelGpu) + " on a GPU, 1 with the dense KV layout)")
      ->check(int_range(1, kMaxSlots));
  add_pan_and_scan_option(app, s.pan_and_scan);
  app.add_option("--kv-layout", s.kv_layout,
                 "How the attention cache is kept. paged: one shared pool, and every running request is decoded "
                 "in one batch (the fast choice). dense: one cache per --parallel slot, the requests decoded one "
                 "after another (for comparison)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, KVLayout>{{"paged", KVLayout::paged},
                                                                          {"dense", KVLayout::dense}}))
      ->default_str("paged")
      ->option_text("paged|dense")
      ->group("Advanced");
  add_int_option(app, "--prefill-chunk", s.prefill_chunk,
                 "Prompt tokens the engine prefills per step, between decode steps (larger: faster admission of "
                 "many prompts, longer pauses for running replies)",
                 1, int64_t(1) << 20)
      ->group("Advanced");
  add_int_option(app, "--block-size", s.block_size, "Paged layout: rows per KV block", 1, 1024)->group("Advanced");
  add_int_option(app, "--kv-cache-mib", s.kv_cache_mib,
                 "Paged layout: the KV pool in MiB (0: every sequence's full context, on CUDA at most 90% of the "
                 "free memory)",
                 0, kMaxCacheMib)
      ->group("Advanced");
  add_spec_options(app, s.spec);
  app.add_option("--spec-max-batch", o->spec_max_batch,
                 "Speculative decoding: a step decoding more sequences than this drafts for none of them, their "
                 "rows batched as plain decoding's (0: no limit; default: " +
                     std::to_string(kAutoSpecBatchCpu) + " on the CPU, " + std::to_string(kAutoSpecBatchGpu) +
                     " on a GPU, no limit with the dense KV layout)")
      ->check(int_range(0, kMaxSpecBatch))
      ->group("Advanced");
  app.add_flag("--batch-invariant", s.batch_invariant,
               "Every row of a batch computed bit for bit as alone: a greedy request's tokens do not depend on "
               "what else runs (slower)")
      ->group("Advanced");
  app.add_option("--api-key", s.api_keys,
                 "Require Authorization: Bearer KEY on every route but /health (repeatable: any of the keys)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--api-key-file", o->api_key_file, "Accept the API keys of this file too (one a line; '#' comments)");
  app.add_flag("--cache-salt-by-key", s.cache_salt_by_key,
               "Keep each API key's prompt-cache entries apart: one key's clients cannot time another's prompts");
  app.add_option("--reasoning-format", o->reasoning_format,
                 "auto: a <think> block of a reasoning model's chat reply comes back as reasoning_content; none: "
                 "the raw text in content")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  app.add_option("--alias", s.alias, "The model's id in the API (default: the folder's name)");
  add_int_option(app, "--prompt-cache-mib", s.prompt_cache_mib, "Prompt cache budget in MiB (0: off)", 0, kMaxCacheMib)
      ->group("Advanced");
  app.add_option("--prompt-cache-dir", s.prompt_cache_dir,
                 "Keep cached prompts in this folder: written in the background (DIR/auto/) and restored at start, so "
                 "that the first requests after a restart reuse them; also where POST /slots/{id}?action=save|restore "
                 "keep their files (llama.cpp's --slot-save-path)")
      ->type_name("DIR");
  app.add_option("--prompt-cache-max-gib", o->prompt_cache_max_gib,
                 "Bound on --prompt-cache-dir's automatic files in GiB: past it the least recently used go (0: no bound)")
      ->check(CLI::Range(0.0, double(kMaxCacheMib)))
      ->type_name("GIB");
  add_int_option(app, "--max-queue", s.max_queue,
                 "Requests that may wait for a sequence slot; past them 429 with Retry-After", 0, kMaxQueue);
  add_int_option(app, "--max-body-mib", o->max_body_mib, "Largest request body in MiB (413 past it)", 1, kMaxBodyMib)
      ->group("Advanced");
  add_int_option(app, "--timeout", s.timeout_s,
                 "Seconds a request body may go without progress, and a response write may take", 1, kMaxTimeout);
  add_int_option(app, "--header-timeout", s.header_timeout_s,
                 "Seconds within which a request's line and headers must arrive", 1, kMaxTimeout)
      ->group("Advanced");
  add_int_option(app, "--keep-alive-timeout", s.idle_timeout_s, "Seconds an idle keep-alive connection stays open", 1,
                 kMaxTimeout)
      ->group("Advanced");
  add_int_option(app, "--keep-alive-max", s.max_requests_per_connection,
                 "Requests served on one connection before it closes", 1, 1 << 20)
      ->group("Advanced");
  add_int_option(app, "--shutdown-timeout", o->shutdown_timeout_s,
                 "Seconds SIGTERM lets running requests finish before ending them (a second signal ends them at once)",
                 0, kMaxTimeout);
  app.add_option("--cors-origin", s.cors_origin,
                 "Answer CORS preflights and allow this origin (\"*\": any) to call the API from a browser (default: off)");
  add_int_option(app, "--threads-http", s.n_http_threads, "Threads serving generation requests (0: 4 * parallel + 16)",
                 0, kMaxHttpThreads)
      ->group("Advanced");
  app.add_flag("--no-webui", o->no_webui, "Do not serve the chat page at /");
  app.add_option("--webui-dir", s.webui.dir, "Serve the chat page from this folder (its index.html) instead of the built-in one")
      ->group("Advanced");
  add_device_option(app, o->device);
  add_cache_type_options(app, o->cache_type_k, o->cache_type_v);
  add_threads_option(app, o->threads);
  return [o] { return run_serve(*o); };
}

}  // namespace osprey::cli
