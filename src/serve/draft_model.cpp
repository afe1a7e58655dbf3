#include "serve/draft_model.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "backend/sample_noise.h"
#include "bundle/model_files.h"
#include "core/error.h"
#include "engine/decode_stepper.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

// Rows of a catch-up feed per forward pass (the first draft of a long prompt).
constexpr int64_t kDraftFeedChunk = 512;

// The last row of `logits` ([n, vocab] f32 on any device), its first `n` ids, on the host.
void last_row_prefix(const Array& logits, int64_t n, std::vector<float>& out) {
  Array host = ops::to_device(logits, Device::cpu());
  const int64_t vocab = host.dim(-1);
  const float* row = host.data<float>() + (host.numel() - vocab);
  out.assign(row, row + std::min(n, vocab));
}

// softmax(l)'s largest probability, 1 / sum(exp(l - max)); throws for non-finite logits.
double top_probability(std::span<const float> l) {
  float mx = -INFINITY;
  for (float x : l) {
    if (!std::isfinite(x)) throw_non_finite(l);
    mx = std::max(mx, x);
  }
  double s = 0;
  for (float x : l) s += std::exp(double(x) - double(mx));
  return 1.0 / s;
}

}  // namespace

uint64_t draft_noise_seed(uint64_t seed) { return noise_mix(seed ^ 0x6472616674ull); }     // "draft"
uint64_t verify_noise_seed(uint64_t seed) { return noise_mix(seed ^ 0x766572696679ull); }  // "verify"

struct ModelDrafter::Slot {
  bool busy = false;
  SequenceCache cache;
  std::unique_ptr<DecodeStepper> stepper;
  std::vector<int32_t> held;  // the tokens whose K/V rows the cache holds, in order
};

ModelDrafter::ModelDrafter(Model& draft, const DraftModelOptions& options) : model_(draft), options_(options) {
  if (draft.info().embedding_only)
    throw InvalidInput("--model-draft: the draft model has no language-model head (an embedding checkpoint)");
  if (!draft.make_cache(options.cache).gives_back_rows())
    throw InvalidInput(
        "--model-draft: the draft model has sliding-window layers, whose rotating KV cache of `window` rows cannot "
        "give drafted rows back");
  vocab_ = options.target_vocab > 0 ? std::min(options.target_vocab, draft.info().vocab_size) : draft.info().vocab_size;
  context_ = draft.info().max_position_embeddings;
}

ModelDrafter::~ModelDrafter() = default;

ModelDrafter::Slot& ModelDrafter::slot(int handle) {
  if (handle < 0 || size_t(handle) >= slots_.size() || !slots_[size_t(handle)]->busy)
    throw InvalidInput("draft model: no sequence " + std::to_string(handle));
  return *slots_[size_t(handle)];
}

int ModelDrafter::begin() {
  size_t i = 0;
  while (i < slots_.size() && slots_[i]->busy) ++i;
  if (i == slots_.size()) slots_.push_back(std::make_unique<Slot>());
  Slot& s = *slots_[i];
  s.busy = true;
  // The stepper holds the layers' replay hooks: a new cache gets a new stepper.
  s.stepper.reset();
  s.cache = model_.make_cache(options_.cache);
  DecodeStepperOptions o;
  o.graphs = options_.graphs;
  s.stepper = std::make_unique<DecodeStepper>(model_, s.cache, o);
  s.held.clear();
  return int(i);
}

void ModelDrafter::end(int handle) {
  Slot& s = slot(handle);
  s.busy = false;
  s.stepper.reset();
  s.cache = SequenceCache();
  s.held.clear();
}

KVCounters ModelDrafter::kv_counters() const {
  KVCounters c;
  for (const auto& s : slots_)
    if (s->busy) c += s->cache.counters();
  return c;
}

