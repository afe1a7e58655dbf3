#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "backend/ops.h"
#include "backend/readback.h"
#include "core/error.h"
#include "engine/decode_stepper.h"
#include "grammar/matcher.h"
#include "model/model.h"

namespace osprey {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

ops::DeviceSampling device_sampling(const SamplerParams& p) {
  ops::DeviceSampling d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.seed = p.seed;
  return d;
}

// The last row of host logits [..., vocab].
std::span<const float> last_row(const Array& host) {
  const int64_t vocab = host.dim(-1);
  return {host.data<float>() + (host.numel() - vocab), size_t(vocab)};
}

// Throws InvalidInput for a prompt that is empty, holds an id outside the vocabulary or does not
// fit in the context after what the cache holds, and for a negative token budget.
void check_request(const Model& model, const SequenceCache& cache, std::span<const int32_t> prompt,
                   const GenerateParams& params) {
  if (prompt.empty()) throw InvalidInput("the prompt is empty");
  if (params.max_tokens < 0) throw InvalidInput("the number of tokens to generate must be >= 0");
  validate(params.sampler);
  ops::check_token_ids(prompt, model.info().vocab_size, "prompt token id");
  const int64_t ctx = model.info().max_position_embeddings;
  if (ctx > 0 && cache.offset() + int64_t(prompt.size()) > ctx)
    throw InvalidInput("the prompt (" + std::to_string(prompt.size()) + " tokens) exceeds the model's context of " +
                       std::to_string(ctx));
}

// The device sampler found non-finite logits for generated token i. Throws InvalidInput in the
// host sampler's words (which logits are NaN or Inf) when last_sampled, the logits it read last
// (token i's or, pipelined, the next step's), holds them; else names token i alone.
[[noreturn]] void throw_non_finite_token(const Array& last_sampled, int64_t i) {
  if (last_sampled.defined()) {
    Array host = ops::to_device(last_sampled, Device::cpu());
    std::span<const float> row = last_row(host);
    if (std::any_of(row.begin(), row.end(), [](float x) { return !std::isfinite(x); })) {
      try {
        throw_non_finite(row);
      } catch (const InvalidInput& e) {
        throw InvalidInput(std::string(e.what()) + " (at generated token " + std::to_string(i) + ")");
      }
    }
  }
  throw InvalidInput(non_finite_logits_message("at generated token " + std::to_string(i)));
}

}  // namespace

GenerateResult generate(Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                        const GenerateParams& params, const TokenCallback& on_token) {
  check_request(model, cache, prompt, params);
  const int64_t ctx = model.info().max_position_embeddings;

  GenerateResult result;
  GenerateStats& st = result.stats;
  st.n_prompt = int64_t(prompt.size());
  const KVCounters kv_before = cache.counters();
  if (params.max_tokens == 0) {
    st.stop_reason = "length";
    return result;
  }
  const Device dev = model.info().device;
  // NOTE: the penalties need the history on the host, so they sample there; so do the logit
  // bias and typical-p, which the device sampler does not apply (needs_host_sampler).
  st.device_sampling = !dev.is_cpu() && !needs_host_sampler(params.sampler) && !params.grammar;
  st.pipelined = st.device_sampling && params.pipelined;
  Sampler sampler(params.sampler);
  std::optional<grammar::Matcher> matcher;
  if (params.grammar) matcher.emplace(params.grammar);
  const ops::DeviceSampling ds = device_sampling(params.sampler);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  DecodeStepperOptions dopt;
  dopt.graphs = params.graphs;
  DecodeStepper stepper(model, cache, dopt);
  TokenReadback readback(dev, 2);

  // The prefill's chunks land in one buffer size; decode grows step by step from there.
  cache.reserve(cache.offset() + int64_t(prompt.size()));

  auto t0 = Clock::now();
  Array logits;
  const int64_t chunk = std::max<int64_t>(1, params.prefill_chunk);
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk)) {
    size_t e = std::min(prompt.size(), b + size_t(chunk));
    logits = model.forward(host_i32(prompt.subspan(b, e - b)), cache, false);
  }

  // Chooses token `i` from `logits`: on the device into stepper.token() (read back through
  // slot i % 2), or on the host (returned at once).
  Array last_sampled;  // the logits the device sampler read last (kept for an error's detail)
  auto choose = [&](const Array& lg, int64_t i) -> int32_t {
    if (st.device_sampling) {
      last_sampled = lg;
      ops::sample_into(lg, ds, uint64_t(i), stepper.token());
      readback.enqueue(stepper.token(), int(i % 2));
      return -1;
    }
    Array host = ops::to_device(lg, Device::cpu());
    std::span<const uint64_t> allowed;
    if (matcher) allowed = matcher->mask();
    return sampler.sample(last_row(host), history, allowed);
  };
  // Enqueues the step whose input is token i - 1 and chooses token i.
  auto run_step = [&](int64_t i, int32_t host_token) -> int32_t {
    if (!st.device_sampling) ops::fill_i32_(stepper.token(), host_token);
    return choose(stepper.step(), i);
  };

  int32_t next_host = choose(logits, 0);
  Clock::time_point t_decode;
  for (int64_t i = 0;; ++i) {
    // Step i + 1 (input: token i) may run when more tokens are wanted and the context allows.
    const bool more = i + 1 < params.max_tokens && !(ctx > 0 && cache.offset() + 1 > ctx);
    bool ahead = false;
    if (st.pipelined && more) {
      run_step(i + 1, 0);
      ahead = true;
    }
    const int32_t token = st.device_sampling ? readback.wait(int(i % 2)) : next_host;
    if (token == kNonFiniteLogits) {
      ops::synchronize(dev);  // the step enqueued ahead may still run
      throw_non_finite_token(last_sampled, i);
    }
    if (i == 0) {
      st.prompt_seconds = seconds_since(t0);
      t_decode = Clock::now();
    }
    auto stop = [&](const char* reason) {
      st.stop_reason = reason;
      // The step enqueued ahead wrote a row for a token that is not kept.
      if (ahead) cache.rewind_own_write(1);
    };
    if (std::find(params.stop_ids.begin(), params.stop_ids.end(), token) != params.stop_ids.end()) {
      stop("stop");
      break;
    }
    if (matcher && !matcher->accept(token)) throw InvalidInput("the grammar rejected token " + std::to_string(token));
    result.tokens.push_back(token);
    history.push_back(token);
    ++st.n_generated;
    if (on_token && !on_token(token)) {
      stop("callback");
      break;
    }
    if (matcher && matcher->must_end()) {
      st.stop_reason = "stop";
      break;
    }
    if (!more) {
      st.stop_reason = "length";
      break;
    }
    if (!st.pipelined) next_host = run_step(i + 1, token);
  }
  // A rewound step may still run on the device; results must not be read before it ends.
  ops::synchronize(dev);
  if (st.n_generated > 0 || st.stop_reason == "stop") st.decode_seconds = seconds_since(t_decode);
  st.kv = cache.counters().since(kv_before);
  st.n_graph_replays = stepper.n_graph_replays();
  st.n_graph_captures = stepper.n_graph_captures();
  return result;
}

}  // namespace osprey
