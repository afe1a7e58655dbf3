// The device sampler (backend/cuda/sample.h) against a host reference that sorts the logits to
// find the kept set and redraws with its own copy of the noise definition; frequencies of a
// small known distribution; edge cases; and a timing report (disabled by default).
#ifdef OSPREY_WITH_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/sample.h"
#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "backend/readback.h"
#include "core/error.h"
#include "support/cuda_buffers.h"
#include "support/noise_reference.h"
#include "support/numeric.h"

namespace osprey {
namespace {


constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::DeviceVec;
using testing::st;
using testing::sync;

// ---- The reference -----------------------------------------------------------------------
using testing::reference_gumbel;  // support/noise_reference.h

struct Config {
  float t;
  int top_k;
  float top_p;
  float min_p;
};

std::string describe(const Config& c) {
  return "T=" + std::to_string(c.t) + " top_k=" + std::to_string(c.top_k) + " top_p=" + std::to_string(c.top_p) +
         " min_p=" + std::to_string(c.min_p);
}

// The non-NaN indices, largest logit first (ties in any order).
std::vector<int> sorted_by_value(const std::vector<float>& l) {
  std::vector<int> order;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i])) order.push_back(int(i));
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
  return order;
}

// How many of `order` (sorted) the cuts keep: top-k (keeping the logits tied with the k-th),
// then top-p over the top-k survivors by whole groups of equal logits, then min-p relative to
// the maximum. top_p and min_p are multiplied by p_scale and min_p_scale (to probe how stable
// the answer is).
size_t kept_length(const std::vector<float>& l, const std::vector<int>& order, const Config& c, double p_scale,
                   double min_p_scale) {
  auto at = [&](size_t k) { return double(l[size_t(order[k])]); };
  if (order.empty()) return 0;
  const double mx = at(0);
  size_t keep = order.size();
  if (c.top_k > 0 && size_t(c.top_k) < order.size()) {
    keep = size_t(c.top_k);
    while (keep < order.size() && at(keep) == at(size_t(c.top_k) - 1)) ++keep;
  }
  if (c.top_p < 1.0f) {
    std::vector<double> w(keep);
    double z = 0;
    for (size_t k = 0; k < keep; ++k) z += w[k] = at(k) == mx ? 1.0 : std::exp((at(k) - mx) / double(c.t));
    const double target = std::min(1.0, double(c.top_p) * p_scale) * z;
    double acc = 0;
    size_t k = 0;
    while (k < keep) {
      const double v = at(k);
      while (k < keep && at(k) == v) acc += w[k++];
      if (acc >= target) break;
    }
    keep = k;
  }
  if (c.min_p > 0.0f) {
    const double floor_ = double(c.t) * std::log(double(c.min_p) * min_p_scale);
    size_t k = 0;
    while (k < keep && (at(k) == mx || at(k) - mx >= floor_)) ++k;
    keep = k;
  }
  return keep;
}

// The reference token: Gumbel-max over the kept prefix of `order`, the lowest index winning a
// tie; -1 when the answer is fragile: it changes when top_p or min_p move by 1e-5 (relative),
// or the two best scores are within 1e-9 (f32 weights or logarithms one ulp apart may then
// legitimately pick another token).
int reference_token(const std::vector<float>& l, const std::vector<int>& order, const Config& c, uint64_t seed,
                    uint64_t counter) {
  const double e = 1e-5;
  const size_t lengths[] = {kept_length(l, order, c, 1, 1), kept_length(l, order, c, 1 - e, 1),
                            kept_length(l, order, c, 1 + e, 1), kept_length(l, order, c, 1, 1 - e),
                            kept_length(l, order, c, 1, 1 + e)};
  const size_t longest = *std::max_element(std::begin(lengths), std::end(lengths));
  // Scores in sorted order; the best over each prefix length.
  std::vector<int> best_at(longest + 1, -1);
  double best = -INFINITY, second = -INFINITY, second_at_nominal = INFINITY, best_at_nominal = -INFINITY;
  int token = -1;
  for (size_t k = 0; k < longest; ++k) {
    const int i = order[k];
    const double s = double(l[size_t(i)]) / double(c.t) + reference_gumbel(seed, counter, uint64_t(i));
    if (s > best || (s == best && i < token)) {
      second = best;
      best = s;
      token = i;
    } else if (s > second) {
      second = s;
    }
    best_at[k + 1] = token;
    if (k + 1 == lengths[0]) best_at_nominal = best, second_at_nominal = second;
  }
  const int nominal = best_at[lengths[0]];
  for (size_t n : lengths)
    if (best_at[n] != nominal) return -1;
  if (best_at_nominal - second_at_nominal < 1e-9) return -1;
  return nominal;
}

