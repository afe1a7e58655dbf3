#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "core/error.h"
#include "sample/sampler.h"

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
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  Sampler s(p);
  EXPECT_EQ(ids_of(s.distribution(kLogits, {})), (std::vector<int32_t>{1, 3, 5}));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_p = 0.8f;
  Sampler s(p);
  auto ref = softmax(kLogits, 1.0);
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

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.min_p = 0.3f;
  Sampler s(p);
  auto ref = softmax(kLogits, 1.0);
  double best = *std::max_element(ref.begin(), ref.end());
  std::vector<int32_t> expect;
  for (size_t i = 0; i < ref.size(); ++i)
    if (ref[i] >= 0.3 * best) expect.push_back(int32_t(i));
  EXPECT_EQ(ids_of(s.distribution(kLogits, {})), expect);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<int32_t> history = {1, 2, 1};
  std::vector<float> penalised = kLogits;
  penalised[1] = 3.0f / 2.0f;
  penalised[2] = -2.0f * 2.0f;
  auto ref = softmax(penalised, 1.0);
  for (auto& [id, prob] : s.distribution(kLogits, history)) EXPECT_NEAR(prob, ref[size_t(id)], 1e-6);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesSubtractPerSeenToken) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  // Token 1 seen twice, 2 once: l - (0.5 + c * 0.25), by hand.
  std::vector<int32_t> history = {1, 2, 1};
  std::vector<float> penalised = kLogits;
  penalised[1] = 3.0f - 1.0f;
  penalised[2] = -2.0f - 0.75f;
  auto ref = softmax(penalised, 1.0);
  for (auto& [id, prob] : s.distribution(kLogits, history)) EXPECT_NEAR(prob, ref[size_t(id)], 1e-6);
}

TEST(Sampler, PenaltiesLookOnlyAtTheLastNTokens) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.presence_penalty = 1.0f;
  p.repeat_last_n = 2;
  Sampler s(p);
  std::vector<int32_t> history = {5, 1, 3};  // 5 is outside the window
  std::vector<float> penalised = kLogits;
  penalised[1] -= 1.0f;
  penalised[3] -= 1.0f;
  auto ref = softmax(penalised, 1.0);
  for (auto& [id, prob] : s.distribution(kLogits, history)) EXPECT_NEAR(prob, ref[size_t(id)], 1e-6);
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

// The documented noise (backend/sample_noise.h), written again from its definition.
double reference_gumbel(uint64_t seed, uint64_t counter, uint64_t index) {
  auto mix = [](uint64_t z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t g = 0x9e3779b97f4a7c15ull;
  const uint64_t bits = mix(mix(seed ^ mix(counter + g)) + (index + 1) * g);
  const double u = (double(bits >> 12) + 0.5) / 4503599627370496.0;
  return -std::log(-std::log(u));
}

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
      const double key = double(kLogits[t]) / 0.7 + reference_gumbel(p.seed, i, t);
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
