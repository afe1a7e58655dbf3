#pragma once
// The sampler chain: token mask (constrained decoding) -> logit bias -> repetition, presence and frequency penalties -> temperature -> top-k -> top-p -> min-p -> draw.
// Temperature <= 0 is greedy (argmax; the lowest id wins a tie). Draws are Gumbel-max with the
// counter-based noise of backend/sample_noise.h at (seed, draw index): deterministic for a seed,
// and the same draws as the CUDA sampler's for the same kept set.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace osprey {

struct SamplerParams {
  float temperature = 0.0f;
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
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

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  // logits [vocab] f32 (not modified); `history` is the sequence so far (prompt + output).
  // `allowed`, when not empty: a bitmask over the vocabulary (bit id % 64 of word id / 64;
  // constrained decoding's token mask); only its tokens can be drawn, on every setting of
  // the chain, before any other step; ids past its end are banned. Throws InvalidInput "the model computed non-finite
  // logits ..." when any logit is NaN or Inf (broken weights or config), rather than choosing
  // a token from them, and when the mask and the logit bias leave no token.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const uint64_t> allowed = {});

  // The candidate distribution the chain would draw from, sorted by id; for tests.
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits, std::span<const int32_t> history,
                                                      std::span<const uint64_t> allowed = {});

 private:
  std::vector<std::pair<int32_t, float>> filtered(std::span<const float> logits, std::span<const int32_t> history,
                                                  std::span<const uint64_t> allowed);

  SamplerParams params_;
  uint64_t step_ = 0;  // draws so far: the noise counter of the next draw
  std::vector<float> work_;
};

int32_t argmax(std::span<const float> logits);

// Throws the sampler's InvalidInput for `logits`, which hold a NaN or an Inf (also the
// message the device sampler's non-finite flag turns into).
[[noreturn]] void throw_non_finite(std::span<const float> logits);
// "the model computed non-finite logits (<detail>): ..." (the device sampler's flag too).
std::string non_finite_logits_message(const std::string& detail);

// Whether sampling must run on the host sampler: a penalty needs the token history, and the
// device sampler applies no logit bias.
bool uses_history(const SamplerParams& p);

}  // namespace osprey
