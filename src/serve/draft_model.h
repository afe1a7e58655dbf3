#pragma once
// Speculative decoding's draft model (docs/design.md, "Speculative decoding"): a smaller model of
// the target's tokenizer proposes the next tokens of a sequence, which the target verifies in
// one multi-row step (Scheduler::speculative_steps).
//
// Each sequence has a draft cache of its own that follows the sequence's accepted tokens: a
// draft begins by giving back the rows past the longest common prefix of what the cache holds
// and the sequence's tokens (rejected drafts; KVCache::rewind_own_write, never a copy), feeds
// the tokens it misses (the prompt on the first draft, then the accepted tokens and the
// target's own) in one multi-row write in place, and then drafts one token per one-row step.
// The draft cache takes no snapshot, so rows of its own writes may always be given back and the
// guard stays armed: its next write goes in place at the new length.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "sample/sampler.h"
#include "serve/speculative.h"

namespace osprey {

class Model;
class Tokenizer;
struct LoadOptions;

struct DraftModelOptions {
  KVCacheParams cache;  // step and inplace of the draft caches (the target's)
  bool graphs = true;   // CUDA graph replay of the draft's one-row steps
  float p_min = 0.75f;  // SpeculativeParams::draft_p_min
  // Ids the target's vocabulary holds (its logits' width): the draft's logits are read over
  // the ids both vocabularies hold, so that no draft is an id the target cannot score.
  int64_t target_vocab = 0;
};

// What a draft proposes: its tokens, and for a sampled request the distribution each one was
// drawn from (the draft's logits through the request's sampler chain), which the acceptance
// rule needs; empty for a greedy request (each token is the draft's argmax: a point mass).
struct DraftProposal {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> q;
};

// Used on the engine thread only.
class ModelDrafter {
 public:
  // `draft` must outlive the drafter. Throws InvalidInput naming --model-draft for a draft
  // whose caches cannot give rows back (sliding-window layers) or that has no language head.
  ModelDrafter(Model& draft, const DraftModelOptions& options);
  ~ModelDrafter();

  // A handle for a new sequence, with an empty draft cache.
  int begin();
  // Drops the sequence's draft cache.
  void end(int handle);

  // Up to max_tokens tokens to follow `tokens` (the sequence: prompt and reply so far). Greedy
  // (sampler.temperature <= 0): each the draft's choice under the request's chain (its argmax
  // after any penalties); sampled: each drawn from the draft's distribution under that chain
  // with noise counter `counter + i` (counter: the reply's index of the first drafted token)
  // of a stream of its own (draft_noise_seed). Stops early where the draft's most likely token
  // has probability below p_min (greedy: softmax of its logits; sampled: the chain's
  // distribution), or where the draft's context ends. Throws InvalidInput for non-finite draft
  // logits.
  DraftProposal draft(int handle, std::span<const int32_t> tokens, int max_tokens, const SamplerParams& sampler,
                      uint64_t counter);

  // Rows the draft model computed (one-row steps and rows fed to catch up), for the stats.
  uint64_t n_draft_steps() const { return n_steps_; }
  uint64_t n_rows_fed() const { return n_fed_; }
  KVCounters kv_counters() const;

 private:
  struct Slot;
  Slot& slot(int handle);

  Model& model_;
  DraftModelOptions options_;
  int64_t vocab_ = 0;    // ids read from the draft's logits
  int64_t context_ = 0;  // the draft's max_position_embeddings (0: unbounded)
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t n_steps_ = 0, n_fed_ = 0;
};

// The noise seeds of a sampled request's draft draws and of its acceptance tests: streams of
// their own, apart from the seed whose stream the request's plain draws use.
uint64_t draft_noise_seed(uint64_t seed);
uint64_t verify_noise_seed(uint64_t seed);

// Whether `draft` may draft for `target`: throws InvalidInput naming --model-draft (`draft_name`)
// and what differs. With both tokenizers: their vocabulary sizes, every id's token text and
// special flag, the bos and eos ids, and the ids of a probe text must agree. With neither (token
// ids given directly), the models' vocabulary sizes must. One tokenizer alone is refused.
void check_draft_compatible(const Model& target, const Tokenizer* target_tokenizer, const Model& draft,
                            const Tokenizer* draft_tokenizer, const std::string& draft_name);

// Loads the draft model folder `dir` with `options` (the target's device) and its tokenizer
// where it has one, and checks it against the target (check_draft_compatible).
std::unique_ptr<Model> load_draft_model(const std::filesystem::path& dir, const Model& target,
                                        const Tokenizer* target_tokenizer, const LoadOptions& options);

}  // namespace osprey