// ---- Helpers around the kernel -----------------------------------------------------------
cuda::SampleArgs args_of(const Config& c, uint64_t seed, uint64_t counter) {
  cuda::SampleArgs a;
  a.temperature = c.t;
  a.top_k = c.top_k;
  a.top_p = c.top_p;
  a.min_p = c.min_p;
  a.seed = seed;
  a.counter = counter;
  return a;
}

// Tokens for counters 0..n-1 (one launch sequence each, one download at the end).
std::vector<int32_t> draw_many(const float* d_logits, int64_t vocab, const Config& c, uint64_t seed, int n) {
  DeviceVec<int32_t> out(std::vector<int32_t>(size_t(n), -1));
  for (int k = 0; k < n; ++k) cuda::sample(d_logits, vocab, args_of(c, seed, uint64_t(k)), out.get() + k, st());
  return out.download();
}

int32_t draw_one(const float* d_logits, int64_t vocab, const cuda::SampleArgs& a) {
  DeviceVec<int32_t> out(std::vector<int32_t>{-1});
  cuda::sample(d_logits, vocab, a, out.get(), st());
  return out.download()[0];
}

int host_argmax(const std::vector<float>& l) {
  int best = -1;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i]) && (best < 0 || l[i] > l[size_t(best)])) best = int(i);
  return best;
}

enum class Shape { kFlat, kPeaked, kQuantized };

// kFlat: uniform in [-4, 4]. kPeaked: normal(0, 2) with 20 tokens lifted by 6..12, like a
// language model's logits. kQuantized: normal(0, 2) rounded to quarters, so every cut falls on
// a run of equal logits.
std::vector<float> make_logits(size_t n, Shape shape, std::mt19937& rng) {
  std::vector<float> l(n);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> flat(-4.0f, 4.0f), lift(6.0f, 12.0f);
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  for (auto& x : l) x = shape == Shape::kFlat ? flat(rng) : normal(rng);
  if (shape == Shape::kPeaked)
    for (int j = 0; j < 20; ++j) l[pick(rng)] += lift(rng);
  if (shape == Shape::kQuantized)
    for (auto& x : l) x = std::round(x * 4.0f) / 4.0f;
  return l;
}

const char* shape_name(Shape s) { return s == Shape::kFlat ? "flat" : s == Shape::kPeaked ? "peaked" : "quantized"; }

// ---- Tests -------------------------------------------------------------------------------

