#include "serve/dense_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/ops.h"
#include "backend/readback.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/decode_stepper.h"
#include "serve/invariant_scope.h"
#include "serve/prompt_cache.h"
#include "serve/prompt_store.h"

namespace osprey {
namespace {

// The last row of `logits` ([n, vocab] f32 on any device), on the host.
void last_row(const Array& logits, std::vector<float>& out) {
  Array host = ops::to_device(logits, Device::cpu());
  const int64_t vocab = host.dim(-1);
  const float* row = host.data<float>() + (host.numel() - vocab);
  out.assign(row, row + vocab);
}

ops::DeviceSampling device_sampling(const SamplerParams* p) {
  ops::DeviceSampling d;  // greedy: temperature 0, the argmax
  if (!p) return d;
  d.temperature = p->temperature;
  d.top_k = p->top_k;
  d.top_p = p->top_p;
  d.min_p = p->min_p;
  d.seed = p->seed;
  return d;
}

// The device sampler found non-finite logits. The host sampler's words (which logits are NaN or
// Inf) when `last`, the logits it read last (this token's or, pipelined, the next step's),
// holds them; else the token's position alone.
std::string non_finite_detail(const Array& last, uint64_t counter) {
  const std::string where = "at generated token " + std::to_string(counter);
  if (last.defined()) {
    std::vector<float> row;
    last_row(last, row);
    if (std::any_of(row.begin(), row.end(), [](float x) { return !std::isfinite(x); })) {
      try {
        throw_non_finite(row);
      } catch (const InvalidInput& e) {
        return std::string(e.what()) + " (" + where + ")";
      }
    }
  }
  return non_finite_logits_message(where);
}

// Multi-row writes in place on a sequence cache for a scope (a verify step), off after.
class MultirowInplaceScope {
 public:
  explicit MultirowInplaceScope(SequenceCache& c) : c_(c) { c_.set_multirow_inplace(true); }
  ~MultirowInplaceScope() { c_.set_multirow_inplace(false); }
  MultirowInplaceScope(const MultirowInplaceScope&) = delete;
  MultirowInplaceScope& operator=(const MultirowInplaceScope&) = delete;

 private:
  SequenceCache& c_;
};

}  // namespace

struct DenseSlotBackend::Slot {
  bool busy = false;
  std::string salt;        // the running sequence's prompt-cache salt
  SequenceCache own;       // the slot's cache, unless it runs over the caller's
  SequenceCache* cache = nullptr;
  int64_t base = 0;        // rows a caller's cache held before the sequence began
  std::unique_ptr<DecodeStepper> decoder;
  // CUDA: the chosen tokens' copies to the host, two in flight at most (the token read now
  // and the one of the step ahead).
  std::unique_ptr<TokenReadback> readback;
  uint64_t n_enqueued = 0, n_read = 0;
  bool ahead = false;      // the step fed by `returned` is enqueued
  int32_t returned = -1;   // the token decode() or prefill_and_choose() returned last
  Array last_logits;       // the logits the device sampler read last (an error's detail)
  std::vector<ImageSpan> images;  // the prompt's images, at positions of the cache (base added)
};

DenseSlotBackend::DenseSlotBackend(Model& model, PromptCache& prompt_cache, const DenseBackendOptions& options)
    : model_(model), prompt_cache_(prompt_cache), options_(options) {
  if (options.n_slots < 1) throw InvalidInput("--parallel must be >= 1, got " + std::to_string(options.n_slots));
  if (options.caller_cache) {
    if (options.n_slots != 1) throw InvalidInput("dense backend: a caller's cache takes one slot");
    const int64_t model_ctx = model.info().max_position_embeddings;
    context_ = model_ctx > 0 ? model_ctx - options.caller_cache->offset() : std::numeric_limits<int64_t>::max() / 4;
  } else {
    context_ = sequence_context(options.context_size, model.info().max_position_embeddings);
  }
  const Device dev = model.info().device;
  for (int i = 0; i < options.n_slots; ++i) {
    auto s = std::make_unique<Slot>();
    if (options.caller_cache) {
      s->cache = options.caller_cache;
    } else {
      s->own = new_cache();
      s->cache = &s->own;
    }
    s->decoder = new_stepper(*s->cache);
    if (!dev.is_cpu()) s->readback = std::make_unique<TokenReadback>(dev, 2);
    slots_.push_back(std::move(s));
  }
  last_.resize(slots_.size());
}

DenseSlotBackend::~DenseSlotBackend() {
  for (auto& s : slots_) {
    try {
      drop_ahead(*s);
    } catch (const std::exception&) {
    }
  }
}

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
  retired_ += s.cache->counters();
  counters_.n_graph_replays += s.decoder->n_graph_replays();
  counters_.n_graph_captures += s.decoder->n_graph_captures();
  // The stepper holds the layers' replay hooks: a new cache gets a new stepper.
  s.decoder.reset();
  s.own = new_cache();
  s.decoder = new_stepper(s.own);
}

