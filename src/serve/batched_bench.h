#pragma once
// Batched throughput after llama-batched-bench (docs/benchmarks.md, "Batched decoding"): for
// each batch size B, B sequences of n_prompt random tokens are prefilled one after another,
// then decoded together for n_gen steps through the paged backend (serve/paged_backend.h),
// one token per sequence per step, each fed its own choice (greedy, or sampled with
// BatchedBenchParams::sampler). Distinct random prompts, so no prefix is shared.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"
#include "sample/sampler.h"

namespace osprey::grammar {
struct Grammar;
class TokenTrie;
}

namespace osprey {

struct BatchedBenchParams {
  int64_t n_prompt = 512;
  int64_t n_gen = 128;
  std::vector<int> batch_sizes{1, 4, 16, 64};
  int64_t block_size = 16;
  uint64_t seed = 1234;
  bool graphs = true;       // PagedBackendOptions::graphs
  int64_t split_keys = 0;   // PagedBackendOptions::split_keys
  bool inplace = true;      // PagedBackendOptions::inplace
  std::optional<DType> k_type, v_type;  // PagedBackendOptions::k_type, v_type
  // When set, every sequence is constrained by `grammar` over `trie` (the model's vocabulary):
  // each token is the allowed non-end token of highest logit, the step's masks are computed
  // by a mask worker while the backend runs the step (as the scheduler does), and a sequence
  // whose grammar is complete starts it again, so every sequence decodes all n_gen steps.
  // One automaton per batch size, shared by its sequences: its first document meets every
  // state cold.
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<const grammar::TokenTrie> trie;
  std::vector<int32_t> end_ids;  // the vocabulary's end tokens, never chosen
  // How each sequence chooses its next token when unconstrained: greedy (temperature 0, the
  // default), or drawn with these parameters, sequence i with seed + i (drawn on the device
  // where the backend draws, as the server's sequences are).
  SamplerParams sampler{};
};

struct BatchedBenchResult {
  int64_t n_prompt = 0, n_gen = 0;
  int batch = 0;
  int64_t n_kv = 0;            // rows held at the end: batch * (n_prompt + n_gen)
  double t_prompt = 0;         // seconds prefilling every prompt
  double t_gen = 0;            // seconds of the n_gen decode steps
  double prompt_tps() const { return t_prompt > 0 ? double(batch * n_prompt) / t_prompt : 0; }
  double gen_tps() const { return t_gen > 0 ? double(batch * n_gen) / t_gen : 0; }  // aggregate
  double gen_tps_per_sequence() const { return t_gen > 0 ? double(n_gen) / t_gen : 0; }
  double total_tps() const {
    return t_prompt + t_gen > 0 ? double(batch * (n_prompt + n_gen)) / (t_prompt + t_gen) : 0;
  }
  size_t peak_reserved_bytes = 0;  // the model device's allocator, over the run (pool included)
  size_t pool_bytes = 0;
};

// Runs every batch size in order (after one small untimed warm-up batch). Throws InvalidInput
// for sizes below 1 or a sequence longer than the model's context.
std::vector<BatchedBenchResult> run_batched_bench(Model& model, const BatchedBenchParams& params);

}  // namespace osprey
