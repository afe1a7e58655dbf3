#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

#include "core/error.h"
#include "backend/cpu_level.h"
#include "sample/sampler.h"
#include "support/noise_reference.h"

namespace osprey {
namespace {

// Softmax in double, as an independent reference.
std::vector<double> softmax(const std::vector<float>& l, double temp) {
  double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - mx) / temp);
  for (double& v : p) v /= s;
  return p;
}

std::vector<int32_t> ids_of(const std::vector<std::pair<int32_t, float>>& d) {
  std::vector<int32_t> ids;
  for (auto& [id, p] : d) ids.push_back(id);
  return ids;
}

const std::vector<float> kLogits = {1.0f, 3.0f, -2.0f, 2.5f, 0.5f, 3.0f, -1.0f, 2.0f};

// The distribution of kLogits after `history` equals the softmax (at temperature 1) of
// `penalised`: kLogits as the penalties of `p` should leave them, worked out by hand.
void expect_penalised(const SamplerParams& p, const std::vector<int32_t>& history, const std::vector<float>& penalised) {
  Sampler s(p);
  const auto ref = softmax(penalised, 1.0);
  for (auto& [id, prob] : s.distribution(kLogits, history)) EXPECT_NEAR(prob, ref[size_t(id)], 1e-6);
}

}  // namespace

TEST(Sampler, GreedyPicksTheArgmaxAndTheLowestIdOnATie) {
  Sampler s({});
  EXPECT_EQ(s.sample(kLogits, {}), 1);  // ids 1 and 5 tie at 3.0
}

TEST(Sampler, TemperatureGivesTheSoftmaxOfScaledLogits) {
  SamplerParams p;
  p.temperature = 0.7f;
  Sampler s(p);
  auto d = s.distribution(kLogits, {});
  auto ref = softmax(kLogits, 0.7);
  ASSERT_EQ(d.size(), kLogits.size());
  for (auto& [id, prob] : d) EXPECT_NEAR(prob, ref[size_t(id)], 1e-6);
}

TEST(Sampler, LogitBiasShiftsLogitsAndMinus100Bans) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  SamplerParams g;
  g.logit_bias = {{1, -100.0f}};
  Sampler greedy(g);
  EXPECT_EQ(greedy.sample(logits, {}), 2);  // the argmax is banned; the runner-up wins
  g.logit_bias = {{3, 10.0f}};
  EXPECT_EQ(Sampler(g).sample(logits, {}), 3);

  SamplerParams t;
  t.temperature = 1.0f;
  t.logit_bias = {{1, -100.0f}, {0, 1.5f}};
  const auto d = Sampler(t).distribution(logits, {});
  EXPECT_EQ(ids_of(d), (std::vector<int32_t>{0, 2, 3}));  // the banned token has no probability at all
  const std::vector<double> ref = softmax({2.5f, 2.0f, 0.5f}, 1.0);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(d[i].second, ref[i], 1e-6);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    t.seed = seed;
    EXPECT_NE(Sampler(t).sample(logits, {}), 1);
  }

  SamplerParams all;
  all.logit_bias = {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}, {3, -100.0f}};
  EXPECT_THROW(Sampler(all).sample(logits, {}), InvalidInput);
  SamplerParams outside;
  outside.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(Sampler(outside).sample(logits, {}), InvalidInput);
  SamplerParams too_big;
  too_big.logit_bias = {{0, 101.0f}};
  EXPECT_THROW(Sampler{too_big}, InvalidInput);
}

TEST(Sampler, TopKKeepsTheKLargest) {
  Sampler s({.temperature = 1.0f, .top_k = 3, .logit_bias = {}});
  EXPECT_EQ(ids_of(s.distribution(kLogits, {})), (std::vector<int32_t>{1, 3, 5}));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  Sampler s({.temperature = 1.0f, .top_p = 0.8f, .logit_bias = {}});
  auto ref = softmax(kLogits, 1.0);
  // The tokens by falling probability; the two at 3.0 (ids 1 and 5) share the top rank.
  std::vector<int32_t> order(kLogits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ref[size_t(a)] > ref[size_t(b)]; });
  std::vector<int32_t> expect;
  double acc = 0;
  for (int32_t id : order) {
    expect.push_back(id);
    acc += ref[size_t(id)];
    if (acc >= 0.8) break;
  }
  std::sort(expect.begin(), expect.end());
  auto d = s.distribution(kLogits, {});
  EXPECT_EQ(ids_of(d), expect);
  double kept = 0;
  for (int32_t id : expect) kept += ref[size_t(id)];
  for (auto& [id, prob] : d) EXPECT_NEAR(prob, ref[size_t(id)] / kept, 1e-6);
}