TEST(CudaSample, MatchesTheSortedReference) {
  SKIP_WITHOUT_CUDA();
  const Config configs[] = {
      {1.0f, 0, 1.0f, 0.0f},     {0.8f, 50, 1.0f, 0.0f},    {0.8f, 0, 0.95f, 0.0f}, {0.7f, 40, 0.9f, 0.0f},
      {1.3f, 0, 1.0f, 0.05f},    {0.6f, 1000, 0.8f, 0.02f}, {2.0f, 5000, 0.99f, 0.0f}, {0.5f, 0, 0.5f, 0.1f},
      {1.0f, 3, 1.0f, 0.0f},     {1.5f, 0, 0.3f, 0.0f},
  };
  const uint64_t counters[] = {0, 1, 77, 1234567};
  std::mt19937 rng(11);
  int checked = 0, fragile = 0;
  for (int64_t vocab : {1000, 50257, 128256}) {
    for (Shape shape : {Shape::kFlat, Shape::kPeaked, Shape::kQuantized}) {
      const auto logits = make_logits(size_t(vocab), shape, rng);
      const auto order = sorted_by_value(logits);
      DeviceVec<float> d(logits);
      for (size_t ci = 0; ci < std::size(configs); ++ci) {
        const uint64_t seed = 0x5eed0000ull + ci;
        for (uint64_t counter : counters) {
          const int ref = reference_token(logits, order, configs[ci], seed, counter);
          if (ref < 0) {
            ++fragile;
            continue;
          }
          ++checked;
          EXPECT_EQ(draw_one(d.get(), vocab, args_of(configs[ci], seed, counter)), ref)
              << "vocab " << vocab << ", " << shape_name(shape) << ", " << describe(configs[ci]) << ", counter "
              << counter;
        }
      }
    }
  }
  EXPECT_GT(checked, 20 * fragile) << checked << " checked, " << fragile << " too close to a cut to check";
}

TEST(CudaSample, FrequenciesFollowTheRenormalisedDistribution) {
  SKIP_WITHOUT_CUDA();
  // Probabilities by rank, placed on scattered ids.
  const double p[8] = {0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.04, 0.01};
  const int id[8] = {5, 2, 7, 0, 3, 6, 1, 4};
  std::vector<float> logits(8);
  for (int r = 0; r < 8; ++r) logits[size_t(id[r])] = float(std::log(p[r]) + 1.7);
  DeviceVec<float> d(logits);
  struct Case {
    Config c;
    int n_kept;  // the ranks the cuts keep, worked out by hand
  };
  const Case cases[] = {
      {{1.0f, 0, 1.0f, 0.0f}, 8},   // no cut
      {{1.0f, 5, 1.0f, 0.0f}, 5},   // top-k
      {{1.0f, 0, 0.6f, 0.0f}, 3},   // cumulative 0.3, 0.5, 0.65
      {{1.0f, 0, 1.0f, 0.3f}, 5},   // p >= 0.09
      {{2.0f, 4, 0.75f, 0.0f}, 3},  // sqrt(p) over 4 ranks: cumulative 0.317, 0.576, 0.800
  };
  const int n = 20000;
  for (const Case& cs : cases) {
    const auto tokens = draw_many(d.get(), 8, cs.c, 42, n);
    std::vector<int> count(8, 0);
    for (int32_t t : tokens) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 8);
      ++count[size_t(t)];
    }
    double z = 0;
    for (int r = 0; r < cs.n_kept; ++r) z += std::pow(p[r], 1.0 / cs.c.t);
    for (int r = 0; r < 8; ++r) {
      const int got = count[size_t(id[r])];
      if (r >= cs.n_kept) {
        EXPECT_EQ(got, 0) << describe(cs.c) << ": rank " << r << " is cut";
        continue;
      }
      const double q = std::pow(p[r], 1.0 / cs.c.t) / z;
      const double sigma = std::sqrt(n * q * (1 - q));
      EXPECT_NEAR(got, n * q, 5 * sigma + 1) << describe(cs.c) << ": rank " << r << " (q = " << q << ")";
    }
  }
}

TEST(CudaSample, TopKOfOneIsTheArgmax) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(3);
  const int64_t vocab = 50257;
  const auto logits = make_logits(size_t(vocab), Shape::kFlat, rng);
  DeviceVec<float> d(logits);
  DeviceVec<int32_t> am(std::vector<int32_t>{-1});
  cuda::argmax(d.get(), vocab, am.get(), st());
  const int expected = host_argmax(logits);
  ASSERT_EQ(am.download()[0], expected);
  for (float t : {0.3f, 1.0f, 5.0f}) {
    const auto tokens = draw_many(d.get(), vocab, {t, 1, 1.0f, 0.0f}, 9, 32);
    for (int32_t tok : tokens) EXPECT_EQ(tok, expected) << "T=" << t;
  }
}

