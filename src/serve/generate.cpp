#include "serve/generate.h"

#include <algorithm>
#include <chrono>

#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "serve/dense_backend.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"

namespace osprey {
namespace {

// Throws InvalidInput for a prompt that is empty, holds an id outside the vocabulary or does not
// fit in the context after what the cache holds, and for a negative token budget.
void check_request(const Model& model, const SequenceCache& cache, std::span<const int32_t> prompt,
                   const GenerateParams& params) {
  if (prompt.empty()) throw InvalidInput("the prompt is empty");
  if (params.max_tokens < 0) throw InvalidInput("the number of tokens to generate must be >= 0");
  validate(params.sampler);
  if (params.spec.enabled()) {
    validate(params.spec);
    if (!cache.gives_back_rows())
      throw InvalidInput(std::string(params.spec.flag()) +
                         ": speculative decoding is not supported for this model: it has sliding-window layers, whose "
                         "rotating KV cache of `window` rows cannot give drafted rows back");
    if (!params.spec.model_draft.empty() && !params.draft_model)
      throw InvalidInput("--model-draft " + params.spec.model_draft + ": the draft model is not loaded");
  }
  ops::check_token_ids(prompt, model.info().vocab_size, "prompt token id");
  const int64_t ctx = model.info().max_position_embeddings;
  if (ctx > 0 && cache.offset() + int64_t(prompt.size()) > ctx)
    throw InvalidInput("the prompt (" + std::to_string(prompt.size()) + " tokens) exceeds the model's context of " +
                       std::to_string(ctx));
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GenerateResult generate(Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                        const GenerateParams& params, const TokenCallback& on_token) {
  check_request(model, cache, prompt, params);
  GenerateResult result;
  GenerateStats& st = result.stats;
  st.n_prompt = int64_t(prompt.size());
  if (params.max_tokens == 0) {
    st.stop_reason = "length";
    return result;
  }
  const KVCounters kv_before = cache.counters();

  // One sequence through the engine's loop: the scheduler without a thread of its own, over a
  // dense backend of one slot on the caller's cache.
  PromptCache no_prompt_cache(0);
  DenseBackendOptions bo;
  bo.caller_cache = &cache;
  bo.graphs = params.graphs;
  bo.pipelined = params.pipelined;
  DenseSlotBackend backend(model, no_prompt_cache, bo);
  SchedulerOptions so;
  so.engine_thread = false;
  so.max_queue = 1;
  so.prefill_chunk = std::max<int64_t>(1, params.prefill_chunk);
  so.spec = params.spec;
  so.draft_model = params.draft_model;
  so.draft_cache = params.draft_cache;
  so.draft_graphs = params.graphs;
  Scheduler engine(backend, so);

  SequenceRequest request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.params.max_tokens = params.max_tokens;
  request.params.sampler = params.sampler;
  request.params.grammar = params.grammar;
  request.params.stop_ids = params.stop_ids;
  request.images = params.images;
  request.channel = std::make_shared<SequenceChannel>();
  std::shared_ptr<SequenceChannel> channel = request.channel;
  const auto t0 = std::chrono::steady_clock::now();
  if (engine.submit(std::move(request)) != Scheduler::Submit::accepted)
    throw Error("generate: the engine did not take the sequence");

  std::chrono::steady_clock::time_point t_first{}, t_end{};
  bool ended = false, cancelled = false;
  std::exception_ptr failure;
  std::string failure_text;
  for (bool busy = true; busy;) {
    busy = engine.run_step();
    while (std::optional<SequenceEvent> e = channel->pop(0)) {
      if (e->kind == SequenceEvent::Kind::token) {
        if (result.tokens.empty()) t_first = e->time;
        result.tokens.push_back(e->token);
        if (on_token && !cancelled && !on_token(e->token)) {
          cancelled = true;
          channel->cancel();  // the next step ends it; the step enqueued ahead is given back
        }
        continue;
      }
      ended = true;
      t_end = e->time;
      if (e->kind == SequenceEvent::Kind::failed) {
        failure = e->exception;
        failure_text = e->error;
      } else {
        st.stop_reason = e->finish_reason == "cancelled" ? "callback" : e->finish_reason;
      }
      st.n_drafted = e->n_drafted;
      st.n_accepted = e->n_accepted;
      st.n_draft_stops = e->n_draft_stops;
    }
  }
  engine.stop();
  // A step given back may still run on the device: nothing is read before it ends.
  ops::synchronize(model.info().device);
  if (failure) std::rethrow_exception(failure);
  if (!failure_text.empty()) throw Error(failure_text);
  if (!ended) throw Error("generate: the sequence did not end");

  st.n_generated = int64_t(result.tokens.size());
  if (st.n_generated > 0) {
    st.prompt_seconds = seconds_between(t0, t_first);
    st.decode_seconds = seconds_between(t_first, t_end);
  } else {
    st.prompt_seconds = seconds_between(t0, t_end);
  }
  st.kv = cache.counters().since(kv_before);
  const DenseBackendCounters c = backend.counters();
  st.device_sampling = c.n_device_chosen > 0 && c.n_host_chosen == 0;
  st.pipelined = c.n_ahead > 0;
  st.n_graph_replays = c.n_graph_replays;
  st.n_graph_captures = c.n_graph_captures;
  st.n_verify_steps = int64_t(c.n_verify_steps);
  return result;
}

}  // namespace osprey
