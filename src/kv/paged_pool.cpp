#include "kv/paged_pool.h"

#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {
namespace {

uint64_t mix64(uint64_t x) {
  // splitmix64's finaliser: every input bit reaches every output bit.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

void validate(const PagedPoolParams& params) {
  if (params.block_size < 1)
    throw InvalidInput("paged pool: block_size " + std::to_string(params.block_size) + " must be at least 1");
  if (params.n_blocks < 1)
    throw InvalidInput("paged pool: n_blocks " + std::to_string(params.n_blocks) + " must be at least 1");
  if (params.n_blocks > (int64_t(1) << 31) / params.block_size)
    throw InvalidInput("paged pool: n_blocks " + std::to_string(params.n_blocks) + " * block_size " +
                       std::to_string(params.block_size) + " slots do not fit int32 slot ids");
  if (params.layers.empty()) throw InvalidInput("paged pool: no layers");
  if (params.window < 0) throw InvalidInput("paged pool: window " + std::to_string(params.window) + " must be >= 0");
  for (size_t i = 0; i < params.layers.size(); ++i) {
    const KVCacheParams& l = params.layers[i];
    if (l.n_kv_heads <= 0 || l.head_dim <= 0)
      throw InvalidInput("paged pool: layer " + std::to_string(i) + " has n_kv_heads " + std::to_string(l.n_kv_heads) +
                         " and head_dim " + std::to_string(l.head_dim) + " (both must be positive)");
    for (DType dt : {l.key_dtype(), l.value_dtype()})
      if (dt != DType::f16 && dt != DType::bf16 && !is_packed_rows(dt))
        throw InvalidInput("paged pool: layer " + std::to_string(i) + " stores " + dtype_name(dt) +
                           " (float16, bfloat16, q8_0 or fp8_e4m3 only)");
    check_kv_cache_types(l);
  }
}

}  // namespace

int64_t paged_block_bytes(const PagedPoolParams& params) {
  int64_t bytes = 0;
  for (const KVCacheParams& l : params.layers) bytes += int64_t(l.row_bytes(params.block_size));
  return bytes;
}

struct PagedPool::Impl {
  // One block's holders and, while the prefix cache holds it, its cache entry. Entries at
  // params.n_blocks and past are a windowed pool's links: a cached block's entry whose rows were
  // evicted while other cached blocks continued it (`link`; never held, never evictable).
  struct Block {
    int32_t n_seq = 0;      // sequences whose table holds it
    bool cached = false;    // the prefix cache holds it (then it is full and never written again)
    bool link = false;      // an entry without rows
    uint64_t key = 0;       // chain key it is cached under
    int32_t parent = -1;    // the cached block before it in its chain (-1: a sequence's first block)
    // Recency for eviction: registered, matched or released last at this tick; in a windowed
    // pool kTail marks a block a sequence let go at its end (its window's tail), evicted only
    // after every block given back from behind a window.
    uint64_t last_use = 0;
    std::vector<int32_t> tokens;    // [block_size] the token ids of its rows
    std::vector<int32_t> children;  // cached blocks whose parent it is
    std::string salt;               // a chain's first block: the salt it was cached under
  };
  struct Seq {
    std::vector<int32_t> table;  // -1: a block release_behind() gave back
    int64_t length = 0;
    int64_t reserved = 0;  // rows [length, reserved) are reserved for writing
    int64_t released = 0;  // rows [0, released) were given back (whole blocks)
    // The chain release_behind() has put in the prefix cache so far: its first chain_blocks
    // blocks, the last one's key and cached block (-1: none yet); `broken` once it cannot go on.
    bool chain_started = false;
    bool chain_broken = false;
    int64_t chain_blocks = 0;
    uint64_t chain_key = 0;
    int32_t chain_parent = -1;
  };

  // NOTE: a chain 32k tokens long leaves 2k links of about 300 bytes (host memory); past this
  // many, an evicted block's chain below it is let go instead (as a pool without a window does).
  static constexpr int64_t kMaxLinks = int64_t(1) << 16;
  static constexpr uint64_t kTail = uint64_t(1) << 62;

