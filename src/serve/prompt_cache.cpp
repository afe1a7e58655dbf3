#include "serve/prompt_cache.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {
namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

void fnv(uint64_t& h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
}

// Hashes the rows [0, n) of a [heads, capacity, head_dim] cache array. A rotating cache's ring
// holds fewer rows than its offset once it has wrapped: then every row is hashed.
void hash_rows(uint64_t& h, const Array& a, int64_t n) {
  if (!a.device().is_cpu()) throw Unsupported("prompt cache checksums read CPU caches only");
  n = std::min(n, a.dim(1));
  const size_t row = size_t(a.dim(2)) * a.itemsize();
  const auto* base = static_cast<const uint8_t*>(a.raw());
  for (int64_t head = 0; head < a.dim(0); ++head)
    for (int64_t r = 0; r < n; ++r)
      fnv(h, base + size_t(head * a.strides()[0] + r * a.strides()[1]) * a.itemsize(), row);
}

uint64_t rows_checksum(const std::vector<KVState>& states) {
  uint64_t h = 1469598103934665603ull;
  for (const KVState& s : states) {
    hash_rows(h, s.keys, s.offset);
    hash_rows(h, s.values, s.offset);
  }
  return h;
}

}  // namespace

uint64_t snapshot_bytes(const std::vector<KVState>& states) {
  uint64_t n = 0;
  for (const KVState& s : states) {
    if (s.keys.defined()) n += s.keys.buffer()->size();
    if (s.values.defined()) n += s.values.buffer()->size();
  }
  return n;
}

PromptCache::PromptCache(uint64_t budget_bytes, bool keep_checksums)
    : budget_(budget_bytes), keep_checksums_(keep_checksums) { stats_.budget_bytes = budget_bytes; }

PromptCache::Match PromptCache::lookup(std::span<const int32_t> tokens, size_t max_use, const std::string& salt) {
  Match m;
  if (!enabled()) return m;
  std::lock_guard<std::mutex> lock(mu_);
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if ((*it)->salt != salt) continue;
    const size_t n = common_prefix((*it)->tokens, tokens);
    if (n > m.n_common) {
      m.n_common = n;
      best = it;
    }
  }
  const size_t use = std::min(m.n_common, max_use);
  if (best == lru_.end() || use == 0) {
    ++stats_.n_misses;
    return {};
  }
  m.entry = *best;
  lru_.splice(lru_.begin(), lru_, best);
  ++stats_.n_hits;
  stats_.n_restored_tokens += use;
  return m;
}

void PromptCache::unusable(size_t n_use) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.n_hits == 0 || stats_.n_restored_tokens < n_use)
    throw InvalidInput("prompt cache: an unusable match that no lookup returned");
  --stats_.n_hits;
  stats_.n_restored_tokens -= n_use;
  ++stats_.n_unusable;
}

PromptCache::Stored PromptCache::store(std::vector<int32_t> tokens, std::vector<KVState> states, const std::string& salt) {
  Stored out;
  if (!enabled() || tokens.empty()) return out;
  for (const KVState& s : states)
    if (s.offset != int64_t(tokens.size()))
      throw InvalidInput("prompt cache: a snapshot of " + std::to_string(s.offset) + " rows stored under " +
                         std::to_string(tokens.size()) + " tokens");
  auto entry = std::make_shared<Entry>();
  entry->bytes = snapshot_bytes(states);
  entry->tokens = std::move(tokens);
  entry->states = std::move(states);
  entry->salt = salt;
  if (keep_checksums_) entry->checksum = rows_checksum(entry->states);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    const Entry& e = **it;
    if (e.salt != salt) {
      ++it;
      continue;
    }
    const size_t n = common_prefix(e.tokens, entry->tokens);
    if (n == entry->tokens.size()) {  // already covered by a longer (or equal) entry
      lru_.splice(lru_.begin(), lru_, it);
      return out;
    }
    if (n == e.tokens.size()) {  // the new entry extends this one
      stats_.bytes -= e.bytes;
      out.replaced.push_back(*it);
      it = lru_.erase(it);
      continue;
    }
    ++it;
  }
  if (entry->bytes > budget_) {
    ++stats_.n_evictions;
    stats_.n_entries = lru_.size();
    return out;
  }
  evict_to(budget_ - entry->bytes);
  stats_.bytes += entry->bytes;
  lru_.push_front(entry);
  ++stats_.n_stored;
  stats_.n_entries = lru_.size();
  out.entry = std::move(entry);
  return out;
}

std::shared_ptr<const PromptCache::Entry> PromptCache::find(std::span<const int32_t> tokens, const std::string& salt) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<const Entry> best;
  for (const auto& e : lru_)
    if (e->salt == salt && e->tokens.size() >= tokens.size() && common_prefix(e->tokens, tokens) == tokens.size() &&
        (!best || e->tokens.size() < best->tokens.size()))
      best = e;
  return best;
}

bool PromptCache::erase(std::span<const int32_t> tokens, const std::string& salt) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const Entry& e = **it;
    if (e.salt == salt && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
      stats_.bytes -= e.bytes;
      lru_.erase(it);
      stats_.n_entries = lru_.size();
      return true;
    }
  }
  return false;
}

void PromptCache::evict_to(uint64_t limit) {
  while (!lru_.empty() && stats_.bytes > limit) {
    stats_.bytes -= lru_.back()->bytes;
    lru_.pop_back();
    ++stats_.n_evictions;
  }
  stats_.n_entries = lru_.size();
}

PromptCacheStats PromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<PromptCache::Checksum> PromptCache::checksums() const {
  if (!keep_checksums_) throw InvalidInput("prompt cache: checksums were not kept");
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Checksum> out;
  for (const auto& e : lru_) out.push_back({e->tokens.size(), e->checksum, rows_checksum(e->states)});
  return out;
}

}  // namespace osprey
