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

// The sequences of one run and how each chooses its tokens: greedy, sampled (each its own
// seed and history, for the penalties) or constrained by the grammar, as the server does.
class BenchBatch {
 public:
  BenchBatch(const BatchedBenchParams& p, const ModelInfo& info, size_t nb)
      : p_(p), nb_(nb), inputs_(nb), seq_params_(nb, p.sampler) {
    if (p.grammar) {
      if (!p.trie || p.trie->vocab_size() > info.vocab_size)
        throw InvalidInput("batched bench: the grammar's vocabulary is missing or larger than the model's");
      automaton_ = std::make_shared<grammar::Automaton>(*p.grammar, p.trie, p.end_ids);
      matchers_.assign(nb, grammar::Matcher(automaton_));
      for (grammar::Matcher& m : matchers_) batch_matchers_.push_back(&m);
      mask_bufs_.resize(nb);
    }
    sampled_ = !constrained() && p.sampler.temperature > 0.0f;
    for (size_t i = 0; i < nb; ++i) seq_params_[i].seed = p.sampler.seed + i;
    if (sampled_) {
      history_.resize(nb);
      for (size_t i = 0; i < nb; ++i) samplers_.emplace_back(seq_params_[i]);
    }
  }

  // Admits and prefills every sequence, choosing its first token.
  void start(PagedBackend& backend, const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<float> logits;
    for (size_t k = 0; k < nb_; ++k) {
      auto begun = backend.begin(prompts[k], "");
      if (!begun) throw InvalidInput("batched bench: the KV pool cannot hold " + std::to_string(nb_) + " sequences");
      SequenceBackend::DecodeInput& in = inputs_[k];
      in.handle = begun->handle;
      if (constrained()) {
        backend.prefill(begun->handle, prompts[k], true, logits);
        logits.resize(size_t(p_.trie->vocab_size()));  // tokens past the tokenizer's vocabulary are never chosen
        in.token = choose_constrained(logits, matchers_[k], automaton_);
        in.greedy = in.masked = true;
      } else if (sampled_) {
        history_[k] = prompts[k];
        in.sampling = &seq_params_[k];
        in.history = history_[k];
        // The first token as the server chooses it: on the device where the backend draws.
        const int32_t chosen = backend.prefill_and_choose(begun->handle, prompts[k], in, logits);
        in.token = chosen >= 0 ? chosen : samplers_[k].sample_at(logits, history_[k], {}, 0);
        history_[k].push_back(in.token);
      } else {
        in.greedy = true;
        const int32_t chosen = backend.prefill_and_choose(begun->handle, prompts[k], in, logits);
        in.token = chosen >= 0 ? chosen : argmax(logits);
      }
    }
  }

  // One decode step of every sequence, and each one's next token.
  void step(PagedBackend& backend, int64_t step) {
    if (sampled_)
      for (size_t i = 0; i < nb_; ++i) {
        inputs_[i].counter = uint64_t(step) + 1;
        inputs_[i].history = history_[i];
      }
    // A backend that chooses the tokens asks for the masks while the step runs (as the
    // server's scheduler does); one that returns logits leaves them to choose_constrained.
    auto masks = [&](std::vector<std::span<const uint64_t>>& out) {
      worker_.wait();
      for (size_t i = 0; i < nb_; ++i) out[i] = device_mask(matchers_[i], automaton_, p_.end_ids, mask_bufs_[i]);
    };
    if (constrained()) worker_.start(batch_matchers_);
    try {
      backend.decode(inputs_, outputs_, constrained() ? SequenceBackend::MaskFn(masks) : SequenceBackend::MaskFn());
    } catch (...) {
      if (constrained()) worker_.wait();
      throw;
    }
    if (constrained()) worker_.wait();
    for (size_t i = 0; i < nb_; ++i) inputs_[i].token = next_token(i, outputs_[i], step);
  }

 private:
  bool constrained() const { return automaton_ != nullptr; }

  int32_t next_token(size_t i, const SequenceBackend::DecodeOutput& out, int64_t step) {
    if (!out.error.empty()) throw InvalidInput("batched bench: " + out.error);
    if (constrained() && out.token >= 0) {  // chosen by the backend from the mask
      if (!matchers_[i].accept(out.token))
        throw Error("batched bench: the backend chose token " + std::to_string(out.token) +
                    ", which the grammar's mask does not allow");
      return out.token;
    }
    if (constrained())
      return choose_constrained(std::span<const float>(out.logits).first(size_t(p_.trie->vocab_size())), matchers_[i],
                                automaton_);
    if (!sampled_) return out.token >= 0 ? out.token : argmax(out.logits);
    const int32_t t = out.token >= 0 ? out.token : samplers_[i].sample_at(out.logits, history_[i], {}, uint64_t(step) + 1);
    history_[i].push_back(t);
    return t;
  }

  const BatchedBenchParams& p_;
  size_t nb_;
  std::vector<SequenceBackend::DecodeInput> inputs_;
  std::vector<SequenceBackend::DecodeOutput> outputs_;
  std::vector<SamplerParams> seq_params_;
  bool sampled_ = false;
  std::vector<Sampler> samplers_;
  std::vector<std::vector<int32_t>> history_;
  std::shared_ptr<grammar::Automaton> automaton_;
  std::vector<grammar::Matcher> matchers_;
  std::vector<grammar::Matcher*> batch_matchers_;
  std::vector<std::vector<uint64_t>> mask_bufs_;
  MaskWorker worker_;
};

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
  o.prefill_chunk = std::max<int64_t>(1, p.n_prompt);  // each prompt is one chunk
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

  BenchBatch seqs(p, info, nb);
  const auto t0 = Clock::now();
  seqs.start(backend, prompts);
  ops::synchronize(info.device);
  const auto t1 = Clock::now();
  for (int64_t step = 0; step < p.n_gen; ++step) seqs.step(backend, step);
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
