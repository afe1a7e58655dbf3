#include "sample/sampler.h"
#include "sample/sampler_fields.h"

#include <math.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu_level.h"
#include "backend/sample_noise.h"
#include "core/error.h"

namespace osprey {
namespace {

constexpr size_t kBlock = 64;         // tokens per entry of block_max_
constexpr int kHeapTopK = 4096;       // a larger top-k selects by histogram
constexpr size_t kBuckets = 2048;     // cut_by_mass's histogram
constexpr size_t kSortedCut = 256;    // cut_by_mass sorts at most this many items
// Top-p over the vocabulary weighs the tokens with x = (l - max) / T above this first.
constexpr double kTopPFirstX = -8.0;
// x = (l - max) / T below which a weight is under 2^-40 (-40 ln 2).
constexpr double kLightX = -27.725887222397812;
// The draw skips a token when 1 - u > w * exp(max / T - best) times this: the slack covers the
// float weight's error (< 2e-5 relative) and the rounding of the keys.
constexpr double kPruneSlack = 1.0 + 0x1p-10;
// Keys at or above this magnitude (l / T) have too coarse an ulp for the slack: no pruning.
constexpr double kPruneKeyLimit = 0x1p20;

// Four floats (SSE2, NEON): GCC's vector extensions, lowered to the baseline instruction set.
using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int32_t __attribute__((vector_size(16)));

f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store4(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }
f32x4 splat(float x) { return f32x4{x, x, x, x}; }
f32x4 select4(i32x4 mask, f32x4 a, f32x4 b) { return (f32x4)((mask & (i32x4)a) | (~mask & (i32x4)b)); }
f32x4 max4(f32x4 a, f32x4 b) { return select4(a > b, a, b); }
f32x4 min4(f32x4 a, f32x4 b) { return select4(a < b, a, b); }
float hmax(f32x4 v) { return std::max(std::max(v[0], v[1]), std::max(v[2], v[3])); }
float hmin(f32x4 v) { return std::min(std::min(v[0], v[1]), std::min(v[2], v[3])); }
// Lanes holding a NaN or an Inf: all exponent bits set.
i32x4 non_finite4(f32x4 v) { return ((i32x4)v & 0x7f800000) == 0x7f800000; }

// exp(x) for x <= 0 (0 below -87, where expf leaves the normal range), within 1e-7 relative:
// Cody-Waite reduction by ln 2 and Cephes' degree-5 polynomial. Every weight of the sampler
// comes from here, so that equal logits always weigh the same. NOTE: the baseline x86-64 build
// has no FMA to contract its products into, so every inlined copy rounds alike.
f32x4 exp4(f32x4 x) {
  const i32x4 under = x < -87.0f;
  x = select4(under, splat(-87.0f), x);
  const float round = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const f32x4 k = (x * 1.44269504088896341f + round) - round;
  f32x4 r = x - k * 0.693145751953125f;  // ln 2 split in a short high part and the rest
  r = r - k * 1.428606765330187045e-6f;
  f32x4 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i32x4 scaled = (i32x4)p + (__builtin_convertvector(k, i32x4) << 23);
  return (f32x4)(scaled & ~under);
}

// w[i] = exp((l[i] - max) * inv_t), i < n.
void weights(const float* l, float* w, size_t n, float max, float inv_t) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) store4(w + i, exp4((load4(l + i) - max) * inv_t));
  if (i < n) {
    float tail[4] = {max, max, max, max};
    std::copy(l + i, l + n, tail);
    const f32x4 v = exp4((load4(tail) - max) * inv_t);
    for (size_t j = 0; i + j < n; ++j) w[i + j] = v[j];
  }
}

// An upper bound of exp(x) for x <= 0, within a factor kBoundSpread of it (Schraudolph's
// trick: the float whose bits are x / ln 2 * 2^23 + 127 * 2^23 interpolates 2^(x / ln 2)
// linearly between powers of two, a chord above the convex curve), for a few operations.
// Its own rounding is below 1e-5 relative, which kBoundSlack covers.
constexpr double kBoundSpread = 1.0615;  // max over f in [0, 1] of (1 + f) / 2^f, rounded up
constexpr double kBoundSlack = 1e-4;
f32x4 exp_bound4(f32x4 x) {
  x = select4(x < -87.0f, splat(-87.0f), x);
  const f32x4 y = x * 12102203.16156148f + 1065353216.0f;  // 2^23 / ln 2, 127 * 2^23
  return (f32x4)__builtin_convertvector(y, i32x4);
}

