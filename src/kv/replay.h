#pragma once
// What a decode step replayed from a captured graph needs from the caches (docs/design.md,
// "Graph capture and replay"). A cache type that supports replay implements ReplayableCache
// and returns it from KVCache::replayable(); the decode loop sees the caches only through
// SequenceReplay.
#include <cstdint>
#include <utility>
#include <vector>

namespace osprey {

class SequenceCache;

class ReplayableCache {
 public:
  virtual ~ReplayableCache() = default;
  // The device buffers a replayed step writes into (keys, values); a graph stays valid while
  // these stay the same.
  virtual std::pair<const void*, const void*> buffers() const = 0;
  // Whether the next write of n_rows rows would go in place without growing the buffers.
  virtual bool next_write_in_place(int64_t n_rows) const = 0;
  // The bookkeeping of one in-place single-row write whose device work a replayed graph did
  // (exactly what update_and_fetch does on that path, minus the kernel). Requires
  // next_write_in_place(1).
  virtual void commit_replayed_write() = 0;
};

// Every layer's replay hooks of one sequence. Holds pointers into `cache`, whose layers must
// outlive it. When some layer has no hooks, next_write_in_place() is always false.
class SequenceReplay {
 public:
  explicit SequenceReplay(SequenceCache& cache);

  // Whether every layer's next single-row write goes in place without growth.
  bool next_write_in_place() const;
  void commit_replayed_write();
  // Every layer's buffers, in order (a replayed graph's key).
  std::vector<const void*> buffers() const;
  // Whether buffers() equals `key` (no allocation: checked every decode step).
  bool has_buffers(const std::vector<const void*>& key) const;

 private:
  std::vector<ReplayableCache*> layers_;
  bool complete_ = false;  // every layer has hooks
};

}  // namespace osprey
