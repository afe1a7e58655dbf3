#pragma once
// Constrained decoding: which tokens of the vocabulary keep the output inside a grammar.
//
// The grammar runs as a pushdown automaton over bytes whose stacks are persistent and
// interned (a stack is a node id; equal stacks are the same id), with tail calls not pushed,
// so a repetition does not grow the stack. A set of stacks is a state, interned too; a
// state's byte transitions are computed once and kept, so the automaton becomes a DFA built
// lazily over the states the output visits. A state's token mask comes from one walk of the
// vocabulary's byte trie that prunes every subtree whose prefix the grammar rejects, and is
// cached per state: inside a string or a number, and on every later item of an array, the
// state repeats and the mask is a lookup (XGrammar's observation that most masks are
// context-independent, reached here through state interning).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace osprey {
class Tokenizer;
}

namespace osprey::grammar {

// The vocabulary as byte strings, in a trie. Immutable; safe to share between threads.
class TokenTrie {
 public:
  // bytes[id]: what token id decodes to; ids in `excluded` (control tokens) and ids whose
  // bytes are empty never enter a mask.
  TokenTrie(std::vector<std::string> bytes, const std::vector<bool>& excluded);
  // The tokenizer's vocabulary, its special tokens excluded.
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tokenizer);

  int32_t vocab_size() const { return int32_t(bytes_.size()); }
  // "" for an excluded id.
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }

  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // into nodes(): its children, by byte
    uint32_t tok_begin = 0, tok_end = 0;      // into ids(): the tokens that end here
    uint32_t sub_end = 0;                     // ids()[tok_begin, sub_end): every token of the subtree
    // The most UTF-8 characters on a path from the parent to a token below (a character cut
    // short at the token's end counts as one); kNotUtf8 when a path is not well-formed UTF-8
    // read from the parent as a character boundary.
    uint32_t height = 0;
    uint8_t byte = 0;                         // the edge from the parent
  };
  static constexpr uint32_t kNotUtf8 = ~0u;
  const std::vector<Node>& nodes() const { return nodes_; }  // [0] is the root
  const std::vector<int32_t>& ids() const { return ids_; }
  // The bytes on every edge of a node's subtree, the edge from its parent included.
  const ByteSet& subtree_bytes(uint32_t node) const { return sub_bytes_[node]; }

 private:
  void fill(uint32_t node, uint32_t lo, uint32_t hi, size_t depth);

  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<ByteSet> sub_bytes_;  // per node
  std::vector<int32_t> ids_;        // token ids sorted by their bytes
};

// A grammar bound to a vocabulary, with the caches its matchers share. Not thread-safe: the
// matchers of one automaton run on one thread at a time (the engine thread).
class Automaton {
 public:
  // end_ids: the tokens that end generation (EOS); allowed exactly where the grammar may end.
  Automaton(Grammar grammar, std::shared_ptr<const TokenTrie> trie, std::vector<int32_t> end_ids);

  static constexpr int32_t kDead = -1;
  int32_t initial_state() const { return initial_; }
  // The state after `byte`, or kDead.
  int32_t step(int32_t state, uint8_t byte) { return transitions(state)[byte]; }
  // Every byte's successor from `state` (kDead where rejected), computed on first use; valid
  // until the automaton is destroyed.
  const std::array<int32_t, 256>& transitions(int32_t state);
  // The tokens allowed in `state`: a bitmask over the vocabulary (bit i of word i / 64),
  // valid until the automaton is destroyed.
  const std::vector<uint64_t>& mask(int32_t state);
  // The grammar may end in `state` / nothing may follow.
  bool can_end(int32_t state) const;
  bool must_end(int32_t state) const;

  const TokenTrie& trie() const { return *trie_; }
  bool is_end_token(int32_t id) const;
  size_t n_states() const { return states_.size(); }

 private:
  static constexpr int32_t kDone = -1;  // in a state: the empty stack (the grammar is complete)
  struct StackNode {
    uint32_t pos;    // into grammar_.elems
    int32_t parent;  // the stack below (-1: none)
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };
  int32_t node(uint32_t pos, int32_t parent);
  void expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out, int depth);
  const std::vector<int32_t>& next(int32_t node_id);
  int32_t intern_state(std::vector<int32_t> stacks);
  // A state's run: `bytes`, the largest set of ASCII bytes that all lead to one state (with
  // every byte from 0x80 when every well-formed multi-byte character does too), and
  // `length`, how many characters of that set in a row the state is known to accept whatever
  // they are, the last one possibly cut short (at least 1 when `bytes` is not empty; kEndless
  // along a cycle). A trie subtree whose bytes all lie in the set and whose height is at most
  // the length is accepted whole, without walking it: most of the vocabulary inside a string.
  struct Run {
    ByteSet bytes{};
    int32_t next = kDead;    // the state every byte of the set leads to
    int32_t length = -1;     // -1: not yet known; -2: being computed
    bool cut = false;        // the chain was followed no further than kRunCap states
  };
  static constexpr int32_t kEndless = 1 << 30;
  static constexpr int32_t kRunCap = 32;
  // NOTE: finding a run costs the transitions of a chain of states; it is sought only below a
  // node with at least this many tokens under its children.
  static constexpr uint32_t kRunMinTokens = 32;
  const Run& run(int32_t state);
  Run& run_slot(int32_t state);  // the run with its bytes found, its length maybe not
  void find_run_bytes(int32_t state, Run& r);
  void walk(uint32_t trie_node, int32_t state, std::vector<uint64_t>& bits);

  Grammar grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> end_ids_;
  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<std::vector<int32_t>> next_;  // node -> the stacks after its terminal
  std::vector<uint8_t> next_known_;
  std::vector<std::vector<int32_t>> states_;  // sorted stack ids (kDone first)
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_ids_;
  std::vector<std::unique_ptr<std::array<int32_t, 256>>> trans_;
  std::vector<std::unique_ptr<std::vector<uint64_t>>> masks_;
  std::vector<std::unique_ptr<Run>> runs_;
  int32_t initial_ = kDead;
};

// One sequence's position in the grammar. Not thread-safe; shares its automaton.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<Automaton> automaton);
  // The tokens allowed next (see Automaton::mask).
  const std::vector<uint64_t>& mask() { return automaton_->mask(state_); }
  // Advances over a sampled token; false (and no change) when the grammar rejects it. An end
  // token is accepted where the grammar may end and leaves the state as it is.
  bool accept(int32_t token);
  // Advances over raw bytes; false (and no change) when the grammar rejects them.
  bool accept_bytes(std::string_view bytes);
  bool can_end() const { return automaton_->can_end(state_); }
  bool must_end() const { return automaton_->must_end(state_); }
  bool is_end_token(int32_t id) const { return automaton_->is_end_token(id); }

 private:
  std::shared_ptr<Automaton> automaton_;
  int32_t state_;
};

inline bool mask_allows(std::span<const uint64_t> mask, int32_t id) { return (mask[size_t(id) >> 6] >> (id & 63)) & 1; }

}  // namespace osprey::grammar
