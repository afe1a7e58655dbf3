// Evaluation of a parsed chat template. Scopes follow jinja2: a for loop's body runs in a
// fresh scope per iteration (a `set` there is gone at the next iteration and after the loop),
// `if` opens none, a macro call opens one over the scope the macro was defined in.
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace osprey::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit on range()

double num(const Value& v) { return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kInt ? double(v.i) : double(v.b); }
int64_t inum(const Value& v) { return v.kind == Value::Kind::kInt ? v.i : v.b; }

class Interp {
 public:
  explicit Interp(std::string& out) : out_(&out) {}
  // Scopes are shared by the values that refer to them; the interpreter holds every scope a
  // macro was defined in for as long as it runs (see make_macro).

  Flow exec(const Body& body, const ScopePtr& scope) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, scope);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "'");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const ExprPtr& a : e.args) items.push_back(eval(*a, scope));
        return Value::make_list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::make_dict();
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], scope);
          if (!key.is_string()) fail_unsupported(e.line, std::string("a dict key of type ") + key.type_name());
          d.dict->set(key.s, eval(*e.args[k + 1], scope));
        }
        return d;
      }
      case Expr::Kind::kGetAttr: return get_attr(eval(*e.args[0], scope), e.name, e.line);
      case Expr::Kind::kGetItem: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope), e.line);
      case Expr::Kind::kSlice: {
        Value obj = eval(*e.args[0], scope);
        Value parts[3];
        const Value* p[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (e.args[std::size_t(k) + 1]) {
            parts[k] = eval(*e.args[std::size_t(k) + 1], scope);
            p[k] = &parts[k];
          }
        return get_slice(obj, p[0], p[1], p[2], e.line);
      }
      case Expr::Kind::kCall: {
        Value callee = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        return call(callee, args, e.line);
      }
      case Expr::Kind::kFilter: {
        Value v = e.args[0] ? eval(*e.args[0], scope) : Value::undefined();
        CallArgs args = eval_args(e, scope);
        return apply_filter(e.name, v, args, e.line);
      }
      case Expr::Kind::kTest: {
        Value v = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        return Value::boolean(apply_test(e.name, v, args, e.line) != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        Value v = eval(*e.args[0], scope);
        if (v.is_undefined()) fail_undefined(e.line, v);
        if (!v.is_number()) fail(e.line, std::string("bad operand type for unary ") + (e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.kind == Expr::Kind::kPos) return v.kind == Value::Kind::kBool ? Value::integer(v.b) : v;
        return v.kind == Value::Kind::kFloat ? Value::floating(-v.f) : Value::integer(-inum(v));
      }
      case Expr::Kind::kNot: return Value::boolean(!eval(*e.args[0], scope).truthy());
      case Expr::Kind::kBinary: {
        if (e.name == "and" || e.name == "or") {
          Value l = eval(*e.args[0], scope);
          if (l.truthy() == (e.name == "or")) return l;
          return eval(*e.args[1], scope);
        }
        return binary(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope), e.line);
      }
      case Expr::Kind::kCompare: {
        Value l = eval(*e.args[0], scope);
        for (std::size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], scope);
          if (!compare(e.ops[k], l, r, e.line)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCond: {
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the else branch of an inline if");
      }
    }
    return Value::undefined();
  }

 private:
  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    std::size_t first = 1;
    for (std::size_t k = 0; k < e.n_pos; ++k) args.pos.push_back(eval(*e.args[first + k], scope));
    for (std::size_t k = 0; k < e.kw_names.size(); ++k)
      args.kw.emplace_back(e.kw_names[k], eval(*e.args[first + e.n_pos + k], scope));
    return args;
  }

  Value call(const Value& callee, CallArgs& args, int line) {
    if (callee.is_undefined()) fail(line, (callee.s.empty() ? std::string("undefined value") : callee.s) + " is undefined (called)");
    if (callee.kind != Value::Kind::kFunction) fail(line, std::string("'") + callee.type_name() + "' object is not callable");
    return (*callee.fn)(args);
  }

  Value binary(const std::string& op, const Value& l, const Value& r, int line) {
    using K = Value::Kind;
    if (op == "~") return Value::string(to_str(l) + to_str(r));
    if (l.is_undefined()) fail_undefined(line, l);
    if (r.is_undefined()) fail_undefined(line, r);
    auto type_error = [&]() -> Value {
      fail(line, "unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
    };
    bool ints = (l.kind == K::kInt || l.kind == K::kBool) && (r.kind == K::kInt || r.kind == K::kBool);
    bool nums = l.is_number() && r.is_number();
    if (op == "+") {
      if (ints) return Value::integer(inum(l) + inum(r));
      if (nums) return Value::floating(num(l) + num(r));
      if (l.is_string() && r.is_string()) return Value::string(l.s + r.s);
      if (l.is_list() && r.is_list() && l.tuple == r.tuple) {
        List items = *l.list;
        items.insert(items.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(items), l.tuple);
      }
      if (l.is_string() || r.is_string())
        fail(line, std::string("can only concatenate str (not \"") + (l.is_string() ? r : l).type_name() + "\") to str");
      return type_error();
    }
    if (op == "-") {
      if (ints) return Value::integer(inum(l) - inum(r));
      if (nums) return Value::floating(num(l) - num(r));
      return type_error();
    }
    if (op == "*") {
      if (ints) return Value::integer(inum(l) * inum(r));
      if (nums) return Value::floating(num(l) * num(r));
      const Value* seq = l.is_string() || l.is_list() ? &l : r.is_string() || r.is_list() ? &r : nullptr;
      const Value* n = seq == &l ? &r : &l;
      if (seq && (n->kind == K::kInt || n->kind == K::kBool)) {
        int64_t times = std::max<int64_t>(inum(*n), 0);
        if (seq->is_string()) {
          std::string out;
          for (int64_t k = 0; k < times; ++k) out += seq->s;
          return Value::string(out);
        }
        List items;
        for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(items), seq->tuple);
      }
      return type_error();
    }
    if (op == "/" || op == "//" || op == "%") {
      if (l.is_string() && op == "%") fail_unsupported(line, "printf-style string formatting with %");
      if (!nums) return type_error();
      if (num(r) == 0) fail(line, op == "%" ? "modulo by zero" : "division by zero");
      if (op == "/") return Value::floating(num(l) / num(r));
      if (ints) {
        int64_t a = inum(l), b = inum(r);
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value::integer(op == "//" ? q : m);
      }
      double a = num(l), b = num(r);
      double q = std::floor(a / b);
      return Value::floating(op == "//" ? q : a - q * b);
    }
    if (op == "**") {
      if (ints && inum(r) >= 0) {
        int64_t out = 1;
        for (int64_t k = 0; k < inum(r); ++k) out *= inum(l);
        return Value::integer(out);
      }
      if (nums) return Value::floating(std::pow(num(l), num(r)));
      return type_error();
    }
    fail(line, "unknown operator " + op);
  }

  bool compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    CallArgs args;
    args.pos.push_back(r);
    if (op == "in") return apply_test("in", l, args, line);
    if (op == "notin") return !apply_test("in", l, args, line);
    return apply_test(op, l, args, line);
  }

  void assign(const Target& t, const Value& v, const ScopePtr& scope, int line) {
    if (!t.attr.empty()) {
      const Value* ns = scope->find(t.names[0]);
      if (!ns || !ns->is_dict() || !ns->namespace_)
        fail(line, "cannot assign attribute on non-namespace object '" + t.names[0] + "'");
      ns->dict->set(t.attr, v);
      return;
    }
    if (!t.tuple) {
      scope->vars[t.names[0]] = v;
      return;
    }
    List items = iterate(v, line);
    if (items.size() != t.names.size())
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(t.names.size()) + " names");
    for (std::size_t k = 0; k < items.size(); ++k) scope->vars[t.names[k]] = items[k];
  }

  std::string capture(const Body& body, const ScopePtr& scope) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      exec(body, scope);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  Value make_macro(const Stmt& s, const ScopePtr& defined_in, const std::string& name) {
    const Stmt* def = &s;
    // The macro is stored in the scope it was defined in: holding that scope by a weak
    // pointer keeps the two from owning each other (a leak per render); macro_scopes_ keeps
    // it alive until the render ends.
    macro_scopes_.push_back(defined_in);
    std::weak_ptr<Scope> where = defined_in;
    return Value::function([this, def, where, name](CallArgs& args) -> Value {
      auto scope = std::make_shared<Scope>();
      scope->parent = where.lock();
      const auto& params = def->params;
      if (args.pos.size() > params.size())
        fail(def->line, "macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
      std::vector<bool> bound(params.size(), false);
      for (std::size_t k = 0; k < args.pos.size(); ++k) {
        scope->vars[params[k].name] = args.pos[k];
        bound[k] = true;
      }
      for (auto& [key, v] : args.kw) {
        if (key == "caller") {
          scope->vars["caller"] = v;
          continue;
        }
        std::size_t k = 0;
        while (k < params.size() && params[k].name != key) ++k;
        if (k == params.size()) fail(def->line, "macro '" + name + "' takes no keyword argument '" + key + "'");
        scope->vars[key] = v;
        bound[k] = true;
      }
      for (std::size_t k = 0; k < params.size(); ++k) {
        if (bound[k]) continue;
        scope->vars[params[k].name] = params[k].default_value ? eval(*params[k].default_value, scope)
                                                              : Value::undefined("parameter '" + params[k].name + "'");
      }
      return Value::string(capture(def->body, scope));
    });
  }

  Value make_loop(const List& items, std::size_t k) {
    Value loop = Value::make_dict();
    int64_t n = int64_t(items.size()), i = int64_t(k);
    loop.dict->set("index", Value::integer(i + 1));
    loop.dict->set("index0", Value::integer(i));
    loop.dict->set("revindex", Value::integer(n - i));
    loop.dict->set("revindex0", Value::integer(n - i - 1));
    loop.dict->set("first", Value::boolean(i == 0));
    loop.dict->set("last", Value::boolean(i == n - 1));
    loop.dict->set("length", Value::integer(n));
    loop.dict->set("depth", Value::integer(1));
    loop.dict->set("depth0", Value::integer(0));
    if (i > 0) loop.dict->set("previtem", items[k - 1]);
    if (i + 1 < n) loop.dict->set("nextitem", items[k + 1]);
    loop.dict->set("cycle", Value::function([i](CallArgs& args) -> Value {
      if (args.pos.empty()) throw InvalidInput("chat template: loop.cycle() needs at least one argument");
      return args.pos[std::size_t(i) % args.pos.size()];
    }));
    return loop;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope) {
    switch (s.kind) {
      case Stmt::Kind::kText: *out_ += s.text; break;
      case Stmt::Kind::kPrint: *out_ += to_str(eval(*s.expr, scope)); break;
      case Stmt::Kind::kIf:
        for (std::size_t k = 0; k < s.conds.size(); ++k)
          if (eval(*s.conds[k], scope).truthy()) return exec(s.bodies[k], scope);
        return exec(s.else_body, scope);
      case Stmt::Kind::kFor: {
        Value seq = eval(*s.expr, scope);
        if (seq.is_undefined() && false) fail_undefined(s.line, seq);
        List all = iterate(seq, s.line);
        List items;
        if (s.filter) {
          for (const Value& x : all) {
            auto tmp = std::make_shared<Scope>();
            tmp->parent = scope;
            assign(s.target, x, tmp, s.line);
            if (eval(*s.filter, tmp).truthy()) items.push_back(x);
          }
        } else {
          items = std::move(all);
        }
        for (std::size_t k = 0; k < items.size(); ++k) {
          auto iter = std::make_shared<Scope>();
          iter->parent = scope;
          iter->vars["loop"] = make_loop(items, k);
          assign(s.target, items[k], iter, s.line);
          if (exec(s.body, iter) == Flow::kBreak) break;
        }
        if (items.empty()) exec(s.else_body, scope);
        break;
      }
      case Stmt::Kind::kSet: assign(s.target, eval(*s.expr, scope), scope, s.line); break;
      case Stmt::Kind::kSetBlock: {
        Value v = Value::string(capture(s.body, scope));
        if (s.filter) v = apply_filter_chain(*s.filter, v, scope);
        assign(s.target, v, scope, s.line);
        break;
      }
      case Stmt::Kind::kMacro: scope->vars[s.name] = make_macro(s, scope, s.name); break;
      case Stmt::Kind::kCallBlock: {
        const Expr& c = *s.expr;
        Value callee = eval(*c.args[0], scope);
        CallArgs args = eval_args(c, scope);
        const Stmt* def = &s;
        ScopePtr outer = scope;
        args.kw.emplace_back("caller", Value::function([this, def, outer](CallArgs& a) -> Value {
          auto inner = std::make_shared<Scope>();
          inner->parent = outer;
          for (std::size_t k = 0; k < def->params.size(); ++k) {
            if (k < a.pos.size()) inner->vars[def->params[k].name] = a.pos[k];
            else if (def->params[k].default_value) inner->vars[def->params[k].name] = eval(*def->params[k].default_value, inner);
            else inner->vars[def->params[k].name] = Value::undefined("parameter '" + def->params[k].name + "'");
          }
          return Value::string(capture(def->body, inner));
        }));
        *out_ += to_str(call(callee, args, s.line));
        break;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kFilterBlock: {
        Value v = Value::string(capture(s.body, scope));
        *out_ += to_str(apply_filter_chain(*s.filter, v, scope));
        break;
      }
      case Stmt::Kind::kGeneration: return exec(s.body, scope);
    }
    return Flow::kNormal;
  }

  // Applies a filter chain parsed over a null subject to v.
  Value apply_filter_chain(const Expr& f, const Value& v, const ScopePtr& scope) {
    Value subject = f.args[0] ? apply_filter_chain(*f.args[0], v, scope) : v;
    CallArgs args = eval_args(f, scope);
    return apply_filter(f.name, subject, args, f.line);
  }

  std::string* out_;

  std::vector<ScopePtr> macro_scopes_;
};

Value global_range(CallArgs& a) {
  if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) throw InvalidInput("chat template: range() takes 1 to 3 integer arguments");
  for (const Value& v : a.pos)
    if (v.kind != Value::Kind::kInt) throw InvalidInput(std::string("chat template: range() argument must be int, not ") + v.type_name());
  int64_t start = a.pos.size() > 1 ? a.pos[0].i : 0, stop = a.pos.size() > 1 ? a.pos[1].i : a.pos[0].i;
  int64_t step = a.pos.size() > 2 ? a.pos[2].i : 1;
  if (step == 0) throw InvalidInput("chat template: range() step must not be zero");
  List out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (int64_t(out.size()) >= kMaxRange) throw InvalidInput("chat template: range() too big");
    out.push_back(Value::integer(k));
  }
  return Value::make_list(std::move(out));
}

