#pragma once
// `osprey serve`: an OpenAI-compatible HTTP server (see docs/server.md for every route, field
// and metric). HTTP threads parse, validate and tokenize; one engine thread (engine/
// scheduler.h) owns the model and its caches.
//
// Lifecycle: bind() -> start() (GET /health answers 503) -> load() (200 from then on) ->
// stop(). Every method is thread-safe; stop() may come from a signal-watching thread.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "core/device.h"
#include "model/model.h"
#include "serve/prompt_cache.h"
#include "serve/speculative.h"
#include "server/webui.h"

namespace osprey {

// Where running sequences keep their K/V rows.
enum class KVLayout {
  paged,  // one paged pool; decode steps batch every running sequence (serve/paged_backend.h)
  dense,  // one dense cache per slot, decoded in turn; the prompt cache keeps whole snapshots
};

struct ServerOptions {
  std::filesystem::path model_dir;
  // --pan-and-scan / --no-pan-and-scan: images also cut into pan-and-scan crops (unset: the
  // model's preprocessor_config.json); a request's image_url `detail` "high" or "low" decides
  // for its image. Refused at load for a model without a vision tower.
  std::optional<bool> pan_and_scan;
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (bind() returns it)
  std::vector<std::string> api_keys;  // any one is accepted; none: no authentication
  // Each API key's requests keep prompt-cache entries of their own (see cache_salt in
  // docs/server.md): one key's clients cannot time another's cached prefixes.
  bool cache_salt_by_key = false;
  std::string alias;                  // the model's id in the API ("" : the folder's name)
  int n_slots = 1;                    // -np: sequences running at once
  int64_t ctx_size = 0;               // per sequence; 0: the model's max_position_embeddings
  uint64_t prompt_cache_mib = 1024;   // 0 disables the prompt cache (paged: the prefix cache)
  int max_queue = 64;                 // waiting requests past this get 429
  // /v1/responses' store of finished responses (server/response_store.h): past either bound
  // the oldest are evicted.
  size_t response_store_entries = 1000;
  size_t response_store_bytes = 64u << 20;
  size_t max_body_bytes = 8u << 20;   // larger request bodies get 413
  int n_http_threads = 0;             // generation threads; 0: 4 * n_slots + 16
  int timeout_s = 30;                 // a body's progress and a write's deadline
  int header_timeout_s = 10;          // the request line and headers must arrive within this
  int idle_timeout_s = 5;             // an idle keep-alive connection is closed after this
  int max_requests_per_connection = 1000;
  std::string cors_origin;            // "" : no CORS; "*" or one origin
  int64_t prefill_chunk = 512;
  KVLayout kv_layout = KVLayout::paged;
  int64_t block_size = 16;            // paged: rows per block
  int64_t kv_cache_mib = 0;           // paged: the pool's size; 0: see PagedBackendOptions
  bool batch_invariant = false;       // ops::set_batch_invariant for the server's lifetime
  // Speculative decoding for every request (--spec-ngram, or --model-draft: spec.model_draft is
  // then the draft's folder, loaded on `device` and refused unless its tokenizer is the
  // target's), with either layout; sequences with a grammar or with logprobs, and with the
  // dense layout those of a model with sliding-window layers, decode without drafts.
  SpeculativeParams spec;
  Device device = Device::cpu();
  KVCacheParams cache;
  std::function<SequenceCache()> make_cache;  // tests: see DenseBackendOptions
  bool graphs = true;
  std::string system_fingerprint = "osprey";
  // Chat replies of models whose template writes <think> blocks: true returns the block as
  // reasoning_content; false (--reasoning-format none) leaves the raw text in content.
  bool split_reasoning = true;
  bool keep_prompt_cache_checksums = false;  // tests: see PromptCache
  // --prompt-cache-dir: cached prompts are written to DIR/auto/ in the background and restored
  // from it at load; the slot routes save and restore files in DIR (serve/prompt_store.h).
  // Empty: nothing is kept on disk, and the slot routes answer 501.
  std::filesystem::path prompt_cache_dir;
  uint64_t prompt_cache_max_bytes = 0;       // --prompt-cache-max-gib: DIR/auto/'s bound; 0: none
  std::function<ssize_t(int fd, const void* data, size_t n)> prompt_cache_write;  // tests: a full disk
  WebUiOptions webui;                 // the chat page at GET / (server/webui.h)
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
  // Stops accepting connections and waits up to timeout_ms for the requests in progress to
  // end (a graceful shutdown's first half; stop() is the second).
  void drain(int timeout_ms);
  // Ends every waiting and running request with an error (code shutting_down), closes the
  // listener and every connection and joins the threads. Idempotent.
  void stop();
  // Blocks until stop() has finished, or the device has failed (device_lost()).
  void wait();
  // The DeviceLost error that stopped the engine ("" while the device works): /health then
  // answers 503 (code device_lost), and the process should stop() and exit non-zero so that
  // its supervisor restarts it.
  std::string device_lost() const;

  // The /metrics text.
  std::string metrics_text() const;
  // Every stored prompt-cache entry's checksums (tests; needs keep_prompt_cache_checksums).
  // Runs on the engine thread.
  std::vector<PromptCache::Checksum> prompt_cache_checksums();
  // Waits until the prompt cache folder's writer has written what it was handed (tests).
  void flush_prompt_cache_dir();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
