#include "serve/paged_backend.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda_available.h"
#include "backend/fault_injection.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/log.h"
#include "sample/sampler.h"
#include "serve/invariant_scope.h"
#include "serve/prompt_store.h"

namespace osprey {
namespace {

constexpr int64_t kCpuDefaultPoolBytes = int64_t(4) << 30;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An i32 array of `values` on `device`.
Array i32_array(const std::vector<int32_t>& values, const Shape& shape, Device device) {
  Array a = Array::empty(shape, DType::i32);
  std::copy(values.begin(), values.end(), a.data<int32_t>());
  return ops::to_device(a, device);
}

}  // namespace

PagedBackend::PagedBackend(Model& model, const PagedBackendOptions& options) : model_(model), options_(options) {
  if (options.max_sequences < 1)
    throw InvalidInput("--parallel must be >= 1, got " + std::to_string(options.max_sequences));
  if (options.block_size < 1 || options.block_size > 1024)
    throw InvalidInput("--block-size must be in [1, 1024], got " + std::to_string(options.block_size));
  if (options.kv_cache_bytes < 0) throw InvalidInput("--kv-cache-mib must be >= 0");
  if (options.split_keys < 0 || options.split_keys % 64 != 0)
    throw InvalidInput("the paged attention's split size must be a multiple of 64, got " + std::to_string(options.split_keys));
  if (!(options.kv_memory_fraction > 0 && options.kv_memory_fraction <= 1))
    throw InvalidInput("the KV memory fraction must be in (0, 1]");
  if (options.prefill_chunk < 1) throw InvalidInput("the prefill chunk must be >= 1, got " + std::to_string(options.prefill_chunk));
  const ModelInfo& info = model.info();
  context_ = sequence_context(options.context_size, info.max_position_embeddings);
  pools_ = std::make_unique<PagedPools>(size_pools());
  step_.groups.resize(pools_->n_groups());
  step_cache_ = make_paged_step_cache(*pools_, step_);
  table_width_ = ceil_div(context_, options.block_size);
  // A model whose step reads values back to the host (a mixture of experts' routing) cannot be
  // captured: it runs every step eagerly, as on the CPU.
  if (info.device.is_cpu() || !model.replayable_step()) options_.graphs = false;
  seqs_.resize(size_t(options.max_sequences));
  last_.resize(seqs_.size());
  publish_stats();
}

PagedBackend::~PagedBackend() = default;

int64_t PagedBackend::seq_blocks(int64_t w, int64_t rows) const {
  const int64_t bs = options_.block_size, full = ceil_div(rows, bs);
  // A window's rows, the chunk or verify being written, and the partial blocks at both ends.
  const int64_t write = std::max(options_.prefill_chunk, options_.verify_rows);
  return w > 0 ? std::min(full, ceil_div(w - 1 + write, bs) + 2) : full;
}

int64_t PagedBackend::tail_blocks(int64_t w) const {
  // The full blocks of the last w - 1 rows (a query at the sequence's end sees them).
  return std::min(ceil_div(context_, options_.block_size), ceil_div(w - 1, options_.block_size) + 1);
}

PagedPoolsParams PagedBackend::size_pools() {
  const ModelInfo& info = model_.info();
  PagedPoolsParams pp;
  KVCacheParams types;  // --cache-type-k / --cache-type-v, else the model's
  types.k_type = options_.k_type;
  types.v_type = options_.v_type;
  for (int64_t l = 0; l < info.n_layers; ++l) pp.layers.push_back(model_.kv_params(l, types));
  pp.block_size = options_.block_size;
  pp.inplace = options_.inplace;
  const std::vector<int64_t> windows = paged_group_windows(pp.layers);
  const size_t n_groups = windows.size();
  // per_seq: the blocks of one running sequence. tail: with the prefix cache on, a windowed
  // group also has room for one ended sequence's window (its blocks are the last evicted: kTail
  // in kv/paged_pool.cpp), so that a conversation's next turn finds it even after another
  // request ran in between.
  std::vector<int64_t> bb(n_groups), per_seq(n_groups), tail(n_groups, 0);
  int64_t all_bytes = 0;  // one block of every group
  for (size_t g = 0; g < n_groups; ++g) {
    bb[g] = paged_group_block_bytes(pp.layers, options_.block_size, windows[g]);
    per_seq[g] = seq_blocks(windows[g], context_);
    if (windows[g] > 0 && options_.prefix_cache) tail[g] = tail_blocks(windows[g]);
    all_bytes += bb[g];
  }
  int64_t bytes = options_.kv_cache_bytes;
  const char* sized_by = "--kv-cache-mib";
  bool budget = bytes > 0;
  if (bytes == 0) {
    for (size_t g = 0; g < n_groups; ++g) bytes += (int64_t(options_.max_sequences) * per_seq[g] + tail[g]) * bb[g];
    sized_by = "room for every sequence's full context";
    if (!info.device.is_cpu()) {
      const int64_t cap = int64_t(double(cuda_free_memory(info.device.index)) * options_.kv_memory_fraction);
      if (bytes > cap) {
        bytes = cap;
        sized_by = "a fraction of the free device memory";
        budget = true;
      }
    } else if (bytes > kCpuDefaultPoolBytes) {
      bytes = kCpuDefaultPoolBytes;
      sized_by = "the CPU default of 4 GiB";
      budget = true;
    }
  }
  pp.n_blocks.assign(n_groups, 0);
  if (!budget) {
    for (size_t g = 0; g < n_groups; ++g) pp.n_blocks[g] = int64_t(options_.max_sequences) * per_seq[g] + tail[g];
  } else {
    // A budget: as many blocks of each group as one pool of whole-model blocks would have, but
    // a windowed group beside a full-attention one takes only what its sequences hold at most
    // (and as much again for the prefix cache), leaving the rest to the full-attention group.
    const int64_t even = bytes / all_bytes;
    int64_t left = bytes;
    for (size_t g = 0; g < n_groups; ++g) {
      if (windows[g] == 0) continue;
      pp.n_blocks[g] = windows[0] == 0 ? std::min(even, 2 * int64_t(options_.max_sequences) * per_seq[g]) : even;
      left -= pp.n_blocks[g] * bb[g];
    }
    if (windows[0] == 0) pp.n_blocks[0] = left / bb[0];
  }
  for (size_t g = 0; g < n_groups; ++g)
    if (pp.n_blocks[g] < 1)
      throw InvalidInput("the KV pool (" + std::to_string(bytes >> 20) + " MiB) cannot hold one block of " +
                         std::to_string(all_bytes) + " bytes");
  std::string groups;
  int64_t total = 0;
  for (size_t g = 0; g < n_groups; ++g) {
    total += pp.n_blocks[g] * bb[g];
    groups += (g ? "; " : "") + std::to_string(pp.n_blocks[g]) + " blocks of " +
              (windows[g] > 0 ? "the layers of window " + std::to_string(windows[g])
                               : std::string(n_groups > 1 ? "the full-attention layers" : "every layer"));
  }
  log_info("KV pool: " + groups + ", " + std::to_string(options_.block_size) + " rows a block (" +
           std::to_string(total >> 20) + " MiB; " + sized_by + ")");
  const int64_t rows = pp.n_blocks[0] * options_.block_size;
  if (windows[0] == 0 && rows < context_)
    log_warn("the KV pool holds " + std::to_string(rows) + " tokens, fewer than one full context of " +
             std::to_string(context_) + ": longer sequences fail");
  return pp;
}

PagedBackend::Seq& PagedBackend::seq(int handle) {
  if (handle < 0 || size_t(handle) >= seqs_.size() || !seqs_[size_t(handle)].busy)
    throw InvalidInput("paged backend: no running sequence " + std::to_string(handle));
  return seqs_[size_t(handle)];
}

std::optional<SequenceBackend::Begun> PagedBackend::begin(std::span<const int32_t> prompt, const std::string& cache_salt) {
  check_prompt(prompt, context_, model_.info().vocab_size);
  const int64_t bs = options_.block_size, n_prompt = int64_t(prompt.size());
  for (size_t g = 0; g < pools_->n_groups(); ++g)
    if (seq_blocks(pools_->window(g), n_prompt) > pools_->group(g).n_blocks())
      throw InvalidInput("the prompt (" + std::to_string(prompt.size()) + " tokens) needs more KV blocks than the pool has (" +
                         std::to_string(pools_->group(g).n_blocks()) + " of " + std::to_string(bs) + " rows" +
                         (pools_->n_groups() > 1 ? " for the layers of window " + std::to_string(pools_->window(g)) : "") + ")");
  auto free_slot = std::find_if(seqs_.begin(), seqs_.end(), [](const Seq& s) { return !s.busy; });
  if (free_slot == seqs_.end()) return std::nullopt;

  const PagedPool::SeqId id = pools_->create();
  // At least the last prompt token is computed again: its logits choose the next token.
  const int64_t n_cached = options_.prefix_cache ? pools_->match_prefix(id, prompt, n_prompt - 1, cache_salt) : 0;
  // Admit only when the rest of the prompt fits now, so that prefill rarely preempts.
  auto more = [&](size_t g) { return seq_blocks(pools_->window(g), n_prompt) - seq_blocks(pools_->window(g), n_cached); };
  if (!pools_->has_room(more)) {
    pools_->free(id);
    publish_stats();
    return std::nullopt;
  }
  free_slot->busy = true;
  free_slot->id = id;
  free_slot->salt = cache_salt;
  free_slot->tokens.clear();
  free_slot->images.clear();
  free_slot->rewindable = 0;
  advance(*free_slot, prompt.first(size_t(n_cached)));
  if (store_ && n_cached > 0) store_->touch(prompt_prefix_id(cache_salt, prompt.first(size_t(n_cached))));
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (options_.prefix_cache) ++(n_cached > 0 ? prefix_.n_hits : prefix_.n_misses);
    prefix_.n_restored_tokens += uint64_t(n_cached);
  }
  publish_stats();
  return Begun{int(free_slot - seqs_.begin()), n_cached};
}