Value global_dict(CallArgs& a, bool is_namespace) {
  Value d = Value::make_dict();
  d.namespace_ = is_namespace;
  for (const Value& p : a.pos) {
    if (!p.is_dict()) throw InvalidInput(std::string("chat template: ") + (is_namespace ? "namespace" : "dict") + "() positional argument must be a dict");
    for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
  }
  for (const auto& [k, v] : a.kw) d.dict->set(k, v);
  return d;
}

}  // namespace

Template::Template(const std::string& source)
    : body_(std::make_shared<const Body>(parse(source))) {}

std::string Template::render(const Dict& variables) const {
  auto globals = std::make_shared<Scope>();
  globals->vars["range"] = Value::function(global_range);
  globals->vars["dict"] = Value::function([](CallArgs& a) { return global_dict(a, false); });
  globals->vars["namespace"] = Value::function([](CallArgs& a) { return global_dict(a, true); });
  globals->vars["raise_exception"] = Value::function([](CallArgs& a) -> Value {
    throw InvalidInput(a.pos.empty() ? std::string("raise_exception()") : to_str(a.pos[0]));
  });
  globals->vars["strftime_now"] = Value::function([](CallArgs& a) -> Value {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) throw InvalidInput("chat template: strftime_now() takes one format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    std::size_t n = std::strftime(buf, sizeof(buf), a.pos[0].s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
  auto root = std::make_shared<Scope>();
  root->parent = globals;
  for (const auto& [k, v] : variables.items) root->vars[k] = v;
  std::string out;
  Interp interp(out);
  interp.exec(*body_, root);
  return out;
}

}  // namespace osprey::jinja
