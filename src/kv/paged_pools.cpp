#include "kv/paged_pools.h"

#include <algorithm>

#include "core/error.h"

namespace osprey {

std::vector<int64_t> paged_group_windows(const std::vector<KVCacheParams>& layers) {
  std::vector<int64_t> w;
  for (const KVCacheParams& l : layers) w.push_back(std::max<int64_t>(0, l.window));
  std::sort(w.begin(), w.end());
  w.erase(std::unique(w.begin(), w.end()), w.end());
  return w;
}

int64_t paged_group_block_bytes(const std::vector<KVCacheParams>& layers, int64_t block_size, int64_t window) {
  PagedPoolParams p;
  for (const KVCacheParams& l : layers)
    if (std::max<int64_t>(0, l.window) == window) p.layers.push_back(l);
  p.block_size = block_size;
  return paged_block_bytes(p);
}

PagedPools::PagedPools(const PagedPoolsParams& params) : block_size_(params.block_size), layers_(params.layers) {
  if (params.layers.empty()) throw InvalidInput("paged pool: no layers");
  windows_ = paged_group_windows(params.layers);
  if (params.n_blocks.size() != windows_.size())
    throw InvalidInput("paged pool: " + std::to_string(params.n_blocks.size()) + " block counts for " +
                       std::to_string(windows_.size()) + " groups of layers");
  layer_group_.resize(params.layers.size());
  layer_index_.resize(params.layers.size());
  for (size_t g = 0; g < windows_.size(); ++g) {
    PagedPoolParams p;
    p.block_size = params.block_size;
    p.n_blocks = params.n_blocks[g];
    p.inplace = params.inplace;
    p.window = windows_[g];
    for (size_t l = 0; l < params.layers.size(); ++l) {
      if (std::max<int64_t>(0, params.layers[l].window) != windows_[g]) continue;
      layer_group_[l] = g;
      layer_index_[l] = p.layers.size();
      p.layers.push_back(params.layers[l]);
    }
    block_bytes_.push_back(paged_block_bytes(p));
    groups_.push_back(std::make_unique<PagedPool>(p));
  }
}

const Array& PagedPools::keys(size_t layer) const {
  return groups_[layer_group_.at(layer)]->keys(layer_index_[layer]);
}
const Array& PagedPools::values(size_t layer) const {
  return groups_[layer_group_.at(layer)]->values(layer_index_[layer]);
}

PagedPools::SeqId PagedPools::create() {
  const SeqId id = groups_[0]->create();
  for (size_t g = 1; g < groups_.size(); ++g)
    if (groups_[g]->create() != id) throw Error("paged pools: the groups' sequence ids went out of step");
  return id;
}

void PagedPools::free(SeqId seq) {
  for (auto& p : groups_) p->free(seq);
}

PagedPools::SeqId PagedPools::fork(SeqId seq) {
  const SeqId id = groups_[0]->fork(seq);
  for (size_t g = 1; g < groups_.size(); ++g)
    if (groups_[g]->fork(seq) != id) throw Error("paged pools: the groups' sequence ids went out of step");
  return id;
}

int64_t PagedPools::match_prefix(SeqId seq, std::span<const int32_t> tokens, int64_t max_tokens,
                                 const std::string& salt) {
  // A windowed group's usable lengths have gaps (a length whose window lost its rows): the
  // longest length every group allows, not the shortest of each group's longest.
  std::vector<bool> usable = groups_[0]->usable_prefixes(tokens, max_tokens, salt);
  for (size_t g = 1; g < groups_.size(); ++g) {
    const std::vector<bool> u = groups_[g]->usable_prefixes(tokens, max_tokens, salt);
    for (size_t k = 0; k < usable.size(); ++k) usable[k] = usable[k] && u[k];
  }
  const int64_t n = groups_[0]->match_prefix(seq, tokens, max_tokens, salt, &usable);
  for (size_t g = 1; g < groups_.size(); ++g)
    if (groups_[g]->match_prefix(seq, tokens, max_tokens, salt, &usable) != n)
      throw Error("paged pools: the groups matched prefixes of different lengths");
  return n;
}

bool PagedPools::reserve(SeqId seq, int64_t n) {
  if (!has_room([&](size_t g) { return groups_[g]->blocks_to_reserve(seq, n); })) return false;
  for (auto& p : groups_)
    if (!p->reserve(seq, n)) throw Error("paged pools: a group refused rows it had room for");
  return true;
}

void PagedPools::commit(SeqId seq, int64_t n) {
  for (auto& p : groups_) p->commit(seq, n);
}

void PagedPools::truncate(SeqId seq, int64_t length) {
  for (auto& p : groups_) p->truncate(seq, length);
}

void PagedPools::release_behind(SeqId seq, std::span<const int32_t> tokens, bool cache, const std::string& salt) {
  for (auto& p : groups_) p->release_behind(seq, tokens, cache, salt);
}

PagedPool::CachedRun PagedPools::cache_prefix(SeqId seq, std::span<const int32_t> tokens, const std::string& salt) {
  PagedPool::CachedRun run = groups_[0]->cache_prefix(seq, tokens, salt);
  for (size_t g = 1; g < groups_.size(); ++g) groups_[g]->cache_prefix(seq, tokens, salt);
  return run;
}

int64_t PagedPools::forget_prefix(std::span<const int32_t> tokens, const std::string& salt) {
  const int64_t n = groups_[0]->forget_prefix(tokens, salt);
  for (size_t g = 1; g < groups_.size(); ++g) groups_[g]->forget_prefix(tokens, salt);
  return n;
}

std::vector<int32_t> PagedPools::run_blocks(SeqId seq, size_t g, std::span<const int32_t> tokens, int64_t first,
                                            int64_t end, const std::string& salt) const {
  const std::vector<int32_t>& table = groups_.at(g)->block_table(seq);
  if (int64_t(table.size()) >= end) {
    std::vector<int32_t> ids(table.begin() + first, table.begin() + end);
    if (std::all_of(ids.begin(), ids.end(), [](int32_t b) { return b >= 0; })) return ids;
  }
  const std::vector<int32_t> chain = groups_[g]->find_chain(tokens, end, salt);
  if (int64_t(chain.size()) < end) return {};
  // A windowed group's links hold no rows.
  const int64_t n_blocks = groups_[g]->n_blocks();
  if (std::any_of(chain.begin() + first, chain.begin() + end, [&](int32_t b) { return b >= n_blocks; })) return {};
  return std::vector<int32_t>(chain.begin() + first, chain.begin() + end);
}

int64_t PagedPools::total_bytes() const {
  int64_t b = 0;
  for (size_t g = 0; g < groups_.size(); ++g) b += groups_[g]->n_blocks() * block_bytes_[g];
  return b;
}

int64_t PagedPools::bytes_in_use() const {
  int64_t b = 0;
  for (size_t g = 0; g < groups_.size(); ++g) b += groups_[g]->stats().n_in_use * block_bytes_[g];
  return b;
}

int64_t PagedPools::bytes_cached() const {
  int64_t b = 0;
  for (size_t g = 0; g < groups_.size(); ++g) b += groups_[g]->stats().n_cached * block_bytes_[g];
  return b;
}

KVCounters PagedPools::counters() const {
  KVCounters c;
  for (const auto& p : groups_) c += p->counters();
  return c;
}

}  // namespace osprey
