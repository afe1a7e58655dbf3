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

}  // namespace osprey