// The cut is a value: a cut inside a group of equal logits keeps the whole group. (The sampler
// once kept a prefix sorted by id here, token 1 alone: the chain's contract now keeps both.)
TEST(Sampler, TopPKeepsEveryTokenTiedWithTheCut) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_p = 0.2f;  // token 1 alone holds 0.31 of the mass, but token 5 ties with it
  EXPECT_EQ(ids_of(Sampler(p).distribution(kLogits, {})), (std::vector<int32_t>{1, 5}));
  p.top_p = 0.7f;  // 0.31 + 0.31 fall short: the next value, 2.5 (id 3), is kept
  EXPECT_EQ(ids_of(Sampler(p).distribution(kLogits, {})), (std::vector<int32_t>{1, 3, 5}));
  SamplerParams k;
  k.temperature = 1.0f;
  k.top_k = 1;  // the largest value, 3.0, is held by two tokens
  EXPECT_EQ(ids_of(Sampler(k).distribution(kLogits, {})), (std::vector<int32_t>{1, 5}));
  const std::vector<float> steps = {2.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  k.top_k = 2;
  EXPECT_EQ(ids_of(Sampler(k).distribution(steps, {})), (std::vector<int32_t>{0, 1, 2, 3}));
  k.top_k = 4;  // as many as the tokens down to the tie: the same set
  EXPECT_EQ(ids_of(Sampler(k).distribution(steps, {})), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  Sampler s({.temperature = 1.0f, .min_p = 0.3f, .logit_bias = {}});
  auto ref = softmax(kLogits, 1.0);
  double best = *std::max_element(ref.begin(), ref.end());
  std::vector<int32_t> expect;
  for (size_t i = 0; i < ref.size(); ++i)
    if (ref[i] >= 0.3 * best) expect.push_back(int32_t(i));
  EXPECT_EQ(ids_of(s.distribution(kLogits, {})), expect);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  std::vector<float> penalised = kLogits;
  penalised[1] = 3.0f / 2.0f;
  penalised[2] = -2.0f * 2.0f;
  expect_penalised({.temperature = 1.0f, .repetition_penalty = 2.0f, .logit_bias = {}}, {1, 2, 1}, penalised);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesSubtractPerSeenToken) {
  // Token 1 seen twice, 2 once: l - (0.5 + c * 0.25), by hand.
  std::vector<float> penalised = kLogits;
  penalised[1] = 3.0f - 1.0f;
  penalised[2] = -2.0f - 0.75f;
  expect_penalised({.temperature = 1.0f, .presence_penalty = 0.5f, .frequency_penalty = 0.25f, .logit_bias = {}}, {1, 2, 1}, penalised);
}

TEST(Sampler, PenaltiesLookOnlyAtTheLastNTokens) {
  std::vector<float> penalised = kLogits;
  penalised[1] -= 1.0f;
  penalised[3] -= 1.0f;
  // 5 is outside the window of the last two.
  expect_penalised({.temperature = 1.0f, .repeat_last_n = 2, .presence_penalty = 1.0f, .logit_bias = {}}, {5, 1, 3}, penalised);
}

TEST(Sampler, DrawsFollowTheDistributionAndTheSeed) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  auto ref = softmax(kLogits, 1.0);
  std::map<int32_t, int> counts;
  std::vector<int32_t> seq_a, seq_b;
  constexpr int kDraws = 40000;
  for (int i = 0; i < kDraws; ++i) {
    seq_a.push_back(a.sample(kLogits, {}));
    seq_b.push_back(b.sample(kLogits, {}));
    ++counts[seq_a.back()];
  }
  EXPECT_EQ(seq_a, seq_b);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(double(counts[int32_t(i)]) / kDraws, ref[i], 0.01) << i;
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> seq_c;
  for (int i = 0; i < 100; ++i) seq_c.push_back(c.sample(kLogits, {}));
  EXPECT_NE(std::vector<int32_t>(seq_a.begin(), seq_a.begin() + 100), seq_c);
}

using testing::reference_gumbel;  // support/noise_reference.h

TEST(Sampler, DrawIIsGumbelMaxWithTheDocumentedNoiseAtCounterI) {
  // The CUDA sampler draws with the same noise, so the CPU and the device agree for a seed.
  SamplerParams p;
  p.temperature = 0.7f;
  p.seed = 1234;
  Sampler s(p);
  for (uint64_t i = 0; i < 200; ++i) {
    int32_t want = -1;
    double best = -HUGE_VAL;
    for (size_t t = 0; t < kLogits.size(); ++t) {
      const double key = double(kLogits[t]) / double(p.temperature) + reference_gumbel(p.seed, i, t);
      if (key > best) best = key, want = int32_t(t);
    }
    EXPECT_EQ(s.sample(kLogits, {}), want) << "draw " << i;
  }
}