// The largest float <= v (-FLT_MAX at least, so that banned tokens, -inf, stay out).
float float_at_most(double v) {
  if (!(v > -double(FLT_MAX))) return -FLT_MAX;
  float f = float(v);
  if (double(f) > v) f = std::nextafter(f, -INFINITY);
  return f;
}

bool penalties_on(const SamplerParams& p) {
  return p.repeat_last_n > 0 &&
         (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

// The last `repeat_last_n` ids of `history`, sorted, into `ids`.
void sorted_window(std::span<const int32_t> history, int repeat_last_n, std::vector<int32_t>& ids) {
  const size_t n = std::min(history.size(), size_t(std::max(repeat_last_n, 0)));
  ids.assign(history.end() - long(n), history.end());
  std::sort(ids.begin(), ids.end());
}

// Calls f(id, count) for each run of equal ids in sorted `ids`.
template <class F>
void for_each_count(const std::vector<int32_t>& ids, F f) {
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    f(ids[i], int32_t(j - i));
    i = j;
  }
}

}  // namespace

void validate(const SamplerParams& p) {
  auto bad = [](const std::string& what) { throw InvalidInput(what); };
  for (const SamplerField& f : sampler_fields())
    if (!f.accepts(f.get(p)))
      bad(std::string(f.key) + " (" + (f.flag + 2) + ") must be in " + f.range_text() + ", got " + std::to_string(f.get(p)));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) bad("logit bias: token id " + std::to_string(id) + " is negative");
    if (!(bias >= -100.0f && bias <= 100.0f)) bad("logit bias of token " + std::to_string(id) + " must be in [-100, 100]");
  }
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

bool uses_history(const SamplerParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         !p.logit_bias.empty();
}

bool needs_host_sampler(const SamplerParams& p) {
  return uses_history(p) || (p.temperature > 0.0f && p.typical_p < 1.0f);
}

std::vector<std::pair<int32_t, int32_t>> recent_counts(std::span<const int32_t> history, int repeat_last_n) {
  std::vector<int32_t> ids;
  sorted_window(history, repeat_last_n, ids);
  std::vector<std::pair<int32_t, int32_t>> counts;
  for_each_count(ids, [&](int32_t id, int32_t c) { counts.emplace_back(id, c); });
  return counts;
}

void throw_non_finite(std::span<const float> logits) {
  size_t n_bad = 0, first = logits.size();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i])) {
      if (first == logits.size()) first = i;
      ++n_bad;
    }
  throw InvalidInput(non_finite_logits_message(std::to_string(n_bad) + " of " + std::to_string(logits.size()) +
                                               " are NaN or Inf, the first " +
                                               (std::isnan(logits[first]) ? "NaN" : "Inf") + " for token id " +
                                               std::to_string(first)));
}

