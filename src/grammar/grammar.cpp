#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace osprey::grammar {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int64_t kMaxRepeat = 10000;

using Seq = std::vector<Element>;
using Range = std::pair<uint32_t, uint32_t>;  // code points, inclusive

// cp's UTF-8 bytes appended to out.
void encode_utf8(uint32_t cp, std::vector<uint8_t>& out) {
  std::string bytes;
  utf8::append(bytes, cp);
  out.insert(out.end(), bytes.begin(), bytes.end());
}

// Splits [lo, hi] (no surrogates inside) into ranges whose UTF-8 encodings are sequences of
// byte ranges, one range per byte position.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= max && hi > max) {
      utf8_sequences(lo, max, out);
      utf8_sequences(max + 1, hi, out);
      return;
    }
  if (hi > 0x7F) {
    const int n = lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_sequences(lo, lo | m, out);
          utf8_sequences((lo | m) + 1, hi, out);
          return;
        }
        if ((hi & m) != m) {
          utf8_sequences(lo, (hi & ~m) - 1, out);
          utf8_sequences(hi & ~m, hi, out);
          return;
        }
      }
    }
  }
  std::vector<uint8_t> a, b;
  encode_utf8(lo, a);
  encode_utf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

class Parser {
 public:
  explicit Parser(std::string_view text) : src_(text) {}