DraftProposal ModelDrafter::draft(int handle, std::span<const int32_t> tokens, int max_tokens,
                                  const SamplerParams& sampler, uint64_t counter) {
  DraftProposal out;
  Slot& s = slot(handle);
  const int64_t len = int64_t(tokens.size());
  int64_t k_max = max_tokens;
  // The draft feeds up to len + k_max - 1 rows; its context bounds them.
  if (context_ > 0) k_max = std::min<int64_t>(k_max, context_ - len + 1);
  if (k_max <= 0 || len == 0) return out;

  // Give back the rows past the common prefix (rejected drafts), keeping at least the last
  // token to feed: its logits choose the first draft.
  int64_t keep = 0;
  const int64_t n_held = int64_t(s.held.size());
  while (keep < std::min(n_held, len - 1) && s.held[size_t(keep)] == tokens[size_t(keep)]) ++keep;
  if (n_held > keep) {
    s.cache.rewind_own_write(n_held - keep);
    s.held.resize(size_t(keep));
  }
  // Feed what the cache misses, in place where the guard allows (multi-row writes at the end of
  // the cache's own rows), in chunks.
  std::vector<float> logits;
  s.cache.set_multirow_inplace(true);
  try {
    for (int64_t at = keep; at < len; at += kDraftFeedChunk) {
      const int64_t n = std::min(kDraftFeedChunk, len - at);
      const std::span<const int32_t> chunk = tokens.subspan(size_t(at), size_t(n));
      Array l = model_.forward(host_i32(chunk), s.cache, false);
      s.held.insert(s.held.end(), chunk.begin(), chunk.end());
      n_fed_ += uint64_t(n);
      if (at + n == len) last_row_prefix(l, vocab_, logits);
    }
  } catch (...) {
    s.cache.set_multirow_inplace(false);
    throw;
  }
  s.cache.set_multirow_inplace(false);

  Sampler chooser(sampler);
  const bool greedy = sampler.temperature <= 0;
  const uint64_t seed = draft_noise_seed(sampler.seed);
  // The chain's history: the sequence and the drafts so far (only a penalty reads it).
  std::vector<int32_t> history;
  if (uses_history(sampler)) history.assign(tokens.begin(), tokens.end());
  for (int64_t i = 0; i < k_max; ++i) {
    int32_t d = -1;
    if (greedy) {
      if (top_probability(logits) < options_.p_min) break;
      d = chooser.sample_at(logits, history, {}, counter + uint64_t(i));
    } else {
      TokenDistribution q = chooser.distribution(logits, history);
      float top = 0;
      for (const auto& e : q) top = std::max(top, e.second);
      if (top < options_.p_min) break;
      d = draw_from(q, noise_uniform(seed, counter + uint64_t(i), 0));
      out.q.push_back(std::move(q));
    }
    out.tokens.push_back(d);
    if (!history.empty()) history.push_back(d);
    if (i + 1 == k_max) break;
    ops::fill_i32_(s.stepper->token(), d);
    last_row_prefix(s.stepper->step(), vocab_, logits);
    s.held.push_back(d);
    ++n_steps_;
  }
  return out;
}

void check_draft_compatible(const Model& target, const Tokenizer* target_tokenizer, const Model& draft,
                            const Tokenizer* draft_tokenizer, const std::string& draft_name) {
  const std::string flag = "--model-draft " + draft_name + ": ";
  if (draft.info().embedding_only)
    throw InvalidInput(flag + "the draft model has no language-model head (an embedding checkpoint)");
  if (!target_tokenizer || !draft_tokenizer) {
    if (target_tokenizer || draft_tokenizer)
      throw InvalidInput(flag + (draft_tokenizer ? "the target model carries no tokenizer" : "the draft model carries no tokenizer") +
                         ", so the draft's tokens cannot be shown to be the target's");
    if (draft.info().vocab_size != target.info().vocab_size)
      throw InvalidInput(flag + "the draft's vocabulary has " + std::to_string(draft.info().vocab_size) +
                         " ids, the target's " + std::to_string(target.info().vocab_size));
    return;
  }
  const Tokenizer& t = *target_tokenizer;
  const Tokenizer& d = *draft_tokenizer;
  const std::string differs = "the draft's tokenizer differs from the target's: ";
  if (t.vocab_size() != d.vocab_size())
    throw InvalidInput(flag + differs + "its vocabulary has " + std::to_string(d.vocab_size()) + " ids, the target's " +
                       std::to_string(t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    std::string a, b;
    bool has_a = true, has_b = true;
    try {
      a = t.token_text(id);
    } catch (const InvalidInput&) {
      has_a = false;
    }
    try {
      b = d.token_text(id);
    } catch (const InvalidInput&) {
      has_b = false;
    }
    if (has_a != has_b || a != b)
      throw InvalidInput(flag + differs + "token " + std::to_string(id) + " is " + (has_b ? "\"" + b + "\"" : "absent") +
                         " in the draft's, " + (has_a ? "\"" + a + "\"" : "absent") + " in the target's");
    if (t.is_special(id) != d.is_special(id))
      throw InvalidInput(flag + differs + "token " + std::to_string(id) + " is special in " +
                         (t.is_special(id) ? "the target's" : "the draft's") + " only");
  }
  if (t.bos_id() != d.bos_id()) throw InvalidInput(flag + differs + "the bos ids differ");
  if (t.eos_ids() != d.eos_ids()) throw InvalidInput(flag + differs + "the eos ids differ");
  // The same vocabulary may still split text differently (merges, normalizer, pre-tokenizer).
  const std::string probe =
      "Speculative decoding: 12,345.67 tokens/s\n\t  don't STOP -- naïve café, 東京, привет, 🙂 <tag attr=\"x\">";
  if (t.encode(probe, false, false) != d.encode(probe, false, false))
    throw InvalidInput(flag + differs + "they split the same probe text into different ids");
}

std::unique_ptr<Model> load_draft_model(const std::filesystem::path& dir, const Model& target,
                                        const Tokenizer* target_tokenizer, const LoadOptions& options) {
  if (!std::filesystem::exists(dir)) throw IoError("--model-draft: model folder " + dir.string() + " does not exist");
  std::optional<Tokenizer> draft_tokenizer;
  if (model_has_tokenizer(dir)) draft_tokenizer = load_model_tokenizer(dir);
  std::unique_ptr<Model> draft = load_model(dir, options);
  check_draft_compatible(target, target_tokenizer, *draft, draft_tokenizer ? &*draft_tokenizer : nullptr, dir.string());
  return draft;
}

}  // namespace osprey
