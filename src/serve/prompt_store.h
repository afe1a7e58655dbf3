#pragma once
// The prompt-cache folder of `osprey serve --prompt-cache-dir DIR` (docs/design.md, "The
// persistent prompt cache"): the cached prefixes a backend stores are written to DIR/auto/ in
// the background and read back when a server starts on the folder; the slot routes save and
// restore files of their own names in DIR itself.
//
// Writes go through one writer thread and a queue bounded in bytes: the engine thread only
// hands over CPU copies of the rows (serve/prompt_file.h's PromptFileData) and never waits for
// the disk; a write that does not fit the queue is dropped and counted. Each file is written
// atomically (serve/prompt_file.h). DIR/auto/ is bounded by max_bytes: past it the least
// recently used files go, recency being the file's mtime, which a write sets and a use of the
// file's prefix (a hit on it, a paged run written after it) refreshes. A paged file continues
// its parent run's file: removing a file removes the files that continue it.
//
// A file that cannot be used (another model, corrupted, truncated, not a file, unreadable) is
// skipped with a warning naming it and why, and counted; an unusable folder leaves the server
// running without persistence. One server per folder: a second one finds it locked and runs
// without it.
//
// Thread-safe.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve/prompt_file.h"
#include "serve/serve_stats.h"

namespace osprey {

struct PromptStoreOptions {
  std::filesystem::path dir;  // --prompt-cache-dir
  PromptFileKind kind = PromptFileKind::dense;
  uint64_t max_bytes = 0;                    // --prompt-cache-max-gib: DIR/auto/'s bound; 0: none
  uint64_t queue_bytes = uint64_t(1) << 30;  // rows waiting for the writer, at most
  CacheFingerprint fingerprint;              // the model's, with the kv field of `kind`
  std::vector<KVCacheParams> layers;         // the model's KV layout
  int64_t block_size = 0;                    // paged files: the pool's block size
  PromptFileWriteFn write;                   // how bytes reach a file (a test seam); empty: ::write
};

class PromptStore {
 public:
  // Opens DIR (creating DIR and DIR/auto/ when missing), locks it and lists DIR/auto/ (removing
  // temporary files a killed writer left). A folder that cannot be used is logged and leaves
  // the store disabled: nothing is written or read.
  explicit PromptStore(PromptStoreOptions options);
  ~PromptStore();  // close(30 s)
  PromptStore(const PromptStore&) = delete;
  PromptStore& operator=(const PromptStore&) = delete;

  bool enabled() const { return enabled_; }
  const PromptStoreOptions& options() const { return options_; }

  // The files of DIR/auto/ of this store's kind whose header and fingerprint are sound, most
  // recently used first; the others are logged and counted as skipped.
  std::vector<PromptFileInfo> usable_files();
  // A file's rows, or nullopt after a warning naming the file and why it cannot be used.
  std::optional<PromptFileData> read(const std::filesystem::path& path);
  // A file (of usable_files) went into the cache with `n_tokens` tokens.
  void note_restored(int64_t n_tokens);

  // The name in DIR/auto/ of a prefix: "<kind>-<prompt_prefix_id>.oskv".
  std::string auto_name(uint64_t prefix_id) const;
  // Queues `data` (CPU rows, see PromptFileData) for DIR/auto/, named for its prefix (dense: all
  // of its tokens; paged: up to its last block). Never waits for the disk; false when dropped.
  bool write(PromptFileData data);
  // Queues the removal of the dense file of this prefix (an entry a longer one replaced).
  void remove(uint64_t prefix_id);
  // Queues a use of the prefix: the file named for it, or holding a paged block that ends
  // there, and the files it continues, become the most recently used.
  void touch(uint64_t prefix_id);
  // Waits until every queued operation is done (tests, the slot routes' ordering).
  void flush();
  // Waits up to `timeout` for the queue to drain, then abandons what is left (a file being
  // written is removed, never left half-written) and stops the writer. Idempotent.
  void close(std::chrono::milliseconds timeout);

  // The slot routes' files, on the caller's thread. The path of `filename` in DIR: throws
  // InvalidInput unless it is a plain file name (no '/', not "." or "..", no leading '.', no
  // control characters, at most 255 bytes).
  std::filesystem::path user_path(const std::string& filename) const;
  // Writes `data` there atomically; returns the bytes written. Throws IoError (a full disk, ...).
  uint64_t save(const std::string& filename, const PromptFileData& data);
  // Reads it; throws InvalidInput or IoError naming the file and why.
  PromptFileData load(const std::string& filename);

  PromptStoreStats stats() const;

 private:
  struct Op;
  struct FileEntry {
    uint64_t bytes = 0;
    int64_t mtime_ns = 0;
    bool linked = false;  // a paged file whose header was read: parent and block ends known
    uint64_t parent = 0;
    std::vector<uint64_t> block_ends;
  };
  void run();
  void do_write(Op& op);
  void do_touch(uint64_t id);
  void erase_file(const std::string& name, uint64_t& n_removed);  // and the files continuing it
  // Sets the file's mtime to now, in nanoseconds and later than any this store set before (a
  // filesystem's own clock may tick in milliseconds); returns it, or -1 when it cannot.
  int64_t mark_used(const std::filesystem::path& path);
  void add_entry(const std::string& name, FileEntry e);
  void drop_entry(const std::string& name);
  void evict_past_bound(const std::string& keep);
  std::filesystem::path auto_dir() const { return options_.dir / "auto"; }

  PromptStoreOptions options_;
  bool enabled_ = false;
  int lock_fd_ = -1;
  // The writer's index of DIR/auto/ (guarded by mu_).
  std::map<std::string, FileEntry> files_;
  std::unordered_map<uint64_t, std::string> by_block_end_;  // paged: a block end id -> its file
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Op>> queue_;  // guarded by mu_
  uint64_t queued_bytes_ = 0;              // guarded by mu_
  bool busy_ = false;                      // the writer is running an op (guarded by mu_)
  bool stopping_ = false;                  // guarded by mu_
  bool abandon_ = false;                   // guarded by mu_: close() timed out
  PromptStoreStats stats_;                 // guarded by mu_
  int64_t last_use_ns_ = 0;                // mark_used's last (the writer thread's)
  std::thread writer_;
};

}  // namespace osprey