void DenseSlotBackend::check_room(const Slot& s, int64_t n) const {
  if (s.cache->offset() - s.base + n > context_)
    throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
}

std::optional<SequenceBackend::Begun> DenseSlotBackend::begin(std::span<const int32_t> prompt,
                                                              const std::string& cache_salt) {
  check_prompt(prompt, context_, model_.info().vocab_size);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    if (s.busy) continue;
    s.busy = true;
    s.images.clear();
    s.salt = cache_salt;
    Begun b;
    b.handle = int(i);
    if (options_.caller_cache) {
      s.base = s.cache->offset();
      // The prefill's chunks land in one buffer size; decode grows step by step from there.
      s.cache->reserve(s.cache->offset() + int64_t(prompt.size()));
      return b;
    }
    // At least the last prompt token is prefilled again: its logits choose the first token.
    PromptCache::Match m = prompt_cache_.lookup(prompt, prompt.size() - 1, cache_salt);
    if (m.entry) {
      if (store_) store_->touch(prompt_prefix_id(m.entry->salt, m.entry->tokens));
      const size_t use = std::min(m.n_common, prompt.size() - 1);
      s.cache->restore(m.entry->states);
      const int64_t drop = int64_t(m.entry->tokens.size() - use);
      if (s.cache->can_trim(drop)) {
        s.cache->trim(drop);
        b.n_cached = int64_t(use);
      } else {
        // A sliding-window layer's ring no longer holds the rows before the common prefix's
        // end: the prompt is computed from the start.
        s.cache->trim(s.cache->offset());
        prompt_cache_.unusable(use);
      }
    }
    return b;
  }
  return std::nullopt;
}

bool DenseSlotBackend::device_chooses(const DecodeInput& in) const {
  return !model_.info().device.is_cpu() && !in.masked &&
         (in.greedy || (in.sampling && !needs_host_sampler(*in.sampling)));
}

void DenseSlotBackend::choose_on_device(Slot& s, const Array& logits, const DecodeInput& in, uint64_t counter) {
  s.last_logits = logits;
  ops::sample_into(logits, device_sampling(in.sampling), counter, s.decoder->token());
  s.readback->enqueue(s.decoder->token(), int(s.n_enqueued++ % 2));
}

int32_t DenseSlotBackend::finish_choice(Slot& s, const DecodeInput& in) {
  // The token read back now is draw in.counter (the step enqueued ahead drew it with the
  // counter the scheduler now gives); the step ahead draws the next one.
  const uint64_t counter = in.counter;
  s.ahead = false;
  if (options_.pipelined && in.more) {
    // The next step's input is the token just chosen, still on the device.
    check_room(s, 1);
    choose_on_device(s, s.decoder->step(), in, counter + 1);
    s.ahead = true;
    ++counters_.n_ahead;
  }
  const int32_t token = s.readback->wait(int(s.n_read++ % 2));
  if (token == kNonFiniteLogits) {
    ops::synchronize(model_.info().device);  // the step enqueued ahead may still run
    throw InvalidInput(non_finite_detail(s.last_logits, counter));
  }
  s.returned = token;
  ++counters_.n_device_chosen;
  return token;
}

void DenseSlotBackend::drop_ahead(Slot& s) {
  while (s.n_read < s.n_enqueued) s.readback->wait(int(s.n_read++ % 2));
  if (s.ahead) {
    // The step enqueued ahead wrote a row for a token that is not kept.
    s.cache->rewind_own_write(1);
    s.ahead = false;
  }
}

void DenseSlotBackend::set_images(int handle, std::vector<ImageSpan> images) {
  Slot& s = slot(handle);
  for (ImageSpan& im : images) im.pos0 += s.base;
  s.images = std::move(images);
}

void DenseSlotBackend::prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) {
  Slot& s = slot(handle);
  drop_ahead(s);
  check_room(s, int64_t(tokens.size()));
  Array out = model_.forward(host_i32(tokens), *s.cache, false, s.images);
  if (want_logits) last_row(out, logits);
}