TEST(CudaSample, TopKAtLeastTheVocabularyIsOff) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(4);
  for (int64_t vocab : {1000, 4099}) {
    auto logits = make_logits(size_t(vocab), Shape::kFlat, rng);
    logits[17] = kNaN;  // 999 non-NaN logits: top_k = 999 keeps all of them too
    DeviceVec<float> d(logits);
    const auto off = draw_many(d.get(), vocab, {1.0f, 0, 1.0f, 0.0f}, 5, 64);
    for (int k : {int(vocab) - 1, int(vocab), int(vocab) + 7, INT_MAX})
      EXPECT_EQ(draw_many(d.get(), vocab, {1.0f, k, 1.0f, 0.0f}, 5, 64), off) << "vocab " << vocab << " top_k " << k;
  }
}

TEST(CudaSample, TinyTopPKeepsOnlyTheMaximum) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  const int64_t vocab = 128256;
  const auto logits = make_logits(size_t(vocab), Shape::kFlat, rng);  // flat: the max alone is rarely drawn
  DeviceVec<float> d(logits);
  const int expected = host_argmax(logits);
  for (int32_t tok : draw_many(d.get(), vocab, {2.0f, 0, 1e-7f, 0.0f}, 6, 32)) EXPECT_EQ(tok, expected);
  int hits = 0;
  for (int32_t tok : draw_many(d.get(), vocab, {2.0f, 0, 1.0f, 0.0f}, 6, 32)) hits += tok == expected;
  EXPECT_LT(hits, 4) << "without the cut the maximum should rarely be drawn";
}

TEST(CudaSample, NaNLogitsAreNeverDrawn) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(6);
  const int64_t vocab = 10007;
  auto logits = make_logits(size_t(vocab), Shape::kPeaked, rng);
  for (size_t i = 0; i < logits.size(); i += 3) logits[i] = kNaN;  // index 0 included
  const auto order = sorted_by_value(logits);
  DeviceVec<float> d(logits);
  const Config configs[] = {{100.0f, 0, 1.0f, 0.0f}, {1.0f, 1, 1.0f, 0.0f}, {3.0f, 10, 0.9f, 0.0f},
                            {50.0f, 0, 0.99f, 0.001f}};
  for (const Config& c : configs) {
    const auto tokens = draw_many(d.get(), vocab, c, 7, 64);
    for (int k = 0; k < 64; ++k) {
      const int32_t tok = tokens[size_t(k)];
      ASSERT_TRUE(tok >= 0 && tok < vocab) << describe(c) << ": token " << tok;
      ASSERT_FALSE(std::isnan(logits[size_t(tok)])) << describe(c) << " drew NaN at " << tok;
      const int ref = reference_token(logits, order, c, 7, uint64_t(k));
      if (ref >= 0) {
        EXPECT_EQ(tokens[size_t(k)], ref) << describe(c) << ", counter " << k;
      }
    }
  }
  // One non-NaN logit among NaNs is always the answer.
  std::vector<float> lone(3000, kNaN);
  lone[2222] = -5.0f;
  DeviceVec<float> dl(lone);
  for (int32_t tok : draw_many(dl.get(), 3000, {1.0f, 5, 0.5f, 0.5f}, 8, 16)) EXPECT_EQ(tok, 2222);
}

TEST(CudaSample, VocabulariesOfAnySize) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  const Config configs[] = {{1.0f, 0, 1.0f, 0.0f}, {0.9f, 2, 1.0f, 0.0f}, {1.2f, 0, 0.7f, 0.0f},
                            {0.8f, 20, 0.9f, 0.1f}};
  for (int64_t vocab : {1, 2, 3, 31, 511, 2047, 2048, 2049, 4097, 100003}) {
    const auto logits = make_logits(size_t(vocab), Shape::kPeaked, rng);
    const auto order = sorted_by_value(logits);
    DeviceVec<float> d(logits);
    for (const Config& c : configs) {
      const auto tokens = draw_many(d.get(), vocab, c, 3, 8);
      for (int k = 0; k < 8; ++k) {
        const int ref = reference_token(logits, order, c, 3, uint64_t(k));
        if (ref >= 0) {
          EXPECT_EQ(tokens[size_t(k)], ref) << "vocab " << vocab << ", " << describe(c) << ", counter " << k;
        }
      }
    }
  }
}

