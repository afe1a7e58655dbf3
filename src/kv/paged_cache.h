#pragma once
// One forward pass of a batch over the paged pool (kv/paged_pool.h), seen by the model as a
// SequenceCache: layer l writes the pass's rows into the pool slots the engine reserved, and
// hands attention either the batch's block tables (a decode step: one row per sequence) or one
// sequence's rows gathered in order (a prefill chunk). Families run unchanged over it.
//
// The step's arrays are made by the engine before the forward pass; the view only reads
// them. It supports update_and_fetch alone: the pool, not the view, owns trimming, snapshots
// (the prefix cache) and the counters.
#include <cstdint>

#include "kv/kv_cache.h"
#include "kv/paged_pool.h"

namespace osprey {

struct PagedStep {
  // Pool slot of each row the pass writes (PagedPool::slots), i32 [n] on the pool's device;
  // a negative slot leaves its row unwritten (a padded batch entry).
  Array slots;
  // A decode step: n sequences, one row each.
  bool decode = true;
  Array block_tables;  // i32 [n, max_blocks]
  Array seq_lens;      // i32 [n]: each sequence's length after the write
  int64_t split_keys = 0;  // the paged attention's keys per split (0: its default)
  // A prefill chunk of one sequence: its rows [pos0, pos0 + n) are written, and attention
  // reads rows [0, pos0 + n) gathered from block_ids (i32, on the device).
  Array block_ids;
  int64_t pos0 = 0;
  int64_t n_rows = 0;  // pos0 + n
};

// Every layer's view of `pool` for the pass `step` describes. Both must outlive the cache, and
// `step` may be refilled between passes (a decode step replayed from a graph reads the same
// arrays).
SequenceCache make_paged_step_cache(PagedPool& pool, const PagedStep& step);

}  // namespace osprey