int32_t DenseSlotBackend::prefill_and_choose(int handle, std::span<const int32_t> tokens, const DecodeInput& choice,
                                             std::vector<float>& logits) {
  if (!device_chooses(choice)) {
    prefill(handle, tokens, true, logits);
    ++counters_.n_host_chosen;
    return -1;
  }
  Slot& s = slot(handle);
  drop_ahead(s);
  check_room(s, int64_t(tokens.size()));
  choose_on_device(s, model_.forward(host_i32(tokens), *s.cache, false, s.images), choice, choice.counter);
  return finish_choice(s, choice);
}

void DenseSlotBackend::decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs,
                              const MaskFn& /*masks: masked inputs get logits*/) {
  outputs.assign(inputs.size(), {});
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DecodeInput& in = inputs[i];
    Slot& s = slot(in.handle);
    BatchInvariantScope invariant(in.invariant);
    if (!device_chooses(in)) {
      drop_ahead(s);
      check_room(s, 1);
      ops::fill_i32_(s.decoder->token(), in.token);
      last_row(s.decoder->step(), outputs[i].logits);
      ++counters_.n_host_chosen;
      continue;
    }
    if (s.ahead && in.token != s.returned) drop_ahead(s);  // fed another token than the one chosen
    if (!s.ahead) {
      check_room(s, 1);
      ops::fill_i32_(s.decoder->token(), in.token);
      choose_on_device(s, s.decoder->step(), in, in.counter);
    }
    try {
      outputs[i].token = finish_choice(s, in);
    } catch (const InvalidInput& e) {
      outputs[i].error = e.what();
    }
  }
}

bool DenseSlotBackend::can_verify(int handle) const {
  if (handle < 0 || size_t(handle) >= slots_.size()) return false;
  const Slot& s = *slots_[size_t(handle)];
  return s.busy && s.cache->gives_back_rows();
}

void DenseSlotBackend::verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) {
  Slot& s = slot(handle);
  if (!s.cache->gives_back_rows())
    throw InvalidInput("dense backend: this model's KV cache cannot give drafted rows back (sliding-window layers)");
  drop_ahead(s);
  check_room(s, int64_t(tokens.size()));
  BatchInvariantScope invariant(true);
  MultirowInplaceScope inplace(*s.cache);
  Array out = ops::to_device(model_.forward(host_i32(tokens), *s.cache, true), Device::cpu());
  logits.assign(out.data<float>(), out.data<float>() + out.numel());
  ++counters_.n_verify_steps;
  counters_.n_verify_rows += uint64_t(tokens.size());
}

void DenseSlotBackend::rewind(int handle, int64_t n) {
  Slot& s = slot(handle);
  if (n <= 0) return;
  // The rows of the slot's own last write (a verify; no snapshot since): its length moves back
  // and the guard stays armed, so the next write goes in place at the new length.
  s.cache->rewind_own_write(n);
}

void DenseSlotBackend::end(int handle, std::span<const int32_t> tokens) {
  Slot& s = slot(handle);
  drop_ahead(s);
  s.busy = false;
  if (options_.caller_cache) return;  // the caller keeps the cache, holding the sequence's rows
  if (prompt_cache_.enabled() && !tokens.empty() && s.cache->offset() == int64_t(tokens.size())) {
    std::vector<int32_t> t(tokens.begin(), tokens.end());
    last_[size_t(handle)] = {t, s.salt};
    store_entry(std::move(t), s.cache->snapshot(), s.salt, /*persist=*/true);
  }
  reset(s);
}

PromptCache::Stored DenseSlotBackend::store_entry(std::vector<int32_t> tokens, std::vector<KVState> states,
                                                  const std::string& salt, bool persist) {
  PromptCache::Stored st = prompt_cache_.store(std::move(tokens), std::move(states), salt);
  if (!store_) return st;
  // A replaced entry's prefix is in the new one's file.
  for (const auto& r : st.replaced) store_->remove(prompt_prefix_id(r->salt, r->tokens));
  // NOTE: on a device this copies the entry's rows to the host on the engine thread; the disk
  // is the writer thread's.
  if (persist && st.entry && store_->enabled())
    store_->write(dense_file_data(st.entry->tokens, st.entry->states, salt, layers_));
  return st;
}

