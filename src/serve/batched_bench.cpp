#include "serve/batched_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "backend/ops.h"
#include "core/buffer.h"
#include "core/error.h"
#include "sample/sampler.h"
#include "grammar/matcher.h"
#include "serve/mask_worker.h"
#include "serve/paged_backend.h"

namespace osprey {
namespace {

using Clock = std::chrono::steady_clock;

// The allowed token of highest logit that is not an end token (the lowest id on ties); -1 when
// none is allowed.
int32_t masked_argmax(std::span<const float> logits, const grammar::Matcher& m, std::span<const uint64_t> mask) {
  int32_t best = -1;
  for (int32_t id = 0; id < int32_t(logits.size()); ++id)
    if (grammar::mask_allows(mask, id) && !m.is_end_token(id) && (best < 0 || logits[size_t(id)] > logits[size_t(best)]))
      best = id;
  return best;
}

// The token `m` takes next from `logits`; a complete grammar (nothing but an end token allowed)
// starts again.
int32_t choose_constrained(std::span<const float> logits, grammar::Matcher& m, const std::shared_ptr<grammar::Automaton>& a) {
  int32_t t = masked_argmax(logits, m, m.mask());
  if (t < 0) {
    m = grammar::Matcher(a);
    t = masked_argmax(logits, m, m.mask());
    if (t < 0) throw InvalidInput("batched bench: the grammar allows no token of the vocabulary at its start");
  }
  if (!m.accept(t)) throw Error("batched bench: the grammar refused a token its mask allowed");
  return t;
}

// The mask `m` draws its next token from on the device: its grammar's mask without the end
// tokens, in `buf`; a complete grammar (nothing but an end token allowed) starts again.
std::span<const uint64_t> device_mask(grammar::Matcher& m, const std::shared_ptr<grammar::Automaton>& a,
                                      std::span<const int32_t> end_ids, std::vector<uint64_t>& buf) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::vector<uint64_t>& mask = m.mask();
    buf.assign(mask.begin(), mask.end());
    for (int32_t id : end_ids)
      if (id >= 0 && size_t(id) / 64 < buf.size()) buf[size_t(id) / 64] &= ~(uint64_t(1) << (id % 64));
    if (std::any_of(buf.begin(), buf.end(), [](uint64_t w) { return w != 0; })) return buf;
    m = grammar::Matcher(a);
  }
  throw InvalidInput("batched bench: the grammar allows no token of the vocabulary at its start");
}