TEST(CudaSample, LogitsTiedWithACutAreKept) {
  SKIP_WITHOUT_CUDA();
  // top_k = 2 cuts at the value 2, held by ids 1, 2 and 3: all three stay.
  std::vector<float> logits(300, -6.0f);
  logits[0] = 2.5f;
  logits[1] = logits[2] = logits[3] = 2.0f;
  DeviceVec<float> d(logits);
  std::vector<int> seen(logits.size(), 0);
  auto tally = [&](const std::vector<int32_t>& tokens) {
    for (int32_t tok : tokens) {
      ASSERT_TRUE(tok >= 0 && size_t(tok) < logits.size()) << "token " << tok;
      ++seen[size_t(tok)];
    }
  };
  tally(draw_many(d.get(), int64_t(logits.size()), {1.0f, 2, 1.0f, 0.0f}, 1, 2000));
  for (int i = 0; i < 4; ++i) EXPECT_GT(seen[size_t(i)], 100) << "id " << i;
  for (size_t i = 4; i < seen.size(); ++i) EXPECT_EQ(seen[i], 0) << "id " << i;
  // top_p = 0.5: the maximum alone has 0.35 of the mass, with the tied ids 0.98: the cut lands
  // on the tied value.
  std::fill(seen.begin(), seen.end(), 0);
  tally(draw_many(d.get(), int64_t(logits.size()), {1.0f, 0, 0.5f, 0.0f}, 1, 2000));
  for (int i = 0; i < 4; ++i) EXPECT_GT(seen[size_t(i)], 100) << "id " << i;
  for (size_t i = 4; i < seen.size(); ++i) EXPECT_EQ(seen[i], 0) << "id " << i;
}

// Cuts that fall between logits one ulp apart, deep in a Llama 3 sized vocabulary: every draw
// lies in the exact kept set and every member of it is drawn.
struct CutCase {
  std::vector<float> logits;
  Config c;
  std::vector<int> kept;  // sorted ids
};

