/// @file jinja_value.h
/// @brief Values of the Jinja subset interpreter (chat templates), with Python semantics:
/// str()/repr() text, truthiness, equality, ordering, and json.dumps output.
///
/// The interpreter renders chat templates the way transformers renders them with jinja2,
/// so every operation here mirrors what the Python object would do: `{{ [1, 'a'] }}`
/// prints `[1, 'a']`, `{{ 1e16 }}` prints `1e+16`, `tojson` is json.dumps.
/// Lists and dicts are immutable (the sandbox transformers uses forbids mutation) and shared
/// by reference; only namespaces are mutable.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hack::jinja {

class Value;
class Interp;

namespace ast {
struct MacroStmt;
struct CallBlockStmt;
}  // namespace ast

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // list or tuple
  kDict,
  kNamespace,
  kCallable,
  kLoop,
};

/// Containers nest at most this deep; deeper data is rejected (keeps every recursive
/// operation on values, and their destruction, within a small stack).
inline constexpr int kMaxValueDepth = 256;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  // A Python generator (what select / map / unique / reverse / ... return in jinja2): it
  // iterates like a list but is always truthy, has no len(), is not subscriptable and does
  // not print its items.
  bool is_generator = false;
  // dict.keys() / .values() / .items() views: iterable and sized, but not subscriptable,
  // not JSON, and printed as dict_keys([...]).
  enum class View : uint8_t { kNone, kKeys, kValues, kItems } view = View::kNone;
  // A generator whose code failed: Python raises only when it is iterated, so do we.
  std::shared_ptr<const std::string> deferred_error;
  int depth = 1;               // 1 + deepest child container
  bool holds_objects = false;  // a namespace, callable or loop somewhere inside
  uint64_t weight = 1;         // see Value::weight()
};

/// Insertion-ordered dict. Lookups are linear: template dicts are small (messages, tool
/// schemas) and keys keep Python's equality (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;
  bool holds_objects = false;
  uint64_t weight = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

/// jinja2 `namespace()`: the one mutable object, so loop bodies can carry state out.
struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(std::string name, Value value);
};

/// Positional and keyword arguments of a call, a filter or a test.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

enum class CallableKind : uint8_t { kBuiltin, kMacro, kCaller };

struct CallableData {
  std::string name;
  CallableKind kind = CallableKind::kBuiltin;
  std::function<Value(Interp&, const CallArgs&)> fn;  // kBuiltin (bound methods capture self)
  const ast::MacroStmt* macro = nullptr;              // kMacro
  const ast::CallBlockStmt* call_block = nullptr;     // kCaller
  void* caller_scope = nullptr;                       // kCaller: the scope of {% call %}
};

/// The `loop` variable of a for loop.
struct LoopData {
  std::shared_ptr<const ListData> items;
  size_t index0 = 0;
  int depth0 = 0;
  std::optional<std::vector<Value>> changed_last;  // loop.changed() memory
};

