#pragma once
// What a backend does with prompt-cache files (docs/design.md, "The persistent prompt cache"):
// it restores a folder's files when the server starts, and serves the slot routes
// (POST /slots/{id}?action=save|restore|erase, docs/server.md). Both backends implement it; the
// dense one over its prompt cache's entries, the paged one over its pool's prefix cache.
//
// A slot id names where a sequence ran: the dense layout's slot, or the paged layout's sequence
// slot (the n-th of the -np sequences that may run at once). The slot's "cache" is what its last
// finished sequence left in the shared prompt cache: Osprey keeps no cache per slot between
// requests, so a restore makes the file's prefix available to every slot, and is remembered as
// that slot's.
//
// Called on the engine thread only (the server runs them through Scheduler::run_job).
#include <cstdint>
#include <optional>

#include "serve/prompt_file.h"

namespace osprey {

class PromptStore;

class CacheFiles {
 public:
  virtual ~CacheFiles() = default;

  // Restores the files of `store`'s folder (PromptStore::usable_files) into the cache while it
  // has room, and from then on hands the prefixes it caches to `store` to be written (it must
  // outlive the backend). Returns the number of files restored.
  virtual int64_t attach_store(PromptStore& store) = 0;

  // Slot ids are [0, n_slot_ids()).
  virtual int n_slot_ids() const = 0;
  // The rows the slot's last finished sequence left in the cache, as a file's data (CPU rows);
  // nullopt when the cache holds none of them (no sequence ended there, or they were evicted).
  virtual std::optional<PromptFileData> slot_file(int slot) = 0;
  // Puts a file's rows into the cache, as the slot's last sequence; returns the tokens now
  // cached from it (0 when the cache has no room). Throws InvalidInput for a file of the other
  // layout's kind, or whose tokens are not the model's.
  virtual int64_t restore_slot(int slot, const PromptFileData& data) = 0;
  // Takes the slot's last sequence's rows out of the cache (and the file the store keeps of
  // them); returns the tokens taken out.
  virtual int64_t erase_slot(int slot) = 0;
};

}  // namespace osprey
