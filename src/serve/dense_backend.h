#pragma once
// The batch-1 backend of the scheduler: -np slots, each one dense sequence cache and one
// decoder; a step decodes its sequences one after another. Sequences start from the prompt
// cache's longest common prefix (one copying write restores it) and store their cache in it
// when they end.
//
// On CUDA a slot chooses the tokens of greedy and sampled inputs on the device (the sampler's
// one-row kernel; only the token id is read back) and, when the scheduler will feed a token to
// the next step (DecodeInput::more), enqueues that step before the host reads the token
// (docs/design.md, "Pipelined decode"): the step ahead is the next decode() of the sequence,
// or, when the sequence ends instead, its row is given back by end().
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "serve/cache_files.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "model/model.h"

namespace osprey {

class DecodeStepper;

struct DenseBackendOptions {
  int n_slots = 1;
  int64_t context_size = 0;  // 0: the model's max_position_embeddings
  KVCacheParams cache;       // step and inplace (OSPREY_KV_STEP, OSPREY_KV_INPLACE_WRITE)
  bool graphs = true;        // CUDA graph replay of decode steps (OSPREY_CUDA_GRAPHS)
  bool pipelined = true;     // CUDA: steps enqueued one ahead of the host (OSPREY_FORCE_SYNC=1: off)
  // How a slot's cache is made; empty: model.make_cache(cache). A test seam (caches whose
  // guard is disabled, to prove the snapshot checks bite).
  std::function<SequenceCache()> make_cache;
  // One slot over the caller's cache (n_slots must be 1), which may already hold a prefix: a
  // prompt continues at its offset, the context counts from there, the prompt cache is not
  // used, and end() leaves the cache holding the sequence's rows (generate()).
  SequenceCache* caller_cache = nullptr;
};

// What a backend's slots did, summed (generate()'s stats).
struct DenseBackendCounters {
  uint64_t n_device_chosen = 0;  // tokens chosen on the device
  uint64_t n_host_chosen = 0;    // decode outputs returned as logits
  uint64_t n_ahead = 0;          // steps enqueued ahead of the host
  uint64_t n_graph_replays = 0, n_graph_captures = 0;
  uint64_t n_verify_steps = 0, n_verify_rows = 0;  // speculative verify steps and their rows
};

// With a prompt store attached (CacheFiles::attach_store), each entry a sequence stores in the
// prompt cache is handed to the store to be written in the background (dense files: one per
// entry), an entry a longer one replaces has its file removed, and a hit refreshes its file's
// recency.
class DenseSlotBackend final : public SequenceBackend, public CacheFiles {
 public:
  // `model` and `prompt_cache` must outlive the backend. Throws InvalidInput for a slot count
  // below 1 or a context past the model's.
  DenseSlotBackend(Model& model, PromptCache& prompt_cache, const DenseBackendOptions& options);
  ~DenseSlotBackend() override;

  int max_running() const override { return int(slots_.size()); }
  int64_t context_size() const override { return context_; }
  std::optional<Begun> begin(std::span<const int32_t> prompt, const std::string& cache_salt) override;
  void set_images(int handle, std::vector<ImageSpan> images) override;
  void prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) override;
  int32_t prefill_and_choose(int handle, std::span<const int32_t> tokens, const DecodeInput& choice,
                             std::vector<float>& logits) override;
  void decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs, const MaskFn& masks) override;
  // Speculative decoding: a slot whose cache gives rows back (dense layers only: a model with
  // sliding-window layers has none). verify() runs the rows in batch-invariant mode, their
  // K/V rows in place; rewind() gives back rows of that write.
  bool can_verify(int handle) const override;
  void verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) override;
  void rewind(int handle, int64_t n) override;
  void end(int handle, std::span<const int32_t> tokens) override;
  double kv_usage() const override;
  KVCounters kv_counters() const override;
  DenseBackendCounters counters() const;

  // CacheFiles
  int64_t attach_store(PromptStore& store) override;
  int n_slot_ids() const override { return int(slots_.size()); }
  std::optional<PromptFileData> slot_file(int slot) override;
  int64_t restore_slot(int slot, const PromptFileData& data) override;
  int64_t erase_slot(int slot) override;

 private:
  struct Slot;
  Slot& slot(int handle);
  void reset(Slot& s);
  SequenceCache new_cache() const;
  std::unique_ptr<DecodeStepper> new_stepper(SequenceCache& cache) const;
  // Whether the slot chooses `in`'s token on the device.
  bool device_chooses(const DecodeInput& in) const;
  // Chooses the next token from `logits` (on the device) into the stepper's input token and
  // enqueues its readback; `counter` is the draw's.
  void choose_on_device(Slot& s, const Array& logits, const DecodeInput& in, uint64_t counter);
  // After a token was chosen on the device for `in`: enqueues the step it feeds when the
  // sequence goes on (in.more), then reads the chosen token back. Throws InvalidInput for
  // non-finite logits.
  int32_t finish_choice(Slot& s, const DecodeInput& in);
  // Waits for the readbacks still pending and gives back the row of a step enqueued ahead.
  void drop_ahead(Slot& s);
  void check_room(const Slot& s, int64_t n) const;

  Model& model_;
  PromptCache& prompt_cache_;
  DenseBackendOptions options_;
  int64_t context_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  KVCounters retired_;  // counters of the caches slots have dropped
  DenseBackendCounters counters_;
  PromptStore* store_ = nullptr;        // attach_store's
  std::vector<KVCacheParams> layers_;   // the model's KV layout, with a store
  // What each slot's last finished sequence left in the prompt cache: its tokens and salt.
  std::vector<std::pair<std::vector<int32_t>, std::string>> last_;
  // Stores a file's or a sequence's states in the prompt cache, and has the store write
  // (`persist`) or forget the files that follows from.
  PromptCache::Stored store_entry(std::vector<int32_t> tokens, std::vector<KVState> states, const std::string& salt,
                                  bool persist);
};

}  // namespace osprey
