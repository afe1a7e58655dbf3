#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "core/error.h"
#include "backend/sample_noise.h"

namespace osprey {

void validate(const SamplerParams& p) {
  auto bad = [](const std::string& what) { throw InvalidInput(what); };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) bad("temperature must be >= 0");
  if (p.top_k < 0) bad("top-k must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top-p must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) bad("min-p must be in [0, 1)");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) bad("repetition penalty must be > 0");
  if (p.repeat_last_n < 0) bad("repeat-last-n must be >= 0");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) bad("presence penalty must be in [-2, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) bad("frequency penalty must be in [-2, 2]");
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

std::vector<std::pair<int32_t, float>> Sampler::filtered(std::span<const float> logits,
                                                         std::span<const int32_t> history,
                                                         std::span<const uint64_t> allowed) {
  // The copy also checks that every logit is finite (one pass that runs anyway): NaN or Inf
  // weights, or a config value out of its domain, would otherwise emit token 0 forever.
  work_.resize(logits.size());
  bool finite = true;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    work_[i] = v;
    finite &= std::isfinite(v);
  }
  if (!finite) throw_non_finite(logits);
  const char* none_left = "logit bias bans every token";
  if (!allowed.empty()) {
    // Ids past the mask (a model's padded rows beyond the tokenizer's vocabulary) are banned.
    for (size_t i = 0; i < work_.size(); ++i)
      if ((i >> 6) >= allowed.size() || !((allowed[i >> 6] >> (i & 63)) & 1)) work_[i] = -INFINITY;
    none_left = "the grammar and the logit bias leave no token to choose";
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (size_t(id) >= work_.size())
      throw InvalidInput("logit bias: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(work_.size()) + ")");
    work_[size_t(id)] = bias <= -100.0f ? -INFINITY : work_[size_t(id)] + bias;
  }
  if (uses_history(params_) && params_.repeat_last_n > 0) {
    size_t start = history.size() > size_t(params_.repeat_last_n) ? history.size() - size_t(params_.repeat_last_n) : 0;
    std::vector<int32_t> seen(history.begin() + long(start), history.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      const int32_t id = seen[i];
      const float count = float(j - i);
      i = j;
      if (id < 0 || size_t(id) >= work_.size()) continue;
      float& l = work_[size_t(id)];
      if (params_.repetition_penalty != 1.0f) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= params_.presence_penalty + count * params_.frequency_penalty;
    }
  }
  std::vector<std::pair<int32_t, float>> cand;
  if (params_.temperature <= 0.0f) {
    const int32_t best = argmax(work_);
    if (work_[size_t(best)] == -INFINITY) throw InvalidInput(none_left);
    cand.emplace_back(best, 1.0f);
    return cand;
  }
  cand.reserve(work_.size());
  for (size_t i = 0; i < work_.size(); ++i)
    if (work_[i] != -INFINITY) cand.emplace_back(int32_t(i), work_[i] / params_.temperature);
  if (cand.empty()) throw InvalidInput(none_left);
  auto by_logit = [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); };
  if (params_.top_k > 0 && size_t(params_.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + params_.top_k, cand.end(), by_logit);
    cand.resize(size_t(params_.top_k));
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  // Softmax over the survivors (sorted, so the first is the max).
  const float mx = cand[0].second;
  double sum = 0;
  for (auto& c : cand) {
    c.second = std::exp(c.second - mx);
    sum += c.second;
  }
  for (auto& c : cand) c.second = float(c.second / sum);
  if (params_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
      acc += cand[i].second;
      if (acc >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(keep);
  }
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * cand[0].second;
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].second >= threshold) ++keep;
    cand.resize(keep);
  }
  sum = 0;
  for (const auto& c : cand) sum += c.second;
  for (auto& c : cand) c.second = float(c.second / sum);
  return cand;
}

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits,
                                                             std::span<const int32_t> history,
                                                             std::span<const uint64_t> allowed) {
  auto cand = filtered(logits, history, allowed);
  std::sort(cand.begin(), cand.end());
  return cand;
}

std::vector<std::pair<int32_t, int32_t>> recent_counts(std::span<const int32_t> history, int repeat_last_n) {
  const size_t n = std::min(history.size(), size_t(std::max(repeat_last_n, 0)));
  std::vector<int32_t> seen(history.end() - long(n), history.end());
  std::sort(seen.begin(), seen.end());
  std::vector<std::pair<int32_t, int32_t>> out;
  for (size_t i = 0; i < seen.size();) {
    size_t j = i;
    while (j < seen.size() && seen[j] == seen[i]) ++j;
    out.emplace_back(seen[i], int32_t(j - i));
    i = j;
  }
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const uint64_t> allowed) {
  return sample_at(logits, history, allowed, step_++);
}

int32_t Sampler::sample_at(std::span<const float> logits, std::span<const int32_t> history,
                           std::span<const uint64_t> allowed, uint64_t step) {
  auto cand = filtered(logits, history, allowed);
  if (cand.size() == 1) return cand[0].first;
  // Gumbel-max with the device sampler's noise (backend/sample_noise.h): the same seed and
  // step draw the same token on the CPU and on CUDA when their kept sets agree.
  int32_t best = -1;
  double best_key = -HUGE_VAL;
  for (const auto& c : cand) {
    if (c.second <= 0.0f) continue;
    const double key = std::log(double(c.second)) + noise_gumbel(params_.seed, step, uint64_t(c.first));
    if (key > best_key || (key == best_key && c.first < best)) best_key = key, best = c.first;
  }
  return best >= 0 ? best : cand[0].first;
}

}  // namespace osprey