  PagedPoolParams params;
  std::vector<Array> keys, values;  // per layer [n_blocks, n_kv_heads, block_size, head_dim]
  std::vector<Block> blocks;        // [n_blocks] blocks, then links
  std::vector<int32_t> free_list;  // blocks held by nothing, taken from the back
  std::vector<int32_t> free_links;  // link entries no chain uses
  // Cached blocks no sequence holds, least recently used first.
  std::set<std::pair<uint64_t, int32_t>> evictable;
  std::unordered_map<uint64_t, int32_t> by_key;  // chain key -> cached block
  std::unordered_map<SeqId, Seq> seqs;
  SeqId next_seq = 0;
  uint64_t clock = 0;
  int64_t n_in_use = 0;
  int64_t block_bytes = 0;
  PagedPoolStats stats;
  KVCounters counters;

  const Seq& seq(SeqId id, const char* what) const {
    auto it = seqs.find(id);
    if (it == seqs.end())
      throw InvalidInput(std::string("paged pool ") + what + ": sequence " + std::to_string(id) +
                         " is unknown or freed");
    return it->second;
  }
  Seq& seq(SeqId id, const char* what) { return const_cast<Seq&>(std::as_const(*this).seq(id, what)); }

  int64_t blocks_for(int64_t rows) const { return (rows + params.block_size - 1) / params.block_size; }
  bool is_link(int32_t b) const { return b >= params.n_blocks; }
  int64_t n_links() const { return int64_t(blocks.size()) - params.n_blocks - int64_t(free_links.size()); }

  // Whether reserving past the sequence's length copies its partial last block first: the
  // block holding row `length` holds committed rows when the length is not on a block
  // boundary; any other block the new rows land in is the sequence's own (fork and the prefix
  // cache share committed blocks only).
  bool needs_copy(const PagedPool& pool, SeqId id, const Seq& s) const {
    const int64_t bs = params.block_size;
    return s.length % bs != 0 && (!params.inplace || !pool.writable_in_place(id, s.table[size_t(s.length / bs)]));
  }

  void touch(int32_t b) {
    Block& blk = blocks[b];
    if (blk.link) return;
    const bool was_evictable = blk.cached && blk.n_seq == 0;
    if (was_evictable) evictable.erase({blk.last_use, b});
    blk.last_use = (blk.last_use & kTail) | ++clock;
    if (was_evictable) evictable.insert({blk.last_use, b});
  }

  // A sequence takes a hold on b (b is free only when it was just taken from the free list).
  void acquire(int32_t b) {
    Block& blk = blocks[b];
    if (blk.n_seq++ == 0) {
      ++n_in_use;
      if (blk.cached) evictable.erase({blk.last_use, b});
    }
  }

  // A sequence drops its hold on b: the last one leaves it to the prefix cache or frees it.
  // `behind`: release_behind gives it back (else, in a windowed pool, it is a tail block).
  void release(int32_t b, bool behind = false) {
    Block& blk = blocks[b];
    if (--blk.n_seq > 0) return;
    --n_in_use;
    if (blk.cached) {
      blk.last_use = ++clock | (params.window > 0 && !behind ? kTail : 0);
      evictable.insert({blk.last_use, b});
    } else {
      free_list.push_back(b);
    }
  }

  // The prefix cache lets go of b and of every cached block below it, so that no child is ever
  // found under a parent whose block was reused. Returns the number of blocks it let go.
  uint64_t uncache_subtree(int32_t root) {
    const int32_t up = blocks[root].parent;
    if (up >= 0) {
      std::vector<int32_t>& siblings = blocks[up].children;
      siblings.erase(std::find(siblings.begin(), siblings.end(), root));
    }
    uint64_t n = 0;
    std::vector<int32_t> stack{root};
    while (!stack.empty()) {
      const int32_t b = stack.back();
      stack.pop_back();
      Block& blk = blocks[b];
      stack.insert(stack.end(), blk.children.begin(), blk.children.end());
      by_key.erase(blk.key);
      if (blk.link) {
        blk = Block{};
        free_links.push_back(b);
        continue;
      }
      if (blk.n_seq == 0) {
        evictable.erase({blk.last_use, b});
        free_list.push_back(b);
      }
      blk.cached = false;
      blk.parent = -1;
      blk.tokens.clear();
      blk.children.clear();
      ++n;
    }
    drop_idle_links(up);
    return n;
  }

