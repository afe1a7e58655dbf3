#pragma once
// Speculative decoding's drafts (docs/design.md, "Speculative decoding"): prompt lookup, as
// llama.cpp's and vLLM's n-gram drafting. The longest recent n-gram of a sequence's tokens
// (n from ngram_max down to ngram_min) is looked for earlier in the sequence (prompt and
// output); the tokens that followed its most recent earlier occurrence are the draft. A draft
// model (serve/draft_model.h) is the other source; the acceptance rule for its sampled drafts
// is speculative_accept() below.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace osprey {

struct SpeculativeParams {
  bool ngram = false;   // --spec-ngram: prompt-lookup drafts
  // --model-draft (-md): a draft model's folder or Hub id; the command loads it (a draft whose
  // tokenizer differs from the target's is refused). Exclusive with --spec-ngram.
  std::string model_draft;
  // --draft-p-min: the draft model stops drafting when its most likely next token's
  // probability is below this (llama.cpp's --draft-p-min); 0 drafts draft_max tokens always.
  float draft_p_min = 0.75f;
  int ngram_min = 1;    // --spec-ngram-min
  int ngram_max = 3;    // --spec-ngram-max
  int draft_max = 8;    // --draft-max: tokens drafted per step at most
  int draft_min = 1;    // --draft-min: a shorter draft is not verified (the step decodes one token)
  bool enabled() const { return ngram || !model_draft.empty(); }
  // The flag that turned speculation on, for messages: "--spec-ngram" or "--model-draft".
  const char* flag() const { return model_draft.empty() ? "--spec-ngram" : "--model-draft"; }
};

// Throws InvalidInput naming the flag when a value is out of range (ngram 1 <= min <= max <= 16,
// 1 <= draft_min <= draft_max <= 64, 0 <= draft_p_min <= 1) or when --spec-ngram and
// --model-draft are both given (two draft sources: one must be chosen).
void validate(const SpeculativeParams& p);

// A token distribution as Sampler::distribution gives it: (id, probability), sorted by id,
// probabilities summing to 1.
using TokenDistribution = std::vector<std::pair<int32_t, float>>;

// The token at which the cumulative probability of `d` passes u in [0, 1) (inverse CDF, in id
// order); the last token of `d` when rounding leaves u past the sum. -1 for an empty `d`.
int32_t draw_from(const TokenDistribution& d, double u);

// Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023) for a drafted
// token x that was drawn from the draft's distribution q, against the target's distribution p
// for the same position: x is accepted when u_accept < p(x) / q(x); otherwise the emitted token
// is drawn (draw_from with u_resample) from max(0, p - q) renormalised, or from p where that
// residual has no mass (p == q on q's support: only rounding rejects then). The emitted token is
// then distributed exactly as p. u_accept and u_resample are independent uniforms in [0, 1).
struct SpeculativeVerdict {
  bool accepted = false;
  int32_t token = -1;  // x when accepted, else the resampled token
};
SpeculativeVerdict speculative_accept(const TokenDistribution& p, const TokenDistribution& q, int32_t x,
                                      double u_accept, double u_resample);

// `max_tokens` drafted tokens for the sequence `tokens`: for n = ngram_max down to ngram_min,
// the last n tokens are matched against every earlier window (the most recent match first), and
// the tokens that follow the first match are the draft; where they reach the sequence's end the
// draft goes on as a copy with overlap (the sequence repeating with the period the match
// found), so it always has max_tokens tokens. Empty when no n-gram recurs or max_tokens <= 0.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_tokens);

}  // namespace osprey