TEST(Sampler, OutOfRangeParametersAreRejected) {
  SamplerParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, InvalidInput);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, InvalidInput);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler{p}, InvalidInput);
}

}  // namespace osprey

namespace osprey {

// Broken weights show as NaN or Inf logits: the sampler refuses them (greedy or not) rather
// than choosing token 0, and says how many there are and where the first is.
TEST(Sampler, NonFiniteLogitsAreAnErrorNamingThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<float> logits;
    std::string words;
  };
  const std::vector<Case> cases = {{{0.5f, nan, 1.0f}, "1 of 3 are NaN or Inf, the first NaN for token id 1"},
                                   {{nan, nan, nan, nan}, "4 of 4 are NaN or Inf, the first NaN for token id 0"},
                                   {{0.5f, 2.0f, -inf}, "the first Inf for token id 2"},
                                   {{inf, 0.0f}, "the first Inf for token id 0"}};
  for (float temp : {0.0f, 0.8f}) {
    SamplerParams p;
    p.temperature = temp;
    p.top_k = temp > 0 ? 2 : 0;
    for (const Case& c : cases) {
      Sampler s(p);
      try {
        s.sample(c.logits, {});
        ADD_FAILURE() << "no error for temperature " << temp;
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("non-finite logits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << e.what();
      }
    }
  }
  // Finite logits, however large, are fine.
  Sampler s(SamplerParams{});
  EXPECT_EQ(s.sample(std::vector<float>{-3e38f, 3e38f}, {}), 1);
}

}  // namespace osprey

namespace osprey {

// Two draws from std::random_device agree with probability 2^-64 (per pair); three distinct
// seeds also sample different sequences.
TEST(Sampler, RandomSeedsDifferFromCallToCall) {
  const uint64_t a = random_seed(), b = random_seed(), c = random_seed();
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_NE(a, c);
  SamplerParams p;
  p.temperature = 1.0f;
  std::vector<std::vector<int32_t>> seqs;
  for (uint64_t seed : {a, b}) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> seq;
    for (int i = 0; i < 64; ++i) seq.push_back(s.sample(kLogits, {}));
    seqs.push_back(seq);
  }
  EXPECT_NE(seqs[0], seqs[1]);
}

}  // namespace osprey

// ---- The chain against a reference written from its definition (sample/sampler.h) ----

namespace osprey {
namespace {

// Steps 1-3 in float, as the contract writes them.
std::vector<float> reference_adjust(std::vector<float> l, const std::vector<int32_t>& history,
                                    const std::vector<uint64_t>& allowed, const SamplerParams& p) {
  if (!allowed.empty())
    for (size_t i = 0; i < l.size(); ++i)
      if (i / 64 >= allowed.size() || !((allowed[i / 64] >> (i % 64)) & 1)) l[i] = -INFINITY;
  for (const auto& [id, bias] : p.logit_bias) l[size_t(id)] = bias <= -100.0f ? -INFINITY : l[size_t(id)] + bias;
  std::map<int32_t, int> seen;
  const size_t from = history.size() > size_t(p.repeat_last_n) ? history.size() - size_t(p.repeat_last_n) : 0;
  for (size_t i = from; i < history.size(); ++i) ++seen[history[i]];
  for (const auto& [id, c] : seen) {
    if (id < 0 || size_t(id) >= l.size()) continue;
    float& v = l[size_t(id)];
    v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    v -= p.presence_penalty + float(c) * p.frequency_penalty;
  }
  return l;
}

// transformers' TypicalLogitsWarper on the kept tokens, from its documented algorithm: the
// log-softmax of their scores, its entropy H, each token's |-log p - H|; sorted by that
// ascending, the cumulative probability; last = the number of positions where it is still
// below `mass`; every token whose score exceeds the score at `last` is removed (so a token
// tied with it stays).
std::vector<int32_t> reference_typical(const std::vector<int32_t>& kept, const std::vector<double>& scores,
                                       double mass) {
  double mx = -HUGE_VAL;
  for (int32_t id : kept) mx = std::max(mx, scores[size_t(id)]);
  double z = 0;
  for (int32_t id : kept) z += std::exp(scores[size_t(id)] - mx);
  std::vector<double> logp(kept.size()), shifted(kept.size());
  double entropy = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    logp[i] = scores[size_t(kept[i])] - mx - std::log(z);
    entropy -= logp[i] * std::exp(logp[i]);
  }
  for (size_t i = 0; i < kept.size(); ++i) shifted[i] = std::fabs(-logp[i] - entropy);
  std::vector<size_t> order(kept.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shifted[a] < shifted[b]; });
  double cum = 0;
  size_t last = 0;
  for (size_t r = 0; r < order.size(); ++r) {
    cum += std::exp(logp[order[r]]);
    if (cum < mass) last = r + 1;
  }
  last = std::min(last, order.size() - 1);
  std::vector<int32_t> out;
  for (size_t i = 0; i < kept.size(); ++i)
    if (!(shifted[i] > shifted[order[last]])) out.push_back(kept[i]);
  return out;
}

