#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "tokenizer/utf8.h"

namespace osprey::tok {
namespace {

constexpr uint32_t kSmallCharLimit = 0x800;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// One symbol of the word being merged; a doubly linked list over a vector.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

// A candidate merge of symbols[pos] with its right neighbour; lowest rank first, then
// leftmost.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t id;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

BpeModel::BpeModel(const Json& j, BpeTables tables, const std::string& where) {
  if (const Json* d = optional(j, "dropout"))
    if (!d->is_number() || d->get<double>() > 0.0)
      throw Unsupported(child(where, "dropout") + ": BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json* v = optional(j, key))
      if (!as_string(*v, child(where, key)).empty())
        throw Unsupported(child(where, key) + ": BPE " + key + " is not supported");
  byte_fallback_ = bool_field(j, "byte_fallback", false, where);
  fuse_unk_ = bool_field(j, "fuse_unk", false, where);
  ignore_merges_ = bool_field(j, "ignore_merges", false, where);

  const std::string vwhere = child(where, "vocab");
  if (!tables.has_vocab) {
    const Json& vocab = require(j, "vocab", where);
    if (!vocab.is_object()) fail(vwhere, "expected an object of token -> id");
    for (const auto& [token, id_json] : vocab.items()) {
      if (!id_json.is_number_integer()) fail(child(vwhere, token), "expected an integer token id");
      const int64_t id = id_json.is_number_unsigned() && id_json.get<uint64_t>() > uint64_t(kMaxTokenId)
                             ? kMaxTokenId
                             : id_json.get<int64_t>();
      check_token_id(id, id_json.dump(), vwhere, token);
      tables.vocab.emplace_back(token, int32_t(id));
    }
  }
  vocab_.reserve(tables.vocab.size());
  small_char_ids_.assign(kSmallCharLimit, -1);
  for (auto& [token, id] : tables.vocab) {
    if (!token.empty() && utf8::seq_len(static_cast<unsigned char>(token[0])) == token.size()) {
      std::size_t i = 0;
      const uint32_t cp = utf8::next(token, i);
      if (cp < kSmallCharLimit)
        small_char_ids_[cp] = id;
      else
        char_ids_[cp] = id;
    }
    vocab_.insert_or_assign(std::move(token), id);  // a repeated token keeps its last id
  }
  tables.vocab = {};
  if (const Json* unk = optional(j, "unk_token")) {
    const auto it = vocab_.find(as_string(*unk, child(where, "unk_token")));
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  byte_fallback_ids_.fill(-1);
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      const auto it = vocab_.find(std::string_view(name));
      if (it != vocab_.end()) byte_fallback_ids_[b] = it->second;
    }
  }

  const std::string mwhere = child(where, "merges");
  if (!tables.has_merges) {
    const Json& merges = require(j, "merges", where);
    if (!merges.is_array()) fail(mwhere, "expected an array");
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const Json& m = merges[r];
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          fail(child(mwhere, r), "expected \"left right\" with exactly one space");
        tables.merges.add(std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        tables.merges.add(m[0].get_ref<const std::string&>(), m[1].get_ref<const std::string&>());
      } else {
        fail(child(mwhere, r), "expected a string \"left right\" or a pair [\"left\", \"right\"]");
      }
    }
  }
  merges_.reserve(tables.merges.size());
  auto lookup = [&](std::string_view token, std::size_t r) {
    const auto it = vocab_.find(token);
    if (it == vocab_.end())
      fail(child(mwhere, r), "token \"" + std::string(token) + "\" is not in the vocab");
    return it->second;
  };
  for (std::size_t r = 0; r < tables.merges.size(); ++r) {
    const int32_t a = lookup(tables.merges.left(r), r), b = lookup(tables.merges.right(r), r);
    const int32_t merged = lookup(tables.merges.joined(r), r);
    // A repeated pair takes its last rank, as in HF tokenizers.
    merges_.assign(a, b, MergeResult{int32_t(r), merged});
  }
}

void BpeModel::MergeTable::reserve(std::size_t n) {
  std::size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;  // at most half full
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{kEmpty, {}});
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) assign(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.merge);
}

std::size_t BpeModel::MergeTable::slot_of(uint64_t key) const {
  // Fibonacci hashing of the pair; the table size is a power of two.
  const uint64_t h = key * 0x9E3779B97F4A7C15ull;
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = std::size_t(h >> 32) & mask;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask;
  return i;
}

void BpeModel::MergeTable::assign(int32_t a, int32_t b, MergeResult m) {
  if (2 * (size_ + 1) > slots_.size()) reserve(size_ + 1 > 8 ? 2 * (size_ + 1) : 8);
  const uint64_t key = pair_key(a, b);
  Slot& s = slots_[slot_of(key)];
  if (s.key == kEmpty) ++size_;
  s = {key, m};
}

const BpeModel::MergeResult* BpeModel::MergeTable::find(int32_t a, int32_t b) const {
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[slot_of(pair_key(a, b))];
  return s.key == kEmpty ? nullptr : &s.merge;
}

int32_t BpeModel::char_id(uint32_t cp) const {
  if (cp < kSmallCharLimit) return small_char_ids_[cp];
  const auto it = char_ids_.find(cp);
  return it == char_ids_.end() ? -1 : it->second;
}

void BpeModel::push_unknown(std::string_view ch, std::vector<int32_t>& symbols) const {
  if (byte_fallback_) {
    bool all = true;
    for (const char c : ch) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all) {
      for (const char c : ch) symbols.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
      return;
    }
  }
  if (unk_id_ < 0) return;  // no unk token: the character is dropped, as in HF tokenizers
  if (fuse_unk_ && !symbols.empty() && symbols.back() == unk_id_) return;
  symbols.push_back(unk_id_);
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> initial;
  initial.reserve(piece.size());
  for (std::size_t i = 0; i < piece.size();) {
    const std::size_t start = i;
    const int32_t id = char_id(utf8::next(piece, i));
    if (id >= 0)
      initial.push_back(id);
    else
      push_unknown(piece.substr(start, i - start), initial);
  }
  const int32_t n = int32_t(initial.size());
  if (n <= 1) {
    out.insert(out.end(), initial.begin(), initial.end());
    return;
  }
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {initial[i], i - 1, i + 1 < n ? i + 1 : -1, true};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    if (const MergeResult* m = merges_.find(sym[pos].id, sym[sym[pos].next].id))
      queue.push({m->rank, pos, m->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    // Skip candidates made stale by an earlier merge of either symbol.
    const MergeResult* m = merges_.find(left.id, sym[left.next].id);
    if (m == nullptr || m->rank != c.rank || m->id != c.id) continue;
    Symbol& right = sym[left.next];
    left.id = c.id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge(piece, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + std::ptrdiff_t(first), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(piece), std::move(ids));
  }
}

}  // namespace osprey::tok
