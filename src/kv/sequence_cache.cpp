#include "core/error.h"
#include "kv/dense_cache.h"
#include "kv/kv_cache.h"
#include "kv/replay.h"
#include "kv/rotating_cache.h"

namespace osprey {

std::unique_ptr<KVCache> make_kv_cache(const KVCacheParams& params) {
  if (params.window < 0) throw InvalidInput("KV cache: window " + std::to_string(params.window) + " < 0");
  if (params.window > 0) return std::make_unique<RotatingKVCache>(params);
  return std::make_unique<DenseKVCache>(params);
}

SequenceCache SequenceCache::concat(std::vector<SequenceCache> parts) {
  SequenceCache out;
  for (SequenceCache& p : parts)
    for (auto& l : p.layers_) out.layers_.push_back(std::move(l));
  return out;
}

SequenceCache SequenceCache::share_layers(size_t first, size_t count) {
  if (first + count > layers_.size())
    throw InvalidInput("KV cache: layers [" + std::to_string(first) + ", " + std::to_string(first + count) +
                       ") of a sequence cache of " + std::to_string(layers_.size()));
  SequenceCache out;
  out.layers_.assign(layers_.begin() + std::ptrdiff_t(first), layers_.begin() + std::ptrdiff_t(first + count));
  return out;
}

void SequenceCache::reserve(int64_t n) {
  for (auto& l : layers_) l->reserve(n);
}

bool SequenceCache::can_trim(int64_t n) const {
  for (const auto& l : layers_)
    if (!l->can_trim(n)) return false;
  return true;
}

void SequenceCache::trim(int64_t n) {
  // All or nothing: no layer moves unless every layer can.
  if (!can_trim(n))
    throw InvalidInput("KV cache: cannot trim " + std::to_string(n) + " positions (a sliding-window layer's ring no "
                       "longer holds the rows)");
  for (auto& l : layers_) l->trim(n);
}

void SequenceCache::rewind_own_write(int64_t n) {
  for (auto& l : layers_) l->rewind_own_write(n);
}

bool SequenceCache::gives_back_rows() const {
  if (layers_.empty()) return false;
  for (const auto& l : layers_)
    if (!l->gives_back_rows()) return false;
  return true;
}

void SequenceCache::set_multirow_inplace(bool on) {
  for (auto& l : layers_) l->set_multirow_inplace(on);
}

std::vector<KVState> SequenceCache::snapshot() const {
  std::vector<KVState> s;
  s.reserve(layers_.size());
  for (const auto& l : layers_) s.push_back(l->snapshot());
  return s;
}

void SequenceCache::restore(const std::vector<KVState>& states) {
  if (states.size() != layers_.size())
    throw InvalidInput("KV cache restore: " + std::to_string(states.size()) + " layer states for " +
                       std::to_string(layers_.size()) + " layers");
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->restore(states[i]);
}

KVCounters SequenceCache::counters() const {
  KVCounters c;
  for (const auto& l : layers_) c += l->counters();
  return c;
}

SequenceReplay::SequenceReplay(SequenceCache& cache) {
  complete_ = cache.n_layers() > 0;
  for (size_t i = 0; i < cache.n_layers(); ++i) {
    ReplayableCache* r = cache.layer(i).replayable();
    if (!r) complete_ = false;
    layers_.push_back(r);
  }
  if (!complete_) layers_.clear();
}

bool SequenceReplay::next_write_in_place() const {
  if (!complete_) return false;
  for (const ReplayableCache* l : layers_)
    if (!l->next_write_in_place(1)) return false;
  return true;
}

void SequenceReplay::commit_replayed_write() {
  if (!complete_) throw InvalidInput("KV cache: a replayed write needs caches that support replay");
  for (ReplayableCache* l : layers_) l->commit_replayed_write();
}

std::vector<const void*> SequenceReplay::buffers() const {
  std::vector<const void*> b;
  for (const ReplayableCache* l : layers_) {
    auto [k, v] = l->buffers();
    b.push_back(k);
    b.push_back(v);
  }
  return b;
}

bool SequenceReplay::has_buffers(const std::vector<const void*>& key) const {
  if (key.size() != 2 * layers_.size()) return false;
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto [k, v] = layers_[i]->buffers();
    if (key[2 * i] != k || key[2 * i + 1] != v) return false;
  }
  return true;
}

}  // namespace osprey
