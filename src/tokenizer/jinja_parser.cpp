// Jinja parser: tokens -> AST, following jinja2.parser method by method so precedence and
// corner cases match (`-x|abs` is abs(-x), `-2**2` is 4, `not x is defined` negates the
// test, filters bind tighter than `+`).
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_ast.h"

namespace hack::jinja::ast {
namespace {

using Names = std::initializer_list<std::string_view>;

bool in_names(std::string_view name, Names names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string tag_list(Names names) {
  std::string out;
  for (auto n : names) {
    if (!out.empty()) out += " or ";
    out += fmt::format("'{}'", n);
  }
  return out;
}

int depth_of(const ExprPtr& e) { return e ? e->depth : 0; }

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  std::unique_ptr<Program> parse_program() {
    auto program = std::make_unique<Program>();
    program->body = subparse({}, "", {});
    return program;
  }

 private:
  // ---- token stream --------------------------------------------------------------------
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().kind == TokenKind::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().kind == TokenKind::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const Token& at, std::string_view message) const {
    fail("{} at line {}, column {}", message, at.pos.line, at.pos.column);
  }
  [[noreturn]] void unexpected(const Token& at) const {
    if (at.kind == TokenKind::kEof) error(at, "unexpected end of template");
    error(at, fmt::format("unexpected {}", describe(at)));
  }

  const Token& expect_op(std::string_view op) {
    if (!is_op(op)) error(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
    return next();
  }
  const Token& expect_name() {
    if (cur().kind != TokenKind::kName) error(cur(), fmt::format("expected a name, got {}", describe(cur())));
    return next();
  }
  void expect_name(std::string_view name) {
    if (!is_name(name)) error(cur(), fmt::format("expected '{}', got {}", name, describe(cur())));
    next();
  }
  void expect(TokenKind kind) {
    if (cur().kind != kind) {
      Token wanted;
      wanted.kind = kind;
      error(cur(), fmt::format("expected {}, got {}", describe(wanted), describe(cur())));
    }
    next();
  }

  // Recursion guard: deep nesting fails with an error instead of exhausting the stack.
  class Guard {
   public:
    Guard(Parser& p, int& depth, int limit, const Token& at) : depth_(depth) {
      if (++depth_ > limit) {
        --depth_;
        p.error(at, "template nested too deeply");
      }
    }
    ~Guard() { --depth_; }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    int& depth_;
  };

  template <class T>
  std::unique_ptr<T> seal(std::unique_ptr<T> node, int child_depth) {
    node->depth = child_depth + 1;
    if (node->depth > kMaxExprDepth) {
      fail("expression nested too deeply at line {}, column {}", node->pos.line, node->pos.column);
    }
    return node;
  }

  static int args_depth(const Args& args) {
    int d = 0;
    for (const auto& a : args.positional) d = std::max(d, depth_of(a));
    for (const auto& a : args.keyword) d = std::max(d, depth_of(a.second));
    return d;
  }

  // ---- statements ----------------------------------------------------------------------

  // Parses until a block tag whose name is in `end_names` (left as the current token) or
  // the end of the template.
  Body subparse(Names end_names, std::string_view open_tag, SourcePos open_pos) {
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.kind) {
        case TokenKind::kData:
          body.push_back(std::make_unique<Output>(t.pos, t.text));
          next();
          break;
        case TokenKind::kVariableBegin: {
          next();
          auto expr = parse_tuple(false, true, {}, false);
          expect(TokenKind::kVariableEnd);
          body.push_back(std::make_unique<Emit>(t.pos, std::move(expr)));
          break;
        }
        case TokenKind::kBlockBegin: {
          next();
          if (cur().kind == TokenKind::kName && in_names(cur().text, end_names)) return body;
          body.push_back(parse_statement());
          expect(TokenKind::kBlockEnd);
          break;
        }
        case TokenKind::kEof:
          if (end_names.size() != 0) {
            error(t, fmt::format("unexpected end of template: expected {} to close '{}' opened at line {}",
                                 tag_list(end_names), open_tag, open_pos.line));
          }
          return body;
        default:
          unexpected(t);
      }
    }
  }