struct Kept {
  std::vector<int32_t> ids;   // ascending
  std::vector<double> probs;  // renormalised over the kept set
};

// Steps 4-8 in double over adjusted logits `l`, by sorting: the independent reference.
Kept reference_kept(const std::vector<float>& l, const SamplerParams& p) {
  Kept k;
  if (p.temperature <= 0) {
    int32_t best = 0;
    for (size_t i = 1; i < l.size(); ++i)
      if (l[i] > l[size_t(best)]) best = int32_t(i);
    return {{best}, {1.0}};
  }
  const double t = p.temperature;
  double mx = -HUGE_VAL;
  std::vector<int32_t> kept;
  for (size_t i = 0; i < l.size(); ++i)
    if (std::isfinite(l[i])) kept.push_back(int32_t(i)), mx = std::max(mx, double(l[i]));
  std::vector<double> w(l.size(), 0.0), scores(l.size(), 0.0);
  for (int32_t id : kept) {
    w[size_t(id)] = std::exp((double(l[size_t(id)]) - mx) / t);
    scores[size_t(id)] = double(l[size_t(id)]) / t;
  }
  auto keep_if = [&](auto pred) {
    std::vector<int32_t> next;
    for (int32_t id : kept)
      if (pred(id)) next.push_back(id);
    kept = next;
  };
  auto by_logit = [&] {
    std::vector<int32_t> s = kept;
    std::stable_sort(s.begin(), s.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
    return s;
  };
  if (p.top_k > 0 && size_t(p.top_k) < kept.size()) {
    const float v = l[size_t(by_logit()[size_t(p.top_k) - 1])];
    keep_if([&](int32_t id) { return l[size_t(id)] >= v; });
  }
  if (p.top_p < 1.0f) {
    double total = 0;
    for (int32_t id : kept) total += w[size_t(id)];
    const std::vector<int32_t> s = by_logit();
    double cum = 0;
    float v = l[size_t(s.back())];
    for (size_t i = 0; i < s.size();) {
      const float value = l[size_t(s[i])];
      for (; i < s.size() && l[size_t(s[i])] == value; ++i) cum += w[size_t(s[i])];
      if (cum >= double(p.top_p) * total) {
        v = value;
        break;
      }
    }
    keep_if([&](int32_t id) { return l[size_t(id)] >= v; });
  }
  if (p.min_p > 0.0f) keep_if([&](int32_t id) { return w[size_t(id)] >= double(p.min_p); });
  if (p.typical_p < 1.0f) kept = reference_typical(kept, scores, double(p.typical_p));
  double total = 0;
  for (int32_t id : kept) total += w[size_t(id)];
  k.ids = kept;
  for (int32_t id : kept) k.probs.push_back(w[size_t(id)] / total);
  return k;
}

Kept reference_chain(const std::vector<float>& logits, const std::vector<int32_t>& history,
                     const std::vector<uint64_t>& allowed, const SamplerParams& p) {
  return reference_kept(reference_adjust(logits, history, allowed, p), p);
}

// Expects the sampler's distribution() to be the reference's: the same ids, the same
// probabilities within 1e-6.
void expect_reference(const std::vector<float>& logits, const std::vector<int32_t>& history,
                      const std::vector<uint64_t>& allowed, const SamplerParams& p, const std::string& what) {
  const Kept want = reference_chain(logits, history, allowed, p);
  const auto got = Sampler(p).distribution(logits, history, allowed);
  ASSERT_EQ(ids_of(got), want.ids) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i].second, want.probs[i], 1e-6) << what << " id " << got[i].first;
}

std::string describe(const SamplerParams& p, size_t vocab, uint32_t seed) {
  std::ostringstream o;
  o << "vocab " << vocab << " seed " << seed << " T " << p.temperature << " top-k " << p.top_k << " top-p " << p.top_p
    << " min-p " << p.min_p << " typical-p " << p.typical_p;
  return o.str();
}

