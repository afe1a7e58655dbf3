#pragma once
// One sequence through the engine's one loop (serve/scheduler.h): the scheduler runs on the
// caller's thread over a one-slot dense backend on the caller's cache, with the same prefill
// chunks, token choice (on the device where it can), pipelining, graph replay, stop ids and
// grammar masks as the server's sequences; a callback per token.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sample/sampler.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "serve/speculative.h"

namespace osprey {

class Model;
namespace grammar {
class Automaton;
}

struct GenerateParams {
  int max_tokens = 128;
  SamplerParams sampler;
  std::vector<int32_t> stop_ids;  // generation ends after any of these (it is not emitted)
  // Constrained decoding (grammar/matcher.h): tokens are drawn from the grammar's mask on the
  // host sampler; generation stops ("stop") once the grammar is complete and nothing may
  // follow. Its end ids must be stop_ids.
  std::shared_ptr<grammar::Automaton> grammar;
  int64_t prefill_chunk = 512;    // prompt tokens per forward pass
  // CUDA: the sampled token stays on the device and step N+1 is enqueued before the host
  // reads token N (docs/design.md, "Pipelined decode"). Off: OSPREY_FORCE_SYNC=1. Either way
  // the tokens are the same.
  bool pipelined = true;
  bool graphs = true;  // CUDA graph replay of the decode step (OSPREY_CUDA_GRAPHS)
  // Speculative decoding (docs/design.md, "Speculative decoding"): n-gram or draft-model
  // drafts verified in one multi-row step. Greedy: the tokens of plain decoding, byte for byte.
  // Sampled: n-gram drafts give the same draws as plain decoding; a draft model's sampled drafts
  // are accepted by rejection sampling, whose tokens follow the target's distribution (not the
  // same draws). Refused (InvalidInput) for a model with sliding-window layers; off for a
  // constrained sequence (grammar).
  SpeculativeParams spec;
  // spec.model_draft's loaded model (check_draft_compatible passed), on the model's device; not
  // owned. Required when spec.model_draft is set.
  Model* draft_model = nullptr;
  KVCacheParams draft_cache;  // step and inplace of its caches (the target cache's)
  // The prompt's images (Gemma 3): each span's pos0 indexes the prompt, its soft tokens on the
  // model's device (vision/vision_tower.h); an image is never cut between prefill chunks.
  std::vector<ImageSpan> images;
};

struct GenerateStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  double prompt_seconds = 0;  // prefill, up to and including the first sampled token
  double decode_seconds = 0;  // the remaining decode steps
  std::string stop_reason;    // "stop" (a stop id), "length", "callback"
  KVCounters kv;
  bool device_sampling = false;  // tokens chosen on the device (CUDA, no penalty or logit bias)
  bool pipelined = false;        // steps enqueued one ahead of the host
  uint64_t n_graph_replays = 0, n_graph_captures = 0;
  // Speculative decoding: tokens drafted, accepted by the target, and verify steps run.
  int64_t n_drafted = 0, n_accepted = 0, n_verify_steps = 0;
  int64_t n_draft_stops = 0;  // drafting stopped for low acceptance (DraftPacer)
  double acceptance() const { return n_drafted > 0 ? double(n_accepted) / double(n_drafted) : 0; }
  double prompt_tps() const { return prompt_seconds > 0 ? double(n_prompt) / prompt_seconds : 0; }
  double decode_tps() const {
    return decode_seconds > 0 && n_generated > 1 ? double(n_generated - 1) / decode_seconds : 0;
  }
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated, without the prompt or the stop token
  GenerateStats stats;
};

// Called once per generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

// Runs `prompt` through `model` into `cache` (which may already hold a prefix: the prompt
// continues at cache.offset()) and generates. Throws InvalidInput for an empty prompt or a
// prompt past the model's context, and rethrows what ended the sequence otherwise (non-finite
// logits, a grammar that rejects a token, DeviceLost). On return the cache holds the prompt
// and every generated token but the last (which the next step would feed).
GenerateResult generate(Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                        const GenerateParams& params, const TokenCallback& on_token = {});

}  // namespace osprey