std::string non_finite_logits_message(const std::string& detail) {
  return "the model computed non-finite logits (" + detail +
         "): the checkpoint's weights or its config values (such as rms_norm_eps) are broken";
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

Sampler::Sampler(const SamplerParams& params) : params_(params) { validate(params); }

// The max of l[0, n), each block's max into block_max_, and in `finite` whether every value
// is finite (a NaN does not disturb the max's search, only that answer).
float Sampler::scan_max(const float* l, size_t n, bool& finite) const {
  block_max_.resize((n + kBlock - 1) / kBlock);
  f32x4 all = splat(-INFINITY);
  i32x4 bad = {0, 0, 0, 0};
  size_t b = 0;
  for (; (b + 1) * kBlock <= n; ++b) {
    const float* p = l + b * kBlock;
    f32x4 m = load4(p);
    bad |= non_finite4(m);
    for (size_t j = 4; j < kBlock; j += 4) {
      const f32x4 v = load4(p + j);
      bad |= non_finite4(v);
      m = max4(m, v);
    }
    block_max_[b] = hmax(m);
    all = max4(all, m);
  }
  float best = hmax(all);
  finite = !(bad[0] | bad[1] | bad[2] | bad[3]);
  if (b * kBlock < n) {
    float m = -INFINITY;
    for (size_t i = b * kBlock; i < n; ++i) {
      finite &= std::isfinite(l[i]);
      m = std::max(m, l[i]);
    }
    block_max_[b] = m;
    best = std::max(best, m);
  }
  return best;
}

// The lowest id whose logit is `max`.
int32_t Sampler::first_max(const float* l, size_t n, float max) const {
  for (size_t b = 0; b < block_max_.size(); ++b) {
    if (block_max_[b] != max) continue;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
      if (l[i] == max) return int32_t(i);
  }
  return 0;  // not reached: some block holds the max
}

// Steps 1-3 and the max: `logits` itself when no step changes a logit, else work_ (the copy
// checks every input logit is finite on the way).
const float* Sampler::adjust(std::span<const float> logits, std::span<const int32_t> history,
                             std::span<const uint64_t> allowed, float& max) const {
  const size_t n = logits.size();
  if (n == 0) throw InvalidInput("the sampler got no logits (an empty vocabulary)");
  const bool penalties = penalties_on(params_) && !history.empty();
  bool finite = true;
  if (allowed.empty() && params_.logit_bias.empty() && !penalties) {
    max = scan_max(logits.data(), n, finite);
    if (!finite) throw_non_finite(logits);
    return logits.data();
  }
  work_.resize(n);
  float* l = work_.data();
  {
    i32x4 bad = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const f32x4 v = load4(logits.data() + i);
      bad |= non_finite4(v);
      store4(l + i, v);
    }
    for (; i < n; ++i) finite &= std::isfinite(l[i] = logits[i]);
    if (!finite || (bad[0] | bad[1] | bad[2] | bad[3])) throw_non_finite(logits);
  }
  const char* none_left = "logit bias bans every token";
  if (!allowed.empty()) {
    // Ids past the mask (a model's padded rows beyond the tokenizer's vocabulary) are banned.
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
      if (bits == ~uint64_t(0)) continue;
      for (size_t i = w * 64; i < std::min(n, w * 64 + 64); ++i)
        if (!((bits >> (i & 63)) & 1)) l[i] = -INFINITY;
    }
    none_left = "the grammar and the logit bias leave no token to choose";
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (size_t(id) >= n)
      throw InvalidInput("logit bias: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(n) + ")");
    l[size_t(id)] = bias <= -100.0f ? -INFINITY : l[size_t(id)] + bias;
  }
  if (penalties) {
    sorted_window(history, params_.repeat_last_n, recent_);
    for_each_count(recent_, [&](int32_t id, int32_t count) {
      if (id < 0 || size_t(id) >= n) return;
      float& v = l[size_t(id)];
      if (params_.repetition_penalty != 1.0f) v = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
      v -= params_.presence_penalty + float(count) * params_.frequency_penalty;
    });
  }
  max = scan_max(l, n, finite);
  if (max == -INFINITY) throw InvalidInput(none_left);
  return l;
}

// Step 5 for k <= kHeapTopK: the k-th largest finite logit (counting repeats) into `out`, by a
// min-heap of the k largest seen, skipping the blocks whose max cannot enter it. False when
// fewer than k logits are finite (top-k keeps them all).
bool Sampler::kth_largest(const float* l, size_t n, float& out) const {
  const size_t k = size_t(params_.top_k);
  const std::greater<float> above;
  heap_.clear();
  heap_.reserve(k);
  for (size_t b = 0; b < block_max_.size(); ++b) {
    if (heap_.size() == k && !(block_max_[b] > heap_.front())) continue;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float v = l[i];
      if (v == -INFINITY) continue;
      if (heap_.size() < k) {
        heap_.push_back(v);
        std::push_heap(heap_.begin(), heap_.end(), above);
      } else if (v > heap_.front()) {
        std::pop_heap(heap_.begin(), heap_.end(), above);
        heap_.back() = v;
        std::push_heap(heap_.begin(), heap_.end(), above);
      }
    }
  }
  if (heap_.size() < k) return false;
  out = heap_.front();
  return true;
}

