#include "serve/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace osprey {

void validate(const SpeculativeParams& p) {
  if (p.ngram_min < 1 || p.ngram_min > 16)
    throw InvalidInput("--spec-ngram-min must be in [1, 16], got " + std::to_string(p.ngram_min));
  if (p.ngram_max < p.ngram_min || p.ngram_max > 16)
    throw InvalidInput("--spec-ngram-max must be in [--spec-ngram-min, 16], got " + std::to_string(p.ngram_max));
  if (p.draft_max < 1 || p.draft_max > 64)
    throw InvalidInput("--draft-max must be in [1, 64], got " + std::to_string(p.draft_max));
  if (p.draft_min < 1 || p.draft_min > p.draft_max)
    throw InvalidInput("--draft-min must be in [1, --draft-max], got " + std::to_string(p.draft_min));
  if (!(p.draft_p_min >= 0 && p.draft_p_min <= 1))
    throw InvalidInput("--draft-p-min must be in [0, 1], got " + std::to_string(p.draft_p_min));
  if (!(p.min_acceptance >= 0 && p.min_acceptance <= 1))
    throw InvalidInput("--spec-min-acceptance must be in [0, 1], got " + std::to_string(p.min_acceptance));
  if (p.max_batch < 0 || p.max_batch > kMaxSpecBatch)
    throw InvalidInput("--spec-max-batch must be in [0, " + std::to_string(kMaxSpecBatch) + "] (0: no limit), got " +
                       std::to_string(p.max_batch));
  if (p.ngram && !p.model_draft.empty())
    throw InvalidInput("--spec-ngram and --model-draft are two draft sources; give one of them");
}

int32_t draw_from(const TokenDistribution& d, double u) {
  if (d.empty()) return -1;
  double c = 0;
  for (const auto& [id, pr] : d) {
    c += double(pr);
    if (u < c) return id;
  }
  return d.back().first;
}

namespace {

double prob_of(const TokenDistribution& d, int32_t id) {
  auto it = std::lower_bound(d.begin(), d.end(), id, [](const std::pair<int32_t, float>& e, int32_t v) { return e.first < v; });
  return it != d.end() && it->first == id ? double(it->second) : 0.0;
}

}  // namespace

SpeculativeVerdict speculative_accept(const TokenDistribution& p, const TokenDistribution& q, int32_t x,
                                      double u_accept, double u_resample) {
  SpeculativeVerdict v;
  const double px = prob_of(p, x), qx = prob_of(q, x);
  // q(x) > 0 for a token drawn from q; a zero is read as "never proposed": p(x) / q(x) = inf
  // would accept a token p may give no mass, so it is rejected instead.
  if (qx > 0 && u_accept * qx < px) {
    v.accepted = true;
    v.token = x;
    return v;
  }
  // The residual max(0, p - q) over p's support (q's tokens outside it contribute nothing).
  std::vector<std::pair<int32_t, double>> r;
  r.reserve(p.size());
  double mass = 0;
  for (const auto& [id, pr] : p) {
    const double w = std::max(0.0, double(pr) - prob_of(q, id));
    if (w > 0) {
      r.push_back({id, w});
      mass += w;
    }
  }
  if (!(mass > 0)) {
    v.token = draw_from(p, u_resample);
    return v;
  }
  // Inverse CDF over the unnormalised residual, in double.
  const double target = u_resample * mass;
  double c = 0;
  v.token = r.back().first;
  for (const auto& [id, w] : r) {
    c += w;
    if (target < c) {
      v.token = id;
      break;
    }
  }
  return v;
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_tokens) {
  std::vector<int32_t> draft;
  const int64_t len = int64_t(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1) return draft;
  for (int64_t n = std::min<int64_t>(ngram_max, len - 1); n >= ngram_min; --n) {
    const std::span<const int32_t> tail = tokens.subspan(size_t(len - n));
    // Earlier windows [i, i + n), i + n < len so that at least one token follows; the most
    // recent first.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + i)) continue;
      // What followed, continued past the sequence's end as a copy with overlap (LZ77's): a
      // sequence repeating with period len - from goes on repeating, so a loop drafts in full.
      const int64_t from = i + n;
      for (int64_t j = 0; j < max_tokens; ++j) {
        const int64_t src = from + j;
        draft.push_back(src < len ? tokens[size_t(src)] : draft[size_t(src - len)]);
      }
      return draft;
    }
  }
  return draft;
}

// The cost model behind DraftPacer's threshold (docs/design.md, "When a sequence drafts"). A
// verify of the last token and k drafted ones costs c(k) one-row steps of the same sequence and
// yields 1 + a tokens (a accepted); a plain step yields 1. Drafting pays while
// (1 + a) / c(k) > 1. On the CPU each verify row is its own matvec (batch-invariant mode), so
// c(k) is close to linear, c(k) ~= 1 + r k, r the cost of one more row over a one-row step;
// then drafting pays exactly while a / k > r, whatever k: the threshold is one rate on accepted
// over drafted tokens, and the draft length is left at --draft-max (a shorter draft saves r per
// row it drops, which pays only where the dropped rows would be accepted at a rate below r;
// n-gram drafts are accepted in runs, a quoted passage whole, so whether a sequence drafts at
// all is what decides). Measured with tools/spec_verify_bench.cpp on a 2-core CPU, demo model
// (docs/benchmark_results/2026-12-07-cpu-spec-policy.md): c(8) from 2.1 to 3.8 over runs on
// the paged and dense backends alike (r from about 0.15 to 0.35: a one-row step's time moves by
// 2x with the machine's load), and 2.9 to 3.0 from the server's CPU time per token (r 0.24 to
// 0.25). The default min_acceptance, 0.25, is that break-even. On a GPU a verify's rows cost
// far less than a step (the step reads the weights, the rows share those reads in chunks of 8),
// so the break-even there is lower; 0.25 then stops only sequences that gain little (not
// measured).
//
// The window: a judgement over 32 drafted tokens (four verifies of 8) rather than 16 (two).
// The demo model's replies to the quoting prompt, replayed through the rule offline
// (tools/spec_policy_replay.py: the drafts and their acceptance follow from the greedy reply
// alone), cost 6-18% more with windows of 16 than drafting always (a quote's edges stopped it,
// and the back-off then missed the quote), and 1-5% less with windows of 32, for r from 0.25
// down to 0.15.
bool DraftPacer::drafts() {
  if (n_plain_left_ == 0) return true;
  --n_plain_left_;
  return false;
}

void DraftPacer::verified(int64_t drafted, int64_t accepted) {
  n_window_drafted_ += drafted;
  n_window_accepted_ += accepted;
  if (n_window_drafted_ < kWindow) return;
  // accepted / drafted < min_acceptance, without the division's rounding.
  if (double(n_window_accepted_) < double(min_acceptance_) * double(n_window_drafted_)) {
    n_plain_left_ = backoff_;
    backoff_ = std::min(2 * backoff_, kMaxBackoff);
    ++n_stops_;
  } else {
    backoff_ = kBackoff;
  }
  n_window_drafted_ = n_window_accepted_ = 0;
}

}  // namespace osprey
