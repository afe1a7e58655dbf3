#pragma once
// The batch-1 backend of the scheduler: -np slots, each one dense sequence cache and one
// decoder; a step decodes its sequences one after another. Sequences start from the prompt
// cache's longest common prefix (one copying write restores it) and store their cache in it
// when they end.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "serve/scheduler.h"
#include "model/model.h"

namespace osprey {

class PromptCache;
class DecodeStepper;

struct DenseBackendOptions {
  int n_slots = 1;
  int64_t context_size = 0;  // 0: the model's max_position_embeddings
  KVCacheParams cache;       // step and inplace (OSPREY_KV_STEP, OSPREY_KV_INPLACE_WRITE)
  bool graphs = true;        // CUDA graph replay of decode steps (OSPREY_CUDA_GRAPHS)
  // How a slot's cache is made; empty: model.make_cache(cache). A test seam (caches whose
  // guard is disabled, to prove the snapshot checks bite).
  std::function<SequenceCache()> make_cache;
};

class DenseSlotBackend final : public SequenceBackend {
 public:
  // `model` and `prompt_cache` must outlive the backend. Throws InvalidInput for a slot count
  // below 1 or a context past the model's.
  DenseSlotBackend(Model& model, PromptCache& prompt_cache, const DenseBackendOptions& options);
  ~DenseSlotBackend() override;

  int max_running() const override { return int(slots_.size()); }
  int64_t context_size() const override { return context_; }
  std::optional<Begun> begin(std::span<const int32_t> prompt, const std::string& cache_salt) override;
  void prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) override;
  void decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs, const MaskFn& masks) override;
  void end(int handle, std::span<const int32_t> tokens) override;
  double kv_usage() const override;
  KVCounters kv_counters() const override;

 private:
  struct Slot;
  Slot& slot(int handle);
  void reset(Slot& s);
  SequenceCache new_cache() const;
  std::unique_ptr<DecodeStepper> new_stepper(SequenceCache& cache) const;

  Model& model_;
  PromptCache& prompt_cache_;
  DenseBackendOptions options_;
  int64_t context_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  KVCounters retired_;  // counters of the caches slots have dropped
};

}  // namespace osprey