// The sum of the weights exp((l - max) * inv_t) over l[0, n). NOTE: a block of 64 whose max
// weighs under 2^-40 counts as zero mass (the contract allows it); on peaked logits that
// skips most of the vocabulary's exponentials.
double Sampler::heavy_mass(const float* l, size_t n, float max, float inv_t) const {
  const float light = float_at_most(double(max) + kLightX * double(params_.temperature));
  double total = 0;
  float tail[kBlock];
  for (size_t b = 0; b < block_max_.size(); ++b) {
    if (block_max_[b] < light) continue;
    const float* p = l + b * kBlock;
    if ((b + 1) * kBlock <= n) {
      f32x4 acc = exp4((load4(p) - max) * inv_t);
      for (size_t j = 4; j < kBlock; j += 4) acc += exp4((load4(p + j) - max) * inv_t);
      total += double(acc[0]) + double(acc[1]) + double(acc[2]) + double(acc[3]);
    } else {
      const size_t m = n - b * kBlock;
      weights(p, tail, m, max, inv_t);
      for (size_t j = 0; j < m; ++j) total += double(tail[j]);
    }
  }
  return total;
}

// Bounds of the mass of the tokens with l < lo (light blocks count zero, as in heavy_mass),
// from exp_bound4: a pass of a few operations per token, no exponential.
void Sampler::tail_mass_bounds(const float* l, size_t n, float max, float inv_t, float lo, double& low,
                               double& high) const {
  const float light = float_at_most(double(max) + kLightX * double(params_.temperature));
  double total = 0;
  for (size_t b = 0; b < block_max_.size(); ++b) {
    if (block_max_[b] < light) continue;
    const float* p = l + b * kBlock;
    f32x4 acc = splat(0.0f);
    if ((b + 1) * kBlock <= n) {
      for (size_t j = 0; j < kBlock; j += 4) {
        const f32x4 v = load4(p + j);
        acc += select4(v < lo, exp_bound4((v - max) * inv_t), splat(0.0f));
      }
    } else {
      for (size_t j = 0; b * kBlock + j < n; ++j) {
        const f32x4 v = splat(p[j]);
        acc[0] += select4(v < lo, exp_bound4((v - max) * inv_t), splat(0.0f))[0];
      }
    }
    total += double(acc[0]) + double(acc[1]) + double(acc[2]) + double(acc[3]);
  }
  high = total * (1.0 + kBoundSlack);
  low = total / kBoundSpread * (1.0 - kBoundSlack);
}

// The candidates: every i with l[i] >= lo (lo >= -FLT_MAX, so no banned token), ascending.
void Sampler::gather(const float* l, size_t n, float lo) const {
  if (cand_id_.size() < n) {  // once per vocabulary size: every scratch of the cuts at its largest
    cand_id_.resize(n);
    cand_l_.resize(n);
    cand_w_.resize(n);
    cand_key_.resize(n);
    for (int i = 0; i < 2; ++i) level_key_[i].resize(n), level_mass_[i].resize(n);
    sorted_.reserve(kSortedCut);
    hist_.reserve(kBuckets);
  }
  size_t m = 0;
  for (size_t b = 0; b < block_max_.size(); ++b) {
    if (block_max_[b] < lo) continue;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float v = l[i];
      cand_id_[m] = int32_t(i);
      cand_l_[m] = v;
      m += v >= lo;
    }
  }
  n_cand_ = m;
}

void Sampler::weigh(float max, float inv_t) const { weights(cand_l_.data(), cand_w_.data(), n_cand_, max, inv_t); }

// Keeps the candidates whose cand_key_ is >= v, in order.
void Sampler::keep_key_at_least(float v) const {
  size_t m = 0;
  for (size_t i = 0; i < n_cand_; ++i) {
    if (!(cand_key_[i] >= v)) continue;
    cand_id_[m] = cand_id_[i];
    cand_l_[m] = cand_l_[i];
    cand_w_[m] = cand_w_[i];
    ++m;
  }
  n_cand_ = m;
}