  Grammar parse() {
    skip_space(true);
    while (pos_ < src_.size()) {
      parse_rule();
      skip_space(true);
    }
    auto root = by_name_.find("root");
    if (root == by_name_.end() || !defined_[root->second]) fail_at(src_.size(), "the grammar has no 'root' rule");
    for (uint32_t r = 0; r < bodies_.size(); ++r)
      if (!defined_[r]) fail_at(first_use_[r], "rule '" + g_.names[r] + "' is used but not defined");
    g_.root = root->second;
    check_left_recursion();
    for (uint32_t r = 0; r < bodies_.size(); ++r) {
      g_.alts.emplace_back();
      for (const Seq& alt : bodies_[r]) {
        g_.alts[r].push_back(uint32_t(g_.elems.size()));
        g_.elems.insert(g_.elems.end(), alt.begin(), alt.end());
        g_.elems.push_back(Element{Element::Kind::end, 0});
      }
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw InvalidInput("grammar: line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }

  bool at_end() const { return pos_ >= src_.size(); }
  char peek() const { return at_end() ? '\0' : src_[pos_]; }

  // Skips blanks and comments, and newlines when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(src_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t rule_named(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    const uint32_t r = new_rule(name);
    by_name_[name] = r;
    return r;
  }

  uint32_t new_rule(const std::string& name) {
    bodies_.emplace_back();
    defined_.push_back(false);
    first_use_.push_back(pos_);
    g_.names.push_back(name);
    return uint32_t(bodies_.size() - 1);
  }

  // A rule generated for a group, class or repetition inside the current rule.
  uint32_t generated(std::vector<Seq> alts) {
    const uint32_t r = new_rule(current_ + "_" + std::to_string(++n_generated_));
    bodies_[r] = std::move(alts);
    defined_[r] = true;
    return r;
  }

  Element set_element(const ByteSet& s) {
    auto [it, fresh] = set_index_.emplace(s, uint32_t(g_.sets.size()));
    if (fresh) g_.sets.push_back(s);
    return Element{Element::Kind::bytes, it->second};
  }
  static Element ref(uint32_t rule) { return Element{Element::Kind::rule, rule}; }

  void parse_rule() {
    current_ = parse_name();
    const uint32_t r = rule_named(current_);
    if (defined_[r]) fail("rule '" + current_ + "' is defined twice");
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") fail("expected '::=' after the rule name '" + current_ + "'");
    pos_ += 3;
    skip_space(true);
    bodies_[r] = parse_alternatives(false);
    defined_[r] = true;
    skip_space(false);
    if (!at_end() && peek() != '\n' && peek() != '\r') fail(std::string("unexpected '") + peek() + "'");
  }

  std::vector<Seq> parse_alternatives(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested));
    skip_space(nested);
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
      skip_space(nested);
    }
    return alts;
  }

  Seq parse_sequence(bool nested) {
    Seq seq;
    for (;;) {
      skip_space(nested);
      const char c = peek();
      if (at_end() || c == '|' || c == ')' || c == '\n' || c == '\r') break;
      Seq term = parse_term();
      skip_space(nested);
      while (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') {
        term = repeat(std::move(term));
        skip_space(nested);
      }
      seq.insert(seq.end(), term.begin(), term.end());
    }
    return seq;
  }

  Seq parse_term() {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      Seq seq;
      std::vector<uint8_t> bytes;
      while (peek() != '"') {
        if (at_end() || peek() == '\n') fail("unterminated literal");
        bytes.clear();
        encode_utf8(parse_char(), bytes);
        for (uint8_t b : bytes) {
          ByteSet s{};
          add_byte(s, b);
          seq.push_back(set_element(s));
        }
      }
      ++pos_;
      return seq;
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (peek() == '^') {
        negate = true;
        ++pos_;
      }
      std::vector<Range> ranges;
      while (peek() != ']') {
        if (at_end() || peek() == '\n') fail("unterminated character class");
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail("a character range ends before it starts");
        }
        ranges.emplace_back(lo, hi);
      }
      ++pos_;
      return class_elements(std::move(ranges), negate);
    }
    if (c == '.') {
      ++pos_;
      return class_elements({{0, kMaxCodepoint}}, false);
    }
    if (c == '(') {
      ++pos_;
      skip_space(true);
      std::vector<Seq> alts = parse_alternatives(true);
      skip_space(true);
      if (peek() != ')') fail("expected ')'");
      ++pos_;
      return {ref(generated(std::move(alts)))};
    }
    if (c == '<') fail("token references (<...>) are not supported");
    if (name_char(c)) {
      const size_t at = pos_;
      const uint32_t r = rule_named(parse_name());
      if (!defined_[r] && first_use_[r] > at) first_use_[r] = at;
      return {ref(r)};
    }
    fail(std::string("unexpected '") + c + "'");
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char c = peek();
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("expected " + std::to_string(n) + " hex digits");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: an escape or a UTF-8 encoded code point.
  uint32_t parse_char() {
    const unsigned char c = uint8_t(peek());
    if (c == '\\') {
      ++pos_;
      if (at_end()) fail("unterminated escape");
      const char e = src_[pos_++];
      uint32_t cp = 0;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return uint32_t(e);
        case 'x': cp = hex(2); break;
        case 'u': cp = hex(4); break;
        case 'U': cp = hex(8); break;
        default: --pos_; fail(std::string("unknown escape '\\") + e + "'");
      }
      if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) fail("the escape names no Unicode character");
      return cp;
    }
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + size_t(n) > src_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) {
      const uint8_t b = uint8_t(src_[pos_ + size_t(i)]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += size_t(n);
    return cp;
  }

  // A class of code points as elements: one byte set when every member is ASCII, else a rule
  // with an alternative per run of UTF-8 encodings.
  Seq class_elements(std::vector<Range> ranges, bool negate) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<Range> merged;
    for (const Range& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    if (negate) {
      std::vector<Range> inv;
      uint32_t next = 0;
      for (const Range& r : merged) {
        if (r.first > next) inv.emplace_back(next, r.first - 1);
        next = r.second + 1;
      }
      if (next <= kMaxCodepoint) inv.emplace_back(next, kMaxCodepoint);
      merged = std::move(inv);
    }
    // Surrogates have no UTF-8 form.
    std::vector<Range> valid;
    for (const Range& r : merged) {
      if (r.second < 0xD800 || r.first > 0xDFFF) {
        valid.push_back(r);
        continue;
      }
      if (r.first < 0xD800) valid.emplace_back(r.first, 0xD7FF);
      if (r.second > 0xDFFF) valid.emplace_back(0xE000, r.second);
    }
    if (valid.empty()) fail("the character class matches nothing");
    ByteSet ascii{};
    bool any_ascii = false;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (const Range& r : valid) {
      for (uint32_t cp = r.first; cp <= std::min<uint32_t>(r.second, 0x7F); ++cp) {
        add_byte(ascii, uint8_t(cp));
        any_ascii = true;
      }
      if (r.second > 0x7F) utf8_sequences(std::max<uint32_t>(r.first, 0x80), r.second, seqs);
    }
    if (seqs.empty()) return {set_element(ascii)};
    std::vector<Seq> alts;
    if (any_ascii) alts.push_back({set_element(ascii)});
    for (const auto& s : seqs) {
      Seq alt;
      for (auto [lo, hi] : s) {
        ByteSet set{};
        for (unsigned b = lo; b <= hi; ++b) add_byte(set, uint8_t(b));
        alt.push_back(set_element(set));
      }
      alts.push_back(std::move(alt));
    }
    return {ref(generated(std::move(alts)))};
  }

  int64_t parse_int() {
    const size_t start = pos_;
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) fail("a repetition bound past " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    return pos_ == start ? -1 : v;
  }

  // Applies the postfix operator at pos_ to `term`.
  Seq repeat(Seq term) {
    Element e = term.size() == 1 ? term[0] : ref(generated({std::move(term)}));
    const char op = src_[pos_++];
    auto star = [&] { return generated({}); };
    if (op == '*' || op == '+') {
      const uint32_t r = star();
      bodies_[r] = {{e, ref(r)}, {}};
      return op == '*' ? Seq{ref(r)} : Seq{e, ref(r)};
    }
    if (op == '?') return {ref(generated({{e}, {}}))};
    // {m}, {m,}, {m,n}, {,n}
    skip_space(false);
    int64_t lo = parse_int(), hi = lo;
    skip_space(false);
    if (peek() == ',') {
      ++pos_;
      skip_space(false);
      hi = parse_int();  // -1: unbounded
    } else if (lo < 0) {
      fail("expected a number in '{...}'");
    }
    skip_space(false);
    if (peek() != '}') fail("expected '}'");
    ++pos_;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo) fail("a repetition's maximum is below its minimum");
    Seq out(size_t(lo), e);
    if (hi < 0) {
      const uint32_t r = star();
      bodies_[r] = {{e, ref(r)}, {}};
      out.push_back(ref(r));
    } else if (hi > lo) {
      // (e (e (...)?)?)? nested hi - lo deep
      int64_t prev = -1;
      for (int64_t k = 0; k < hi - lo; ++k) {
        Seq alt{e};
        if (prev >= 0) alt.push_back(ref(uint32_t(prev)));
        prev = generated({alt, {}});
      }
      out.push_back(ref(uint32_t(prev)));
    }
    return out;
  }

  // A rule that can reach itself before consuming a byte would expand forever.
  void check_left_recursion() {
    const size_t n = bodies_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : bodies_[r]) {
          bool all = true;
          for (const Element& e : alt)
            if (e.kind != Element::Kind::rule || !nullable[e.index]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      color[r] = 1;
      for (const Seq& alt : bodies_[r])
        for (const Element& e : alt) {
          if (e.kind != Element::Kind::rule) break;
          if (color[e.index] == 1)
            throw InvalidInput("grammar: rule '" + g_.names[e.index] +
                               "' is left-recursive (it can reach itself before matching a character, also through a "
                               "repetition of something that can be empty)");
          if (color[e.index] == 0) visit(e.index);
          if (!nullable[e.index]) break;
        }
      color[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r)
      if (color[r] == 0) visit(r);
  }

  std::string_view src_;
  size_t pos_ = 0;
  Grammar g_;
  std::vector<std::vector<Seq>> bodies_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::map<std::string, uint32_t> by_name_;
  std::map<ByteSet, uint32_t> set_index_;
  std::string current_;
  int n_generated_ = 0;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return Parser(text).parse(); }

void append_gbnf_literal(std::string& out, std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  out += '"';
  for (const char ch : s) {
    const auto c = uint8_t(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace osprey::grammar
