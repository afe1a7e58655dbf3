#include "serve/dense_backend.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"
#include "engine/decode_stepper.h"
#include "serve/prompt_cache.h"

namespace osprey {
namespace {

// The last row of `logits` ([n, vocab] f32 on any device), on the host.
void last_row(const Array& logits, std::vector<float>& out) {
  Array host = ops::to_device(logits, Device::cpu());
  const int64_t vocab = host.dim(-1);
  const float* row = host.data<float>() + (host.numel() - vocab);
  out.assign(row, row + vocab);
}

}  // namespace

struct DenseSlotBackend::Slot {
  bool busy = false;
  std::string salt;  // the running sequence's prompt-cache salt
  SequenceCache cache;
  std::unique_ptr<DecodeStepper> decoder;
};

DenseSlotBackend::DenseSlotBackend(Model& model, PromptCache& prompt_cache, const DenseBackendOptions& options)
    : model_(model), prompt_cache_(prompt_cache), options_(options) {
  if (options.n_slots < 1) throw InvalidInput("--parallel must be >= 1, got " + std::to_string(options.n_slots));
  context_ = sequence_context(options.context_size, model.info().max_position_embeddings);
  for (int i = 0; i < options.n_slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->cache = new_cache();
    s->decoder = new_stepper(s->cache);
    slots_.push_back(std::move(s));
  }
}

DenseSlotBackend::~DenseSlotBackend() = default;

SequenceCache DenseSlotBackend::new_cache() const {
  return options_.make_cache ? options_.make_cache() : model_.make_cache(options_.cache);
}

std::unique_ptr<DecodeStepper> DenseSlotBackend::new_stepper(SequenceCache& cache) const {
  DecodeStepperOptions o;
  o.graphs = options_.graphs;
  return std::make_unique<DecodeStepper>(model_, cache, o);
}

DenseSlotBackend::Slot& DenseSlotBackend::slot(int handle) {
  if (handle < 0 || size_t(handle) >= slots_.size() || !slots_[size_t(handle)]->busy)
    throw InvalidInput("dense backend: no running sequence " + std::to_string(handle));
  return *slots_[size_t(handle)];
}

void DenseSlotBackend::reset(Slot& s) {
  retired_ += s.cache.counters();
  // The stepper holds the layers' replay hooks: a new cache gets a new stepper.
  s.decoder.reset();
  s.cache = new_cache();
  s.decoder = new_stepper(s.cache);
}

std::optional<SequenceBackend::Begun> DenseSlotBackend::begin(std::span<const int32_t> prompt,
                                                              const std::string& cache_salt) {
  check_prompt(prompt, context_, model_.info().vocab_size);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    if (s.busy) continue;
    s.busy = true;
    s.salt = cache_salt;
    Begun b;
    b.handle = int(i);
    // At least the last prompt token is prefilled again: its logits choose the first token.
    PromptCache::Match m = prompt_cache_.lookup(prompt, prompt.size() - 1, cache_salt);
    if (m.entry) {
      const size_t use = std::min(m.n_common, prompt.size() - 1);
      s.cache.restore(m.entry->states);
      const int64_t drop = int64_t(m.entry->tokens.size() - use);
      if (s.cache.can_trim(drop)) {
        s.cache.trim(drop);
        b.n_cached = int64_t(use);
      } else {
        // A sliding-window layer's ring no longer holds the rows before the common prefix's
        // end: the prompt is computed from the start.
        s.cache.trim(s.cache.offset());
        prompt_cache_.unusable(use);
      }
    }
    return b;
  }
  return std::nullopt;
}

void DenseSlotBackend::prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) {
  Slot& s = slot(handle);
  if (s.cache.offset() + int64_t(tokens.size()) > context_)
    throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
  Array out = model_.forward(host_i32(tokens), s.cache, false);
  if (want_logits) last_row(out, logits);
}

void DenseSlotBackend::decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs,
                              const MaskFn& /*masks: logits are returned*/) {
  outputs.assign(inputs.size(), {});
  for (size_t i = 0; i < inputs.size(); ++i) {
    Slot& s = slot(inputs[i].handle);
    if (s.cache.offset() + 1 > context_) throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
    ops::fill_i32_(s.decoder->token(), inputs[i].token);
    last_row(s.decoder->step(), outputs[i].logits);
  }
}

void DenseSlotBackend::end(int handle, std::span<const int32_t> tokens) {
  Slot& s = slot(handle);
  s.busy = false;
  if (prompt_cache_.enabled() && !tokens.empty() && s.cache.offset() == int64_t(tokens.size()))
    prompt_cache_.store(std::vector<int32_t>(tokens.begin(), tokens.end()), s.cache.snapshot(), s.salt);
  reset(s);
}

double DenseSlotBackend::kv_usage() const {
  int64_t used = 0;
  for (const auto& s : slots_)
    if (s->busy) used += s->cache.offset();
  return double(used) / double(context_ * int64_t(slots_.size()));
}

KVCounters DenseSlotBackend::kv_counters() const {
  KVCounters c = retired_;
  for (const auto& s : slots_) c += s->cache.counters();
  return c;
}

}  // namespace osprey