// Over items (key[i], mass[i] >= 0) with finite keys: the largest key value v such that
// sum{mass[i] : key[i] >= v} >= target (the smallest key if rounding leaves the masses short
// of it). A histogram of the masses over the keys' range finds the bucket where the mass
// crosses the target; its items are refined again (each round drops the range's min or
// max, so it ends), and sorted once few.
float Sampler::cut_by_mass(std::span<const float> key, std::span<const float> mass, double target) const {
  const float* k = key.data();
  const float* m = mass.data();
  size_t n = key.size();
  for (int level = 0;; ++level) {
    if (n <= kSortedCut) {
      sorted_.resize(n);
      for (size_t i = 0; i < n; ++i) sorted_[i] = {k[i], m[i]};
      std::sort(sorted_.begin(), sorted_.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      double acc = 0;
      for (size_t i = 0; i < n;) {
        const float v = sorted_[i].first;
        for (; i < n && sorted_[i].first == v; ++i) acc += double(sorted_[i].second);
        if (acc >= target) return v;
      }
      return sorted_.back().first;
    }
    f32x4 hi4 = load4(k), lo4 = hi4;
    size_t i = 4;
    for (; i + 4 <= n; i += 4) {
      const f32x4 v = load4(k + i);
      hi4 = max4(hi4, v);
      lo4 = min4(lo4, v);
    }
    float hi = hmax(hi4), lo = hmin(lo4);
    for (; i < n; ++i) hi = std::max(hi, k[i]), lo = std::min(lo, k[i]);
    if (hi == lo) return hi;
    const double top = hi, scale = double(kBuckets) / (double(hi) - double(lo));
    auto bucket = [&](float v) { return std::min(size_t((top - double(v)) * scale), kBuckets - 1); };
    hist_.assign(kBuckets, 0.0);
    for (i = 0; i < n; ++i) hist_[bucket(k[i])] += double(m[i]);
    size_t cut = 0;
    double above = 0;
    for (; cut + 1 < kBuckets && above + hist_[cut] < target; ++cut) above += hist_[cut];
    std::vector<float>& next_k = level_key_[level & 1];  // as long as the candidates (gather)
    std::vector<float>& next_m = level_mass_[level & 1];
    size_t c = 0;
    for (i = 0; i < n; ++i) {
      if (bucket(k[i]) != cut) continue;
      next_k[c] = k[i];
      next_m[c] = m[i];
      ++c;
    }
    k = next_k.data();
    m = next_m.data();
    n = c;
    target -= above;
  }
}

// Steps 1-8. Greedy decoding: returns the token. Else leaves the kept set in the candidates
// (n_cand_ of them, ascending ids, with their weights) and returns -1. `max`: the adjusted
// logits' max.
int32_t Sampler::chain(std::span<const float> logits, std::span<const int32_t> history,
                       std::span<const uint64_t> allowed, float& max) const {
  const float* l = adjust(logits, history, allowed, max);
  const size_t n = logits.size();
  if (params_.temperature <= 0.0f) return first_max(l, n, max);
  const double t = params_.temperature;
  const float inv_t = float(std::min(1.0 / t, double(FLT_MAX)));
  // The kept set so far: the finite l >= lo, or the candidates once `listed`.
  float lo = -FLT_MAX;
  bool listed = false;
  auto list = [&] {
    if (listed) return;
    gather(l, n, lo);
    weigh(max, inv_t);
    listed = true;
  };
  auto keys_are_logits = [&] { std::copy(cand_l_.begin(), cand_l_.begin() + long(n_cand_), cand_key_.begin()); };

  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    if (params_.top_k <= kHeapTopK) {
      kth_largest(l, n, lo);
    } else {
      list();
      if (n_cand_ > size_t(params_.top_k)) {
        keys_are_logits();
        std::fill(cand_w_.begin(), cand_w_.begin() + long(n_cand_), 1.0f);
        lo = cut_by_mass({cand_key_.data(), n_cand_}, {cand_w_.data(), n_cand_}, double(params_.top_k));
        keep_key_at_least(lo);
        weigh(max, inv_t);
      }
    }
  }
  if (params_.top_p < 1.0f) {
    const double p = params_.top_p;
    auto cut_at = [&](double target) {
      return cut_by_mass({cand_key_.data(), n_cand_}, {cand_w_.data(), n_cand_}, target);
    };
    if (listed || lo > -FLT_MAX) {
      list();
      double total = 0;
      for (size_t i = 0; i < n_cand_; ++i) total += double(cand_w_[i]);
      keys_are_logits();
      keep_key_at_least(cut_at(p * total));
    } else {
      // Over the whole vocabulary. First the tokens with x >= kTopPFirstX, weighed, and bounds
      // of the rest's mass: when every total within the bounds puts the cut at one value among
      // the weighed tokens, that is the cut, and no other token's exponential is needed.
      lo = float_at_most(double(max) + t * kTopPFirstX);
      double rest_low = 0, rest_high = 0;
      tail_mass_bounds(l, n, max, inv_t, lo, rest_low, rest_high);
      list();
      double weighed = 0;
      for (size_t i = 0; i < n_cand_; ++i) weighed += double(cand_w_[i]);
      keys_are_logits();
      bool cut = false;
      if (weighed >= p * (weighed + rest_high)) {
        const float v = cut_at(p * (weighed + rest_low));
        if (rest_high == 0 || cut_at(p * (weighed + rest_high)) == v) {
          keep_key_at_least(v);
          cut = true;
        }
      }
      if (!cut) {
        // The exact total. The tokens under x_pre hold at most n * exp(x_pre), half of the
        // 1 - top_p of the mass that the cut leaves out, so the cut lies above them.
        const double total = heavy_mass(l, n, max, inv_t);
        const double x_pre = std::log(0.5 * (1.0 - p) * total / double(n));
        lo = float_at_most(double(max) + t * x_pre);
        listed = false;
        list();
        keys_are_logits();
        keep_key_at_least(cut_at(p * total));
      }
    }
  }
  if (params_.min_p > 0.0f) {
    if (!listed) {
      // Only tokens with x >= log(min_p) can weigh min_p; the margin covers the float weights.
      lo = std::max(lo, float_at_most(double(max) + t * (std::log(double(params_.min_p)) - 1e-3)));
      list();
    }
    std::copy(cand_w_.begin(), cand_w_.begin() + long(n_cand_), cand_key_.begin());
    keep_key_at_least(params_.min_p);
  }
  list();
  if (params_.typical_p < 1.0f && n_cand_ > 1) {
    // With q_i = w_i / S and x_i = log w_i: -log q_i = log S - x_i and H = log S - sum q x, so
    // |-log q_i - H| = |x_i + e| with e = -sum q x: no logarithm per token.
    double s = 0, sx = 0;
    for (size_t i = 0; i < n_cand_; ++i) {
      const float w = cand_w_[i];
      s += double(w);
      if (w > 0.0f) sx += double(w) * double((cand_l_[i] - max) * inv_t);
    }
    const double e = -sx / s;
    for (size_t i = 0; i < n_cand_; ++i) {
      const double d = std::fabs(double((cand_l_[i] - max) * inv_t) + e);
      cand_key_[i] = -float(std::min(d, double(FLT_MAX)));
    }
    keep_key_at_least(cut_by_mass({cand_key_.data(), n_cand_}, {cand_w_.data(), n_cand_}, double(params_.typical_p) * s));
  }
  return -1;
}

