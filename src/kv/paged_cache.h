#pragma once
// One forward pass of a batch over the paged pools (kv/paged_pools.h), seen by the model as a
// SequenceCache: layer l writes the pass's rows into the pool slots the engine reserved, and
// hands attention either the batch's block tables (a decode step: one row per sequence) or one
// sequence's rows gathered in order (a prefill chunk). Families run unchanged over it.
//
// The step's arrays are made by the engine before the forward pass; the view only reads
// them. It supports update_and_fetch alone: the pool, not the view, owns trimming, snapshots
// (the prefix cache) and the counters.
#include <cstdint>

#include "kv/kv_cache.h"
#include <vector>

#include "kv/paged_pools.h"

namespace osprey {

// What one group of layers (kv/paged_pools.h) reads and writes in a pass.
struct PagedGroupStep {
  // Pool slot of each row the pass writes (PagedPool::slots), i32 [n] on the pool's device;
  // a negative slot leaves its row unwritten (a padded batch entry).
  Array slots;
  // A decode step: i32 [n, max_blocks], each sequence's table in this group (a windowed
  // group's may hold -1 before the window: attention never reads there).
  Array block_tables;
  // A prefill chunk: the blocks holding rows [key_pos0, n_rows) (i32, on the device); key_pos0
  // is 0, or for a windowed group the first row of the block where the chunk's first query's
  // window starts.
  Array block_ids;
  int64_t key_pos0 = 0;
};

struct PagedStep {
  bool decode = true;  // a decode step: n sequences, one row each; else a prefill chunk of one
  Array seq_lens;      // a decode step: i32 [n], each sequence's length after the write
  int64_t split_keys = 0;  // the paged attention's keys per split (0: its default)
  // A prefill chunk of one sequence: its rows [pos0, pos0 + n) are written, and attention reads
  // rows [key_pos0, pos0 + n) of its group.
  int64_t pos0 = 0;
  int64_t n_rows = 0;  // pos0 + n
  std::vector<PagedGroupStep> groups;  // one per group of the pools
};

// Every layer's view of `pools` for the pass `step` describes. Both must outlive the cache, and
// `step` may be refilled between passes (a decode step replayed from a graph reads the same
// arrays).
SequenceCache make_paged_step_cache(PagedPools& pools, const PagedStep& step);

}  // namespace osprey