  // Lets go of `b` and the links above it while each is a link no cached block continues
  // (every link leads to a block with rows).
  void drop_idle_links(int32_t b) {
    while (b >= 0 && blocks[b].link && blocks[b].children.empty()) {
      const int32_t up = blocks[b].parent;
      if (up >= 0) {
        std::vector<int32_t>& siblings = blocks[up].children;
        siblings.erase(std::find(siblings.begin(), siblings.end(), b));
      }
      by_key.erase(blocks[b].key);
      blocks[b] = Block{};
      free_links.push_back(b);
      b = up;
    }
  }

  // A windowed pool evicts the rows of cached block b (held by no sequence) but keeps its
  // entry as a link, in b's place in its chain, so that the blocks continuing it stay
  // reachable and verifiable. b becomes free.
  void evict_to_link(int32_t b) {
    int32_t l;
    if (free_links.empty()) {
      l = int32_t(blocks.size());
      blocks.emplace_back();
    } else {
      l = free_links.back();
      free_links.pop_back();
    }
    Block& from = blocks[b];
    evictable.erase({from.last_use, b});
    Block& link = blocks[l];
    link = std::move(from);
    link.link = true;
    link.n_seq = 0;
    by_key[link.key] = l;
    if (link.parent >= 0) *std::find(blocks[link.parent].children.begin(), blocks[link.parent].children.end(), b) = l;
    for (int32_t c : link.children) blocks[c].parent = l;
    for (auto& [id, s] : seqs)
      if (s.chain_parent == b) s.chain_parent = l;
    blocks[b] = Block{};
    free_list.push_back(b);
  }

  // A block no one holds: a free one, else the least recently used evictable one. The caller
  // has checked that one exists and acquires it.
  int32_t take_block() {
    if (free_list.empty()) {
      const int32_t victim = evictable.begin()->second;
      if (params.window > 0 && !blocks[victim].children.empty() && n_links() < kMaxLinks) {
        evict_to_link(victim);
        ++stats.n_evicted;
      } else {
        stats.n_evicted += uncache_subtree(victim);
      }
    }
    const int32_t b = free_list.back();
    free_list.pop_back();
    return b;
  }

  // Copies block `src` into block `dst` in every layer (keys and values). With in-place writes
  // on, the copy is one copying write per layer; off, the rows' commit counts them instead.
  void copy_block(int32_t dst, int32_t src) {
    for (size_t l = 0; l < keys.size(); ++l) {
      ops::copy_into(keys[l].slice_rows(dst, dst + 1), keys[l].slice_rows(src, src + 1));
      ops::copy_into(values[l].slice_rows(dst, dst + 1), values[l].slice_rows(src, src + 1));
    }
    ++stats.n_cow;
    if (params.inplace) counters.n_copying_writes += keys.size();
    counters.bytes_copied += uint64_t(block_bytes);
  }
};

PagedPool::PagedPool(const PagedPoolParams& params) : impl_(std::make_shared<Impl>()) {
  validate(params);
  Impl& m = *impl_;
  m.params = params;
  m.block_bytes = paged_block_bytes(params);
  for (const KVCacheParams& l : params.layers) {
    // [n_blocks, n_kv_heads, block_size, packed_row_width(type, head_dim)], keys and values each
    // in their own type.
    auto shape = [&](DType dt) {
      return Shape{params.n_blocks, l.n_kv_heads, params.block_size, packed_row_width(dt, l.head_dim)};
    };
    m.keys.push_back(Array::empty(shape(l.key_dtype()), l.key_dtype(), l.device));
    m.values.push_back(Array::empty(shape(l.value_dtype()), l.value_dtype(), l.device));
  }
  m.blocks.resize(size_t(params.n_blocks));
  // Taken from the back: block 0 first.
  for (int64_t b = params.n_blocks - 1; b >= 0; --b) m.free_list.push_back(int32_t(b));
  m.stats.n_blocks = params.n_blocks;
}

const Array& PagedPool::keys(size_t layer) const { return impl_->keys.at(layer); }
const Array& PagedPool::values(size_t layer) const { return impl_->values.at(layer); }
size_t PagedPool::n_layers() const { return impl_->keys.size(); }
int64_t PagedPool::block_size() const { return impl_->params.block_size; }
int64_t PagedPool::n_blocks() const { return impl_->params.n_blocks; }

PagedPool::SeqId PagedPool::create() {
  const SeqId id = impl_->next_seq++;
  impl_->seqs.emplace(id, Impl::Seq{});
  return id;
}

void PagedPool::free(SeqId seq) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "free");
  // Released last block first, so that a chain's tail is evicted before its head (the head
  // is the part other prompts share).
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it)
    if (*it >= 0) m.release(*it);
  m.seqs.erase(seq);
}