bool PagedBackend::keeps_tokens() const {
  // Groups are ordered by window: the last one's is the largest (0: none has a window). The
  // tokens are read only to cache the blocks given back.
  return pools_->window(pools_->n_groups() - 1) > 0 && options_.prefix_cache;
}

void PagedBackend::release_behind(Seq& s) {
  if (pools_->window(pools_->n_groups() - 1) == 0) return;
  pools_->release_behind(s.id, s.tokens, options_.prefix_cache, s.salt);
}

void PagedBackend::advance(Seq& s, std::span<const int32_t> tokens) {
  s.rewindable = 0;
  if (keeps_tokens()) s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  release_behind(s);
}

std::optional<int> PagedBackend::fork(int handle) {
  const Seq& source = seq(handle);
  auto free_slot = std::find_if(seqs_.begin(), seqs_.end(), [](const Seq& s) { return !s.busy; });
  if (free_slot == seqs_.end()) return std::nullopt;
  free_slot->busy = true;
  free_slot->id = pools_->fork(source.id);
  free_slot->salt = source.salt;
  free_slot->tokens = source.tokens;
  free_slot->rewindable = 0;
  publish_stats();
  return int(free_slot - seqs_.begin());
}

bool PagedBackend::reserve(int handle, int64_t n) {
  // NOTE: no publish_stats(): the scheduler reserves for every sequence of every step, and the
  // decode or prefill that follows publishes.
  return pools_->reserve(seq(handle).id, n);
}