class Value {
 public:
  /// Undefined (jinja2's default Undefined: prints empty, falsy, iterates empty).
  Value() = default;
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  /// markupsafe.Markup (what |safe and |e return): prints as is, but `markup + str`
  /// escapes the str, as in jinja2.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items);  // throws when nested past kMaxValueDepth
  static Value tuple(std::vector<Value> items);
  static Value generator(std::vector<Value> items);
  static Value failed_generator(std::string error);
  static Value dict_view(ListData::View view, std::vector<Value> items);
  static Value dict(std::vector<std::pair<Value, Value>> entries);  // keys unique, in order
  static Value ns(std::shared_ptr<NamespaceData> data);
  static Value callable(std::shared_ptr<const CallableData> data);
  static Value builtin(std::string name, std::function<Value(Interp&, const CallArgs&)> fn);
  static Value loop(std::shared_ptr<LoopData> data);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && b_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_generator() const { return kind_ == Kind::kList && as_list().is_generator; }
  bool is_view() const { return kind_ == Kind::kList && as_list().view != ListData::View::kNone; }
  /// A real list or tuple (not a generator or dict view): subscriptable, JSON-able.
  bool is_sequence() const { return kind_ == Kind::kList && !as_list().is_generator && !is_view(); }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_loop() const { return kind_ == Kind::kLoop; }
  /// int, float or bool (Python's numbers.Number; bool is an int subclass).
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }

  bool as_bool() const { return b_; }
  /// int or bool as an integer.
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  /// any number as a double.
  double as_double() const;
  const std::string& as_string() const { return *static_cast<const std::string*>(ref_.get()); }
  const ListData& as_list() const { return *static_cast<const ListData*>(ref_.get()); }
  std::shared_ptr<const ListData> list_ptr() const { return std::static_pointer_cast<const ListData>(ref_); }
  const DictData& as_dict() const { return *static_cast<const DictData*>(ref_.get()); }
  NamespaceData& as_namespace() const {
    return *static_cast<NamespaceData*>(const_cast<void*>(ref_.get()));
  }
  const CallableData& as_callable() const { return *static_cast<const CallableData*>(ref_.get()); }
  LoopData& as_loop() const { return *static_cast<LoopData*>(const_cast<void*>(ref_.get())); }
  /// Identity of a namespace / callable / container (Python `is`).
  const void* identity() const { return ref_.get(); }
  /// What an Undefined stands for, for error messages ("'x' is undefined").
  std::string_view undefined_hint() const;

  /// Container nesting depth (0 for scalars).
  int depth() const;
  /// Work to walk the whole value (compare, print, hash): 1 per element, strings by size,
  /// shared sub-lists counted each time they occur; saturates. The evaluator charges it
  /// to the step budget so comparing huge values in a loop cannot run unbounded.
  uint64_t weight() const;
  /// True for a namespace, callable or loop, or a container holding one (such values may
  /// not be stored in a namespace: that could form reference cycles).
  bool holds_objects() const;
  /// Python truthiness.
  bool truthy() const;
  /// Python type name, as error messages print it ("str", "NoneType", "dict").
  std::string_view type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  // string / ListData / DictData / NamespaceData / CallableData / LoopData, or the
  // undefined hint (a std::string); the kind says which.
  std::shared_ptr<const void> ref_;
};

/// Byte budget for text built from values (str/repr/json); exceeding it throws.
inline constexpr size_t kUnlimitedBytes = static_cast<size_t>(-1);

/// Python str(v): strings as is, None -> "None", True -> "True", containers as repr,
/// Undefined -> "".
std::string py_str(const Value& v, size_t max_bytes = kUnlimitedBytes);
/// Appends py_str(v) to out.
void append_py_str(std::string& out, const Value& v, size_t max_bytes = kUnlimitedBytes);
/// Python repr(v): 'quoted' strings, [a, b], {'k': v}, (a,), 1.5, None.
std::string py_repr(const Value& v, size_t max_bytes = kUnlimitedBytes);
/// markupsafe.escape of a string: & < > " ' as entities.
std::string html_escape(std::string_view s);

/// Python float repr: shortest round-trip digits, 1e+16 / 1e-05 outside [1e-4, 1e16).
std::string py_float_repr(double d);

/// Options of transformers' tojson filter (json.dumps arguments).
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // the indent string; unset = single line
  std::optional<std::string> item_separator;  // default ", " ("," with indent)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
};
/// json.dumps(v, ...). Throws for values JSON cannot hold (Undefined, namespace, callable).
std::string to_json(const Value& v, const JsonOptions& options, size_t max_bytes = kUnlimitedBytes);

/// Python ==, deep for containers; Undefined equals only Undefined.
bool py_equal(const Value& a, const Value& b);
/// Python <: numbers, strings (code point order), lists/tuples lexicographic. Throws
/// hack::Error for unorderable types ("'<' not supported between 'int' and 'str'").
bool py_less(const Value& a, const Value& b);

/// Converts JSON to a Value: objects keep their member order (ordered_json), integers stay
/// integers. Throws when nested deeper than kMaxValueDepth.
Value value_from_json(const nlohmann::ordered_json& json);
/// Converts a Value holding only JSON data back to JSON (throws otherwise).
nlohmann::ordered_json value_to_json(const Value& v);

}  // namespace hack::jinja