// Random logits; with `grid`, rounded to multiples of it, so that many tie.
std::vector<float> random_logits(std::mt19937& rng, size_t n, float sigma, float grid) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> l(n);
  for (float& v : l) v = grid > 0 ? std::round(nd(rng) / grid) * grid : nd(rng);
  return l;
}

}  // namespace

TEST(Sampler, EachCutAndTheirCombinationsMatchTheReference) {
  int n_cases = 0;
  for (size_t vocab : {1, 2, 3, 5, 8, 13, 32, 64}) {
    for (uint32_t seed = 0; seed < 12; ++seed) {
      std::mt19937 rng(seed * 7919 + uint32_t(vocab));
      std::uniform_real_distribution<float> unit(0.0f, 1.0f);
      // Half the rows on a grid of 0.5: ties at every cut.
      const std::vector<float> logits = random_logits(rng, vocab, 2.0f, seed % 2 ? 0.5f : 0.0f);
      for (float temp : {0.05f, 0.6f, 1.0f, 1.7f, 8.0f}) {
        const int k = 1 + int(rng() % vocab);
        const float top_p = 0.2f + 0.75f * unit(rng), min_p = 0.2f * unit(rng), typical_p = 0.2f + 0.75f * unit(rng);
        for (int mask = 1; mask < 16; ++mask) {  // each non-empty subset of {top-k, top-p, min-p, typical-p}
          SamplerParams p;
          p.temperature = temp;
          if (mask & 1) p.top_k = k;
          if (mask & 2) p.top_p = top_p;
          if (mask & 4) p.min_p = min_p;
          if (mask & 8) p.typical_p = typical_p;
          expect_reference(logits, {}, {}, p, describe(p, vocab, seed));
          ++n_cases;
        }
      }
    }
  }
  EXPECT_EQ(n_cases, 8 * 12 * 5 * 15);
}

TEST(Sampler, MaskBiasAndPenaltiesComeBeforeTheCuts) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    const size_t vocab = 16 + rng() % 49;  // 16..64
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    const std::vector<float> logits = random_logits(rng, vocab, 2.0f, seed % 2 ? 0.25f : 0.0f);
    std::vector<uint64_t> allowed;
    if (seed % 3 != 0) {
      // A random mask with at least its first id allowed; shorter than the vocabulary every
      // fourth time (the ids past its end are banned).
      allowed.assign((vocab + 63) / 64, 0);
      for (size_t i = 0; i < vocab; ++i)
        if (rng() % 3 != 0) allowed[i / 64] |= uint64_t(1) << (i % 64);
      allowed[0] |= 1;
      if (seed % 4 == 1 && vocab > 64) allowed.resize(1);
    }
    std::vector<int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(int32_t(rng() % vocab));
    SamplerParams p;
    p.temperature = 0.5f + unit(rng);
    p.repetition_penalty = 1.0f + unit(rng);
    p.presence_penalty = unit(rng) - 0.5f;
    p.frequency_penalty = 0.5f * unit(rng);
    p.repeat_last_n = int(rng() % 40);
    p.logit_bias = {{int32_t(rng() % vocab), 3.0f * unit(rng) - 1.0f}, {int32_t(rng() % vocab), -100.0f}};
    p.top_k = seed % 5 == 0 ? 0 : 1 + int(rng() % vocab);
    p.top_p = seed % 2 ? 0.3f + 0.65f * unit(rng) : 1.0f;
    p.min_p = seed % 3 ? 0.1f * unit(rng) : 0.0f;
    p.typical_p = seed % 4 ? 0.3f + 0.65f * unit(rng) : 1.0f;
    expect_reference(logits, history, allowed, p, describe(p, vocab, seed) + " with a mask, a bias and penalties");
    SamplerParams greedy = p;
    greedy.temperature = 0.0f;
    EXPECT_EQ(Sampler(greedy).sample(logits, history, allowed),
              reference_chain(logits, history, allowed, greedy).ids[0]);
  }
}

// Vocabularies past the sorted last step of the cuts: histograms over thousands of tokens, many
// of them tied, for top-k beyond its heap, top-p, min-p and typical-p.
TEST(Sampler, LargeVocabulariesCutAsTheReference) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::mt19937 rng(100 + seed);
    const size_t vocab = 20000 + 1000 * seed;
    const std::vector<float> logits = random_logits(rng, vocab, seed < 2 ? 0.5f : 2.0f, seed % 2 ? 1.0f / 64 : 0.0f);
    const std::vector<SamplerParams> settings = [] {
      std::vector<SamplerParams> v(6);
      for (auto& p : v) p.temperature = 0.8f;
      v[0].top_k = 6000;
      v[1].top_p = 0.9f;
      v[2].top_p = 0.3f;
      v[3].min_p = 0.3f;
      v[4].typical_p = 0.6f;
      v[5].top_k = 9000, v[5].top_p = 0.95f, v[5].typical_p = 0.9f;
      return v;
    }();
    for (const SamplerParams& p : settings) expect_reference(logits, {}, {}, p, describe(p, vocab, seed));
  }
}

