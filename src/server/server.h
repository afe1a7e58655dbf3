#pragma once
// `osprey serve`: an OpenAI-compatible HTTP server (see docs/server.md for every route, field
// and metric). HTTP threads parse, validate and tokenize; one engine thread (engine/
// scheduler.h) owns the model and its caches.
//
// Lifecycle: bind() -> start() (GET /health answers 503) -> load() (200 from then on) ->
// stop(). Every method is thread-safe; stop() may come from a signal-watching thread.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/model.h"
#include "serve/prompt_cache.h"

namespace osprey {

// Where running sequences keep their K/V rows.
enum class KVLayout {
  paged,  // one paged pool; decode steps batch every running sequence (serve/paged_backend.h)
  dense,  // one dense cache per slot, decoded in turn; the prompt cache keeps whole snapshots
};

struct ServerOptions {
  std::filesystem::path model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (bind() returns it)
  std::string api_key;                // "" : no authentication
  std::string alias;                  // the model's id in the API ("" : the folder's name)
  int n_slots = 1;                    // -np: sequences running at once
  int64_t ctx_size = 0;               // per sequence; 0: the model's max_position_embeddings
  uint64_t prompt_cache_mib = 1024;   // 0 disables the prompt cache (paged: the prefix cache)
  int max_queue = 64;                 // waiting requests past this get 429
  size_t max_body_bytes = 8u << 20;   // larger request bodies get 413
  int n_http_threads = 0;             // 0: 4 * n_slots + 16
  int timeout_s = 30;                 // socket read and write timeout
  int64_t prefill_chunk = 512;
  KVLayout kv_layout = KVLayout::paged;
  int64_t block_size = 16;            // paged: rows per block
  int64_t kv_cache_mib = 0;           // paged: the pool's size; 0: see PagedBackendOptions
  bool batch_invariant = false;       // ops::set_batch_invariant for the server's lifetime
  Device device = Device::cpu();
  KVCacheParams cache;
  std::function<SequenceCache()> make_cache;  // tests: see DenseBackendOptions
  bool graphs = true;
  std::string system_fingerprint = "osprey";
  // Chat replies of models whose template writes <think> blocks: true returns the block as
  // reasoning_content; false (--reasoning-format none) leaves the raw text in content.
  bool split_reasoning = true;
  bool keep_prompt_cache_checksums = false;  // tests: see PromptCache
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // stop()s

  // Binds host:port and returns the port. Throws IoError when it cannot.
  int bind();
  // Serves on a background thread; until load() every route but /health answers 503.
  void start();
  // Loads the tokenizer and model and starts the engine. Throws like load_model().
  void load();
  // Ends every waiting and running request with an error, closes the listener and joins the
  // threads. Idempotent.
  void stop();
  // Blocks until stop() has finished.
  void wait();

  // The /metrics text.
  std::string metrics_text() const;
  // Every stored prompt-cache entry's checksums (tests; needs keep_prompt_cache_checksums).
  // Runs on the engine thread.
  std::vector<PromptCache::Checksum> prompt_cache_checksums();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
