#include "grammar/matcher.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace osprey::grammar {

// ---- TokenTrie ----

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
  fill(0, 0, uint32_t(ids_.size()), 0);
}

// Builds the children of `node` from ids_[lo, hi), which share their first `depth` bytes.
void TokenTrie::fill(uint32_t node, uint32_t lo, uint32_t hi, size_t depth) {
  uint32_t i = lo;
  while (i < hi && bytes_[size_t(ids_[i])].size() == depth) ++i;
  nodes_[node].tok_begin = lo;
  nodes_[node].tok_end = i;
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
  nodes_[node].child_begin = first;
  nodes_[node].child_end = first + uint32_t(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    nodes_[first + k].byte = uint8_t(bytes_[size_t(ids_[groups[k].first])][depth]);
    fill(first + uint32_t(k), groups[k].first, groups[k].second, depth + 1);
  }
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
  return id;
}

int32_t Automaton::step(int32_t state, uint8_t byte) {
  auto& table = trans_[size_t(state)];
  if (!table) {
    table = std::make_unique<std::array<int32_t, 256>>();
    table->fill(-2);
  }
  int32_t& known = (*table)[byte];
  if (known != -2) return known;
  std::vector<int32_t> out;
  for (int32_t id : states_[size_t(state)]) {
    if (id == kDone) continue;
    const StackNode n = nodes_[size_t(id)];
    if (!has_byte(grammar_.sets[grammar_.elems[n.pos].index], byte)) continue;
    const std::vector<int32_t>& nx = next(id);
    out.insert(out.end(), nx.begin(), nx.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  const int32_t to = out.empty() ? kDead : intern_state(std::move(out));
  (*trans_[size_t(state)])[byte] = to;  // interning may have grown trans_, not moved the table
  return to;
}

void Automaton::walk(uint32_t trie_node, int32_t state, std::vector<uint64_t>& bits) {
  const auto& nodes = trie_->nodes();
  const auto& ids = trie_->ids();
  const TokenTrie::Node n = nodes[trie_node];
  for (uint32_t c = n.child_begin; c < n.child_end; ++c) {
    const int32_t to = step(state, nodes[c].byte);
    if (to == kDead) continue;
    for (uint32_t t = nodes[c].tok_begin; t < nodes[c].tok_end; ++t)
      bits[size_t(ids[t]) >> 6] |= uint64_t(1) << (ids[t] & 63);
    if (nodes[c].child_begin != nodes[c].child_end) walk(c, to, bits);
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