// Top-p over a vocabulary weighs the likely tokens first and bounds the rest's mass; where the
// bounds cannot place the cut, it must count that mass exactly. Here 60 unlikely tokens (x = -9)
// hold 0.5% of the mass, and top-p sits 2e-5 (relative) on either side of the top token's
// share: counting their mass short or long by more than that moves the cut.
TEST(Sampler, TopPCountsTheMassOfTokensItDoesNotWeigh) {
  std::vector<float> logits(62, -9.0f);
  logits[0] = 0.0f;
  logits[1] = float(std::log(0.5));
  double total = 0;
  for (float l : logits) total += std::exp(double(l));
  for (double side : {-2e-5, 2e-5}) {
    SamplerParams p;
    p.temperature = 1.0f;
    p.top_p = float(1.0 / total * (1.0 + side));
    const std::vector<int32_t> want = side < 0 ? std::vector<int32_t>{0} : std::vector<int32_t>{0, 1};
    EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), want) << side;
    expect_reference(logits, {}, {}, p, "top-p at the top token's share " + std::to_string(side));
  }
}

TEST(Sampler, TypicalPFollowsTransformersTypicalWarper) {
  // By hand: probabilities 0.5, 0.25, 0.125, 0.125 (logits log2 * {3, 2, 1, 1}) have entropy
  // H = 1.75 bits; |-log2 p - H| = 0.75, 0.25, 1.25, 1.25 bits. typical-p 0.3 keeps the most
  // typical token alone (id 1, 0.25 short of 0.3, then id 0: 0.75); 0.8 adds the two tied
  // tokens together (0.75 + 0.25 = 1).
  const float ln2 = float(std::log(2.0));
  const std::vector<float> logits = {3 * ln2, 2 * ln2, ln2, ln2};
  SamplerParams p;
  p.temperature = 1.0f;
  p.typical_p = 0.2f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1}));
  p.typical_p = 0.3f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{0, 1}));
  p.typical_p = 0.8f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{0, 1, 2, 3}));
  // Random logits (with ties), alone and after top-k and top-p.
  for (uint32_t seed = 0; seed < 60; ++seed) {
    std::mt19937 rng(5000 + seed);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    const size_t vocab = 8 + rng() % 57;
    const std::vector<float> l = random_logits(rng, vocab, 1.0f + 2.0f * unit(rng), seed % 3 == 0 ? 0.5f : 0.0f);
    SamplerParams q;
    q.temperature = 0.5f + unit(rng);
    q.typical_p = 0.05f + 0.9f * unit(rng);
    if (seed % 4 == 1) q.top_k = 1 + int(rng() % vocab);
    if (seed % 4 == 2) q.top_p = 0.5f + 0.45f * unit(rng);
    expect_reference(l, {}, {}, q, describe(q, vocab, seed));
  }
}

namespace {

// The chi-square distribution's survival function Q(df / 2, x / 2), the regularized upper
// incomplete gamma function, in closed form for integer and half-integer a = df / 2:
//   a integer:      Q(a, y) = e^-y sum_{i < a} y^i / i!
//   a = m + 1/2:    Q(a, y) = erfc(sqrt y) + e^-y sum_{i = 1..m} y^(i - 1/2) / Gamma(i + 1/2)
double chi_square_survival(int df, double x) {
  const double y = x / 2;
  double q = 0;
  if (df % 2 == 0) {
    double term = 1;
    for (int i = 0; i < df / 2; ++i) {
      if (i > 0) term *= y / i;
      q += term;
    }
    return q * std::exp(-y);
  }
  q = std::erfc(std::sqrt(y));
  for (int i = 1; i <= df / 2; ++i) q += std::exp((i - 0.5) * std::log(y) - y - std::lgamma(i + 0.5));
  return q;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double x = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    x += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x;
}

}  // namespace

