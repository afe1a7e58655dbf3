#pragma once
// The syntax tree of a chat template and the parser that builds it. Lexing follows jinja2
// under transformers' settings: newlines normalised to \n, one trailing newline dropped,
// trim_blocks, lstrip_blocks, and the -/+ whitespace markers.
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace osprey::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args
    kTuple,     // args
    kDict,      // args: key, value, key, value, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null for an omitted part)
    kCall,      // args[0](args[1..n_pos], kw_names = args[n_pos+1..])
    kFilter,    // args[0] | name(args[1..n_pos], kw...); args[0] is null inside a filter block
    kTest,      // args[0] is [not] name(args[1..])
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] op args[1]: + - * / // % ** ~ and or
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kCond,      // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;                  // name, attribute, filter, test or binary operator
  std::vector<std::string> ops;      // comparison operators
  std::vector<ExprPtr> args;
  std::size_t n_pos = 0;             // positional call arguments (after the callee)
  std::vector<std::string> kw_names; // keyword argument names, in order
  bool negated = false;              // `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: a name, a namespace attribute (`ns.attr`) or a tuple of names.
struct Target {
  std::vector<std::string> names;
  std::string attr;  // when set: names[0].attr
  bool tuple = false;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // conds[k] -> bodies[k]; else_body
    kFor,       // for target in expr [if filter] body [else else_body]
    kSet,       // set target = expr
    kSetBlock,  // set target %}body{% endset, optionally piped through filter
    kMacro,     // macro name(params) body
    kCallBlock, // call(params) expr body
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr (a filter chain on null) body
    kGeneration,   // generation body (transformers' assistant-mask marker: renders body)
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  Target target;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

// Parses template source. Throws InvalidInput for a syntax error and Unsupported for a
// construct outside the implemented subset (both name the line).
Body parse(const std::string& source);

}  // namespace osprey::jinja