void PagedBackend::set_images(int handle, std::vector<ImageSpan> images) { seq(handle).images = std::move(images); }

// A chunk with images runs in passes cut after each image, as the decoder cuts its own
// (docs/design.md, "Image input"): the image's rows attend again once all its keys are written.
// An image the sequence's cached prefix already began (a reused prefix under the same images'
// salt, cut at a block's end) keeps its rows from the chunk's first position on: each attends
// at the image's last position, so it still sees the whole image.
Array PagedBackend::run_prefill(int handle, std::span<const int32_t> tokens) {
  Seq& s = seq(handle);
  if (s.images.empty()) return run_pass(s, tokens, {});
  const int64_t pos0 = pools_->length(s.id), n = int64_t(tokens.size());
  Array out;
  for (int64_t done = 0; done < n;) {
    const int64_t at = pos0 + done;
    int64_t end = n;
    std::vector<ImageSpan> inside;
    for (const ImageSpan& im : s.images) {
      const int64_t b = im.pos0, e = im.pos0 + im.embeds.dim(0);
      if (e <= at || b >= pos0 + n) continue;
      if (e > pos0 + n)
        throw InvalidInput("paged backend: the prefill chunk [" + std::to_string(pos0) + ", " + std::to_string(pos0 + n) +
                           ") cuts the image at positions [" + std::to_string(b) + ", " + std::to_string(e) + ")");
      const int64_t from = std::max(b, at);
      inside.push_back({from, from == b ? im.embeds : im.embeds.slice_rows(from - b, e - b)});
      end = e - pos0;
      break;
    }
    out = run_pass(s, tokens.subspan(size_t(done), size_t(end - done)), inside);
    done = end;
  }
  return out;
}

Array PagedBackend::run_pass(Seq& s, std::span<const int32_t> tokens, std::span<const ImageSpan> images) {
  const int64_t n = int64_t(tokens.size()), pos0 = pools_->length(s.id), bs = options_.block_size;
  if (pos0 + n > context_) throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
  if (!pools_->reserve(s.id, n)) throw InvalidInput("the KV pool has no room for " + std::to_string(n) + " more rows");
  const Device dev = model_.info().device;
  std::vector<int32_t> host(static_cast<size_t>(n), 0);
  for (size_t g = 0; g < pools_->n_groups(); ++g) {
    PagedGroupStep& gs = step_.groups[g];
    pools_->slots(s.id, g, pos0, n, host.data());
    gs.slots = i32_array(host, {n}, dev);
    // The blocks from the one holding the first key the chunk's first query sees.
    const int64_t first = pools_->first_needed_row(g, pos0) / bs;
    const std::vector<int32_t>& table = pools_->block_table(s.id, g);
    const int64_t end = ceil_div(pos0 + n, bs);
    gs.block_ids = i32_array(std::vector<int32_t>(table.begin() + first, table.begin() + end), {end - first}, dev);
    gs.key_pos0 = first * bs;
  }
  step_.decode = false;
  step_.pos0 = pos0;
  step_.n_rows = pos0 + n;
  for (int64_t i = 0; i < n; ++i) host[size_t(i)] = int32_t(pos0 + i);
  Array positions = i32_array(host, {n}, dev);
  Array ids = i32_array(std::vector<int32_t>(tokens.begin(), tokens.end()), {n}, dev);
  // With images: the step cache's offset is pos0, and forward() places the positions itself.
  Array out = images.empty() ? model_.forward(ids, positions, step_cache_, false)
                             : model_.forward(ids, step_cache_, false, images);
  pools_->commit(s.id, n);
  advance(s, tokens);
  publish_stats();
  return out;
}

void PagedBackend::prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) {
  Array out = run_prefill(handle, tokens);
  if (want_logits) {
    Array h = ops::to_device(out, Device::cpu());
    const int64_t vocab = h.dim(-1);
    const float* row = h.data<float>() + (h.numel() - vocab);
    logits.assign(row, row + vocab);
  }
}

int32_t PagedBackend::prefill_and_choose(int handle, std::span<const int32_t> tokens, const DecodeInput& choice,
                                         std::vector<float>& logits) {
  if (!device_chooses(choice) || choice.masked) {
    prefill(handle, tokens, true, logits);
    return -1;
  }
  Array out = run_prefill(handle, tokens);
  std::vector<DecodeOutput> outputs(1);
  choose_on_device(std::span<const DecodeInput>(&choice, 1), out.slice_rows(out.dim(0) - 1, out.dim(0)), outputs, {});
  if (!outputs[0].error.empty()) throw InvalidInput(outputs[0].error);
  return outputs[0].token;
}

bool PagedBackend::device_chooses(const DecodeInput& in) const {
  return !model_.info().device.is_cpu() && (in.greedy || (options_.device_sampling && in.sampling));
}