BatchedBenchResult run_one(Model& model, const BatchedBenchParams& p, int batch, std::mt19937_64& rng) {
  const ModelInfo& info = model.info();
  PagedBackendOptions o;
  o.max_sequences = batch;
  o.context_size = p.n_prompt + p.n_gen + 1;
  o.block_size = p.block_size;
  o.prefix_cache = false;
  o.graphs = p.graphs;
  o.split_keys = p.split_keys;
  o.inplace = p.inplace;
  o.k_type = p.k_type;
  o.v_type = p.v_type;
  Allocator& alloc = allocator_for(info.device);
  ops::synchronize(info.device);
  alloc.reset_peak();
  PagedBackend backend(model, o);

  BatchedBenchResult r;
  r.n_prompt = p.n_prompt;
  r.n_gen = p.n_gen;
  r.batch = batch;
  r.pool_bytes = size_t(backend.prefix_stats().budget_bytes);
  std::uniform_int_distribution<int32_t> token(0, int32_t(info.vocab_size - 1));
  const size_t nb = static_cast<size_t>(batch);
  std::vector<std::vector<int32_t>> prompts(nb);
  for (auto& pr : prompts) {
    pr.resize(size_t(p.n_prompt));
    for (auto& t : pr) t = token(rng);
  }

  const bool constrained = p.grammar != nullptr;
  std::shared_ptr<grammar::Automaton> automaton;
  std::vector<grammar::Matcher> matchers;
  if (constrained) {
    if (!p.trie || p.trie->vocab_size() > info.vocab_size)
      throw InvalidInput("batched bench: the grammar's vocabulary is missing or larger than the model's");
    automaton = std::make_shared<grammar::Automaton>(*p.grammar, p.trie, p.end_ids);
    matchers.assign(nb, grammar::Matcher(automaton));
  }
  MaskWorker worker;
  std::vector<SequenceBackend::DecodeInput> inputs(nb);
  std::vector<float> logits;
  // Sampled: each sequence its own seed, its history (prompt and output) for the penalties.
  const bool sampled = !constrained && p.sampler.temperature > 0.0f;
  std::vector<SamplerParams> seq_params(nb, p.sampler);
  std::vector<Sampler> samplers;
  std::vector<std::vector<int32_t>> history(sampled ? nb : 0);
  for (size_t i = 0; i < nb; ++i) seq_params[i].seed = p.sampler.seed + i;
  if (sampled)
    for (size_t i = 0; i < nb; ++i) samplers.emplace_back(seq_params[i]);
  const auto t0 = Clock::now();
  for (int i = 0; i < batch; ++i) {
    auto begun = backend.begin(prompts[size_t(i)], "");
    if (!begun) throw InvalidInput("batched bench: the KV pool cannot hold " + std::to_string(batch) + " sequences");
    if (constrained) {
      backend.prefill(begun->handle, prompts[size_t(i)], true, logits);
      logits.resize(size_t(p.trie->vocab_size()));  // tokens past the tokenizer's vocabulary are never chosen
      inputs[size_t(i)].handle = begun->handle;
      inputs[size_t(i)].token = choose_constrained(logits, matchers[size_t(i)], automaton);
      inputs[size_t(i)].greedy = inputs[size_t(i)].masked = true;
    } else if (sampled) {
      const size_t k = size_t(i);
      history[k] = prompts[k];
      inputs[k].handle = begun->handle;
      inputs[k].sampling = &seq_params[k];
      inputs[k].history = history[k];
      // The first token as the server chooses it: on the device where the backend draws.
      const int32_t chosen = backend.prefill_and_choose(begun->handle, prompts[k], inputs[k], logits);
      inputs[k].token = chosen >= 0 ? chosen : samplers[k].sample_at(logits, history[k], {}, 0);
      history[k].push_back(inputs[k].token);
    } else {
      inputs[size_t(i)].handle = begun->handle;
      inputs[size_t(i)].greedy = true;
      const int32_t chosen = backend.prefill_and_choose(begun->handle, prompts[size_t(i)], inputs[size_t(i)], logits);
      inputs[size_t(i)].token = chosen >= 0 ? chosen : argmax(logits);
    }
  }
  ops::synchronize(info.device);
  const auto t1 = Clock::now();
  std::vector<SequenceBackend::DecodeOutput> outputs;
  std::vector<grammar::Matcher*> batch_matchers;
  for (grammar::Matcher& m : matchers) batch_matchers.push_back(&m);
  // A backend that chooses the tokens asks for the masks while the step runs (as the server's
  // scheduler does); one that returns logits leaves them to choose_constrained below.
  std::vector<std::vector<uint64_t>> mask_bufs(nb);
  auto masks = [&](std::vector<std::span<const uint64_t>>& out) {
    worker.wait();
    for (size_t i = 0; i < nb; ++i) out[i] = device_mask(matchers[i], automaton, p.end_ids, mask_bufs[i]);
  };
  for (int64_t step = 0; step < p.n_gen; ++step) {
    if (sampled)
      for (size_t i = 0; i < nb; ++i) {
        inputs[i].counter = uint64_t(step) + 1;
        inputs[i].history = history[i];
      }
    if (constrained) worker.start(batch_matchers);
    try {
      backend.decode(inputs, outputs, constrained ? SequenceBackend::MaskFn(masks) : SequenceBackend::MaskFn());
    } catch (...) {
      if (constrained) worker.wait();
      throw;
    }
    if (constrained) worker.wait();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& out = outputs[i];
      if (!out.error.empty()) throw InvalidInput("batched bench: " + out.error);
      if (constrained && out.token >= 0) {  // chosen by the backend from the mask
        if (!matchers[i].accept(out.token))
          throw Error("batched bench: the backend chose token " + std::to_string(out.token) +
                      ", which the grammar's mask does not allow");
        inputs[i].token = out.token;
      } else if (constrained)
        inputs[i].token = choose_constrained(std::span<const float>(out.logits).first(size_t(p.trie->vocab_size())),
                                             matchers[i], automaton);
      else if (sampled)
        inputs[i].token = out.token >= 0 ? out.token
                                         : samplers[i].sample_at(out.logits, history[i], {}, uint64_t(step) + 1);
      else
        inputs[i].token = out.token >= 0 ? out.token : argmax(out.logits);
      if (sampled) history[i].push_back(inputs[i].token);
    }
  }
  ops::synchronize(info.device);
  const auto t2 = Clock::now();
  r.t_prompt = std::chrono::duration<double>(t1 - t0).count();
  r.t_gen = std::chrono::duration<double>(t2 - t1).count();
  r.n_kv = int64_t(batch) * (p.n_prompt + p.n_gen);
  r.peak_reserved_bytes = alloc.stats().peak_reserved_bytes;
  return r;
}

}  // namespace

std::vector<BatchedBenchResult> run_batched_bench(Model& model, const BatchedBenchParams& params) {
  if (params.n_prompt < 1 || params.n_gen < 1) throw InvalidInput("batched bench: prompt and generation sizes must be >= 1");
  for (int b : params.batch_sizes)
    if (b < 1) throw InvalidInput("--batch: sizes must be >= 1, got " + std::to_string(b));
  const int64_t ctx = model.info().max_position_embeddings;
  if (ctx > 0 && params.n_prompt + params.n_gen + 1 > ctx)
    throw InvalidInput("batched bench: " + std::to_string(params.n_prompt + params.n_gen) +
                       " tokens per sequence exceed the model's context of " + std::to_string(ctx));
  std::mt19937_64 rng(params.seed);
  {
    BatchedBenchParams warm = params;
    warm.n_prompt = std::min<int64_t>(params.n_prompt, 32);
    warm.n_gen = 4;
    run_one(model, warm, 2, rng);
  }
  std::vector<BatchedBenchResult> out;
  for (int b : params.batch_sizes) out.push_back(run_one(model, params, b, rng));
  return out;
}

}  // namespace osprey