PagedPool::SeqId PagedPool::fork(SeqId seq) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "fork");
  Impl::Seq child = s;
  child.length = child.reserved = s.length;
  child.table.assign(s.table.begin(), s.table.begin() + m.blocks_for(s.length));
  for (int32_t b : child.table)
    if (b >= 0) m.acquire(b);
  // The partial last block is shared now: a write into it must go through reserve() again.
  s.reserved = s.length;
  const SeqId id = m.next_seq++;
  m.seqs.emplace(id, std::move(child));
  return id;
}

int64_t PagedPool::length(SeqId seq) const { return impl_->seq(seq, "length").length; }

const std::vector<int32_t>& PagedPool::block_table(SeqId seq) const { return impl_->seq(seq, "block_table").table; }

int64_t PagedPool::released_rows(SeqId seq) const { return impl_->seq(seq, "released_rows").released; }

int64_t PagedPool::first_needed_row(int64_t length) const {
  const int64_t w = impl_->params.window;
  return w > 0 ? std::max<int64_t>(0, length - w + 1) : 0;
}

int64_t PagedPool::match_prefix(SeqId seq, std::span<const int32_t> tokens, int64_t max_tokens,
                                const std::string& salt, const std::vector<bool>* usable) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "match_prefix");
  if (s.length != 0 || !s.table.empty())
    throw InvalidInput("paged pool match_prefix: sequence " + std::to_string(seq) + " holds " +
                       std::to_string(s.length) + " rows (it must be empty)");
  if (max_tokens < 0) throw InvalidInput("paged pool match_prefix: max_tokens " + std::to_string(max_tokens) + " < 0");
  const int64_t bs = m.params.block_size;
  const int64_t n_full = std::min<int64_t>(int64_t(tokens.size()), max_tokens) / bs;
  m.stats.n_prefix_queries += uint64_t(n_full);
  const std::vector<int32_t> chain = find_chain(tokens, n_full, salt);
  const std::vector<bool> ours = usable_prefixes(tokens, max_tokens, salt);
  int64_t k = int64_t(chain.size());
  while (k > 0 && !(ours[size_t(k)] && (!usable || (size_t(k) < usable->size() && (*usable)[size_t(k)])))) --k;
  // The blocks before the window of a query at the match's end are not held (a windowed pool
  // may keep only their links).
  const int64_t first = first_needed_row(k * bs) / bs;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t b = chain[size_t(i)];
    if (i < first) {
      s.table.push_back(-1);
    } else {
      m.acquire(b);
      m.touch(b);
      s.table.push_back(b);
    }
    ++m.stats.n_prefix_hits;
  }
  s.length = s.reserved = k * bs;
  s.released = first * bs;
  // A windowed sequence caches its blocks as it gives them back: its chain goes on from here.
  s.chain_started = true;
  s.chain_blocks = k;
  s.chain_parent = k > 0 ? chain[size_t(k - 1)] : -1;
  s.chain_key = k > 0 ? m.blocks[size_t(s.chain_parent)].key : root_key(salt);
  return s.length;
}