void PagedBackend::choose_on_device(std::span<const DecodeInput> inputs, Array logits,
                                    std::vector<DecodeOutput>& outputs, const MaskFn& masks) {
  const int64_t b = int64_t(inputs.size());
  const Device dev = model_.info().device;
  const bool all_greedy = std::all_of(inputs.begin(), inputs.end(), [](const DecodeInput& in) { return in.greedy; });
  // Tokens and non-finite flags side by side in one array: one readback.
  Array both = Array::empty({2 * b}, DType::i32, dev);
  Array chosen = both.slice_rows(0, b), nonfinite = both.slice_rows(b, 2 * b);
  // Constrained inputs: their masks are computed while the step runs, and cross to the
  // device (4 bytes per 32 tokens a row) instead of the logits to the host.
  const Array allowed = device_masks(inputs, logits.dim(1), masks);
  if (all_greedy) {
    ops::argmax_rows(logits, chosen, nonfinite, allowed);
  } else {
    // NOTE: sample_rows changes the rows it adjusts (bias, penalties) in place: only rows of
    // sampled inputs, whose logits never reach the host.
    build_row_args(inputs);
    ops::sample_rows(logits, row_args_, row_adjust_, chosen, nonfinite, allowed);
  }
  const Array host = ops::to_device(both, Device::cpu());
  const int32_t* h_tok = host.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    if (!device_chooses(inputs[size_t(i)])) continue;
    if (h_tok[b + i])
      outputs[size_t(i)].error = non_finite_logits_message("NaN or Inf");
    else if (h_tok[i] < 0)
      outputs[size_t(i)].error = inputs[size_t(i)].masked ? "the token mask allows no token of the vocabulary"
                                                           : "the logit bias bans every token";
    else
      outputs[size_t(i)].token = h_tok[i];
  }
}

PagedBackend::Bucket& PagedBackend::bucket_for(int64_t b, int64_t blocks) {
  // Graphs want few shapes; the CPU runs every step eagerly and pads nothing.
  int64_t size = 1;
  while (size < b) size *= 2;
  size = std::min<int64_t>(size, int64_t(seqs_.size()));
  if (!options_.graphs) size = b;
  // Table rows as wide as the longest sequence needs, rounded up to a power of two (so the
  // attention's grid and a graph cover short sequences cheaply however long the context),
  // at most one full context.
  int64_t width = 8;
  while (width < blocks) width *= 2;
  width = std::min(width, table_width_);
  for (auto& bk : buckets_)
    if (bk->size == size && bk->width == width) return *bk;
  auto bk = std::make_unique<Bucket>();
  bk->size = size;
  bk->width = width;
  const int64_t per_group = size + size * width, n = 3 * size + int64_t(pools_->n_groups()) * per_group;
  const Device dev = model_.info().device;
  bk->host = Array::empty({n}, DType::i32);
  bk->device = dev.is_cpu() ? bk->host : Array::empty({n}, DType::i32, dev);
  bk->tokens = bk->device.slice_rows(0, size);
  bk->positions = bk->device.slice_rows(size, 2 * size);
  bk->lens = bk->device.slice_rows(2 * size, 3 * size);
  for (size_t g = 0; g < pools_->n_groups(); ++g) {
    const int64_t at = 3 * size + int64_t(g) * per_group;
    bk->slots.push_back(bk->device.slice_rows(at, at + size));
    bk->tables.push_back(bk->device.slice_rows(at + size, at + per_group).reshape({size, width}));
  }
  buckets_.push_back(std::move(bk));
  return *buckets_.back();
}

int64_t PagedBackend::split_keys(int64_t size) const {
  if (options_.split_keys > 0) return options_.split_keys;
  // Batch invariance needs one split size for every batch; otherwise small batches split finer.
  // Few sequences: fine splits spread them over the SMs. Many: one split covers most of a
  // sequence, and the combine has little to do (an H200 decoding 64 Llama-3.1-8B sequences of
  // 512 to 640 rows: 8.2k t/s with 1024-key splits, 7.6k with 512, 7.6k with 256).
  return ops::batch_invariant() ? 128 : size <= 2 ? 64 : size <= 8 ? 128 : 1024;
}

