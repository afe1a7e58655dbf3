#pragma once
// A context-free grammar over bytes, as the constrained decoder runs it, and its text form:
// GBNF, llama.cpp's grammar syntax.
//
//   root  ::= "{" ws pair ("," ws pair)* "}"     # rules; `root` is the start
//   pair  ::= [a-z]+ ":" ws ( "true" | "false" )  # literals, classes, groups, alternation
//   ws    ::= [ \t\n]{0,8}                         # * + ? {m} {m,} {m,n} {,n}
//
// Literals "..." and classes [...] take the escapes \n \r \t \\ \" \' \] \- \xHH \uHHHH
// \UHHHHHHHH; a class may be negated ([^...]) and holds characters and ranges (a-z); `.` is
// any character. Characters are Unicode code points, matched as their UTF-8 bytes. A rule
// ends at the end of its line unless a group or an alternation (`|`) carries it on. `#`
// starts a comment. Left recursion (a rule that can reach itself before consuming a byte)
// is refused, as llama.cpp does.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::grammar {

using ByteSet = std::array<uint64_t, 4>;  // bit b: byte b matches

inline bool has_byte(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void add_byte(ByteSet& s, uint8_t b) { s[b >> 6] |= uint64_t(1) << (b & 63); }

struct Element {
  enum class Kind : uint8_t { bytes, rule, end };
  Kind kind = Kind::end;
  uint32_t index = 0;  // bytes: into Grammar::sets; rule: the rule
};

// Immutable once built; safe to share between threads.
struct Grammar {
  // Every alternative of every rule, one after another, each closed by an end element.
  std::vector<Element> elems;
  std::vector<ByteSet> sets;
  std::vector<std::vector<uint32_t>> alts;  // rule -> the positions in elems its alternatives start at
  std::vector<std::string> names;           // rule -> its name ("" for generated rules: groups, repetitions)
  uint32_t root = 0;
};

// Parses GBNF text. Throws InvalidInput naming the line and column and what is wrong: a
// syntax error, an undefined rule, a missing `root`, left recursion, a repetition bound past
// 10000.
Grammar parse_gbnf(std::string_view text);

// Appends `s` as a GBNF literal ("...", with escapes) to out.
void append_gbnf_literal(std::string& out, std::string_view s);

}  // namespace osprey::grammar
