#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <pthread.h>
#include <thread>

#include "backend/device_select.h"
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

struct ServeOptions {
  ServerOptions server;
  std::string model;
  bool download = false;
  std::string device;
  int threads = -1;
  int64_t max_body_mib = 8;
};

int run_serve(ServeOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  ServerOptions& so = o.server;
  so.model_dir = model_folder(o.model, o.download);
  if (so.alias.empty() && !o.model.empty() && !fs::exists(o.model)) so.alias = o.model;  // a Hub id names itself
  if (!fs::exists(so.model_dir)) throw IoError("model folder " + so.model_dir.string() + " does not exist");
  so.device = select_device(o.device.empty() ? env_options().device : o.device);
  const EnvOptions& env = env_options();
  so.cache.step = env.kv_step;
  so.cache.inplace = env.kv_inplace_write;
  so.graphs = env.cuda_graphs;
  so.max_body_bytes = size_t(o.max_body_mib) << 20;
  so.system_fingerprint = std::string("osprey-") + OSPREY_VERSION + "-" + OSPREY_GIT_COMMIT;

  // SIGINT and SIGTERM are taken by one thread with sigwait(); every other thread, started
  // after this, inherits the mask.
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
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log_info(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    server.stop();
  });
  try {
    server.load();
  } catch (...) {
    pthread_kill(watcher.native_handle(), SIGTERM);
    watcher.join();
    throw;
  }
  server.wait();
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
  app.add_option("--port", s.port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  app.add_option("-c,--ctx-size", s.ctx_size, "Context per sequence (0: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--parallel", s.n_slots, "Sequences running at once (also -np)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kv-layout", s.kv_layout,
                 "How the attention cache is kept. paged: one shared pool, and every running request is decoded "
                 "in one batch (the fast choice). dense: one cache per --parallel slot, the requests decoded one "
                 "after another (for comparison)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, KVLayout>{{"paged", KVLayout::paged},
                                                                          {"dense", KVLayout::dense}}))
      ->default_str("paged")
      ->option_text("paged|dense")
      ->group("Advanced");
  app.add_option("--prefill-chunk", s.prefill_chunk,
                 "Prompt tokens the engine prefills per step, between decode steps (larger: faster admission of "
                 "many prompts, longer pauses for running replies)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str()
      ->group("Advanced");
  app.add_option("--block-size", s.block_size, "Paged layout: rows per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str()
      ->group("Advanced");
  app.add_option("--kv-cache-mib", s.kv_cache_mib,
                 "Paged layout: the KV pool in MiB (0: every sequence's full context, on CUDA at most 90% of the free "
                 "memory)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Advanced");
  app.add_flag("--batch-invariant", s.batch_invariant,
               "Every row of a batch computed bit for bit as alone: a greedy request's tokens do not depend on "
               "what else runs (slower)")
      ->group("Advanced");
  app.add_option("--api-key", s.api_key, "Require Authorization: Bearer KEY on every route but /health");
  app.add_option("--alias", s.alias, "The model's id in the API (default: the folder's name)");
  app.add_option("--prompt-cache-mib", s.prompt_cache_mib, "Prompt cache budget in MiB (0: off)")
      ->capture_default_str()
      ->group("Advanced");
  app.add_option("--max-queue", s.max_queue, "Waiting requests past this get 429")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-body-mib", o->max_body_mib, "Largest request body in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Advanced");
  app.add_option("--timeout", s.timeout_s, "Socket read and write timeout in seconds")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads-http", s.n_http_threads, "HTTP worker threads (0: 4 * parallel + 16)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Advanced");
  add_device_option(app, o->device);
  add_threads_option(app, o->threads);
  return [o] { return run_serve(*o); };
}

}  // namespace osprey::cli