// 40,000 draws (counters 0..39,999) after top-k, top-p and min-p over 14 tokens against the
// reference's kept distribution. The test rejects when the chi-square statistic's p-value is
// below 1e-6: a correct sampler (independent draws) fails it with probability 1e-6. With
// df = (kept tokens - 1) = 9 that is a statistic above 44.81, computed below by bisection on
// the survival function (which gives the tables' 16.919 at 0.05 and 21.666 at 0.01 for df 9).
TEST(Sampler, DrawsFollowTheReferenceDistributionByChiSquare) {
  const std::vector<float> logits = {2.0f, 1.6f, 1.6f, 1.1f, 0.7f, 0.3f, 0.0f,
                                     -0.4f, -1.0f, -1.6f, -2.5f, -4.0f, -6.0f, 2.4f};
  SamplerParams p;
  p.temperature = 0.9f;
  p.top_k = 12;
  p.top_p = 0.995f;
  p.min_p = 0.02f;
  p.seed = 20240611;
  const Kept ref = reference_chain(logits, {}, {}, p);
  ASSERT_EQ(ref.ids.size(), 10u);  // cut by each of top-k, top-p and min-p on the way
  constexpr int kDraws = 40000;
  std::map<int32_t, int> seen;
  Sampler s(p);
  for (int i = 0; i < kDraws; ++i) ++seen[s.sample(logits, {})];
  std::vector<int> counts;
  for (int32_t id : ref.ids) counts.push_back(seen[id]);
  int inside = 0;
  for (int c : counts) inside += c;
  EXPECT_EQ(inside, kDraws) << "a draw outside the kept set";
  const int df = int(ref.ids.size()) - 1;
  // The critical value at false-alarm rate 1e-6, by bisection on the survival function.
  double lo = 0, hi = 1000;
  for (int i = 0; i < 200; ++i) ((chi_square_survival(df, (lo + hi) / 2) > 1e-6) ? lo : hi) = (lo + hi) / 2;
  EXPECT_NEAR(chi_square_survival(df, 16.919), 0.05, 1e-5);
  EXPECT_NEAR(chi_square_survival(df, 21.666), 0.01, 1e-5);
  EXPECT_NEAR(lo, 44.81, 0.01);
  const double x = chi_square(counts, ref.probs, kDraws);
  EXPECT_LT(x, lo) << "p-value " << chi_square_survival(df, x);
  // The test can fail: the draws are far from the kept tokens' distribution at temperature 1.
  std::vector<double> other;
  double z = 0;
  for (int32_t id : ref.ids) z += std::exp(double(logits[size_t(id)]));
  for (int32_t id : ref.ids) other.push_back(std::exp(double(logits[size_t(id)])) / z);
  EXPECT_GT(chi_square(counts, other, kDraws), lo);
}

TEST(Sampler, SampleAtCounterIIsTheIthSample) {
  std::mt19937 rng(7);
  const std::vector<float> logits = random_logits(rng, 64, 1.5f, 0.0f);
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 99;
  Sampler a(p);
  const Sampler b(p);
  std::vector<int32_t> seq;
  for (uint64_t i = 0; i < 300; ++i) {
    seq.push_back(a.sample(logits, {}));
    EXPECT_EQ(seq.back(), b.sample_at(logits, {}, {}, i)) << "draw " << i;
  }
  // Out of order and again: a pure function of the counter.
  for (uint64_t i : {250u, 3u, 3u, 117u, 0u}) EXPECT_EQ(b.sample_at(logits, {}, {}, i), seq[i]);
  // Another seed draws another sequence.
  p.seed = 100;
  const Sampler c(p);
  int same = 0;
  for (uint64_t i = 0; i < 300; ++i) same += c.sample_at(logits, {}, {}, i) == seq[i];
  EXPECT_LT(same, 200);
}

namespace {

// The plain Gumbel-max draw over the reference's kept set: every key evaluated.
int32_t brute_force_draw(const std::vector<float>& l, const Kept& kept, float temperature, uint64_t seed,
                         uint64_t counter) {
  int32_t best = -1;
  double best_key = -HUGE_VAL;
  for (int32_t id : kept.ids) {
    const double key = double(l[size_t(id)]) / double(temperature) + reference_gumbel(seed, counter, uint64_t(id));
    if (key > best_key) best_key = key, best = id;  // ascending ids: the lowest wins a tie
  }
  return best;
}

}  // namespace

