#pragma once
// The sampler chain, one definition for the CPU (Sampler, here) and the CUDA sampler
// (backend/cuda/sample.h, one row or a batch of rows):
//   1. token mask (constrained decoding): ids outside the mask become -inf;
//   2. logit bias: l[id] += bias (bias <= -100: -inf);
//   3. penalties over the last `repeat_last_n` tokens of the history: a token seen c times gets
//      l = l > 0 ? l / repetition_penalty : l * repetition_penalty, then
//      l -= presence_penalty + c * frequency_penalty;
//   4. temperature <= 0: greedy, the argmax of l (the lowest id wins a tie); else the weights
//      w_i = exp((l_i - max) / T) over the tokens still finite, and the cuts below, each a
//      threshold on a value so that every token tied with a cut value is kept:
//   5. top-k: keep l_i >= the k-th largest l (counting repeats), when 0 < k < their count;
//   6. top-p: over the tokens kept so far, keep l_i >= v for the largest v whose mass
//      sum{w_j : l_j >= v} reaches top_p * (the kept mass);
//   7. min-p: keep w_i >= min_p (the best token has weight 1);
//   8. typical-p (Meister et al., "Locally typical sampling", as transformers' typical_p): over
//      the kept set K with q_i = w_i / sum_K w and its entropy H = -sum q log q, keep
//      |-log q_i - H| <= d for the smallest d whose kept mass reaches typical_p (1: off);
//   9. draw: Gumbel-max, argmax over the kept set of double(l_i) / double(T) +
//      noise_gumbel(seed, counter, i) (backend/sample_noise.h), the lowest id on a tie, where
//      the counter is the index of the draw in the sequence (0 for its first token). The same
//      (logits, history, parameters, counter) draw the same token every time, alone or in a
//      batch, and the CPU and the device draw the same token wherever their kept sets agree.
// Masses may ignore weights below 2^-40 (the device sums them in 2^-40 fixed point): a token
// that light is never the one a top-p or typical-p cut turns on.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace osprey {

struct SamplerParams {
  float temperature = 0.0f;
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float typical_p = 1.0f;    // 1: off; in (0, 1]
  float repetition_penalty = 1.0f;  // 1: off; applied to the last `repeat_last_n` tokens
  int repeat_last_n = 64;
  // OpenAI's penalties over the same last `repeat_last_n` tokens: a token seen c times loses
  // presence_penalty + c * frequency_penalty from its logit. 0: off. Range [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // The draws are a function of (seed, draw index): the same seed repeats a reply. Front ends
  // give random_seed() when the user names none (the CLI without --seed or with --seed -1, a
  // server request without "seed"); the fixed default keeps library callers reproducible.
  uint64_t seed = 0x5eed;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logit before any other
  // step; -100 bans the token. Ids outside the vocabulary are an error at sampling.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// A fresh seed from std::random_device (a different one on every call, with high probability).
uint64_t random_seed();

// Throws InvalidInput naming the parameter when one is out of range.
void validate(const SamplerParams& p);

// The distinct ids among the last `repeat_last_n` tokens of `history` with the number of times
// each occurs there, sorted by id: the list step 3 applies (the device sampler receives it as
// is). Ids are as the history holds them; the penalties skip any outside the vocabulary.
std::vector<std::pair<int32_t, int32_t>> recent_counts(std::span<const int32_t> history, int repeat_last_n);

// The CPU sampler. Every step is linear in the vocabulary (no sort of it): a pass adjusts the
// logits and finds the maximum, the cuts are thresholds found by bounded selection and by
// histograms over the candidates, and the draw evaluates the full Gumbel noise only for the
// tokens that can still win. Its scratch makes a step allocate nothing once warm.
// Thread safety: its methods, const ones included, write that scratch: one Sampler per thread.
class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  // logits [vocab] f32 (not modified); `history` is the sequence so far (prompt + output).
  // `allowed`, when not empty: a bitmask over the vocabulary (bit id % 64 of word id / 64;
  // constrained decoding's token mask); only its tokens can be drawn, on every setting of
  // the chain, before any other step; ids past its end are banned. Throws InvalidInput "the
  // model computed non-finite logits ..." when any logit is NaN or Inf (broken weights or
  // config), rather than choosing a token from them, and when the mask and the logit bias
  // leave no token. sample() is sample_at(..., n) for its n-th call (counting from 0).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const uint64_t> allowed = {});
  // The draw with noise counter `counter` (the index of the draw in its sequence): a pure
  // function of the arguments and the parameters.
  int32_t sample_at(std::span<const float> logits, std::span<const int32_t> history,
                    std::span<const uint64_t> allowed, uint64_t counter) const;

