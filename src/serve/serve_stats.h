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

struct ServeStats {
  SchedulerStats scheduler;
  PromptCacheStats prompt_cache;
  std::optional<PagedPoolStats> pool;  // the paged layout only
};

}  // namespace osprey