std::vector<bool> PagedPool::usable_prefixes(std::span<const int32_t> tokens, int64_t max_tokens,
                                             const std::string& salt) const {
  const Impl& m = *impl_;
  const int64_t bs = m.params.block_size;
  const int64_t n_full = std::max<int64_t>(0, std::min<int64_t>(int64_t(tokens.size()), max_tokens)) / bs;
  const std::vector<int32_t> chain = find_chain(tokens, n_full, salt);
  std::vector<bool> ok(size_t(n_full + 1), false);
  int64_t last_link = -1;  // the last entry of chain[0 .. k) without rows
  ok[0] = true;
  for (int64_t k = 1; k <= int64_t(chain.size()); ++k) {
    if (m.is_link(chain[size_t(k - 1)])) last_link = k - 1;
    ok[size_t(k)] = last_link < first_needed_row(k * bs) / bs;
  }
  return ok;
}

int64_t PagedPool::blocks_to_reserve(SeqId seq, int64_t n) const {
  const Impl& m = *impl_;
  const Impl::Seq& s = m.seq(seq, "blocks_to_reserve");
  if (n <= 0) return 0;
  const int64_t grow = std::max<int64_t>(0, m.blocks_for(s.length + n) - int64_t(s.table.size()));
  return grow + (m.needs_copy(*this, seq, s) ? 1 : 0);
}

bool PagedPool::reserve(SeqId seq, int64_t n) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "reserve");
  if (n < 0) throw InvalidInput("paged pool reserve: n " + std::to_string(n) + " < 0");
  if (n == 0) return true;
  const int64_t bs = m.params.block_size;
  const size_t last = size_t(s.length / bs);
  const bool copy = m.needs_copy(*this, seq, s);
  const int64_t grow = std::max<int64_t>(0, m.blocks_for(s.length + n) - int64_t(s.table.size()));
  if (grow + (copy ? 1 : 0) > n_available()) return false;

  if (copy) {
    const int32_t old = s.table[last];
    // The old block stays held while it is copied, so taking the new one cannot evict it.
    const int32_t b = m.take_block();
    m.acquire(b);
    m.copy_block(b, old);
    s.table[last] = b;
    m.release(old);
  }
  for (int64_t i = 0; i < grow; ++i) {
    const int32_t b = m.take_block();
    m.acquire(b);
    s.table.push_back(b);
  }
  s.reserved = std::max(s.reserved, s.length + n);
  return true;
}

void PagedPool::slots(SeqId seq, int64_t row0, int64_t n, int32_t* out) const {
  const Impl& m = *impl_;
  const Impl::Seq& s = m.seq(seq, "slots");
  if (n < 0 || row0 < s.length || row0 + n > s.reserved)
    throw InvalidInput("paged pool slots: rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                       ") of sequence " + std::to_string(seq) + " are not reserved (reserved rows: [" +
                       std::to_string(s.length) + ", " + std::to_string(s.reserved) + "))");
  if (n > 0 && out == nullptr) throw InvalidInput("paged pool slots: null output for " + std::to_string(n) + " slots");
  const int64_t bs = m.params.block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = row0 + i;
    out[i] = int32_t(int64_t(s.table[size_t(row / bs)]) * bs + row % bs);
  }
}

void PagedPool::commit(SeqId seq, int64_t n) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "commit");
  if (n < 0 || s.length + n > s.reserved)
    throw InvalidInput("paged pool commit: " + std::to_string(n) + " rows of sequence " + std::to_string(seq) +
                       " at length " + std::to_string(s.length) + " (rows reserved up to " +
                       std::to_string(s.reserved) + ")");
  s.length += n;
  (m.params.inplace ? m.counters.n_inplace_writes : m.counters.n_copying_writes) += uint64_t(n) * m.keys.size();
}