#if defined(__x86_64__)
// NOTE: GCC reports its own _mm512_undefined_* placeholders inside the intrinsics as
// uninitialised (a false positive, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {
// The candidates [i, i + 8) that the draw's prune test cannot skip (bit j for candidate i + j):
// lane j is skipped when 1 - u > w * bound and |l| < limit, u the candidate's noise_uniform
// (its stream given) - the scalar test below, lane by lane, in the same double arithmetic
// (u's integer is below 2^52, so its conversion is exact), so the same candidates survive.
// AVX-512 F and DQ (64-bit multiplies and conversions): x86-64-v4.
__attribute__((target("avx512f,avx512dq"))) unsigned survivors8(const int32_t* ids, const float* w, const float* l,
                                                                uint64_t stream, double bound, double limit) {
  const __m512i gamma = _mm512_set1_epi64(int64_t(kNoiseGamma));
  const __m512i id = _mm512_cvtepi32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids)));
  __m512i z = _mm512_add_epi64(_mm512_set1_epi64(int64_t(stream)),
                               _mm512_mullo_epi64(_mm512_add_epi64(id, _mm512_set1_epi64(1)), gamma));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(int64_t(0xbf58476d1ce4e5b9ull)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(int64_t(0x94d049bb133111ebull)));
  z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
  const __m512d u = _mm512_mul_pd(_mm512_add_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(z, 12)), _mm512_set1_pd(0.5)),
                                  _mm512_set1_pd(1.0 / 4503599627370496.0));
  const __m512d wd = _mm512_cvtps_pd(_mm256_loadu_ps(w));
  const __m512d ld = _mm512_cvtps_pd(_mm256_loadu_ps(l));
  const __mmask8 beaten = _mm512_cmp_pd_mask(_mm512_sub_pd(_mm512_set1_pd(1.0), u),
                                             _mm512_mul_pd(wd, _mm512_set1_pd(bound)), _CMP_GT_OQ);
  const __mmask8 small = _mm512_cmp_pd_mask(_mm512_abs_pd(ld), _mm512_set1_pd(limit), _CMP_LT_OQ);
  return unsigned(~(beaten & small)) & 0xffu;
}
}  // namespace
#pragma GCC diagnostic pop
#endif

