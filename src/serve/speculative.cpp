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
