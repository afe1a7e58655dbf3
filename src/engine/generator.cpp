#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"

namespace osprey {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Array token_array(std::span<const int32_t> ids) {
  Array a = Array::empty({int64_t(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), a.data<int32_t>());
  return a;
}

}  // namespace

GenerateResult generate(Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                        const GenerateParams& params, const TokenCallback& on_token) {
  if (prompt.empty()) throw InvalidInput("the prompt is empty");
  if (params.max_tokens < 0) throw InvalidInput("the number of tokens to generate must be >= 0");
  for (int32_t id : prompt)
    if (id < 0 || id >= model.info().vocab_size)
      throw InvalidInput("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(model.info().vocab_size) + ")");
  const int64_t ctx = model.info().max_position_embeddings;
  if (ctx > 0 && cache.offset() + int64_t(prompt.size()) > ctx)
    throw InvalidInput("the prompt (" + std::to_string(prompt.size()) + " tokens) exceeds the model's context of " +
                       std::to_string(ctx));

  GenerateResult result;
  GenerateStats& st = result.stats;
  st.n_prompt = int64_t(prompt.size());
  const KVCounters kv_before = cache.counters();
  Sampler sampler(params.sampler);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  if (params.max_tokens == 0) {
    st.stop_reason = "length";
    return result;
  }

  auto t0 = Clock::now();
  Array logits;
  const int64_t chunk = std::max<int64_t>(1, params.prefill_chunk);
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk)) {
    size_t e = std::min(prompt.size(), b + size_t(chunk));
    logits = model.forward(token_array(prompt.subspan(b, e - b)), cache, false);
  }
  Clock::time_point t_decode;
  for (int i = 0; i < params.max_tokens; ++i) {
    logits = ops::to_device(logits, Device::cpu());
    const int64_t vocab = logits.dim(-1);
    std::span<const float> row(logits.data<float>() + (logits.numel() - vocab), size_t(vocab));
    const int32_t token = sampler.sample(row, history);
    if (i == 0) {
      st.prompt_seconds = seconds_since(t0);
      t_decode = Clock::now();
    }
    if (std::find(params.stop_ids.begin(), params.stop_ids.end(), token) != params.stop_ids.end()) {
      st.stop_reason = "stop";
      break;
    }
    result.tokens.push_back(token);
    history.push_back(token);
    ++st.n_generated;
    if (on_token && !on_token(token)) {
      st.stop_reason = "callback";
      break;
    }
    if (i + 1 == params.max_tokens) {
      st.stop_reason = "length";
      break;
    }
    if (ctx > 0 && cache.offset() + 1 > ctx) {
      st.stop_reason = "length";
      break;
    }
    logits = model.forward(token_array(std::span<const int32_t>(&token, 1)), cache, false);
  }
  if (st.n_generated > 0 || st.stop_reason == "stop") st.decode_seconds = seconds_since(t_decode);
  KVCounters kv = cache.counters();
  st.kv.n_inplace_writes = kv.n_inplace_writes - kv_before.n_inplace_writes;
  st.kv.n_copying_writes = kv.n_copying_writes - kv_before.n_copying_writes;
  st.kv.bytes_copied = kv.bytes_copied - kv_before.bytes_copied;
  return result;
}

}  // namespace osprey
