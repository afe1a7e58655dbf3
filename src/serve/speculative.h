#pragma once
// Speculative decoding's drafts (docs/design.md, "Speculative decoding"): prompt lookup, as
// llama.cpp's and vLLM's n-gram drafting. The longest recent n-gram of a sequence's tokens
// (n from ngram_max down to ngram_min) is looked for earlier in the sequence (prompt and
// output); the tokens that followed its most recent earlier occurrence are the draft.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace osprey {

struct SpeculativeParams {
  bool ngram = false;   // --spec-ngram: prompt-lookup drafts
  int ngram_min = 1;    // --spec-ngram-min
  int ngram_max = 3;    // --spec-ngram-max
  int draft_max = 8;    // --draft-max: tokens drafted per step at most
  int draft_min = 1;    // --draft-min: a shorter draft is not verified (the step decodes one token)
  bool enabled() const { return ngram; }
};

// Throws InvalidInput naming the flag when a value is out of range (ngram 1 <= min <= max <= 16,
// 1 <= draft_min <= draft_max <= 64).
void validate(const SpeculativeParams& p);

// `max_tokens` drafted tokens for the sequence `tokens`: for n = ngram_max down to ngram_min,
// the last n tokens are matched against every earlier window (the most recent match first), and
// the tokens that follow the first match are the draft; where they reach the sequence's end the
// draft goes on as a copy with overlap (the sequence repeating with the period the match
// found), so it always has max_tokens tokens. Empty when no n-gram recurs or max_tokens <= 0.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_tokens);

}  // namespace osprey
