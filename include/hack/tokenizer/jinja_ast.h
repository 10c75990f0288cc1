/// @file jinja_ast.h
/// @brief Syntax tree of the Jinja interpreter and the parser that builds it (a port of
/// jinja2.parser's grammar, operator precedence included). Internal to the interpreter;
/// users go through jinja.h / chat_template.h.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hack/tokenizer/jinja_builtins.h"
#include "hack/tokenizer/jinja_lexer.h"
#include "hack/tokenizer/jinja_value.h"

namespace hack::jinja::ast {

/// Expressions nest at most this deep (parenthesis towers, `a+a+a...` chains, filter
/// chains); deeper templates are rejected at parse time so evaluation stays within a small
/// stack.
inline constexpr int kMaxExprDepth = 200;
/// Statements ({% if %}, {% for %}, ...) nest at most this deep.
inline constexpr int kMaxStmtDepth = 100;

enum class ExprKind : uint8_t {
  kLiteral, kName, kList, kDict, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest,
  kUnary, kBinary, kCompare, kAnd, kOr, kNot, kCondExpr,
};

struct Expr {
  explicit Expr(ExprKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  ExprKind kind;
  SourcePos pos;
  int depth = 1;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Args {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Literal : Expr {
  Literal(SourcePos p, Value v) : Expr(ExprKind::kLiteral, p), value(std::move(v)) {}
  Value value;
};
struct Name : Expr {
  Name(SourcePos p, std::string n) : Expr(ExprKind::kName, p), name(std::move(n)) {}
  std::string name;
};
struct ListExpr : Expr {  // [a, b] or (a, b)
  explicit ListExpr(SourcePos p) : Expr(ExprKind::kList, p) {}
  std::vector<ExprPtr> items;
  bool is_tuple = false;
};
struct DictExpr : Expr {
  explicit DictExpr(SourcePos p) : Expr(ExprKind::kDict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;
};
struct GetAttr : Expr {  // object.name
  explicit GetAttr(SourcePos p) : Expr(ExprKind::kGetAttr, p) {}
  ExprPtr object;
  std::string name;
};
struct GetItem : Expr {  // object[index]
  explicit GetItem(SourcePos p) : Expr(ExprKind::kGetItem, p) {}
  ExprPtr object;
  ExprPtr index;
};
struct Slice : Expr {  // object[start:stop:step], each part optional
  explicit Slice(SourcePos p) : Expr(ExprKind::kSlice, p) {}
  ExprPtr object, start, stop, step;
};
struct Call : Expr {
  explicit Call(SourcePos p) : Expr(ExprKind::kCall, p) {}
  ExprPtr callee;
  Args args;
};
struct FilterExpr : Expr {  // input | name(args); input is null in {% filter %} / {% set %} blocks
  explicit FilterExpr(SourcePos p) : Expr(ExprKind::kFilter, p) {}
  ExprPtr input;
  std::string name;
  FilterFn fn = nullptr;
  Args args;
};
struct TestExpr : Expr {  // input is name(args)
  explicit TestExpr(SourcePos p) : Expr(ExprKind::kTest, p) {}
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;
  Args args;
};
struct Unary : Expr {  // -x, +x
  explicit Unary(SourcePos p) : Expr(ExprKind::kUnary, p) {}
  char op = '-';
  ExprPtr operand;
};
enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
struct Binary : Expr {
  explicit Binary(SourcePos p) : Expr(ExprKind::kBinary, p) {}
  BinaryOp op = BinaryOp::kAdd;
  ExprPtr left, right;
  // jinja2 quirk: `-1 ** y` (a negative number literal, a non-constant exponent) compiles
  // to Python's `-1 ** y`, i.e. -(1 ** y).
  bool negate_power = false;
};
enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
struct Compare : Expr {  // a < b <= c: every pair, like Python
  explicit Compare(SourcePos p) : Expr(ExprKind::kCompare, p) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};
struct Logical : Expr {  // and / or, returning an operand like Python
  Logical(ExprKind k, SourcePos p) : Expr(k, p) {}
  ExprPtr left, right;
};
struct Not : Expr {
  explicit Not(SourcePos p) : Expr(ExprKind::kNot, p) {}
  ExprPtr operand;
};
struct CondExpr : Expr {  // then if test else otherwise (otherwise may be null -> undefined)
  explicit CondExpr(SourcePos p) : Expr(ExprKind::kCondExpr, p) {}
  ExprPtr test, then, otherwise;
};

// ---- statements ------------------------------------------------------------------------

enum class StmtKind : uint8_t {
  kOutput, kEmit, kIf, kFor, kSet, kSetBlock, kMacro, kCallBlock, kFilterBlock, kWith,
  kBreak, kContinue, kGeneration,
};

struct Stmt {
  Stmt(StmtKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  SourcePos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// Left side of an assignment or a for loop: a name, `ns.attr`, or a tuple of targets.
struct Target {
  enum class Kind : uint8_t { kName, kNamespaceAttr, kTuple } kind = Kind::kName;
  std::string name;  // kName: the variable; kNamespaceAttr: the namespace variable
  std::string attr;  // kNamespaceAttr
  std::vector<Target> items;  // kTuple
  SourcePos pos;
};

struct Output : Stmt {  // template text
  Output(SourcePos p, std::string t) : Stmt(StmtKind::kOutput, p), text(std::move(t)) {}
  std::string text;
};
struct Emit : Stmt {  // {{ expr }}
  Emit(SourcePos p, ExprPtr e) : Stmt(StmtKind::kEmit, p), expr(std::move(e)) {}
  ExprPtr expr;
};
struct If : Stmt {
  explicit If(SourcePos p) : Stmt(StmtKind::kIf, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};
struct For : Stmt {
  explicit For(SourcePos p) : Stmt(StmtKind::kFor, p) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // `for x in xs if cond`, may be null
  Body body;
  Body otherwise;  // {% else %}: runs when there was no iteration
};
struct Set : Stmt {
  explicit Set(SourcePos p) : Stmt(StmtKind::kSet, p) {}
  Target target;
  ExprPtr value;
};
struct SetBlock : Stmt {  // {% set x | filter %}...{% endset %}
  explicit SetBlock(SourcePos p) : Stmt(StmtKind::kSetBlock, p) {}
  Target target;
  ExprPtr filter;  // FilterExpr chain whose innermost input is null, may be null
  Body body;
};
struct Param {
  std::string name;
  ExprPtr default_value;  // may be null
};
struct MacroStmt : Stmt {
  explicit MacroStmt(SourcePos p) : Stmt(StmtKind::kMacro, p) {}
  std::string name;
  std::vector<Param> params;
  Body body;
};
struct CallBlockStmt : Stmt {  // {% call(params) macro(args) %}body{% endcall %}
  explicit CallBlockStmt(SourcePos p) : Stmt(StmtKind::kCallBlock, p) {}
  std::vector<Param> params;
  ExprPtr call;  // a Call expression
  Body body;
};
struct FilterBlock : Stmt {
  explicit FilterBlock(SourcePos p) : Stmt(StmtKind::kFilterBlock, p) {}
  ExprPtr filter;  // FilterExpr chain whose innermost input is null
  Body body;
};
struct With : Stmt {
  explicit With(SourcePos p) : Stmt(StmtKind::kWith, p) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};
struct LoopControl : Stmt {  // break / continue
  LoopControl(StmtKind k, SourcePos p) : Stmt(k, p) {}
};
struct Generation : Stmt {  // transformers' {% generation %}: renders its body
  explicit Generation(SourcePos p) : Stmt(StmtKind::kGeneration, p) {}
  Body body;
};

struct Program {
  Body body;
};

/// Parses template source. Throws hack::Error for syntax errors and for jinja2 features
/// this interpreter lacks ("unsupported Jinja tag 'extends' at line 3, column 5").
std::unique_ptr<Program> parse(std::string_view source);

}  // namespace hack::jinja::ast