  // The kept set the chain draws from, sorted by id, with its probabilities softmax(l / T)
  // renormalised over it (greedy: the argmax alone, probability 1); for tests.
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits, std::span<const int32_t> history,
                                                      std::span<const uint64_t> allowed = {}) const;

 private:
  const float* adjust(std::span<const float> logits, std::span<const int32_t> history,
                      std::span<const uint64_t> allowed, float& max) const;
  float scan_max(const float* l, size_t n, bool& finite) const;
  int32_t first_max(const float* l, size_t n, float max) const;
  bool kth_largest(const float* l, size_t n, float& out) const;
  double heavy_mass(const float* l, size_t n, float max, float inv_t) const;
  void tail_mass_bounds(const float* l, size_t n, float max, float inv_t, float lo, double& low, double& high) const;
  void gather(const float* l, size_t n, float lo) const;
  void weigh(float max, float inv_t) const;
  void keep_key_at_least(float v) const;
  float cut_by_mass(std::span<const float> key, std::span<const float> mass, double target) const;
  int32_t chain(std::span<const float> logits, std::span<const int32_t> history, std::span<const uint64_t> allowed,
                float& max) const;
  int32_t draw(float max, uint64_t counter) const;

  SamplerParams params_;
  uint64_t step_ = 0;  // draws so far: the noise counter of the next draw
  // Scratch, reused from step to step.
  mutable std::vector<float> work_;       // [vocab] the adjusted logits, when a step changes any
  mutable std::vector<float> block_max_;  // [vocab / 64 rounded up] the max of each block of 64
  mutable std::vector<float> heap_;       // [top_k] top-k's min-heap
  mutable size_t n_cand_ = 0;             // candidates (the vectors below may be longer)
  mutable std::vector<int32_t> cand_id_;  // [n_cand] the candidates, ascending ids
  mutable std::vector<float> cand_l_;     // [n_cand] their adjusted logits
  mutable std::vector<float> cand_w_;     // [n_cand] their weights exp((l - max) / T)
  mutable std::vector<float> cand_key_;   // [n_cand] a cut's key per candidate (kept: key >= a value)
  mutable std::vector<float> level_key_[2], level_mass_[2];  // cut_by_mass's refinements
  mutable std::vector<std::pair<float, float>> sorted_;      // cut_by_mass's last level
  mutable std::vector<double> hist_;                         // cut_by_mass's bucket masses
  mutable std::vector<int32_t> recent_;                      // the penalties' window, sorted
};

int32_t argmax(std::span<const float> logits);

// Throws the sampler's InvalidInput for `logits`, which hold a NaN or an Inf (also the
// message the device sampler's non-finite flag turns into).
[[noreturn]] void throw_non_finite(std::span<const float> logits);
// "the model computed non-finite logits (<detail>): ..." (the device sampler's flag too).
std::string non_finite_logits_message(const std::string& detail);

// Whether the chain reads the token history (a penalty is on) or applies a logit bias.
bool uses_history(const SamplerParams& p);
// Whether sampling must run on the host sampler (this one) rather than the device sampler:
// the penalties need the history, and the device sampler applies no logit bias and has no
// typical-p cut.
bool needs_host_sampler(const SamplerParams& p);

}  // namespace osprey