void PagedBackend::decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs, const MaskFn& masks) {
  const int64_t b = int64_t(inputs.size());
  outputs.assign(inputs.size(), {});
  if (b == 0) return;
  // A speculating sequence's one-row steps compute what its verify rows compute: the whole
  // batch runs batch-invariant then (the mode is the step's, not a row's), with the split a
  // lone sequence's step takes (so that a sequence alone decodes as it would without drafts).
  const bool speculating = std::any_of(inputs.begin(), inputs.end(), [](const DecodeInput& in) { return in.invariant; });
  const int64_t lone_split = split_keys(1);
  BatchInvariantScope invariant_step(speculating);
  const Device dev = model_.info().device;
  fault_injection_decode_step(dev);
  // Padded to the bucket's size: a padded row writes nothing (slot -1) and reads one key of
  // block 0; its output is not looked at.
  int64_t need = 1;
  for (const DecodeInput& in : inputs) need = std::max(need, ceil_div(pools_->length(seq(in.handle).id) + 1, options_.block_size));
  Bucket& bk = bucket_for(b, need);
  const int64_t size = bk.size, width = bk.width, per_group = size + size * width;
  const size_t n_groups = pools_->n_groups();
  int32_t* h = bk.host.data<int32_t>();
  std::fill(h, h + bk.host.numel(), 0);
  int32_t *tok = h, *pos = h + size, *len = h + 2 * size;
  auto slot = [&](size_t g) { return h + 3 * size + int64_t(g) * per_group; };
  auto table = [&](size_t g) { return slot(g) + size; };
  for (int64_t i = 0; i < size; ++i) {
    for (size_t g = 0; g < n_groups; ++g) slot(g)[i] = -1;
    len[i] = 1;
  }
  for (int64_t i = 0; i < b; ++i) {
    const Seq& s = seq(inputs[size_t(i)].handle);
    const int64_t n = pools_->length(s.id);
    if (n + 1 > context_) throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
    if (!pools_->reserve(s.id, 1)) throw InvalidInput("the KV pool has no room for the next row");
    tok[i] = inputs[size_t(i)].token;
    pos[i] = int32_t(n);
    len[i] = int32_t(n + 1);
    for (size_t g = 0; g < n_groups; ++g) {
      pools_->slots(s.id, g, n, 1, &slot(g)[i]);
      const std::vector<int32_t>& t = pools_->block_table(s.id, g);
      std::copy_n(t.begin(), std::min<int64_t>(width, int64_t(t.size())), table(g) + i * width);
    }
  }
  ops::check_token_ids(std::span<const int32_t>(tok, size_t(b)), model_.info().vocab_size);
  if (!dev.is_cpu()) ops::copy_into(bk.device, bk.host);
  const bool invariant = ops::batch_invariant();
  const int64_t split = speculating ? lone_split : split_keys(size);
  if (bk.graph && (bk.split_keys != split || bk.invariant != invariant)) bk.graph.reset();
  bk.split_keys = split;
  bk.invariant = invariant;
  step_.split_keys = split;
  step_.decode = true;
  for (size_t g = 0; g < n_groups; ++g) {
    step_.groups[g].slots = bk.slots[g];
    step_.groups[g].block_tables = bk.tables[g];
  }
  step_.seq_lens = bk.lens;

  Array logits;
  if (options_.graphs && !dev.is_cpu() && bk.graph && bk.memory_generation == CapturedGraph::memory_generation(dev)) {
    bk.graph->replay();
    logits = bk.logits;
    ++n_graph_replays_;
  } else if (options_.graphs && !dev.is_cpu() && bk.warm) {
    bk.graph.reset();
    bk.graph = CapturedGraph::capture(dev, [&] { bk.logits = model_.forward(bk.tokens, bk.positions, step_cache_, true); });
    bk.memory_generation = CapturedGraph::memory_generation(dev);
    bk.graph->replay();
    logits = bk.logits;
    ++n_graph_captures_;
  } else {
    logits = model_.forward(bk.tokens, bk.positions, step_cache_, true);
    bk.warm = true;
  }
  for (int64_t i = 0; i < b; ++i) {
    Seq& s = seq(inputs[size_t(i)].handle);
    pools_->commit(s.id, 1);
    advance(s, std::span<const int32_t>(&inputs[size_t(i)].token, 1));
  }
  publish_stats();
  if (size > b) logits = logits.slice_rows(0, b);

  // Inputs whose token the device chooses: only tokens cross to the host for them, not rows
  // of logits.
  auto chooses = [this](const DecodeInput& in) { return device_chooses(in); };
  if (std::any_of(inputs.begin(), inputs.end(), chooses)) {
    choose_on_device(inputs, logits, outputs, masks);
    if (std::all_of(inputs.begin(), inputs.end(), chooses)) return;
  }
  Array hl = ops::to_device(logits, Device::cpu());
  const int64_t vocab = hl.dim(-1);
  for (int64_t i = 0; i < b; ++i) {
    if (chooses(inputs[size_t(i)])) continue;
    const float* row = hl.data<float>() + i * vocab;
    outputs[size_t(i)].logits.assign(row, row + vocab);
  }
}

bool PagedBackend::can_verify(int handle) const {
  return handle >= 0 && size_t(handle) < seqs_.size() && seqs_[size_t(handle)].busy;
}

void PagedBackend::verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) {
  std::vector<std::vector<float>> out;
  const VerifyInput item{handle, tokens};
  verify_batch(std::span<const VerifyInput>(&item, 1), out);
  logits = std::move(out[0]);
}