std::vector<CutCase> ulp_cut_cases() {
  std::mt19937 rng(13);
  const size_t vocab = 128256;
  std::uniform_real_distribution<float> low(-30.0f, -20.0f);
  std::vector<float> background(vocab);
  for (auto& x : background) x = low(rng);
  std::vector<size_t> ids(vocab);
  for (size_t i = 0; i < vocab; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  // 100 logits 5, 5 + 1 ulp, ..., 5 + 99 ulps on scattered ids: near-equal weights, so each
  // kept one is drawn about as often as the others.
  std::vector<float> top(vocab);
  top = background;
  std::vector<float> value(100);
  value[0] = 5.0f;
  for (int r = 1; r < 100; ++r) value[size_t(r)] = std::nextafter(value[size_t(r) - 1], kInf);
  for (int r = 0; r < 100; ++r) top[ids[size_t(r)]] = value[size_t(r)];
  auto ids_of_ranks = [&](int from, int to) {  // ids holding value[from..to)
    std::vector<int> out;
    for (int r = from; r < to; ++r) out.push_back(int(ids[size_t(r)]));
    std::sort(out.begin(), out.end());
    return out;
  };
  std::vector<CutCase> cases;
  cases.push_back({top, {1.0f, 37, 1.0f, 0.0f}, ids_of_ranks(63, 100)});
  // top-p: the target sits 0.001 below the mass of the 37 largest (weights from a double loop).
  {
    double z = 0, top37 = 0;
    for (int r = 0; r < 100; ++r) {
      const double w = std::exp(double(value[size_t(r)]) - double(value[99]));
      z += w;
      if (r >= 63) top37 += w;
    }
    for (float x : background) z += std::exp(double(x) - double(value[99]));
    cases.push_back({top, {1.0f, 0, float((top37 - 0.001) / z), 0.0f}, ids_of_ranks(63, 100)});
    // The same cut over the top-60 set.
    double z60 = 0;
    for (int r = 40; r < 100; ++r) z60 += std::exp(double(value[size_t(r)]) - double(value[99]));
    cases.push_back({top, {1.0f, 60, float((top37 - 0.001) / z60), 0.0f}, ids_of_ranks(63, 100)});
  }
  // min-p: the maximum 0, and 40 logits within 20 ulps of log(0.1) on either side.
  {
    std::vector<float> l = background;
    l[ids[0]] = 0.0f;
    const float cut = float(std::log(0.1));
    float x = cut;
    for (int k = 0; k < 20; ++k) x = std::nextafter(x, -kInf);
    CutCase cs{l, {1.0f, 0, 1.0f, 0.1f}, {int(ids[0])}};
    for (int k = 1; k <= 40; ++k) {
      cs.logits[ids[size_t(k)]] = x;
      if (double(x) - 0.0 >= 1.0 * std::log(double(0.1f))) cs.kept.push_back(int(ids[size_t(k)]));
      x = std::nextafter(x, kInf);
    }
    std::sort(cs.kept.begin(), cs.kept.end());
    cases.push_back(cs);
  }
  return cases;
}

TEST(CudaSample, CutsResolveLogitsOneUlpApart) {
  SKIP_WITHOUT_CUDA();
  for (const CutCase& cs : ulp_cut_cases()) {
    ASSERT_GE(cs.kept.size(), 10u);
    ASSERT_LE(cs.kept.size(), 40u);
    DeviceVec<float> d(cs.logits);
    std::vector<int> drawn;
    for (int32_t tok : draw_many(d.get(), int64_t(cs.logits.size()), cs.c, 4, 3000)) {
      ASSERT_TRUE(tok >= 0 && size_t(tok) < cs.logits.size()) << describe(cs.c) << ": token " << tok;
      EXPECT_TRUE(std::binary_search(cs.kept.begin(), cs.kept.end(), int(tok)))
          << describe(cs.c) << ": drew " << tok << " (logit " << cs.logits[size_t(tok)] << ")";
      drawn.push_back(tok);
    }
    std::sort(drawn.begin(), drawn.end());
    drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
    EXPECT_EQ(drawn, cs.kept) << describe(cs.c);
  }
}

TEST(CudaSample, InfiniteLogits) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(8);
  const Config configs[] = {{1.0f, 0, 1.0f, 0.0f}, {1.0f, 1, 1.0f, 0.0f}, {1.0f, 0, 0.5f, 0.0f},
                            {1.0f, 0, 1.0f, 0.2f}};
  // +inf wins, the lowest-index one among several.
  auto logits = make_logits(5000, Shape::kFlat, rng);
  logits[4321] = logits[1234] = kInf;
  logits[0] = kNaN;
  DeviceVec<float> d(logits);
  for (const Config& c : configs)
    for (int32_t tok : draw_many(d.get(), 5000, c, 2, 8)) EXPECT_EQ(tok, 1234) << describe(c);
  // -inf is never drawn while a finite logit exists.
  std::vector<float> low(5000, -kInf);
  low[4000] = 1.0f;
  low[4001] = 1.5f;
  DeviceVec<float> dlow(low);
  for (const Config& c : configs)
    for (int32_t tok : draw_many(dlow.get(), 5000, c, 2, 32)) EXPECT_TRUE(tok == 4000 || tok == 4001) << describe(c);
  // Nothing above -inf: the lowest-index -inf; only NaN: 0.
  std::vector<float> none(5000, -kInf);
  none[0] = none[1] = kNaN;
  DeviceVec<float> dnone(none);
  for (const Config& c : configs)
    for (int32_t tok : draw_many(dnone.get(), 5000, c, 2, 4)) EXPECT_EQ(tok, 2) << describe(c);
  DeviceVec<float> dnan(std::vector<float>(5000, kNaN));
  for (const Config& c : configs)
    for (int32_t tok : draw_many(dnan.get(), 5000, c, 2, 4)) EXPECT_EQ(tok, 0) << describe(c);
}

