// Lexer and recursive-descent parser for the chat-template subset of jinja2. Operator
// precedence is jinja2's: `x if c else y` < or < and < not < comparisons and `in` < + - <
// ~ < * / // % < ** < unary - + < postfix (. [] ()) < filters and tests.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "chat/jinja_ast.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace osprey::jinja {
namespace {

struct Token {
  enum Type { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Type type;
  std::string text;
  int line;
};

[[noreturn]] void syntax_error(int line, const std::string& what) {
  throw InvalidInput("chat template line " + std::to_string(line) + ": " + what);
}

[[noreturn]] void unsupported(int line, const std::string& what) {
  throw Unsupported("chat template line " + std::to_string(line) + ": " + what + " is not supported");
}

// jinja2 joins str.splitlines() with \n: every line break becomes \n and one trailing
// line break is dropped (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(src[i]);
    if (c == '\r') {
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      out += '\n';
    } else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E) {
      out += '\n';
    } else if (c == 0xC2 && i + 1 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x85) {
      ++i;
      out += '\n';
    } else if (c == 0xE2 && i + 2 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(src[i + 2]) == 0xA8 || static_cast<unsigned char>(src[i + 2]) == 0xA9)) {
      i += 2;
      out += '\n';
    } else {
      out += static_cast<char>(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(const std::string& s, int line) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    auto hex = [&](int n) {
      if (i + n >= s.size()) syntax_error(line, "truncated \\" + std::string(1, c) + " escape in a string");
      uint32_t cp = 0;
      for (int k = 0; k < n; ++k) {
        char h = s[++i];
        if (!std::isxdigit(static_cast<unsigned char>(h))) syntax_error(line, "bad \\" + std::string(1, c) + " escape in a string");
        cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) syntax_error(line, "escape outside Unicode scalar values in a string");
      utf8::append(out, cp);
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case '\n': break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default: out += '\\'; out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      std::size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit(Token::kData, text);
        advance_to(start);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
      if (sign == '-') {
        std::size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the spaces before a block or comment that opens its line.
        std::size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool blank = true;
          for (std::size_t k = l_pos; k < text.size(); ++k)
            if (!is_space(text[k])) blank = false;
          if (blank) text.resize(l_pos);
        }
      }
      if (!text.empty()) emit(Token::kData, text);
      advance_to(start);
      std::size_t body = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        std::size_t end = src_.find("#}", body);
        if (end == std::string::npos) syntax_error(line_, "unterminated comment");
        char esign = end > body ? src_[end - 1] : 0;
        std::size_t after = end + 2;
        if (esign == '-') {
          while (after < src_.size() && is_space(src_[after])) ++after;
        } else if (esign != '+' && after < src_.size() && src_[after] == '\n') {
          ++after;
        }
        line_starting = src_[after - 1] == '\n';
        advance_to(after);
        continue;
      }
      advance_to(body);
      emit(kind == '{' ? Token::kVarBegin : Token::kBlockBegin, "");
      line_starting = lex_tag(kind == '{');
    }
    emit(Token::kEof, "");
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  void emit(Token::Type t, std::string text) { tokens_.push_back({t, std::move(text), line_}); }

  void advance_to(std::size_t p) {
    for (; pos_ < p; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  bool starts(const char* s) const { return src_.compare(pos_, std::char_traits<char>::length(s), s) == 0; }

  // Lexes the inside of a tag up to and including its end; returns whether what it
  // consumed ends with a newline (jinja2's line_starting for the next lstrip).
  bool lex_tag(bool variable) {
    const char* close = variable ? "}}" : "%}";
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) syntax_error(line_, std::string("unterminated tag, expected '") + close + "'");
      if (depth == 0) {
        std::size_t after = 0;
        bool strip = false, keep = false;
        if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
          strip = true;
          after = pos_ + 3;
        } else if (src_[pos_] == '+' && src_.compare(pos_ + 1, 2, close) == 0) {
          keep = true;
          after = pos_ + 3;
        } else if (src_.compare(pos_, 2, close) == 0) {
          after = pos_ + 2;
        }
        if (after) {
          emit(variable ? Token::kVarEnd : Token::kBlockEnd, "");
          if (strip) {
            while (after < src_.size() && is_space(src_[after])) ++after;
          } else if (!variable && !keep && after < src_.size() && src_[after] == '\n') {
            ++after;  // trim_blocks
          }
          bool ends_newline = src_[after - 1] == '\n';
          advance_to(after);
          return ends_newline;
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        emit(Token::kName, src_.substr(pos_, e - pos_));
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        std::size_t e = pos_ + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) syntax_error(line_, "unterminated string");
        int line = line_;
        std::string body = src_.substr(pos_ + 1, e - pos_ - 1);
        advance_to(e + 1);
        tokens_.push_back({Token::kString, unescape(body, line), line});
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* o : kOps2)
          if (starts(o)) op = o;
        if (op.empty()) {
          if (std::string("+-/*%~[](){}><=.:|,;").find(c) == std::string::npos)
            syntax_error(line_, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        emit(Token::kOp, op);
        advance_to(pos_ + op.size());
      }
    }
  }

  void lex_number() {
    std::size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1])) &&
        !(tokens_.size() && tokens_.back().type == Token::kOp && tokens_.back().text == ".")) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      std::size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        e = k;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (std::size_t k = pos_; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    emit(is_float ? Token::kFloat : Token::kInt, text);
    advance_to(e);
  }

  std::string src_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(std::size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  Token next() { return toks_[i_ < toks_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Token::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Token::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) syntax_error(cur().line, std::string("expected '") + op + "', found " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Token::kName) syntax_error(cur().line, "expected a name, found " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Token::kBlockEnd) syntax_error(cur().line, "expected end of statement '%}', found " + describe(cur()));
    ++i_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::kEof: return "end of template";
      case Token::kBlockEnd: return "'%}'";
      case Token::kVarEnd: return "'}}'";
      case Token::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  // Parses statements until a block whose keyword is in `ends` (left in `end`, with the
  // stream after the keyword) or the end of the template (when `ends` is empty).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::kEof) {
        if (!ends.empty()) syntax_error(t.line, "unexpected end of template, expected '" + *ends.begin() + "'");
        return body;
      }
      if (t.type == Token::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.type == Token::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = t.line;
        s->expr = parse_tuple_or_expr();
        if (cur().type != Token::kVarEnd) syntax_error(cur().line, "expected '}}', found " + describe(cur()));
        ++i_;
        body.push_back(std::move(s));
      } else if (t.type == Token::kBlockBegin) {
        ++i_;
        if (cur().type != Token::kName) syntax_error(cur().line, "expected a statement name, found " + describe(cur()));
        std::string kw = cur().text;
        if (ends.count(kw)) {
          ++i_;
          end = kw;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        syntax_error(t.line, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    Token kw = next();
    auto s = std::make_unique<Stmt>();
    s->line = kw.line;
    const std::string& k = kw.text;
    std::string end;
    if (k == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conds.push_back(parse_tuple_or_expr());
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          s->conds.push_back(parse_tuple_or_expr());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, end);
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (k == "for") {
      s->kind = Stmt::Kind::kFor;
      s->target = parse_target(true);
      if (!skip_name("in")) syntax_error(cur().line, "expected 'in' in for loop, found " + describe(cur()));
      s->expr = parse_tuple_or_expr(/*with_condexpr=*/false);
      if (skip_name("if")) s->filter = parse_expression();
      if (is_name("recursive")) unsupported(cur().line, "recursive for loop");
      expect_block_end();
      s->body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
    } else if (k == "set") {
      s->target = parse_target(false);
      if (skip_op("=")) {
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple_or_expr();
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::kSetBlock;
        if (s->target.tuple || !s->target.attr.empty()) syntax_error(s->line, "a block set assigns one name");
        if (is_op("|")) s->filter = parse_filters(nullptr);
        expect_block_end();
        s->body = parse_body({"endset"}, end);
        expect_block_end();
      }
    } else if (k == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->name = expect_name();
      parse_params(s->params);
      expect_block_end();
      s->body = parse_body({"endmacro"}, end);
      if (cur().type == Token::kName) ++i_;
      expect_block_end();
    } else if (k == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (is_op("(")) parse_params(s->params);
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::kCall) syntax_error(s->line, "expected a call after 'call'");
      expect_block_end();
      s->body = parse_body({"endcall"}, end);
      expect_block_end();
    } else if (k == "break" || k == "continue") {
      s->kind = k == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (k == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->filter = parse_filters(nullptr, /*first_without_pipe=*/true);
      expect_block_end();
      s->body = parse_body({"endfilter"}, end);
      expect_block_end();
    } else if (k == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, end);
      expect_block_end();
    } else {
      unsupported(kw.line, "statement '" + k + "'");
    }
    return s;
  }

  Target parse_target(bool for_loop) {
    Target t;
    bool parens = skip_op("(");
    t.names.push_back(expect_name());
    if (!for_loop && !parens && skip_op(".")) {
      t.attr = expect_name();
      return t;
    }
    while (skip_op(",")) {
      t.tuple = true;
      if (cur().type != Token::kName) break;
      t.names.push_back(expect_name());
    }
    if (parens) {
      t.tuple = true;
      expect_op(")");
    }
    return t;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!params.empty()) expect_op(",");
      if (skip_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
    }
  }

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // An expression, or a bare tuple `a, b` (as in `{% set a = 1, 2 %}`).
  ExprPtr parse_tuple_or_expr(bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Token::kBlockEnd || cur().type == Token::kVarEnd || is_op(")")) break;
      t->args.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto c = node(Expr::Kind::kCond, line);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression() : nullptr;
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(Expr::Kind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  // Operands read by `operand`, joined left to right by any of `ops` (operator tokens, or names
  // such as "or" when `words`) into binary nodes named by the operator.
  template <class Operand>
  ExprPtr left_chain(std::initializer_list<const char*> ops, bool words, Operand operand) {
    ExprPtr e = operand();
    while (std::any_of(ops.begin(), ops.end(), [&](const char* op) { return words ? is_name(op) : is_op(op); })) {
      Token t = next();
      e = binary(t.text, std::move(e), operand(), t.line);
    }
    return e;
  }

  ExprPtr parse_or() { return left_chain({"or"}, true, [this] { return parse_and(); }); }
  ExprPtr parse_and() { return left_chain({"and"}, true, [this] { return parse_not(); }); }
  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = next().line;
      auto e = node(Expr::Kind::kNot, line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Token::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                       cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().type == Token::kName && peek().text == "in") {
        i_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() { return left_chain({"+", "-"}, false, [this] { return parse_concat(); }); }
  ExprPtr parse_concat() { return left_chain({"~"}, false, [this] { return parse_math2(); }); }
  ExprPtr parse_math2() { return left_chain({"*", "/", "//", "%"}, false, [this] { return parse_pow(); }); }
  ExprPtr parse_pow() { return left_chain({"**"}, false, [this] { return parse_unary(); }); }
  ExprPtr parse_unary(bool with_filter = true) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Token t = next();
      e = node(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.line);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Token t = next();
    switch (t.type) {
      case Token::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        auto e = node(Expr::Kind::kName, t.line);
        e->name = t.text;
        return e;
      }
      case Token::kString: {
        std::string s = t.text;
        while (cur().type == Token::kString) s += next().text;
        return literal(Value::string(std::move(s)), t.line);
      }
      case Token::kInt: {
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno) unsupported(t.line, "integer literal " + t.text + " beyond 64 bits");
        return literal(Value::integer(v), t.line);
      }
      case Token::kFloat: return literal(Value::floating(std::strtod(t.text.c_str(), nullptr)), t.line);
      case Token::kOp:
        if (t.text == "(") {
          if (skip_op(")")) return seq(Expr::Kind::kTuple, t.line);
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto tup = seq(Expr::Kind::kTuple, t.line);
            tup->args.push_back(std::move(e));
            while (skip_op(",")) {
              if (is_op(")")) break;
              tup->args.push_back(parse_expression());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = seq(Expr::Kind::kList, t.line);
          parse_items("]", [&] { e->args.push_back(parse_expression()); });
          return e;
        }
        if (t.text == "{") {
          auto e = seq(Expr::Kind::kDict, t.line);
          parse_items("}", [&] {
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          });
          return e;
        }
        break;
      default: break;
    }
    syntax_error(t.line, "unexpected " + describe(t));
  }

  // Comma-separated items up to the operator `close` (a trailing comma allowed), each read by
  // `item`; the opening bracket is already read.
  template <class Item>
  void parse_items(const char* close, Item item) {
    bool first = true;
    while (!skip_op(close)) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(close)) break;
      item();
    }
  }

  ExprPtr literal(Value v, int line) {
    auto e = node(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }
  ExprPtr seq(Expr::Kind kind, int line) { return node(kind, line); }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        int line = next().line;
        auto g = node(Expr::Kind::kGetAttr, line);
        if (cur().type == Token::kName) {
          g->name = next().text;
        } else if (cur().type == Token::kInt) {
          g->kind = Expr::Kind::kGetItem;
          g->args.push_back(std::move(e));
          g->args.push_back(literal(Value::integer(std::strtoll(next().text.c_str(), nullptr, 10)), line));
          e = std::move(g);
          continue;
        } else {
          syntax_error(line, "expected an attribute name after '.', found " + describe(cur()));
        }
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        int line = next().line;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
          if (k < 2 && skip_op(":")) {
            slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        auto g = node(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
        g->args.push_back(std::move(e));
        if (slice) {
          for (auto& p : parts) g->args.push_back(std::move(p));
        } else {
          if (!parts[0]) syntax_error(line, "empty subscript");
          g->args.push_back(std::move(parts[0]));
        }
        e = std::move(g);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // callee(a, b, k=v), the call at the current "(".
  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(Expr::Kind::kCall, cur().line);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  // Parses `(a, b, k=v)` into e.args (after what is already there), n_pos and kw_names.
  void parse_call_args(Expr& e) {
    expect_op("(");
    parse_items(")", [&] {
      if (is_op("*") || is_op("**")) unsupported(cur().line, "*args and **kwargs in a call");
      if (cur().type == Token::kName && peek().type == Token::kOp && peek().text == "=") {
        e.kw_names.push_back(next().text);
        ++i_;
        e.args.push_back(parse_expression());
      } else {
        if (!e.kw_names.empty()) syntax_error(cur().line, "positional argument after a keyword argument");
        e.args.push_back(parse_expression());
        ++e.n_pos;
      }
    });
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        int line = next().line;
        auto t = node(Expr::Kind::kTest, line);
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) t->name += "." + expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Token::kName && cur().text != "else" && cur().text != "or" &&
                    cur().text != "and" && cur().text != "is" && cur().text != "if" && cur().text != "in" &&
                    cur().text != "not") ||
                   cur().type == Token::kString || cur().type == Token::kInt || cur().type == Token::kFloat ||
                   is_op("[") || is_op("{")) {
          // `is sameas x`: one argument without parentheses.
          ExprPtr arg = parse_primary();
          arg = parse_postfix(std::move(arg));
          t->args.push_back(std::move(arg));
          t->n_pos = 1;
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // One or more `| name(args)`; e may be null (filter blocks, block sets).
  ExprPtr parse_filters(ExprPtr e, bool first_without_pipe = false) {
    bool first = true;
    while ((first && first_without_pipe) || is_op("|")) {
      if (!(first && first_without_pipe)) ++i_;
      first = false;
      int line = cur().line;
      auto f = node(Expr::Kind::kFilter, line);
      f->name = expect_name();
      while (skip_op(".")) f->name += "." + expect_name();
      f->args.push_back(std::move(e));
      if (is_op("(")) parse_call_args(*f);
      e = std::move(f);
    }
    return e;
  }

  std::vector<Token> toks_;
  std::size_t i_ = 0;
};

}  // namespace

Body parse(const std::string& source) {
  Lexer lexer(source);
  Parser parser(lexer.run());
  return parser.parse_template();
}

}  // namespace osprey::jinja
