#include "grammar/matcher.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace osprey::grammar {

// ---- TokenTrie ----

// Well-formed UTF-8 as a decoder: 0 is a character boundary, -1 a rejected byte.
static int utf8_next(int s, uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (s) {
    case 0:
      if (b < 0x80) return 0;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if (b == 0xED) return 5;
      if (b >= 0xE1 && b <= 0xEF) return 2;
      if (b == 0xF0) return 6;
      if (b >= 0xF1 && b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return cont ? 0 : -1;
    case 2: return cont ? 1 : -1;
    case 3: return cont ? 2 : -1;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;
  }
  return -1;
}


TokenTrie::TokenTrie(std::vector<std::string> bytes, const std::vector<bool>& excluded) : bytes_(std::move(bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (id < excluded.size() && excluded[id]) bytes_[id].clear();
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) ids_.push_back(int32_t(id));
  std::sort(ids_.begin(), ids_.end(), [&](int32_t a, int32_t b) {
    const int c = bytes_[size_t(a)].compare(bytes_[size_t(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  nodes_.reserve(ids_.size() * 2);
  nodes_.emplace_back();
  sub_bytes_.emplace_back();
  fill(0, 0, uint32_t(ids_.size()), 0);
}

// Builds the children of `node` from ids_[lo, hi), which share their first `depth` bytes.
void TokenTrie::fill(uint32_t node, uint32_t lo, uint32_t hi, size_t depth) {
  uint32_t i = lo;
  while (i < hi && bytes_[size_t(ids_[i])].size() == depth) ++i;
  nodes_[node].tok_begin = lo;
  nodes_[node].tok_end = i;
  nodes_[node].sub_end = hi;
  std::vector<std::pair<uint32_t, uint32_t>> groups;
  while (i < hi) {
    const uint8_t b = uint8_t(bytes_[size_t(ids_[i])][depth]);
    uint32_t j = i;
    while (j < hi && uint8_t(bytes_[size_t(ids_[j])][depth]) == b) ++j;
    groups.emplace_back(i, j);
    i = j;
  }
  const uint32_t first = uint32_t(nodes_.size());
  nodes_.resize(nodes_.size() + groups.size());
  sub_bytes_.resize(nodes_.size());
  nodes_[node].child_begin = first;
  nodes_[node].child_end = first + uint32_t(groups.size());
  ByteSet below{};
  for (size_t k = 0; k < groups.size(); ++k) {
    const uint32_t c = first + uint32_t(k);
    nodes_[c].byte = uint8_t(bytes_[size_t(ids_[groups[k].first])][depth]);
    fill(c, groups[k].first, groups[k].second, depth + 1);
    for (size_t w = 0; w < below.size(); ++w) below[w] |= sub_bytes_[c][w];
  }
  if (node == 0) return;
  add_byte(below, nodes_[node].byte);
  sub_bytes_[node] = below;
  // The most characters on a path from the parent, each path read from a character boundary.
  uint32_t height = 0;
  for (uint32_t t = lo; t < hi && height != kNotUtf8; ++t) {
    const std::string& b = bytes_[size_t(ids_[t])];
    uint32_t chars = 0;
    int u = 0;
    for (size_t i = depth - 1; i < b.size(); ++i) {
      chars += u == 0;
      u = utf8_next(u, uint8_t(b[i]));
      if (u < 0) {
        chars = kNotUtf8;
        break;
      }
    }
    height = std::max(height, chars);
  }
  nodes_[node].height = height;
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes{size_t(n)};
  std::vector<bool> excluded(size_t(n), false);
  for (int32_t id = 0; id < n; ++id) {
    bytes[size_t(id)] = tokenizer.token_bytes(id);
    excluded[size_t(id)] = tokenizer.is_special(id);
  }
  return std::make_shared<const TokenTrie>(std::move(bytes), excluded);
}

// ---- Automaton ----

size_t Automaton::VecHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t x : v) h = (h ^ uint32_t(x)) * 0x100000001b3ull;
  return size_t(h);
}

Automaton::Automaton(Grammar grammar, std::shared_ptr<const TokenTrie> trie, std::vector<int32_t> end_ids)
    : grammar_(std::move(grammar)), trie_(std::move(trie)), end_ids_(std::move(end_ids)) {
  for (int32_t id : end_ids_)
    if (id < 0 || id >= trie_->vocab_size())
      throw InvalidInput("grammar: end token " + std::to_string(id) + " is outside the vocabulary");
  std::vector<int32_t> stacks;
  for (uint32_t alt : grammar_.alts[grammar_.root]) expand(alt, -1, stacks, 0);
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  initial_ = intern_state(std::move(stacks));
}

int32_t Automaton::node(uint32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t(pos) << 32) | uint32_t(parent);
  auto [it, fresh] = node_ids_.emplace(key, int32_t(nodes_.size()));
  if (fresh) {
    nodes_.push_back({pos, parent});
    next_.emplace_back();
    next_known_.push_back(0);
  }
  return it->second;
}

// Appends the stacks whose top is a byte set reachable from position `pos` over `parent`
// without consuming a byte (kDone for the empty stack).
void Automaton::expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out, int depth) {
  if (depth > 100000) throw InvalidInput("grammar: the rules nest too deep to expand");
  const Element e = grammar_.elems[pos];
  switch (e.kind) {
    case Element::Kind::bytes:
      out.push_back(node(pos, parent));
      return;
    case Element::Kind::end:
      if (parent < 0) {
        out.push_back(kDone);
      } else {
        const StackNode p = nodes_[size_t(parent)];
        expand(p.pos, p.parent, out, depth + 1);
      }
      return;
    case Element::Kind::rule: {
      // A call in tail position returns straight to the caller's caller.
      const int32_t ret = grammar_.elems[pos + 1].kind == Element::Kind::end ? parent : node(pos + 1, parent);
      for (uint32_t alt : grammar_.alts[e.index]) expand(alt, ret, out, depth + 1);
      return;
    }
  }
}

const std::vector<int32_t>& Automaton::next(int32_t id) {
  if (!next_known_[size_t(id)]) {
    std::vector<int32_t> out;
    const StackNode n = nodes_[size_t(id)];
    expand(n.pos + 1, n.parent, out, 0);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    next_[size_t(id)] = std::move(out);
    next_known_[size_t(id)] = 1;
  }
  return next_[size_t(id)];
}

int32_t Automaton::intern_state(std::vector<int32_t> stacks) {
  auto it = state_ids_.find(stacks);
  if (it != state_ids_.end()) return it->second;
  const int32_t id = int32_t(states_.size());
  states_.push_back(stacks);
  state_ids_.emplace(std::move(stacks), id);
  trans_.emplace_back();
  masks_.emplace_back();
  runs_.emplace_back();
  return id;
}

const std::array<int32_t, 256>& Automaton::transitions(int32_t state) {
  if (trans_[size_t(state)]) return *trans_[size_t(state)];
  // Bytes taken by the same stacks lead to the same state: split the byte range by every
  // stack's top set, then compute one successor per class.
  std::vector<ByteSet> classes{ByteSet{~0ull, ~0ull, ~0ull, ~0ull}};
  const std::vector<int32_t> stacks = states_[size_t(state)];  // a copy: interning grows states_
  for (int32_t id : stacks) {
    if (id == kDone) continue;
    const ByteSet& set = grammar_.sets[grammar_.elems[nodes_[size_t(id)].pos].index];
    for (size_t k = 0, n = classes.size(); k < n; ++k) {
      ByteSet in, out;
      bool has_in = false, has_out = false;
      for (size_t w = 0; w < 4; ++w) {
        in[w] = classes[k][w] & set[w];
        out[w] = classes[k][w] & ~set[w];
        has_in = has_in || in[w];
        has_out = has_out || out[w];
      }
      if (has_in && has_out) {
        classes[k] = in;
        classes.push_back(out);
      }
    }
  }
  auto table = std::make_unique<std::array<int32_t, 256>>();
  for (const ByteSet& cls : classes) {
    int b = 0;
    while (!has_byte(cls, uint8_t(b))) ++b;
    std::vector<int32_t> out;
    for (int32_t id : stacks) {
      if (id == kDone || !has_byte(grammar_.sets[grammar_.elems[nodes_[size_t(id)].pos].index], uint8_t(b))) continue;
      const std::vector<int32_t>& nx = next(id);
      out.insert(out.end(), nx.begin(), nx.end());
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    const int32_t to = out.empty() ? kDead : intern_state(std::move(out));
    for (; b < 256; ++b)
      if (has_byte(cls, uint8_t(b))) (*table)[size_t(b)] = to;
  }
  trans_[size_t(state)] = std::move(table);
  return *trans_[size_t(state)];
}

// The run's bytes: the largest set of ASCII bytes that lead to one state, joined by every
// byte from 0x80 when each well-formed multi-byte character leads to that state too (and
// each of its prefixes is accepted).
void Automaton::find_run_bytes(int32_t state, Run& r) {
  const std::array<int32_t, 256> table = transitions(state);
  int32_t best = kDead;
  int best_n = 0;
  for (int b = 0; b < 128; ++b) {
    if (table[size_t(b)] == kDead) continue;
    int n = 0;
    for (int c = 0; c < 128; ++c) n += table[size_t(c)] == table[size_t(b)];
    if (n > best_n) best = table[size_t(b)], best_n = n;
    if (best_n >= 64) break;  // a majority
  }
  if (best_n < 2) return;  // nothing worth a run
  r.next = best;
  for (int b = 0; b < 128; ++b)
    if (table[size_t(b)] == best) add_byte(r.bytes, uint8_t(b));
  // (decoder state, automaton state) pairs inside a character, from `state` at a boundary.
  std::vector<std::pair<int, int32_t>> todo{{0, state}}, seen;
  while (!todo.empty()) {
    const auto [u, s] = todo.back();
    todo.pop_back();
    const std::array<int32_t, 256>& t = transitions(s);
    for (int b = 0x80; b < 0x100; ++b) {
      const int v = utf8_next(u, uint8_t(b));
      if (v < 0) continue;
      const int32_t to = t[size_t(b)];
      if (to == kDead || (v == 0 && to != best)) return;
      if (v == 0 || std::find(seen.begin(), seen.end(), std::pair{v, to}) != seen.end()) continue;
      if (seen.size() >= 64) return;
      seen.emplace_back(v, to);
      todo.emplace_back(v, to);
    }
  }
  for (size_t w = 2; w < 4; ++w) r.bytes[w] = ~0ull;
}

static bool bytes_within(const ByteSet& a, const ByteSet& b) {
  for (size_t w = 0; w < a.size(); ++w)
    if (a[w] & ~b[w]) return false;
  return true;
}

Automaton::Run& Automaton::run_slot(int32_t state) {
  if (!runs_[size_t(state)]) {
    auto r = std::make_unique<Run>();  // find_run_bytes may intern states, growing runs_
    find_run_bytes(state, *r);
    runs_[size_t(state)] = std::move(r);
  }
  return *runs_[size_t(state)];
}

const Automaton::Run& Automaton::run(int32_t state) {
  // A length cut short by the cap is a lower bound; one that has fallen to half the cap (a
  // state further down a chain) is followed again.
  auto usable = [](const Run& r) { return r.length >= 0 && (!r.cut || r.length >= kRunCap / 2); };
  if (runs_[size_t(state)] && usable(*runs_[size_t(state)])) return *runs_[size_t(state)];
  // Follows the chain state -> next -> ... while each set lies within the next one's (then
  // length(s) >= 1 + length(next)), for at most kRunCap states, and fills the lengths in
  // backwards.
  std::vector<int32_t> chain;
  int32_t s = state;
  int32_t base = 0;
  bool cut = false;
  for (;;) {
    Run& r = run_slot(s);
    if (usable(r)) {
      base = r.length;
      cut = r.cut;
      break;
    }
    if (r.length == -2) {  // a cycle of equal sets: endless
      base = kEndless;
      break;
    }
    if (r.next == kDead) {
      r.length = 0;
      base = 0;
      break;
    }
    chain.push_back(s);
    r.length = -2;
    if (!bytes_within(r.bytes, run_slot(r.next).bytes)) break;
    if (chain.size() >= size_t(kRunCap)) {
      cut = true;
      break;
    }
    s = r.next;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    base = std::min(kEndless, base + 1);
    runs_[size_t(*it)]->length = base;
    runs_[size_t(*it)]->cut = cut && base < kEndless;
  }
  return *runs_[size_t(state)];
}

void Automaton::walk(uint32_t trie_node, int32_t state, std::vector<uint64_t>& bits) {
  const auto& nodes = trie_->nodes();
  const auto& ids = trie_->ids();
  const TokenTrie::Node n = nodes[trie_node];
  const std::array<int32_t, 256>& table = transitions(state);
  const Run* r = nullptr;  // found when a subtree is large enough to be worth it
  for (uint32_t c = n.child_begin; c < n.child_end; ++c) {
    const TokenTrie::Node& child = nodes[c];
    const int32_t to = table[child.byte];
    if (to == kDead) continue;
    if (child.sub_end - child.tok_end >= kRunMinTokens) {
      if (!r) r = &run(state);
      if (int64_t(child.height) <= r->length && bytes_within(trie_->subtree_bytes(c), r->bytes)) {
        for (uint32_t t = child.tok_begin; t < child.sub_end; ++t)
          bits[size_t(ids[t]) >> 6] |= uint64_t(1) << (ids[t] & 63);
        continue;
      }
    }
    for (uint32_t t = child.tok_begin; t < child.tok_end; ++t)
      bits[size_t(ids[t]) >> 6] |= uint64_t(1) << (ids[t] & 63);
    if (child.child_begin != child.child_end) walk(c, to, bits);
  }
}

const std::vector<uint64_t>& Automaton::mask(int32_t state) {
  if (!masks_[size_t(state)]) {
    auto bits = std::make_unique<std::vector<uint64_t>>((size_t(trie_->vocab_size()) + 63) / 64, 0);
    walk(0, state, *bits);
    if (can_end(state))
      for (int32_t id : end_ids_) (*bits)[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
    masks_[size_t(state)] = std::move(bits);
  }
  return *masks_[size_t(state)];
}

bool Automaton::can_end(int32_t state) const {
  const auto& s = states_[size_t(state)];
  return !s.empty() && s[0] == kDone;
}

bool Automaton::must_end(int32_t state) const {
  const auto& s = states_[size_t(state)];
  return s.size() == 1 && s[0] == kDone;
}

bool Automaton::is_end_token(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

// ---- Matcher ----

Matcher::Matcher(std::shared_ptr<Automaton> automaton)
    : automaton_(std::move(automaton)), state_(automaton_->initial_state()) {}

bool Matcher::accept(int32_t token) {
  if (token < 0 || token >= automaton_->trie().vocab_size()) return false;
  if (automaton_->is_end_token(token)) return can_end();
  const std::string& b = automaton_->trie().bytes(token);
  return !b.empty() && accept_bytes(b);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  int32_t s = state_;
  for (char c : bytes) {
    s = automaton_->step(s, uint8_t(c));
    if (s == Automaton::kDead) return false;
  }
  state_ = s;
  return true;
}

}  // namespace osprey::grammar