// Logits holding a NaN or an Inf set the device's non-finite flag; the token readback returns
// it as kNonFiniteLogits and clears it, while the token written on the device stays a valid id
// (a pipelined step reads it). Finite logits leave the flag clear. Greedy and drawn.
TEST(CudaSample, NonFiniteLogitsAreFlaggedToTheReadback) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(21);
  const int64_t vocab = 5000;
  const std::vector<float> finite = make_logits(size_t(vocab), Shape::kPeaked, rng);
  auto with_nan = finite, with_inf = finite, last_nan = finite;
  with_nan[123] = kNaN;
  with_inf[17] = -kInf;
  last_nan[size_t(vocab - 1)] = kNaN;  // in the last, partial chunk
  const Device dev = Device::cuda(0);
  TokenReadback readback(dev, 2);
  Array out = Array::empty({1}, DType::i32, dev);
  ops::DeviceSampling greedy, drawn, filtered;
  drawn.temperature = 1.0f;
  filtered.temperature = 0.8f;
  filtered.top_k = 40;
  filtered.top_p = 0.9f;
  filtered.min_p = 0.05f;
  int k = 0;
  for (const ops::DeviceSampling& p : {greedy, drawn, filtered}) {
    for (const auto& [logits, bad] : std::vector<std::pair<std::vector<float>, bool>>{
             {finite, false}, {with_nan, true}, {finite, false}, {with_inf, true}, {last_nan, true}, {finite, false}}) {
      Array host = Array::empty({1, vocab}, DType::f32);
      std::copy(logits.begin(), logits.end(), host.data<float>());
      const Array d = ops::to_device(host, dev);
      ops::sample_into(d, p, uint64_t(k), out);
      readback.enqueue(out, k % 2);
      const int32_t got = readback.wait(k % 2);
      const int32_t token = ops::to_device(out, Device::cpu()).data<int32_t>()[0];
      EXPECT_TRUE(token >= 0 && token < vocab) << "temperature " << p.temperature << ": token " << token;
      if (bad)
        EXPECT_EQ(got, kNonFiniteLogits) << "temperature " << p.temperature << ", case " << k;
      else
        EXPECT_EQ(got, token) << "temperature " << p.temperature << ", case " << k;
      ++k;
    }
  }
}

TEST(CudaSample, RepeatedCallsGiveTheSameToken) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(9);
  const int64_t vocab = 128256;
  const auto logits = make_logits(size_t(vocab), Shape::kFlat, rng);
  DeviceVec<float> d(logits);
  for (const Config& c : {Config{1.0f, 0, 0.9f, 0.0f}, Config{0.7f, 3000, 0.95f, 0.01f}}) {
    const auto first = draw_many(d.get(), vocab, c, 12, 16);
    for (int rep = 0; rep < 5; ++rep) EXPECT_EQ(draw_many(d.get(), vocab, c, 12, 16), first) << describe(c);
    std::vector<int32_t> other_seed = draw_many(d.get(), vocab, c, 13, 16);
    EXPECT_NE(other_seed, first) << "the seed should change the draws";
  }
}