void PagedPool::truncate(SeqId seq, int64_t length) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "truncate");
  if (length < 0 || length > s.length)
    throw InvalidInput("paged pool truncate: sequence " + std::to_string(seq) + " to " + std::to_string(length) +
                       " rows (it holds " + std::to_string(s.length) + ")");
  if (s.released > first_needed_row(length))
    throw InvalidInput("paged pool truncate: sequence " + std::to_string(seq) + " to " + std::to_string(length) +
                       " rows needs rows from " + std::to_string(first_needed_row(length)) +
                       ", but its window's rows before " + std::to_string(s.released) + " were given back");
  const size_t keep = size_t(m.blocks_for(length));
  while (s.table.size() > keep) {
    m.release(s.table.back());
    s.table.pop_back();
  }
  s.length = s.reserved = length;
}

PagedPool::ChainStep PagedPool::cache_block(uint64_t& key, int32_t& parent, std::span<const int32_t> t, int32_t b,
                                            const std::string& salt) {
  Impl& m = *impl_;
  const uint64_t k = chain_key(key, t);
  auto it = m.by_key.find(k);
  if (it != m.by_key.end()) {
    const int32_t e = it->second;
    const Impl::Block& blk = m.blocks[e];
    // The block already there stays (it may be this one): the chain goes on through it when it
    // holds these tokens after this parent, and stops at a key collision.
    if (blk.parent != parent || !std::equal(t.begin(), t.end(), blk.tokens.begin())) return ChainStep::stop;
    if (parent < 0 && blk.salt != salt) return ChainStep::stop;
    m.touch(e);
    key = k;
    parent = e;
    return ChainStep::found;
  }
  // A block given back, or cached under another key (it holds other tokens than the caller
  // says): stop.
  if (b < 0 || m.blocks[b].cached) return ChainStep::stop;
  Impl::Block& blk = m.blocks[b];
  blk.cached = true;
  blk.key = k;
  blk.parent = parent;
  blk.tokens.assign(t.begin(), t.end());
  blk.salt = parent < 0 ? salt : std::string();
  blk.last_use = ++m.clock;
  if (parent >= 0) m.blocks[parent].children.push_back(b);
  m.by_key.emplace(k, b);
  key = k;
  parent = b;
  return ChainStep::added;
}

PagedPool::CachedRun PagedPool::cache_prefix(SeqId seq, std::span<const int32_t> tokens, const std::string& salt) {
  Impl& m = *impl_;
  const Impl::Seq& s = m.seq(seq, "cache_prefix");
  const int64_t bs = m.params.block_size;
  const int64_t n_full = std::min<int64_t>(s.length, int64_t(tokens.size())) / bs;
  uint64_t key = root_key(salt);
  int32_t parent = -1;  // the cached block the chain resolved to so far
  CachedRun run;
  for (int64_t i = 0; i < n_full; ++i) {
    const ChainStep step = cache_block(key, parent, tokens.subspan(size_t(i * bs), size_t(bs)), s.table[size_t(i)], salt);
    if (step == ChainStep::stop) break;
    if (step == ChainStep::found) run.first = i + 1;
    run.end = i + 1;
  }
  return run;
}

int64_t PagedPool::release_behind(SeqId seq, std::span<const int32_t> tokens, bool cache, const std::string& salt) {
  Impl& m = *impl_;
  Impl::Seq& s = m.seq(seq, "release_behind");
  const int64_t bs = m.params.block_size;
  if (m.params.window <= 0) return 0;
  const int64_t done = s.released / bs, target = first_needed_row(s.length) / bs;
  if (target <= done) return 0;
  if (cache && !s.chain_broken) {
    if (int64_t(tokens.size()) < target * bs)
      throw InvalidInput("paged pool release_behind: " + std::to_string(tokens.size()) + " tokens for the " +
                         std::to_string(target * bs) + " rows to cache of sequence " + std::to_string(seq));
    if (!s.chain_started) {
      s.chain_started = true;
      s.chain_key = root_key(salt);
      s.chain_parent = -1;
    }
    // The chain's last block must still be cached under its key (an eviction may have let it go).
    if (s.chain_parent >= 0 && !(m.blocks[s.chain_parent].cached && m.blocks[s.chain_parent].key == s.chain_key))
      s.chain_broken = true;
    for (int64_t i = s.chain_blocks; i < target && !s.chain_broken; ++i) {
      if (cache_block(s.chain_key, s.chain_parent, tokens.subspan(size_t(i * bs), size_t(bs)), s.table[size_t(i)],
                      salt) == ChainStep::stop)
        s.chain_broken = true;
      else
        s.chain_blocks = i + 1;
    }
  }
  for (int64_t i = done; i < target; ++i) {
    m.release(s.table[size_t(i)], true);
    s.table[size_t(i)] = -1;
  }
  s.released = target * bs;
  return (target - done) * bs;
}