void PagedBackend::verify_batch(std::span<const VerifyInput> items, std::vector<std::vector<float>>& logits) {
  const int64_t bs = options_.block_size, vocab = model_.info().vocab_size;
  int64_t rows = 0, width = 1;
  for (const VerifyInput& it : items) {
    Seq& s = seq(it.handle);
    const int64_t n = int64_t(it.tokens.size()), pos0 = pools_->length(s.id);
    if (n < 1) throw InvalidInput("paged backend: a verify needs at least the sequence's last token");
    if (pos0 + n > context_) throw InvalidInput("the sequence would exceed the context of " + std::to_string(context_));
    ops::check_token_ids(it.tokens, vocab);
    // The rows so far are settled (the last verify's rewind came first): what no query from
    // here on sees may go, and into the prefix cache. Nothing is given back again until this
    // verify's rewind or the next write, so the rewind never needs a row given back.
    release_behind(s);
    s.rewindable = 0;
    if (!pools_->reserve(s.id, n)) throw InvalidInput("the KV pool has no room for " + std::to_string(n) + " more rows");
    rows += n;
    width = std::max(width, ceil_div(pos0 + n, bs));
  }
  // The split of a lone sequence's one-row step, chosen before the mode is set for the verify.
  const int64_t split = split_keys(1);
  BatchInvariantScope invariant(true);
  // One decode entry per row, each over its sequence's own table: row i of an item is the query
  // at position pos0 + i, seeing the keys up to its own (written by this pass before attention
  // reads them), as a one-row step at that length would.
  const Device dev = model_.info().device;
  const size_t n_groups = pools_->n_groups();
  std::vector<int32_t> ids, pos, lens;
  std::vector<std::vector<int32_t>> slots(n_groups, std::vector<int32_t>(size_t(rows), 0));
  std::vector<std::vector<int32_t>> tables(n_groups, std::vector<int32_t>(size_t(rows * width), 0));
  for (const VerifyInput& it : items) {
    const Seq& s = seq(it.handle);
    const int64_t n = int64_t(it.tokens.size()), pos0 = pools_->length(s.id), r0 = int64_t(ids.size());
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(it.tokens[size_t(i)]);
      pos.push_back(int32_t(pos0 + i));
      lens.push_back(int32_t(pos0 + i + 1));
    }
    for (size_t g = 0; g < n_groups; ++g) {
      pools_->slots(s.id, g, pos0, n, slots[g].data() + r0);
      const std::vector<int32_t>& t = pools_->block_table(s.id, g);
      const int64_t m = std::min<int64_t>(width, int64_t(t.size()));
      for (int64_t i = r0; i < r0 + n; ++i) std::copy_n(t.begin(), m, tables[g].begin() + i * width);
    }
  }
  for (size_t g = 0; g < n_groups; ++g) {
    step_.groups[g].slots = i32_array(slots[g], {rows}, dev);
    step_.groups[g].block_tables = i32_array(tables[g], {rows, width}, dev);
  }
  step_.decode = true;
  step_.split_keys = split;
  step_.seq_lens = i32_array(lens, {rows}, dev);
  const Array out =
      ops::to_device(model_.forward(i32_array(ids, {rows}, dev), i32_array(pos, {rows}, dev), step_cache_, true), Device::cpu());
  logits.assign(items.size(), {});
  const int64_t width_out = out.dim(-1);  // the logits' row
  int64_t r0 = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    Seq& s = seq(items[k].handle);
    const int64_t n = int64_t(items[k].tokens.size());
    pools_->commit(s.id, n);
    if (keeps_tokens()) s.tokens.insert(s.tokens.end(), items[k].tokens.begin(), items[k].tokens.end());
    s.rewindable = n;
    const float* first = out.data<float>() + r0 * width_out;
    logits[k].assign(first, first + n * width_out);
    r0 += n;
  }
  publish_stats();
}

void PagedBackend::rewind(int handle, int64_t n) {
  Seq& s = seq(handle);
  if (n <= 0) return;
  if (n > s.rewindable)
    throw InvalidInput("paged backend: rewinding " + std::to_string(n) + " rows, but the last write left " +
                       std::to_string(s.rewindable) + " to give back");
  // The blocks past the new end go back; the partly filled last one stays the sequence's own
  // (the verify wrote into it, so reserve had made it so), and the next write goes there.
  pools_->truncate(s.id, pools_->length(s.id) - n);
  if (keeps_tokens()) s.tokens.resize(s.tokens.size() - size_t(n));
  s.rewindable = 0;  // one rewind per verify: the rows kept are settled
  release_behind(s);
  publish_stats();
}

void PagedBackend::build_row_args(std::span<const DecodeInput> inputs) {
  row_args_.assign(inputs.size(), {});
  row_adjust_.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DecodeInput& in = inputs[i];
    SampleRowArgs& a = row_args_[i];
    a.adjust_begin = a.adjust_end = int32_t(row_adjust_.size());
    if (!in.sampling) continue;  // greedy: temperature 0; or not chosen here (its token is ignored)
    const SamplerParams& p = *in.sampling;
    a.temperature = p.temperature;
    a.top_k = p.top_k;
    a.top_p = p.top_p;
    a.min_p = p.min_p;
    a.typical_p = p.typical_p;
    a.repetition_penalty = p.repetition_penalty;
    a.presence_penalty = p.presence_penalty;
    a.frequency_penalty = p.frequency_penalty;
    a.seed = p.seed;
    a.counter = in.counter;
    // One entry per distinct id: the logit bias (a ban of a repeated id bans it, its biases add
    // up, as the host sampler applies them one after another), then the penalty's count.
    const size_t first = row_adjust_.size();
    for (const auto& [id, bias] : p.logit_bias) {
      LogitAdjust e;
      e.id = id;
      e.banned = bias <= -100.0f;
      e.bias = e.banned ? 0.0f : bias;
      row_adjust_.push_back(e);
    }
    if (uses_history(p) && p.repeat_last_n > 0)
      for (const auto& [id, count] : recent_counts(in.history, p.repeat_last_n)) {
        LogitAdjust e;
        e.id = id;
        e.count = count;
        row_adjust_.push_back(e);
      }
    auto begin = row_adjust_.begin() + long(first);
    std::stable_sort(begin, row_adjust_.end(), [](const LogitAdjust& x, const LogitAdjust& y) { return x.id < y.id; });
    size_t out = first;
    for (size_t k = first; k < row_adjust_.size(); ++k) {
      const LogitAdjust& e = row_adjust_[k];
      if (out > first && row_adjust_[out - 1].id == e.id) {
        LogitAdjust& m = row_adjust_[out - 1];
        m.banned |= e.banned;
        m.bias += e.bias;
        m.count += e.count;
      } else {
        row_adjust_[out++] = e;
      }
    }
    row_adjust_.resize(out);
    a.adjust_end = int32_t(row_adjust_.size());
  }
}