TEST(CudaSample, DeviceCounterInACapturedGraph) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(10);
  const int64_t vocab = 50257;
  const auto logits = make_logits(size_t(vocab), Shape::kPeaked, rng);
  DeviceVec<float> d(logits);
  DeviceVec<uint64_t> counter(std::vector<uint64_t>{0});
  DeviceVec<int32_t> out(std::vector<int32_t>{-1});
  const Config c{1.5f, 100, 0.95f, 0.0f};
  cuda::SampleArgs a = args_of(c, 21, 999);
  a.counter_dev = counter.get();
  cuda::scratch(cuda::sample_scratch_bytes(vocab));
  sync();
  cudaGraph_t graph = nullptr;
  OSPREY_CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
  cuda::sample(d.get(), vocab, a, out.get(), st());
  OSPREY_CUDA_CHECK(cudaStreamEndCapture(st(), &graph));
  cudaGraphExec_t exec = nullptr;
  OSPREY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t k = 0; k < 12; ++k) {
    OSPREY_CUDA_CHECK(cudaMemcpyAsync(counter.get(), &k, sizeof(k), cudaMemcpyHostToDevice, st()));
    OSPREY_CUDA_CHECK(cudaGraphLaunch(exec, st()));
    const int32_t replayed = out.download()[0];
    EXPECT_EQ(replayed, draw_one(d.get(), vocab, args_of(c, 21, k))) << "counter " << k;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(CudaSample, RejectsArgumentsOutOfRange) {
  // Checked on the host before any device work, so no device is needed.
  auto call = [](int64_t vocab, const Config& c) { cuda::sample(nullptr, vocab, args_of(c, 0, 0), nullptr, nullptr); };
  EXPECT_THROW(call(100, {0.0f, 0, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {-1.0f, 0, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {kNaN, 0, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {kInf, 0, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {1.0f, -1, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {1.0f, 0, 0.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {1.0f, 0, 1.5f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(100, {1.0f, 0, 1.0f, 1.0f}), InvalidInput);
  EXPECT_THROW(call(100, {1.0f, 0, 1.0f, -0.1f}), InvalidInput);
  EXPECT_THROW(call(0, {1.0f, 0, 1.0f, 0.0f}), InvalidInput);
  EXPECT_THROW(call(cuda::kSampleMaxVocab + 1, {1.0f, 0, 1.0f, 0.0f}), Unsupported);
  try {
    call(100, {1.0f, 0, 2.0f, 0.0f});
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
}

// Microseconds per sample() call for a Llama 3 vocabulary: the median over 100 calls, each
// timed alone with CUDA events, and the mean over 100 back-to-back calls.
TEST(CudaSample, DISABLED_SampleSpeed) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(12);
  const int64_t vocab = 128256;
  const auto logits = make_logits(size_t(vocab), Shape::kPeaked, rng);
  DeviceVec<float> d(logits);
  DeviceVec<int32_t> out(std::vector<int32_t>{-1});
  cudaEvent_t e0, e1;
  OSPREY_CUDA_CHECK(cudaEventCreate(&e0));
  OSPREY_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_of = [&](const std::function<void(uint64_t)>& fn, const char* what) {
    for (uint64_t k = 0; k < 10; ++k) fn(k);
    sync();
    std::vector<float> us(100);
    for (int k = 0; k < 100; ++k) {
      OSPREY_CUDA_CHECK(cudaEventRecord(e0, st()));
      fn(uint64_t(k));
      OSPREY_CUDA_CHECK(cudaEventRecord(e1, st()));
      OSPREY_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      OSPREY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      us[size_t(k)] = ms * 1000.0f;
    }
    std::sort(us.begin(), us.end());
    OSPREY_CUDA_CHECK(cudaEventRecord(e0, st()));
    for (int k = 0; k < 100; ++k) fn(uint64_t(k));
    OSPREY_CUDA_CHECK(cudaEventRecord(e1, st()));
    OSPREY_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    OSPREY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("SampleSpeed vocab %lld %-34s median %7.1f us (p10 %6.1f, p90 %6.1f), back-to-back %7.1f us/call\n",
                (long long)vocab, what, us[50], us[10], us[90], ms * 10.0f);
  };
  time_of([&](uint64_t) { cuda::argmax(d.get(), vocab, out.get(), st()); }, "argmax");
  const Config configs[] = {{0.8f, 50, 1.0f, 0.0f}, {0.8f, 0, 0.95f, 0.0f}, {0.8f, 0, 1.0f, 0.0f},
                            {0.8f, 0, 1.0f, 0.05f}, {0.8f, 40, 0.95f, 0.0f}};
  for (const Config& c : configs) {
    const std::string what = describe(c);
    time_of([&](uint64_t k) { cuda::sample(d.get(), vocab, args_of(c, 1, k), out.get(), st()); }, what.c_str());
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace osprey

#endif  // OSPREY_WITH_CUDA