std::vector<int32_t> PagedPool::find_chain(std::span<const int32_t> tokens, int64_t n_blocks,
                                           const std::string& salt) const {
  const Impl& m = *impl_;
  const int64_t bs = m.params.block_size;
  std::vector<int32_t> chain;
  uint64_t key = root_key(salt);
  int32_t parent = -1;
  for (int64_t i = 0; i < std::min<int64_t>(n_blocks, int64_t(tokens.size()) / bs); ++i) {
    const std::span<const int32_t> t = tokens.subspan(size_t(i * bs), size_t(bs));
    key = chain_key(key, t);
    auto it = m.by_key.find(key);
    if (it == m.by_key.end()) break;
    const Impl::Block& blk = m.blocks[it->second];
    if (blk.parent != parent || !std::equal(t.begin(), t.end(), blk.tokens.begin())) break;
    if (parent < 0 && blk.salt != salt) break;
    chain.push_back(it->second);
    parent = it->second;
  }
  return chain;
}

int64_t PagedPool::forget_prefix(std::span<const int32_t> tokens, const std::string& salt) {
  Impl& m = *impl_;
  const int64_t bs = m.params.block_size;
  std::vector<int32_t> chain = find_chain(tokens, int64_t(tokens.size()) / bs, salt);
  int64_t n = 0;
  while (!chain.empty()) {
    const Impl::Block& blk = m.blocks[chain.back()];
    if (blk.n_seq > 0 || !blk.children.empty()) break;
    m.uncache_subtree(chain.back());
    chain.pop_back();
    n += bs;
  }
  return n;
}

void PagedPool::clear_prefix_cache() {
  Impl& m = *impl_;
  // A cached block that sequences still hold stays unless its parent goes (with the parent).
  while (!m.evictable.empty()) m.uncache_subtree(m.evictable.begin()->second);
}

int64_t PagedPool::n_available() const { return int64_t(impl_->free_list.size() + impl_->evictable.size()); }

PagedPoolStats PagedPool::stats() const {
  const Impl& m = *impl_;
  PagedPoolStats st = m.stats;
  st.n_free = int64_t(m.free_list.size());
  st.n_cached = int64_t(m.evictable.size());
  st.n_in_use = m.n_in_use;
  return st;
}

KVCounters PagedPool::counters() const { return impl_->counters; }

bool PagedPool::writable_in_place(SeqId seq, int32_t block) const {
  (void)seq;
  const Impl::Block& blk = impl_->blocks[size_t(block)];
  return blk.n_seq == 1 && !blk.cached;
}

uint64_t PagedPool::root_key(const std::string& salt) {
  uint64_t h = kRootChainKey;
  for (unsigned char c : salt) h = mix64(h ^ (uint64_t(c) + 0x9e3779b97f4a7c15ull));
  return salt.empty() ? kRootChainKey : mix64(h ^ salt.size());
}

uint64_t PagedPool::chain_key(uint64_t parent_key, std::span<const int32_t> tokens) const {
  uint64_t h = mix64(parent_key ^ uint64_t(tokens.size()));
  for (int32_t t : tokens) h = mix64(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull));
  return h;
}

}  // namespace osprey