Array PagedBackend::device_masks(std::span<const DecodeInput> inputs, int64_t vocab, const MaskFn& masks) {
  if (!masks || std::none_of(inputs.begin(), inputs.end(), [](const DecodeInput& in) { return in.masked; })) return {};
  std::vector<std::span<const uint64_t>> spans(inputs.size());
  masks(spans);
  const int64_t b = int64_t(inputs.size()), words = (vocab + 31) / 32;
  if (!mask_host_.defined() || mask_host_.dim(0) != b || mask_host_.dim(1) != words)
    mask_host_ = Array::empty({b, words}, DType::u32);
  uint32_t* m = mask_host_.data<uint32_t>();
  for (int64_t i = 0; i < b; ++i) {
    uint32_t* row = m + i * words;
    const std::span<const uint64_t> s = spans[size_t(i)];
    if (!inputs[size_t(i)].masked || s.empty()) {
      std::fill(row, row + words, ~0u);
      continue;
    }
    // u64 word k holds ids 64k .. 64k + 63, low bits first: as u32 words 2k and 2k + 1.
    for (int64_t w = 0; w < words; ++w) {
      const size_t k = size_t(w / 2);
      row[w] = k < s.size() ? uint32_t(s[k] >> (32 * (w % 2))) : 0u;
    }
  }
  return ops::to_device(mask_host_, model_.info().device);
}

void PagedBackend::end(int handle, std::span<const int32_t> tokens) {
  Seq& s = seq(handle);
  s.busy = false;
  if (options_.prefix_cache && !tokens.empty() && pools_->length(s.id) == int64_t(tokens.size())) {
    const PagedPool::CachedRun run = pools_->cache_prefix(s.id, tokens, s.salt);
    const int64_t full = int64_t(tokens.size()) / options_.block_size * options_.block_size;
    last_[size_t(handle)] = {std::vector<int32_t>(tokens.begin(), tokens.begin() + full), s.salt};
    // NOTE: on a device this copies the run's rows to the host on the engine thread; the disk
    // is the writer thread's.
    if (store_ && store_->enabled() && run.end > run.first)
      if (std::optional<PromptFileData> d = run_file(s.id, tokens, run.first, run.end, s.salt)) store_->write(std::move(*d));
    std::lock_guard<std::mutex> lock(stats_mu_);
    prefix_.n_stored += uint64_t(int64_t(tokens.size()) / options_.block_size);
  }
  pools_->free(s.id);
  s.id = -1;
  s.tokens.clear();
  s.images.clear();
  publish_stats();
}

void PagedBackend::publish_stats() {
  PagedPoolStats ps;
  for (size_t g = 0; g < pools_->n_groups(); ++g) {
    const PagedPoolStats st = pools_->stats(g);
    ps.n_blocks += st.n_blocks;
    ps.n_free += st.n_free;
    ps.n_cached += st.n_cached;
    ps.n_in_use += st.n_in_use;
    ps.n_cow += st.n_cow;
    ps.n_evicted += st.n_evicted;
    ps.n_prefix_hits += st.n_prefix_hits;
    ps.n_prefix_queries += st.n_prefix_queries;
  }
  const int64_t in_use = pools_->bytes_in_use(), cached = pools_->bytes_cached();
  KVCounters c = pools_->counters();
  std::lock_guard<std::mutex> lock(stats_mu_);
  pool_stats_ = ps;
  bytes_in_use_ = in_use;
  bytes_cached_ = cached;
  counters_ = c;
}

double PagedBackend::kv_usage() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return double(bytes_in_use_) / double(pools_->total_bytes());
}

KVCounters PagedBackend::kv_counters() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return counters_;
}

PromptCacheStats PagedBackend::prefix_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  PromptCacheStats s = prefix_;
  s.n_evictions = pool_stats_.n_evicted;
  s.n_entries = uint64_t(pool_stats_.n_cached);
  s.bytes = uint64_t(bytes_cached_);
  s.budget_bytes = uint64_t(pools_->total_bytes());
  return s;
}

PagedPoolStats PagedBackend::pool_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return pool_stats_;
}

std::optional<PromptFileData> PagedBackend::run_file(PagedPool::SeqId id, std::span<const int32_t> tokens,
                                                     int64_t first, int64_t end, const std::string& salt) {
  const int64_t bs = options_.block_size;
  std::vector<Array> ids;
  for (size_t g = 0; g < pools_->n_groups(); ++g) {
    const std::vector<int32_t> blocks = pools_->run_blocks(id, g, tokens, first, end, salt);
    if (blocks.empty()) return std::nullopt;
    ids.push_back(i32_array(blocks, {end - first}, model_.info().device));
  }
  PromptFileData d;
  d.kind = PromptFileKind::paged;
  d.salt = salt;
  d.tokens.assign(tokens.begin(), tokens.begin() + end * bs);
  d.first_row = first * bs;
  for (size_t l = 0; l < pools_->n_layers(); ++l) {
    const Array& g = ids[pools_->group_of(l)];
    d.layers.emplace_back(ops::to_device(ops::gather_kv_blocks(pools_->keys(l), g, (end - first) * bs), Device::cpu()),
                          ops::to_device(ops::gather_kv_blocks(pools_->values(l), g, (end - first) * bs), Device::cpu()));
  }
  return d;
}

