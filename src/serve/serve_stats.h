#pragma once
// What the serving layer reports, in one type: /metrics renders it, the batched bench and the
// CLI read their parts of it. Each part is filled by the component that owns it.
#include <cstdint>
#include <optional>

#include "kv/paged_pool.h"
#include "serve/scheduler.h"

namespace osprey {

// The prompt cache of either layout. Dense: entries are snapshots of whole sequences
// (PromptCache). Paged: the pool's prefix cache, whose entries are full blocks
// (PagedBackend::prefix_stats).
struct PromptCacheStats {
  uint64_t n_hits = 0;             // lookups (admissions) that found a common prefix and used it
  uint64_t n_misses = 0;
  uint64_t n_unusable = 0;         // dense: lookups whose match the cache could not rewind to
  uint64_t n_restored_tokens = 0;  // prompt tokens reused by hits
  uint64_t n_stored = 0;           // entries stored (paged: blocks handed to the prefix cache)
  uint64_t n_evictions = 0;
  uint64_t n_entries = 0;          // held now (paged: blocks the prefix cache alone holds)
  uint64_t bytes = 0;              // held by entries (dense: a buffer two entries share counts twice)
  uint64_t budget_bytes = 0;       // dense: the cache's budget; paged: the whole pool
};

// The prompt cache's folder (--prompt-cache-dir; serve/prompt_store.h).
struct PromptStoreStats {
  uint64_t n_written = 0;          // files written by the writer thread
  uint64_t bytes_written = 0;
  uint64_t n_write_failures = 0;   // writes that failed (a full disk, an unwritable folder)
  uint64_t n_dropped = 0;          // writes dropped: the queue was full, or a file past max_bytes
  uint64_t n_evicted = 0;          // files removed by the size bound (with the files continuing them)
  uint64_t n_restored = 0;         // files restored into the cache
  uint64_t n_restored_tokens = 0;  // tokens whose rows they brought
  uint64_t n_skipped = 0;          // files skipped: unusable (each logged with its reason)
  uint64_t n_files = 0;            // files in DIR/auto/ now
  uint64_t bytes = 0;              // and their size
};

struct ServeStats {
  SchedulerStats scheduler;
  PromptCacheStats prompt_cache;
  std::optional<PagedPoolStats> pool;  // the paged layout only
  std::optional<PromptStoreStats> prompt_store;  // with --prompt-cache-dir only
};

}  // namespace osprey