// Step 9 over the candidates: the argmax of l / T + gumbel(seed, counter, id). Token i can beat
// the best key B only if its gumbel -log(E_i) >= B - l_i / T, i.e. E_i = -log(u_i) <=
// exp(l_i / T - B) = w_i * exp(max / T - B); as E_i >= 1 - u_i, a token with 1 - u_i above that
// bound (times kPruneSlack) cannot win, and its logarithms are skipped. The winner is the plain
// argmax's, bit for bit.
int32_t Sampler::draw(float max, uint64_t counter) const {
  const size_t n = n_cand_;
  if (n == 1) return cand_id_[0];
  const double t = params_.temperature;
  const uint64_t stream = noise_stream(params_.seed, counter);
  // noise_uniform(seed, counter, id), its stream computed once.
  auto uniform = [&](int32_t id) {
    const uint64_t bits = noise_mix(stream + (uint64_t(id) + 1) * kNoiseGamma);
    return (double(bits >> 12) + 0.5) * (1.0 / 4503599627370496.0);
  };
  auto key_of = [&](size_t i, double u) { return double(cand_l_[i]) / t + -::log(-::log(u)); };
  size_t start = 0;  // the heaviest candidate first, for a high bound at once
  for (size_t i = 1; i < n; ++i)
    if (cand_l_[i] > cand_l_[start]) start = i;
  int32_t best = cand_id_[start];
  double best_key = key_of(start, uniform(best));
  const double max_t = double(max) / t, limit = kPruneKeyLimit * t;
  const bool prune = std::fabs(double(max)) < limit;
  double bound = prune ? std::exp(max_t - best_key) * kPruneSlack : 0.0;
  auto visit = [&](size_t i) {
    const int32_t id = cand_id_[i];
    const double u = uniform(id);
    // 1 - u is exact (u is a multiple of 2^-53); a NaN bound (0 * inf) skips nothing.
    if (prune && 1.0 - u > double(cand_w_[i]) * bound && std::fabs(double(cand_l_[i])) < limit) return;
    const double key = key_of(i, u);
    if (key > best_key || (key == best_key && id < best)) {
      best = id;
      best_key = key;
      if (prune) bound = std::exp(max_t - best_key) * kPruneSlack;
    }
  };
  size_t i = 0;
#if defined(__x86_64__)
  // Eight candidates' noise and prune tests at once; the few survivors go through visit() in
  // order. The block's test uses the bound at its start, which is at least the bound visit()
  // then holds (a new best only lowers it): a candidate skipped here is one visit() would skip,
  // and one kept here is tested again there. Skipping changes no key, so the winner is the same.
  if (prune && cpu_level() >= CpuLevel::v4)
    for (; i + 8 <= n; i += 8)
      for (unsigned live = survivors8(&cand_id_[i], &cand_w_[i], &cand_l_[i], stream, bound, limit); live != 0;
           live &= live - 1) {
        const size_t k = i + size_t(__builtin_ctz(live));
        if (k != start) visit(k);
      }
#endif
  for (; i < n; ++i)
    if (i != start) visit(i);
  return best;
}

int32_t Sampler::sample_at(std::span<const float> logits, std::span<const int32_t> history,
                           std::span<const uint64_t> allowed, uint64_t counter) const {
  float max = 0;
  const int32_t token = chain(logits, history, allowed, max);
  return token >= 0 ? token : draw(max, counter);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const uint64_t> allowed) {
  const uint64_t counter = step_++;
  return sample_at(logits, history, allowed, counter);
}

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits,
                                                             std::span<const int32_t> history,
                                                             std::span<const uint64_t> allowed) const {
  float max = 0;
  const int32_t token = chain(logits, history, allowed, max);
  if (token >= 0) return {{token, 1.0f}};
  // The draw's distribution exactly: softmax(l / T) over the kept set, in double.
  const double t = params_.temperature;
  std::vector<std::pair<int32_t, float>> d(n_cand_);
  std::vector<double> p(n_cand_);
  double s = 0;
  for (size_t i = 0; i < n_cand_; ++i) s += p[i] = std::exp((double(cand_l_[i]) - double(max)) / t);
  for (size_t i = 0; i < n_cand_; ++i) d[i] = {cand_id_[i], float(p[i] / s)};
  return d;
}

}  // namespace osprey