std::optional<int64_t> PagedBackend::insert_run(const PromptFileData& data) {
  const int64_t bs = options_.block_size, n = int64_t(data.tokens.size());
  if (data.kind != PromptFileKind::paged)
    throw InvalidInput("the file holds a dense snapshot; the paged layout restores paged blocks (--kv-layout paged)");
  if (n % bs != 0 || data.first_row % bs != 0 || data.layers.size() != pools_->n_layers())
    throw InvalidInput("the file's rows are not whole blocks of " + std::to_string(bs) + " rows of this pool");
  const int64_t vocab = model_.info().vocab_size;
  for (int32_t t : data.tokens)
    if (t < 0 || t >= vocab) throw InvalidInput("the file holds token id " + std::to_string(t) + ", outside the vocabulary");
  if (!options_.prefix_cache) return 0;
  const PagedPool::SeqId id = pools_->create();
  struct Freer {
    PagedPools& pools;
    PagedPool::SeqId id;
    ~Freer() { pools.free(id); }
  } freer{*pools_, id};
  const int64_t matched = pools_->match_prefix(id, data.tokens, n, data.salt);
  if (matched < data.first_row) return std::nullopt;
  // The blocks after the match, taken from free ones or the least recently used cached ones
  // (the chain itself is held by this sequence meanwhile).
  if (matched == n || !pools_->reserve(id, n - matched)) return matched;
  const Device dev = model_.info().device;
  for (size_t l = 0; l < pools_->n_layers(); ++l) {
    const std::vector<int32_t>& table = pools_->block_table(id, pools_->group_of(l));
    const Array pools[2] = {pools_->keys(l), pools_->values(l)};
    const Array rows[2] = {ops::to_device(data.layers[l].first, dev), ops::to_device(data.layers[l].second, dev)};
    for (int kv = 0; kv < 2; ++kv) {
      const Array& pool = pools[kv];
      for (int64_t g = matched / bs; g < n / bs; ++g) {
        const int32_t b = table[size_t(g)];
        ops::copy_into(pool.slice_rows(b, b + 1).reshape({pool.dim(1), bs, pool.dim(3)}),
                       kv_rows_view(rows[kv], g * bs - data.first_row, bs));
      }
    }
  }
  pools_->commit(id, n - matched);
  pools_->cache_prefix(id, data.tokens, data.salt);
  return n;
}

int64_t PagedBackend::attach_store(PromptStore& store) {
  store_ = &store;
  if (!store.enabled() || !options_.prefix_cache) return 0;
  // A run's parent chain comes first (its first row is past its parent's); among runs from the
  // same row, the most recently used first. Runs stop when the pool has no room left, so that
  // no restored block evicts another.
  std::vector<PromptFileInfo> files = store.usable_files();
  std::stable_sort(files.begin(), files.end(),
                   [](const PromptFileInfo& a, const PromptFileInfo& b) { return a.first_row < b.first_row; });
  int64_t restored = 0, tokens = 0, n_full = 0;
  for (const PromptFileInfo& f : files) {
    const int64_t need = (f.n_tokens - f.first_row) / options_.block_size;
    bool fits = true;  // in free blocks of every group
    for (size_t g = 0; g < pools_->n_groups(); ++g) fits = fits && pools_->stats(g).n_free >= need;
    if (!fits) {
      ++n_full;
      continue;
    }
    std::optional<PromptFileData> d = store.read(f.path);
    if (!d) continue;
    try {
      const std::optional<int64_t> cached = insert_run(*d);
      if (!cached) {
        log_warn("prompt cache: skipping " + f.path.string() + ": the run it continues is not on disk (or not restored)");
        continue;
      }
    } catch (const InvalidInput& e) {
      log_warn("prompt cache: skipping " + f.path.string() + ": " + e.what());
      continue;
    }
    store.note_restored(f.n_tokens - f.first_row);
    ++restored;
    tokens += f.n_tokens - f.first_row;
  }
  publish_stats();
  if (!files.empty())
    log_info("prompt cache: restored " + std::to_string(restored) + " of " + std::to_string(files.size()) +
             " block runs (" + std::to_string(tokens) + " tokens) from " + store.options().dir.string() +
             (n_full > 0 ? "; " + std::to_string(n_full) + " did not fit the KV pool" : ""));
  return restored;
}

std::optional<PromptFileData> PagedBackend::slot_file(int slot) {
  const auto& [tokens, salt] = last_.at(size_t(slot));
  if (tokens.empty()) return std::nullopt;
  const PagedPool::SeqId id = pools_->create();
  const int64_t matched = pools_->match_prefix(id, tokens, int64_t(tokens.size()), salt);
  std::optional<PromptFileData> d;
  if (matched > 0) d = run_file(id, tokens, 0, matched / options_.block_size, salt);
  pools_->free(id);
  publish_stats();
  return d;
}

int64_t PagedBackend::restore_slot(int slot, const PromptFileData& data) {
  const std::optional<int64_t> cached = insert_run(data);
  publish_stats();
  if (!cached)
    throw InvalidInput("the file continues a chain of " + std::to_string(data.first_row) +
                       " tokens that is not in the prefix cache (restore the file it continues first)");
  if (*cached > 0) last_.at(size_t(slot)) = {std::vector<int32_t>(data.tokens.begin(), data.tokens.begin() + *cached), data.salt};
  return *cached;
}

int64_t PagedBackend::erase_slot(int slot) {
  auto& [tokens, salt] = last_.at(size_t(slot));
  if (tokens.empty()) return 0;
  const int64_t n = pools_->forget_prefix(tokens, salt);
  // The files of the runs taken out: each ends at a block end the chain had.
  if (store_ && n > 0)
    for (int64_t e = int64_t(tokens.size()); e > int64_t(tokens.size()) - n; e -= options_.block_size)
      store_->remove(prompt_prefix_id(salt, std::span<const int32_t>(tokens).first(size_t(e))));
  tokens.clear();
  publish_stats();
  return n;
}

}  // namespace osprey
