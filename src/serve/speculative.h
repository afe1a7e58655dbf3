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

// The largest --spec-max-batch (a batch limit past any server's -np).
constexpr int kMaxSpecBatch = 4096;

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
  // --spec-min-acceptance: a sequence whose drafts are accepted at a lower rate (accepted over
  // drafted tokens, judged every DraftPacer::kWindow drafted tokens) stops drafting for a
  // back-off of plain steps (DraftPacer). 0: never stops. The default is the break-even rate of
  // the CPU's verify cost (speculative.cpp).
  float min_acceptance = 0.25f;
  // --spec-max-batch: a step whose decoding batch holds more sequences than this drafts for none
  // of them (0: no limit). serve chooses a default per device; the library's is no limit.
  int max_batch = 0;
  bool enabled() const { return ngram || !model_draft.empty(); }
  // The flag that turned speculation on, for messages: "--spec-ngram" or "--model-draft".
  const char* flag() const { return model_draft.empty() ? "--spec-ngram" : "--model-draft"; }
};

// Throws InvalidInput naming the flag when a value is out of range (ngram 1 <= min <= max <= 16,
// 1 <= draft_min <= draft_max <= 64, 0 <= draft_p_min <= 1, 0 <= min_acceptance <= 1,
// 0 <= max_batch <= kMaxSpecBatch) or when --spec-ngram and
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

// When one sequence drafts (docs/design.md, "Speculative decoding", "When a sequence drafts").
// The cost model that sets the threshold (a verify of k drafted rows against one-row steps,
// measured on the CPU) is written out in speculative.cpp.
//
// The rule: the acceptance (accepted over drafted tokens) is judged over tumbling windows of at
// least kWindow drafted tokens. A window below min_acceptance stops drafting for `backoff`
// plain steps, kBackoff at first, doubled on each stop in a row up to kMaxBackoff; a window at or
// above it resets the back-off to kBackoff. Drafting starts again after a back-off with a fresh
// window, so a reply whose later text quotes its prompt drafts again. A sequence whose drafts
// are all rejected therefore drafts at most kWindow + draft_max - 1 tokens per window, one
// window at the start and one after each back-off.
class DraftPacer {
 public:
  static constexpr int64_t kWindow = 32;
  static constexpr int64_t kBackoff = 16;
  static constexpr int64_t kMaxBackoff = 512;

  explicit DraftPacer(float min_acceptance = 0.25f) : min_acceptance_(min_acceptance) {}
  // Called once for each step the sequence could draft in: false while it backs off (that
  // step counts as one of the back-off's plain steps).
  bool drafts();
  // The verify of `drafted` tokens, `accepted` of them accepted.
  void verified(int64_t drafted, int64_t accepted);
  // Whether the next step is a back-off step (drafts() will return false).
  bool backing_off() const { return n_plain_left_ > 0; }
  int64_t n_stops() const { return n_stops_; }  // times drafting stopped for low acceptance

 private:
  float min_acceptance_;
  int64_t n_window_drafted_ = 0, n_window_accepted_ = 0;
  int64_t n_plain_left_ = 0, backoff_ = kBackoff, n_stops_ = 0;
};

}  // namespace osprey