  // `%}` then the body up to one of `end_names`; consumes the end name when drop_needle.
  Body parse_statements(Names end_names, std::string_view open_tag, SourcePos open_pos, bool drop_needle) {
    skip_op(":");
    expect(TokenKind::kBlockEnd);
    Body body = subparse(end_names, open_tag, open_pos);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& tag = cur();
    Guard guard(*this, stmt_depth_, kMaxStmtDepth, tag);
    if (tag.kind != TokenKind::kName) error(tag, "tag name expected");
    const std::string name = tag.text;
    const SourcePos pos = tag.pos;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") {
      next();
      auto node = std::make_unique<Generation>(pos);
      node->body = parse_statements({"endgeneration"}, "generation", pos, true);
      return node;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error(tag, fmt::format("'{}' outside of a loop", name));
      next();
      return std::make_unique<LoopControl>(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, pos);
    }
    static constexpr std::string_view kUnsupported[] = {
        "extends", "block", "include", "import", "from", "autoescape", "trans", "pluralize", "do", "print"};
    for (auto u : kUnsupported) {
      if (name == u) error(tag, fmt::format("unsupported Jinja tag '{}'", name));
    }
    static constexpr std::string_view kEndTags[] = {"endif", "elif", "else", "endfor", "endset", "endmacro",
                                                    "endcall", "endfilter", "endwith", "endraw", "endgeneration"};
    for (auto e : kEndTags) {
      if (name == e) error(tag, fmt::format("unexpected tag '{}' (nothing to close)", name));
    }
    error(tag, fmt::format("unknown Jinja tag '{}'", name));
  }

  StmtPtr parse_if() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<If>(pos);
    auto test = parse_tuple(false, false, {}, false);
    Body body = parse_statements({"elif", "else", "endif"}, "if", pos, false);
    node->branches.emplace_back(std::move(test), std::move(body));
    while (true) {
      const std::string tag = next().text;
      if (tag == "elif") {
        auto elif_test = parse_tuple(false, false, {}, false);
        Body elif_body = parse_statements({"elif", "else", "endif"}, "if", pos, false);
        node->branches.emplace_back(std::move(elif_test), std::move(elif_body));
      } else if (tag == "else") {
        node->otherwise = parse_statements({"endif"}, "if", pos, true);
        break;
      } else {
        break;
      }
    }
    return node;
  }

  StmtPtr parse_for() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<For>(pos);
    node->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    node->iter = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) node->filter = parse_expression(true);
    if (is_name("recursive")) error(cur(), "unsupported Jinja feature 'recursive' loops");
    ++loop_depth_;
    node->body = parse_statements({"endfor", "else"}, "for", pos, false);
    --loop_depth_;
    if (next().text == "else") node->otherwise = parse_statements({"endfor"}, "for", pos, true);
    return node;
  }

  StmtPtr parse_set() {
    const SourcePos pos = next().pos;
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto node = std::make_unique<Set>(pos);
      node->target = std::move(target);
      node->value = parse_tuple(false, true, {}, false);
      return node;
    }
    auto node = std::make_unique<SetBlock>(pos);
    node->target = std::move(target);
    if (is_op("|")) node->filter = parse_filter(nullptr, false);
    node->body = parse_statements({"endset"}, "set", pos, true);
    return node;
  }

  std::vector<Param> parse_signature() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      const Token& name = expect_name();
      Param p;
      p.name = name.text;
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        error(name, "non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<MacroStmt>(pos);
    node->name = expect_name().text;
    node->params = parse_signature();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    node->body = parse_statements({"endmacro"}, "macro", pos, true);
    loop_depth_ = saved_loops;
    return node;
  }

  StmtPtr parse_call_block() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<CallBlockStmt>(pos);
    if (is_op("(")) node->params = parse_signature();
    const Token& at = cur();
    node->call = parse_expression(true);
    if (node->call->kind != ExprKind::kCall) error(at, "expected a call after 'call'");
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    node->body = parse_statements({"endcall"}, "call", pos, true);
    loop_depth_ = saved_loops;
    return node;
  }

  StmtPtr parse_filter_block() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<FilterBlock>(pos);
    node->filter = parse_filter(nullptr, true);
    node->body = parse_statements({"endfilter"}, "filter", pos, true);
    return node;
  }

  StmtPtr parse_with() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<With>(pos);
    while (cur().kind != TokenKind::kBlockEnd) {
      if (!node->assignments.empty()) expect_op(",");
      Target target = parse_assign_target(true, false, {}, false);
      expect_op("=");
      node->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    node->body = parse_statements({"endwith"}, "with", pos, true);
    return node;
  }

  Target to_target(const Expr& e) const {
    Target t;
    t.pos = e.pos;
    if (e.kind == ExprKind::kName) {
      t.kind = Target::Kind::kName;
      t.name = static_cast<const Name&>(e).name;
      static constexpr std::string_view kReserved[] = {"true", "false", "none", "True", "False", "None"};
      for (auto r : kReserved) {
        if (t.name == r) fail("cannot assign to '{}' at line {}, column {}", r, e.pos.line, e.pos.column);
      }
      return t;
    }
    if (e.kind == ExprKind::kList && static_cast<const ListExpr&>(e).is_tuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& item : static_cast<const ListExpr&>(e).items) t.items.push_back(to_target(*item));
      return t;
    }
    fail("cannot assign to this expression at line {}, column {}", e.pos.line, e.pos.column);
  }

  Target parse_assign_target(bool with_tuple, bool name_only, Names extra_end, bool with_namespace) {
    if (with_namespace && cur().kind == TokenKind::kName && look().kind == TokenKind::kOperator &&
        look().text == ".") {
      Target t;
      t.pos = cur().pos;
      t.kind = Target::Kind::kNamespaceAttr;
      t.name = next().text;
      next();  // '.'
      t.attr = expect_name().text;
      return t;
    }
    if (name_only) {
      Target t;
      t.pos = cur().pos;
      t.name = expect_name().text;
      return t;
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    return to_target(*e);
  }

  // ---- expressions ---------------------------------------------------------------------

  bool is_tuple_end(Names extra_end) const {
    const Token& t = cur();
    if (t.kind == TokenKind::kVariableEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEof) return true;
    if (t.kind == TokenKind::kOperator && t.text == ")") return true;
    return t.kind == TokenKind::kName && in_names(t.text, extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parentheses) {
    const SourcePos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        items.push_back(parse_primary());
      } else {
        items.push_back(parse_expression(with_condexpr));
      }
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) error(cur(), fmt::format("expected an expression, got {}", describe(cur())));
    }
    auto node = std::make_unique<ListExpr>(pos);
    node->is_tuple = true;
    int d = 0;
    for (const auto& item : items) d = std::max(d, depth_of(item));
    node->items = std::move(items);
    return seal(std::move(node), d);
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Guard guard(*this, expr_depth_, kMaxExprDepth, cur());
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    Guard guard(*this, expr_depth_, kMaxExprDepth, cur());
    const SourcePos pos = cur().pos;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      auto node = std::make_unique<CondExpr>(pos);
      node->test = parse_or();
      if (skip_name("else")) node->otherwise = parse_condexpr();
      node->then = std::move(expr1);
      const int d = std::max({depth_of(node->test), depth_of(node->then), depth_of(node->otherwise)});
      expr1 = seal(std::move(node), d);
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto node = std::make_unique<Logical>(ExprKind::kOr, next().pos);
      node->left = std::move(left);
      node->right = parse_and();
      const int d = std::max(depth_of(node->left), depth_of(node->right));
      left = seal(std::move(node), d);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto node = std::make_unique<Logical>(ExprKind::kAnd, next().pos);
      node->left = std::move(left);
      node->right = parse_not();
      const int d = std::max(depth_of(node->left), depth_of(node->right));
      left = seal(std::move(node), d);
    }
    return left;
  }

  ExprPtr parse_not() {
    Guard guard(*this, expr_depth_, kMaxExprDepth, cur());
    if (is_name("not")) {
      auto node = std::make_unique<Not>(next().pos);
      node->operand = parse_not();
      const int d = depth_of(node->operand);
      return seal(std::move(node), d);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = cur().pos;
    ExprPtr expr = parse_math1();
    std::vector<std::pair<CompareOp, ExprPtr>> ops;
    while (true) {
      CompareOp op;
      if (is_op("==")) {
        op = CompareOp::kEq;
      } else if (is_op("!=")) {
        op = CompareOp::kNe;
      } else if (is_op("<")) {
        op = CompareOp::kLt;
      } else if (is_op("<=")) {
        op = CompareOp::kLe;
      } else if (is_op(">")) {
        op = CompareOp::kGt;
      } else if (is_op(">=")) {
        op = CompareOp::kGe;
      } else if (is_name("in")) {
        op = CompareOp::kIn;
      } else if (is_name("not") && look().kind == TokenKind::kName && look().text == "in") {
        next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      next();
      ops.emplace_back(op, parse_math1());
    }
    if (ops.empty()) return expr;
    auto node = std::make_unique<Compare>(pos);
    int d = depth_of(expr);
    for (const auto& o : ops) d = std::max(d, depth_of(o.second));
    node->first = std::move(expr);
    node->rest = std::move(ops);
    return seal(std::move(node), d);
  }

  ExprPtr binary(BinaryOp op, SourcePos pos, ExprPtr left, ExprPtr right) {
    auto node = std::make_unique<Binary>(pos);
    node->op = op;
    const int d = std::max(depth_of(left), depth_of(right));
    node->left = std::move(left);
    node->right = std::move(right);
    return seal(std::move(node), d);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      const BinaryOp kind = op.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      left = binary(kind, op.pos, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const SourcePos pos = next().pos;
      left = binary(BinaryOp::kConcat, pos, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      const BinaryOp kind = op.text == "*"   ? BinaryOp::kMul
                            : op.text == "/" ? BinaryOp::kDiv
                            : op.text == "//" ? BinaryOp::kFloorDiv
                                              : BinaryOp::kMod;
      left = binary(kind, op.pos, std::move(left), parse_pow());
    }
    return left;
  }

  // What jinja2's optimizer folds to a constant at compile time.
  static bool is_constant(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return true;
      case ExprKind::kUnary: return is_constant(*static_cast<const Unary&>(e).operand);
      case ExprKind::kNot: return is_constant(*static_cast<const Not&>(e).operand);
      case ExprKind::kBinary: {
        const auto& b = static_cast<const Binary&>(e);
        return is_constant(*b.left) && is_constant(*b.right);
      }
      case ExprKind::kList: {
        const auto& l = static_cast<const ListExpr&>(e);
        return std::all_of(l.items.begin(), l.items.end(), [](const ExprPtr& i) { return is_constant(*i); });
      }
      default: return false;
    }
  }

  static bool is_negative_number_literal(const Expr& e) {
    if (e.kind != ExprKind::kUnary) return false;
    const auto& u = static_cast<const Unary&>(e);
    if (u.op != '-' || u.operand->kind != ExprKind::kLiteral) return false;
    const Value& v = static_cast<const Literal&>(*u.operand).value;
    return v.is_int() || v.is_float();
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const SourcePos pos = next().pos;
      const bool quirk = is_negative_number_literal(*left);
      ExprPtr right = parse_unary(true);
      const bool negate = quirk && !is_constant(*right);
      left = binary(BinaryOp::kPow, pos, std::move(left), std::move(right));
      static_cast<Binary&>(*left).negate_power = negate;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Guard guard(*this, expr_depth_, kMaxExprDepth, cur());
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      auto u = std::make_unique<Unary>(op.pos);
      u->op = op.text[0];
      u->operand = parse_unary(false);
      const int d = depth_of(u->operand);
      node = seal(std::move(u), d);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    Guard guard(*this, expr_depth_, kMaxExprDepth, cur());
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        if (t.text == "true" || t.text == "True") return std::make_unique<Literal>(t.pos, Value::boolean(true));
        if (t.text == "false" || t.text == "False") return std::make_unique<Literal>(t.pos, Value::boolean(false));
        if (t.text == "none" || t.text == "None") return std::make_unique<Literal>(t.pos, Value::none());
        return std::make_unique<Name>(t.pos, t.text);
      }
      case TokenKind::kString: {
        std::string s = next().text;
        while (cur().kind == TokenKind::kString) s += next().text;  // adjacent literals join
        return std::make_unique<Literal>(t.pos, Value::string(std::move(s)));
      }
      case TokenKind::kInteger:
        next();
        return std::make_unique<Literal>(t.pos, Value::integer(t.int_value));
      case TokenKind::kFloat:
        next();
        return std::make_unique<Literal>(t.pos, Value::number(t.float_value));
      case TokenKind::kOperator:
        if (t.text == "(") {
          next();
          ExprPtr inner = parse_tuple(false, true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    unexpected(t);
  }

  ExprPtr parse_list() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<ListExpr>(pos);
    int d = 0;
    while (!is_op("]")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("]")) break;
      node->items.push_back(parse_expression(true));
      d = std::max(d, node->items.back()->depth);
    }
    expect_op("]");
    return seal(std::move(node), d);
  }

  ExprPtr parse_dict() {
    const SourcePos pos = next().pos;
    auto node = std::make_unique<DictExpr>(pos);
    int d = 0;
    while (!is_op("}")) {
      if (!node->entries.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      ExprPtr value = parse_expression(true);
      d = std::max({d, key->depth, value->depth});
      node->entries.emplace_back(std::move(key), std::move(value));
    }
    expect_op("}");
    return seal(std::move(node), d);
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& attr = cur();
      if (attr.kind == TokenKind::kName) {
        next();
        auto g = std::make_unique<GetAttr>(t.pos);
        g->name = attr.text;
        const int d = depth_of(node);
        g->object = std::move(node);
        return seal(std::move(g), d);
      }
      if (attr.kind != TokenKind::kInteger) error(attr, "expected name or number after '.'");
      next();
      auto g = std::make_unique<GetItem>(t.pos);
      g->index = std::make_unique<Literal>(attr.pos, Value::integer(attr.int_value));
      const int d = depth_of(node);
      g->object = std::move(node);
      return seal(std::move(g), d);
    }
    // '[': one subscript (maybe a slice) or several -> tuple index
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      ExprPtr sub = parse_subscribed();
      args.push_back(std::move(sub));
    }
    expect_op("]");
    // parse_subscribed returns a bare slice (no object yet) for `a:b:c`
    auto bare_slice = [](const ExprPtr& e) {
      return e->kind == ExprKind::kSlice && static_cast<const Slice&>(*e).object == nullptr;
    };
    if (args.size() == 1 && bare_slice(args[0])) {
      std::unique_ptr<Slice> s(static_cast<Slice*>(args[0].release()));
      const int d = std::max({depth_of(node), depth_of(s->start), depth_of(s->stop), depth_of(s->step)});
      s->object = std::move(node);
      return seal(std::move(s), d);
    }
    auto g = std::make_unique<GetItem>(t.pos);
    int d = depth_of(node);
    if (args.size() == 1) {
      g->index = std::move(args[0]);
    } else {
      auto tuple = std::make_unique<ListExpr>(t.pos);
      tuple->is_tuple = true;
      int td = 0;
      for (auto& a : args) {
        if (bare_slice(a)) error(t, "unsupported Jinja feature: slices inside a tuple subscript");
        td = std::max(td, a->depth);
        tuple->items.push_back(std::move(a));
      }
      g->index = seal(std::move(tuple), td);
    }
    d = std::max(d, g->index->depth);
    g->object = std::move(node);
    return seal(std::move(g), d);
  }

  // One subscript: an expression, or a slice start:stop:step (returned as a Slice with a
  // null object that parse_subscript fills in).
  ExprPtr parse_subscribed() {
    const SourcePos pos = cur().pos;
    ExprPtr start;
    if (is_op(":")) {
      next();
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      start = std::move(e);
    }
    auto s = std::make_unique<Slice>(pos);
    s->start = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) s->step = parse_expression(true);
    }
    return s;
  }

  Args parse_call_args() {
    const Token& open = expect_op("(");
    Args args;
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error(cur(), "unsupported Jinja feature: *args / **kwargs in calls");
      if (cur().kind == TokenKind::kName && look().kind == TokenKind::kOperator && look().text == "=") {
        std::string key = next().text;
        next();
        for (const auto& kw : args.keyword) {
          if (kw.first == key) error(open, fmt::format("duplicate keyword argument '{}'", key));
        }
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.keyword.empty()) error(cur(), "positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    const SourcePos pos = cur().pos;
    auto node = std::make_unique<Call>(pos);
    node->args = parse_call_args();
    const int d = std::max(depth_of(callee), args_depth(node->args));
    node->callee = std::move(callee);
    return seal(std::move(node), d);
  }

  std::string dotted_name() {
    std::string name = expect_name().text;
    while (is_op(".")) {
      next();
      name += "." + expect_name().text;
    }
    return name;
  }

  // `| name(args)` chain applied to node (null node: filter blocks; start_inline: the
  // first filter has no leading pipe).
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& name_tok = cur();
      auto f = std::make_unique<FilterExpr>(name_tok.pos);
      f->name = dotted_name();
      f->fn = find_filter(f->name);
      if (!f->fn) {
        error(name_tok, is_known_unsupported_filter(f->name)
                            ? fmt::format("unsupported Jinja filter '{}'", f->name)
                            : fmt::format("no filter named '{}'", f->name));
      }
      if (is_op("(")) f->args = parse_call_args();
      const int d = std::max(depth_of(node), args_depth(f->args));
      f->input = std::move(node);
      node = seal(std::move(f), d);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const SourcePos pos = next().pos;  // 'is'
    const bool negated = skip_name("not");
    const Token& name_tok = cur();
    auto t = std::make_unique<TestExpr>(pos);
    t->name = dotted_name();
    t->fn = find_test(t->name);
    if (!t->fn) error(name_tok, fmt::format("no test named '{}'", t->name));
    const Token& c = cur();
    const bool arg_start =
        c.kind == TokenKind::kName || c.kind == TokenKind::kString || c.kind == TokenKind::kInteger ||
        c.kind == TokenKind::kFloat || (c.kind == TokenKind::kOperator && (c.text == "[" || c.text == "{"));
    if (is_op("(")) {
      t->args = parse_call_args();
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error(c, "you cannot chain multiple tests with 'is'");
      ExprPtr arg = parse_postfix(parse_primary());
      t->args.positional.push_back(std::move(arg));
    }
    const int d = std::max(depth_of(node), args_depth(t->args));
    t->input = std::move(node);
    ExprPtr result = seal(std::move(t), d);
    if (negated) {
      auto n = std::make_unique<Not>(pos);
      const int nd = result->depth;
      n->operand = std::move(result);
      result = seal(std::move(n), nd);
    }
    return result;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int expr_depth_ = 0;
  int stmt_depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse(std::string_view source) {
  Parser parser(lex(source));
  return parser.parse_program();
}

}  // namespace hack::jinja::ast
