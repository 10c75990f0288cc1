// Tree-walking evaluator of the Jinja interpreter, and Template::parse / render.
//
// Scoping follows jinja2: `if` does not open a scope; each for-loop iteration, macro call,
// caller() call and `with` block does, so `{% set %}` inside them does not leak out (which
// is why templates carry state in namespace() objects). Macros see the template's top
// level, not the scope they were defined in.
//
// Every expression and statement costs one step; built-ins charge for the elements they
// touch. Steps, output size, string and list sizes, and evaluation depth are bounded by
// RenderLimits, so any template finishes (or fails) in bounded time and memory.
#include <fmt/format.h>

#include <cmath>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja.h"
#include "hack/tokenizer/jinja_ast.h"
#include "hack/tokenizer/jinja_builtins.h"
#include "hack/tokenizer/jinja_text.h"

namespace hack::jinja {
namespace {

using namespace ast;

// An error that already names its line (set by the innermost node that saw it).
class LocatedError : public hack::Error {
 public:
  using hack::Error::Error;
};
class LocatedRaised : public TemplateRaised {
 public:
  using TemplateRaised::TemplateRaised;
};

std::string at(const SourcePos& pos) { return fmt::format("at line {}, column {}", pos.line, pos.column); }

struct Scope {
  explicit Scope(Scope* p) : parent(p) {}
  Scope* parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent) {
      for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it) {
        if (it->first == name) return &it->second;
      }
    }
    return nullptr;
  }
  void set(std::string_view name, Value value) {
    for (auto& var : vars) {
      if (var.first == name) {
        var.second = std::move(value);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(value));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

bool is_index(const Value& v) { return v.is_int() || v.is_bool(); }

class Evaluator final : public Interp {
 public:
  Evaluator(const Variables& variables, const RenderOptions& options)
      : options_(options), globals_(nullptr), root_(&globals_) {
    globals_.vars = make_globals();
    for (const auto& [name, value] : variables) globals_.set(name, value);
  }

  std::string run(const Program& program) {
    std::string out;
    exec_body(program.body, root_, out);
    return out;
  }

  void charge(uint64_t steps) override {
    steps_ = steps > UINT64_MAX - steps_ ? UINT64_MAX : steps_ + steps;
    if (steps_ > options_.limits.max_steps) {
      fail("template exceeded its step budget ({} steps)", options_.limits.max_steps);
    }
  }
  const RenderOptions& options() const override { return options_; }

 private:
  class DepthGuard {
   public:
    DepthGuard(Evaluator& e) : e_(e) {
      if (++e_.depth_ > e_.options_.limits.max_eval_depth) {
        --e_.depth_;
        fail("template evaluation nested too deeply (limit {})", e_.options_.limits.max_eval_depth);
      }
    }
    ~DepthGuard() { --e_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Evaluator& e_;
  };

  // Rethrows an error with the position of the innermost node it passed through.
  [[noreturn]] static void relocate(const SourcePos& pos) {
    try {
      throw;
    } catch (const LocatedError&) {
      throw;
    } catch (const LocatedRaised&) {
      throw;
    } catch (const TemplateRaised& e) {
      throw LocatedRaised(fmt::format("{} ({})", e.message(), at(pos)), e.message());
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw LocatedError(fmt::format("{} {}", e.what(), at(pos)));
    }
  }

  void emit(std::string& out, std::string_view text) {
    if (text.size() > options_.limits.max_output_bytes || out.size() > options_.limits.max_output_bytes - text.size()) {
      fail("template output exceeds {} bytes", options_.limits.max_output_bytes);
    }
    out += text;
  }

  // ---- statements ----------------------------------------------------------------------

  Flow exec_body(const Body& body, Scope& scope, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& stmt, Scope& scope, std::string& out) {
    try {
      DepthGuard guard(*this);
      charge(1);
      return exec_inner(stmt, scope, out);
    } catch (...) {
      relocate(stmt.pos);
    }
  }

  Flow exec_inner(const Stmt& stmt, Scope& scope, std::string& out) {
    switch (stmt.kind) {
      case StmtKind::kOutput:
        emit(out, static_cast<const Output&>(stmt).text);
        return Flow::kNormal;
      case StmtKind::kEmit: {
        const Value v = eval(*static_cast<const Emit&>(stmt).expr, scope);
        if (v.is_string()) {
          emit(out, v.as_string());
        } else {
          emit(out, py_str(v, options_.limits.max_output_bytes));
        }
        return Flow::kNormal;
      }
      case StmtKind::kIf: {
        const auto& node = static_cast<const If&>(stmt);
        for (const auto& [test, body] : node.branches) {
          if (eval(*test, scope).truthy()) return exec_body(body, scope, out);
        }
        return exec_body(node.otherwise, scope, out);
      }
      case StmtKind::kFor:
        exec_for(static_cast<const For&>(stmt), scope, out);
        return Flow::kNormal;
      case StmtKind::kSet: {
        const auto& node = static_cast<const Set&>(stmt);
        assign(node.target, eval(*node.value, scope), scope);
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        const auto& node = static_cast<const SetBlock&>(stmt);
        std::string captured;
        Scope inner(&scope);  // like filter blocks, a set block's body is its own scope
        exec_body(node.body, inner, captured);
        Value v = Value::string(std::move(captured));
        if (node.filter) v = apply_filter_chain(*node.filter, v, scope);
        assign(node.target, std::move(v), scope);
        return Flow::kNormal;
      }
      case StmtKind::kMacro: {
        const auto& node = static_cast<const MacroStmt&>(stmt);
        auto data = std::make_shared<CallableData>();
        data->name = node.name;
        data->kind = CallableKind::kMacro;
        data->macro = &node;
        scope.set(node.name, Value::callable(std::move(data)));
        return Flow::kNormal;
      }
      case StmtKind::kCallBlock: {
        const auto& node = static_cast<const CallBlockStmt&>(stmt);
        const auto& call = static_cast<const Call&>(*node.call);
        auto data = std::make_shared<CallableData>();
        data->name = "caller";
        data->kind = CallableKind::kCaller;
        data->call_block = &node;
        data->caller_scope = &scope;
        const Value callee = eval(*call.callee, scope);
        CallArgs args = eval_args(call.args, scope);
        args.keyword.emplace_back("caller", Value::callable(std::move(data)));
        const Value result = call_value(callee, args);
        emit(out, py_str(result, options_.limits.max_output_bytes));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        const auto& node = static_cast<const FilterBlock&>(stmt);
        std::string captured;
        Scope inner(&scope);
        exec_body(node.body, inner, captured);
        const Value v = apply_filter_chain(*node.filter, Value::string(std::move(captured)), scope);
        emit(out, py_str(v, options_.limits.max_output_bytes));
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        const auto& node = static_cast<const With&>(stmt);
        Scope inner(&scope);
        for (const auto& [target, value] : node.assignments) assign(target, eval(*value, scope), inner);
        return exec_body(node.body, inner, out);
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kGeneration: {  // a call block in transformers: its own scope
        Scope inner(&scope);
        return exec_body(static_cast<const Generation&>(stmt).body, inner, out);
      }
    }
    return Flow::kNormal;
  }

  void exec_for(const For& node, Scope& scope, std::string& out) {
    const Value iterable = eval(*node.iter, scope);
    std::shared_ptr<const ListData> items;
    if (iterable.is_list() && !iterable.as_list().deferred_error && !node.filter) {
      items = iterable.list_ptr();
    } else {
      std::vector<Value> all = iterate(*this, iterable);
      if (node.filter) {
        std::vector<Value> kept;
        for (auto& item : all) {
          charge(1);
          Scope probe(&scope);
          assign(node.target, item, probe);
          if (eval(*node.filter, probe).truthy()) kept.push_back(std::move(item));
        }
        all = std::move(kept);
      }
      items = Value::list(std::move(all)).list_ptr();
    }
    if (items->items.empty()) {
      Scope inner(&scope);
      exec_body(node.otherwise, inner, out);
      return;
    }
    auto loop = std::make_shared<LoopData>();
    loop->items = items;
    const Value loop_value = Value::loop(loop);
    for (size_t i = 0; i < items->items.size(); ++i) {
      charge(1);
      loop->index0 = i;
      Scope inner(&scope);
      inner.vars.reserve(4);
      assign(node.target, items->items[i], inner);
      inner.set("loop", loop_value);
      if (exec_body(node.body, inner, out) == Flow::kBreak) break;
    }
  }

  void assign(const Target& target, Value value, Scope& scope) {
    switch (target.kind) {
      case Target::Kind::kName:
        scope.set(target.name, std::move(value));
        return;
      case Target::Kind::kNamespaceAttr: {
        const Value* ns = scope.find(target.name);
        if (!ns || !ns->is_namespace()) {
          fail("cannot assign attribute '{}' on non-namespace object '{}' {}", target.attr, target.name, at(target.pos));
        }
        if (value.holds_objects()) {
          fail("a namespace attribute cannot hold a {} ('{}.{}') {}", value.type_name(), target.name, target.attr,
               at(target.pos));
        }
        if (!target.attr.empty() && target.attr[0] == '_') {
          fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'", target.attr);
        }
        ns->as_namespace().set(target.attr, std::move(value));
        return;
      }
      case Target::Kind::kTuple: {
        const std::vector<Value> parts = iterate(*this, value);
        if (parts.size() != target.items.size()) {
          if (parts.size() > target.items.size()) {
            fail("too many values to unpack (expected {})", target.items.size());
          }
          fail("not enough values to unpack (expected {}, got {})", target.items.size(), parts.size());
        }
        for (size_t i = 0; i < parts.size(); ++i) assign(target.items[i], parts[i], scope);
        return;
      }
    }
  }

  // ---- calls ---------------------------------------------------------------------------

  CallArgs eval_args(const Args& args, Scope& scope) {
    CallArgs out;
    out.positional.reserve(args.positional.size());
    for (const auto& a : args.positional) out.positional.push_back(eval(*a, scope));
    for (const auto& [key, value] : args.keyword) out.keyword.emplace_back(key, eval(*value, scope));
    return out;
  }

  Value call_value(const Value& callee, const CallArgs& args) {
    if (callee.is_undefined()) fail("{}", callee.undefined_hint());
    if (!callee.is_callable()) fail("'{}' object is not callable", callee.type_name());
    const CallableData& fn = callee.as_callable();
    switch (fn.kind) {
      case CallableKind::kBuiltin:
        return fn.fn(*this, args);
      case CallableKind::kMacro:
        return call_macro(*fn.macro, args);
      case CallableKind::kCaller:
        return call_caller(*fn.call_block, *static_cast<Scope*>(fn.caller_scope), args);
    }
    return Value();
  }

  // Binds macro / caller parameters: positional, then keywords, then defaults (evaluated
  // in the new scope); extra arguments land in `varargs` / `kwargs`.
  void bind_params(const std::vector<Param>& params, const CallArgs& args, Scope& scope, std::string_view what) {
    std::vector<bool> bound(params.size(), false);
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < params.size()) {
        scope.set(params[i].name, args.positional[i]);
        bound[i] = true;
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    std::vector<std::pair<Value, Value>> kwargs;
    for (const auto& [key, value] : args.keyword) {
      if (key == "caller") {
        scope.set("caller", value);
        continue;
      }
      bool found = false;
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].name == key) {
          if (bound[i]) fail("{} got multiple values for argument '{}'", what, key);
          scope.set(key, value);
          bound[i] = found = true;
        }
      }
      if (!found) kwargs.emplace_back(Value::string(key), value);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      scope.set(params[i].name, params[i].default_value ? eval(*params[i].default_value, scope)
                                                        : Value::undefined(fmt::format(
                                                              "parameter '{}' was not provided", params[i].name)));
    }
    scope.set("varargs", Value::tuple(std::move(varargs)));
    scope.set("kwargs", Value::dict(std::move(kwargs)));
  }

  Value call_macro(const MacroStmt& macro, const CallArgs& args) {
    if (++call_depth_ > options_.limits.max_call_depth) {
      --call_depth_;
      fail("macro calls nested deeper than {} (recursion?)", options_.limits.max_call_depth);
    }
    struct Unwind {
      int& d;
      ~Unwind() { --d; }
    } unwind{call_depth_};
    Scope scope(&root_);
    bind_params(macro.params, args, scope, fmt::format("macro '{}'", macro.name));
    std::string out;
    exec_body(macro.body, scope, out);
    return Value::string(std::move(out));
  }

  Value call_caller(const CallBlockStmt& block, Scope& site, const CallArgs& args) {
    if (++call_depth_ > options_.limits.max_call_depth) {
      --call_depth_;
      fail("caller() calls nested deeper than {}", options_.limits.max_call_depth);
    }
    struct Unwind {
      int& d;
      ~Unwind() { --d; }
    } unwind{call_depth_};
    Scope scope(&site);
    bind_params(block.params, args, scope, "caller");
    std::string out;
    exec_body(block.body, scope, out);
    return Value::string(std::move(out));
  }

  // Applies a filter chain whose innermost input is null to `input` ({% filter %}, set blocks).
  Value apply_filter_chain(const Expr& chain, const Value& input, Scope& scope) {
    const auto& f = static_cast<const FilterExpr&>(chain);
    const Value inner = f.input ? apply_filter_chain(*f.input, input, scope) : input;
    return f.fn(*this, inner, eval_args(f.args, scope));
  }

  // ---- expressions ---------------------------------------------------------------------

  Value eval(const Expr& e, Scope& scope) {
    try {
      DepthGuard guard(*this);
      charge(1);
      return eval_inner(e, scope);
    } catch (...) {
      relocate(e.pos);
    }
  }

  Value eval_inner(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return static_cast<const Literal&>(e).value;
      case ExprKind::kName: {
        const auto& name = static_cast<const Name&>(e).name;
        if (const Value* v = scope.find(name)) return *v;
        return Value::undefined(fmt::format("'{}' is undefined", name));
      }
      case ExprKind::kList: {
        const auto& node = static_cast<const ListExpr&>(e);
        std::vector<Value> items;
        items.reserve(node.items.size());
        for (const auto& item : node.items) items.push_back(eval(*item, scope));
        return node.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case ExprKind::kDict: {
        const auto& node = static_cast<const DictExpr&>(e);
        std::vector<std::pair<Value, Value>> entries;
        for (const auto& [k, v] : node.entries) {
          Value key = eval(*k, scope);
          Value value = eval(*v, scope);
          if (key.is_list() || key.is_dict() || key.is_undefined()) {
            fail("unhashable type: '{}'", key.type_name());
          }
          bool replaced = false;
          for (auto& entry : entries) {
            if (py_equal(entry.first, key)) {
              entry.second = std::move(value);
              replaced = true;
              break;
            }
          }
          if (!replaced) entries.emplace_back(std::move(key), std::move(value));
        }
        return Value::dict(std::move(entries));
      }
      case ExprKind::kGetAttr: {
        const auto& node = static_cast<const GetAttr&>(e);
        return get_attribute(*this, eval(*node.object, scope), node.name);
      }
      case ExprKind::kGetItem: {
        const auto& node = static_cast<const GetItem&>(e);
        const Value obj = eval(*node.object, scope);
        return get_item(*this, obj, eval(*node.index, scope));
      }
      case ExprKind::kSlice: {
        const auto& node = static_cast<const Slice&>(e);
        const Value obj = eval(*node.object, scope);
        const Value start = node.start ? eval(*node.start, scope) : Value::none();
        const Value stop = node.stop ? eval(*node.stop, scope) : Value::none();
        const Value step = node.step ? eval(*node.step, scope) : Value::none();
        return slice(*this, obj, start, stop, step);
      }
      case ExprKind::kCall: {
        const auto& node = static_cast<const Call&>(e);
        const Value callee = eval(*node.callee, scope);
        return call_value(callee, eval_args(node.args, scope));
      }
      case ExprKind::kFilter: {
        const auto& node = static_cast<const FilterExpr&>(e);
        const Value input = eval(*node.input, scope);
        return node.fn(*this, input, eval_args(node.args, scope));
      }
      case ExprKind::kTest: {
        const auto& node = static_cast<const TestExpr&>(e);
        const Value input = eval(*node.input, scope);
        return Value::boolean(node.fn(*this, input, eval_args(node.args, scope)));
      }
      case ExprKind::kUnary: {
        const auto& node = static_cast<const Unary&>(e);
        return unary(node.op, eval(*node.operand, scope));
      }
      case ExprKind::kBinary: {
        const auto& node = static_cast<const Binary&>(e);
        if (node.negate_power) {
          const Value base = eval(*static_cast<const Unary&>(*node.left).operand, scope);
          return unary('-', binary(BinaryOp::kPow, base, eval(*node.right, scope)));
        }
        const Value left = eval(*node.left, scope);
        const Value right = eval(*node.right, scope);
        return binary(node.op, left, right);
      }
      case ExprKind::kCompare: {
        const auto& node = static_cast<const Compare&>(e);
        Value left = eval(*node.first, scope);
        for (const auto& [op, expr] : node.rest) {
          Value right = eval(*expr, scope);
          if (!compare(op, left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kAnd: {
        const auto& node = static_cast<const Logical&>(e);
        Value left = eval(*node.left, scope);
        return left.truthy() ? eval(*node.right, scope) : left;
      }
      case ExprKind::kOr: {
        const auto& node = static_cast<const Logical&>(e);
        Value left = eval(*node.left, scope);
        return left.truthy() ? left : eval(*node.right, scope);
      }
      case ExprKind::kNot:
        return Value::boolean(!eval(*static_cast<const Not&>(e).operand, scope).truthy());
      case ExprKind::kCondExpr: {
        const auto& node = static_cast<const CondExpr&>(e);
        if (eval(*node.test, scope).truthy()) return eval(*node.then, scope);
        if (node.otherwise) return eval(*node.otherwise, scope);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was defined.", e.pos.line));
      }
    }
    return Value();
  }

  // ---- operators -----------------------------------------------------------------------

  void charge_weight(const Value& a, const Value& b) {
    const uint64_t wa = a.weight(), wb = b.weight();
    if (wa > 16 || wb > 16) charge((wa > UINT64_MAX / 2 || wb > UINT64_MAX / 2) ? UINT64_MAX / 2 : (wa + wb) / 16);
  }

  static void require_defined(const Value& v) {
    if (v.is_undefined()) fail("{}", v.undefined_hint());
  }

  static Value unary(char op, const Value& v) {
    require_defined(v);
    if (v.is_float()) return Value::number(op == '-' ? -v.as_double() : v.as_double());
    if (v.is_int() || v.is_bool()) {
      if (op == '+') return Value::integer(v.as_int());
      HACK_CHECK(v.as_int() != INT64_MIN, "integer overflow");
      return Value::integer(-v.as_int());
    }
    fail("bad operand type for unary {}: '{}'", op, v.type_name());
  }

  static std::string_view op_symbol(BinaryOp op) {
    switch (op) {
      case BinaryOp::kAdd: return "+";
      case BinaryOp::kSub: return "-";
      case BinaryOp::kMul: return "*";
      case BinaryOp::kDiv: return "/";
      case BinaryOp::kFloorDiv: return "//";
      case BinaryOp::kMod: return "%";
      case BinaryOp::kPow: return "**";
      case BinaryOp::kConcat: return "~";
    }
    return "?";
  }

  [[noreturn]] static void unsupported(BinaryOp op, const Value& a, const Value& b) {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), a.type_name(), b.type_name());
  }

  Value repeat(const Value& seq, int64_t times) {
    size_t n = times > 0 ? static_cast<size_t>(times) : 0;
    if (seq.is_string()) {
      const std::string& s = seq.as_string();
      if (n && !s.empty()) check_string_size(s.size() > SIZE_MAX / n ? SIZE_MAX : s.size() * n);
      if (s.empty() || n == 0) return seq.is_markup() ? Value::markup("") : Value::string("");
      charge(s.size() * n / 64);
      std::string out;
      out.reserve(s.size() * n);
      for (size_t i = 0; i < n; ++i) out += s;
      return seq.is_markup() ? Value::markup(std::move(out)) : Value::string(std::move(out));
    }
    const auto& items = seq.as_list().items;
    if (n && !items.empty()) check_list_size(items.size() > SIZE_MAX / n ? SIZE_MAX : items.size() * n);
    if (items.empty()) n = 0;
    charge(items.size() * n / 16);
    std::vector<Value> out;
    out.reserve(items.size() * n);
    for (size_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
    return seq.as_list().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }

  Value binary(BinaryOp op, const Value& a, const Value& b) {
    if (op == BinaryOp::kConcat) {
      std::string s = py_str(a, options_.limits.max_output_bytes);
      append_py_str(s, b, options_.limits.max_output_bytes);
      check_string_size(s.size());
      charge(s.size() / 64);
      return Value::string(std::move(s));
    }
    if (op == BinaryOp::kMod && a.is_string()) {
      std::string s = percent_format(*this, a.as_string(), b, a.is_markup());
      return a.is_markup() ? Value::markup(std::move(s)) : Value::string(std::move(s));
    }
    require_defined(a);
    require_defined(b);
    const bool nums = a.is_number() && b.is_number();
    const bool ints = nums && !a.is_float() && !b.is_float();
    switch (op) {
      case BinaryOp::kAdd: {
        if (ints) {
          int64_t r = 0;
          HACK_CHECK(!__builtin_add_overflow(a.as_int(), b.as_int(), &r), "integer overflow");
          return Value::integer(r);
        }
        if (nums) return Value::number(a.as_double() + b.as_double());
        if (a.is_string() && b.is_string()) {
          check_string_size(a.as_string().size() + b.as_string().size());
          charge((a.as_string().size() + b.as_string().size()) / 64);
          if (a.is_markup() || b.is_markup()) {
            // markupsafe: the plain side is escaped, the result is Markup
            return Value::markup((a.is_markup() ? a.as_string() : html_escape(a.as_string())) +
                                 (b.is_markup() ? b.as_string() : html_escape(b.as_string())));
          }
          return Value::string(a.as_string() + b.as_string());
        }
        if (a.is_sequence() && b.is_sequence() && a.as_list().is_tuple == b.as_list().is_tuple) {
          check_list_size(a.as_list().items.size() + b.as_list().items.size());
          charge((a.as_list().items.size() + b.as_list().items.size()) / 16);
          std::vector<Value> items = a.as_list().items;
          items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
          return a.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
        }
        if (a.is_string() || a.is_list()) {
          fail("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name());
        }
        unsupported(op, a, b);
      }
      case BinaryOp::kSub: {
        if (ints) {
          int64_t r = 0;
          HACK_CHECK(!__builtin_sub_overflow(a.as_int(), b.as_int(), &r), "integer overflow");
          return Value::integer(r);
        }
        if (nums) return Value::number(a.as_double() - b.as_double());
        unsupported(op, a, b);
      }
      case BinaryOp::kMul: {
        if (ints) {
          int64_t r = 0;
          HACK_CHECK(!__builtin_mul_overflow(a.as_int(), b.as_int(), &r), "integer overflow");
          return Value::integer(r);
        }
        if (nums) return Value::number(a.as_double() * b.as_double());
        if ((a.is_string() || a.is_sequence()) && is_index(b)) return repeat(a, b.as_int());
        if ((b.is_string() || b.is_sequence()) && is_index(a)) return repeat(b, a.as_int());
        if (a.is_string() || b.is_string()) fail("can't multiply sequence by non-int of type '{}'", (a.is_string() ? b : a).type_name());
        unsupported(op, a, b);
      }
      case BinaryOp::kDiv: {
        if (!nums) unsupported(op, a, b);
        HACK_CHECK(b.as_double() != 0.0, "division by zero");
        return Value::number(a.as_double() / b.as_double());
      }
      case BinaryOp::kFloorDiv:
      case BinaryOp::kMod: {
        if (!nums) unsupported(op, a, b);
        if (ints) {
          const int64_t x = a.as_int(), y = b.as_int();
          HACK_CHECK(y != 0, "integer division or modulo by zero");
          HACK_CHECK(!(x == INT64_MIN && y == -1), "integer overflow");
          int64_t q = x / y, r = x % y;
          if (r != 0 && ((r < 0) != (y < 0))) {
            r += y;
            q -= 1;
          }
          return Value::integer(op == BinaryOp::kMod ? r : q);
        }
        const double x = a.as_double(), y = b.as_double();
        HACK_CHECK(y != 0.0, "{}", op == BinaryOp::kMod ? "float modulo" : "float floor division by zero");
        // CPython float_divmod
        double mod = std::fmod(x, y);
        double div = (x - mod) / y;
        if (mod != 0.0) {
          if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
          }
        } else {
          mod = std::copysign(0.0, y);
        }
        double floordiv = 0.0;
        if (div != 0.0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, x / y);
        }
        return Value::number(op == BinaryOp::kMod ? mod : floordiv);
      }
      case BinaryOp::kPow: {
        if (!nums) unsupported(op, a, b);
        if (ints && b.as_int() >= 0) {
          int64_t base = a.as_int(), exp = b.as_int(), result = 1;
          while (exp > 0) {
            if (exp & 1) HACK_CHECK(!__builtin_mul_overflow(result, base, &result), "integer overflow");
            exp >>= 1;
            if (exp > 0) HACK_CHECK(!__builtin_mul_overflow(base, base, &base), "integer overflow");
          }
          return Value::integer(result);
        }
        const double x = a.as_double(), y = b.as_double();
        HACK_CHECK(!(x == 0.0 && y < 0), "0.0 cannot be raised to a negative power");
        const double r = std::pow(x, y);
        HACK_CHECK(!std::isinf(r) || std::isinf(x) || std::isinf(y), "(34, 'Numerical result out of range')");
        return Value::number(r);
      }
      case BinaryOp::kConcat:
        break;
    }
    unsupported(op, a, b);
  }

  bool compare(CompareOp op, const Value& a, const Value& b) {
    charge_weight(a, b);
    switch (op) {
      case CompareOp::kEq: return py_equal(a, b);
      case CompareOp::kNe: return !py_equal(a, b);
      case CompareOp::kIn: return contains(b, a);
      case CompareOp::kNotIn: return !contains(b, a);
      default: break;
    }
    require_defined(a);
    require_defined(b);
    switch (op) {
      case CompareOp::kLt: return py_less(a, b);
      case CompareOp::kGt: return py_less(b, a);
      case CompareOp::kLe: return !py_less(b, a) && (py_less(a, b) || py_equal(a, b));
      case CompareOp::kGe: return !py_less(a, b) && (py_less(b, a) || py_equal(a, b));
      default: return false;
    }
  }

  const RenderOptions& options_;
  Scope globals_;  // built-ins and the caller's variables
  Scope root_;     // the template's top level
  uint64_t steps_ = 0;
  int depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace

Template Template::parse(std::string_view source, std::string name) {
  Template t;
  t.name_ = std::move(name);
  try {
    t.program_ = ast::parse(source);
  } catch (const hack::Error& e) {
    fail("{}: {}", t.name_, e.what());
  }
  return t;
}

std::string Template::render(const Variables& variables, const RenderOptions& options) const {
  HACK_CHECK(program_ != nullptr, "render() of a template that was never parsed");
  try {
    Evaluator evaluator(variables, options);
    return evaluator.run(*program_);
  } catch (const TemplateRaised& e) {
    throw TemplateRaised(fmt::format("{} raised an exception: {}", name_, e.what()), e.message());
  } catch (const hack::Error& e) {
    fail("{}: {}", name_, e.what());
  }
}

}  // namespace hack::jinja