// The draw skips the logarithms of tokens that cannot win; its token must still be the plain
// argmax's, bit for bit, over 128,256 tokens flat (every token a contender) and peaked.
TEST(Sampler, DrawsAreBitIdenticalToBruteForceGumbelMaxAtA128kVocabulary) {
  constexpr size_t kVocab = 128256;
  std::mt19937 rng(2024);
  std::vector<float> flat = random_logits(rng, kVocab, 0.1f, 0.0f);
  std::vector<float> peaked = random_logits(rng, kVocab, 3.0f, 0.0f);
  std::uniform_int_distribution<size_t> pick(0, kVocab - 1);
  for (float v : {20.0f, 19.5f, 18.0f, 17.0f, 15.0f, 13.0f, 12.0f, 12.0f}) peaked[pick(rng)] = v;
  struct Case {
    const char* logits;
    float temperature;
    int top_k;
    float top_p, min_p, typical_p;
    int n_draws;
  };
  const std::vector<Case> cases = {
      {"flat", 0.8f, 0, 1.0f, 0.0f, 1.0f, 12},   {"peaked", 0.8f, 0, 1.0f, 0.0f, 1.0f, 12},
      {"flat", 0.8f, 0, 0.95f, 0.0f, 1.0f, 8},   {"peaked", 0.8f, 0, 0.95f, 0.0f, 1.0f, 40},
      {"peaked", 2.5f, 0, 0.99f, 0.0f, 1.0f, 40}, {"flat", 0.8f, 40, 1.0f, 0.0f, 1.0f, 40},
      {"flat", 0.8f, 0, 1.0f, 0.5f, 1.0f, 8},    {"peaked", 0.8f, 0, 1.0f, 0.0f, 0.9f, 40},
      {"flat", 0.8f, 0, 0.9f, 0.0f, 0.9f, 8},    {"peaked", 0.05f, 0, 1.0f, 0.0f, 1.0f, 12},
  };
  for (const Case& c : cases) {
    const std::vector<float>& l = std::string(c.logits) == "flat" ? flat : peaked;
    const SamplerParams p{.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p, .min_p = c.min_p,
                          .typical_p = c.typical_p, .seed = 77, .logit_bias = {}};
    const std::string what = std::string(c.logits) + " " + describe(p, kVocab, 0);
    const Kept kept = reference_kept(l, p);
    const Sampler s(p);
    ASSERT_EQ(ids_of(s.distribution(l, {})), kept.ids) << what;
    // Every CPU level the host has: v4 tests eight candidates' pruning at once.
    for (CpuLevel level : kAllCpuLevels) {
      if (!cpu_level_supported(level)) continue;
      ScopedCpuLevel scope(level);
      for (int i = 0; i < c.n_draws; ++i)
        ASSERT_EQ(s.sample_at(l, {}, {}, uint64_t(i)), brute_force_draw(l, kept, p.temperature, p.seed, uint64_t(i)))
            << what << " draw " << i << " at " << cpu_level_name(level);
    }
  }
  // Logits too large for the pruning's bound (l / T past 2^20), with ties: drawn in full.
  const std::vector<float> huge = {3e38f, -3e38f, 3e38f, 1e30f, 3e38f, -1e20f};
  SamplerParams p;
  p.temperature = 1e-3f;
  const Sampler s(p);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(s.sample_at(huge, {}, {}, uint64_t(i)), brute_force_draw(huge, reference_kept(huge, p), p.temperature, p.seed, uint64_t(i)));
}

TEST(Sampler, RecentCountsListTheWindowsIdsWithCountsById) {
  const std::vector<int32_t> history = {9, 4, 7, 4, 2, 9, 4, 11, 2};
  using Counts = std::vector<std::pair<int32_t, int32_t>>;
  EXPECT_EQ(recent_counts(history, 64), (Counts{{2, 2}, {4, 3}, {7, 1}, {9, 2}, {11, 1}}));
  EXPECT_EQ(recent_counts(history, 4), (Counts{{2, 1}, {4, 1}, {9, 1}, {11, 1}}));  // 9, 4, 11, 2
  EXPECT_EQ(recent_counts(history, 1), (Counts{{2, 1}}));
  EXPECT_EQ(recent_counts(history, 0), Counts{});
  EXPECT_EQ(recent_counts({}, 64), Counts{});
}

TEST(Sampler, TypicalPOutOfRangeIsRejectedNamingIt) {
  for (float bad : {0.0f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    SamplerParams p;
    p.typical_p = bad;
    try {
      Sampler{p};
      ADD_FAILURE() << "typical-p " << bad << " accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("typical-p"), std::string::npos) << e.what();
    }
  }
  for (float good : {1.0f, 0.5f, 1e-6f}) {
    SamplerParams p;
    p.typical_p = good;
    EXPECT_NO_THROW(Sampler{p});
  }
}

TEST(Sampler, OnlyTypicalPAtATemperatureNeedsTheHostSamplerAmongTheCuts) {
  SamplerParams p{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f, .logit_bias = {}};
  EXPECT_FALSE(needs_host_sampler(p));
  p.typical_p = 0.9f;
  EXPECT_TRUE(needs_host_sampler(p));
  p.temperature = 0.0f;  // greedy: no cut applies
  EXPECT_FALSE(needs_host_sampler(p));
  p.presence_penalty = 0.5f;
  EXPECT_TRUE(needs_host_sampler(p));
}

}  // namespace osprey