int64_t DenseSlotBackend::attach_store(PromptStore& store) {
  store_ = &store;
  layers_ = model_kv_layers(model_, options_.cache);
  if (!store.enabled() || !prompt_cache_.enabled()) return 0;
  // The most recently used files that fit the budget, put in oldest first so that the cache's
  // recency follows the files'.
  std::vector<PromptFileInfo> files = store.usable_files();
  uint64_t bytes = 0;
  size_t n = 0;
  while (n < files.size() && bytes + files[n].payload_bytes <= prompt_cache_.budget_bytes()) bytes += files[n++].payload_bytes;
  int64_t restored = 0, tokens = 0;
  for (size_t i = n; i-- > 0;) {
    std::optional<PromptFileData> d = store.read(files[i].path);
    if (!d) continue;
    const int64_t vocab = model_.info().vocab_size;
    if (std::any_of(d->tokens.begin(), d->tokens.end(), [&](int32_t t) { return t < 0 || t >= vocab; })) {
      log_warn("prompt cache: skipping " + files[i].path.string() + ": a token id outside the vocabulary");
      continue;
    }
    const int64_t n_tokens = int64_t(d->tokens.size());
    std::vector<KVState> states = dense_file_states(*d, layers_, model_.info().device);
    PromptCache::Stored st = store_entry(std::move(d->tokens), std::move(states), d->salt, false);
    if (!st.entry) continue;
    store.note_restored(n_tokens);
    ++restored;
    tokens += n_tokens;
  }
  if (!files.empty())
    log_info("prompt cache: restored " + std::to_string(restored) + " of " + std::to_string(files.size()) + " entries (" +
             std::to_string(tokens) + " tokens) from " + store.options().dir.string());
  return restored;
}

std::optional<PromptFileData> DenseSlotBackend::slot_file(int slot) {
  const auto& [tokens, salt] = last_.at(size_t(slot));
  if (tokens.empty()) return std::nullopt;
  std::shared_ptr<const PromptCache::Entry> e = prompt_cache_.find(tokens, salt);
  if (!e) return std::nullopt;
  return dense_file_data(e->tokens, e->states, e->salt,
                         layers_.empty() ? model_kv_layers(model_, options_.cache) : layers_);
}

int64_t DenseSlotBackend::restore_slot(int slot, const PromptFileData& data) {
  if (data.kind != PromptFileKind::dense)
    throw InvalidInput("the file holds paged blocks; the dense layout restores dense snapshots (--kv-layout dense)");
  const int64_t vocab = model_.info().vocab_size;
  for (int32_t t : data.tokens)
    if (t < 0 || t >= vocab) throw InvalidInput("the file holds token id " + std::to_string(t) + ", outside the vocabulary");
  const std::vector<KVCacheParams> layers = layers_.empty() ? model_kv_layers(model_, options_.cache) : layers_;
  PromptCache::Stored st =
      store_entry(data.tokens, dense_file_states(data, layers, model_.info().device), data.salt, false);
  last_.at(size_t(slot)) = {data.tokens, data.salt};
  // Stored, or already covered by a longer entry of the same salt.
  return st.entry || prompt_cache_.find(data.tokens, data.salt) ? int64_t(data.tokens.size()) : 0;
}

int64_t DenseSlotBackend::erase_slot(int slot) {
  auto& [tokens, salt] = last_.at(size_t(slot));
  if (tokens.empty()) return 0;
  const bool erased = prompt_cache_.erase(tokens, salt);
  if (erased && store_) store_->remove(prompt_prefix_id(salt, tokens));
  const int64_t n = erased ? int64_t(tokens.size()) : 0;
  tokens.clear();
  return n;
}

double DenseSlotBackend::kv_usage() const {
  int64_t used = 0;
  for (const auto& s : slots_)
    if (s->busy) used += s->cache->offset() - s->base;
  return double(used) / double(context_ * int64_t(slots_.size()));
}

KVCounters DenseSlotBackend::kv_counters() const {
  KVCounters c = retired_;
  if (options_.caller_cache) {
    c += options_.caller_cache->counters();
    return c;
  }
  for (const auto& s : slots_) c += s->cache->counters();
  return c;
}

DenseBackendCounters DenseSlotBackend::counters() const {
  DenseBackendCounters c = counters_;
  for (const auto& s : slots_) {
    c.n_graph_replays += s->decoder->n_graph_replays();
    c.n_graph_captures += s->decoder->n_graph_captures();
  }
  return c;
}

}  // namespace osprey
