/// @file jinja_builtins.h
/// @brief Built-ins of the Jinja interpreter: filters, tests, attribute and item access
/// (with Python's str / dict / list methods), and the globals transformers provides.
/// Internal to the interpreter.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hack/tokenizer/jinja.h"
#include "hack/tokenizer/jinja_value.h"

namespace hack::jinja {

/// What built-ins need from the running evaluator.
class Interp {
 public:
  virtual ~Interp() = default;
  /// Counts work against RenderLimits::max_steps (throws when exhausted).
  virtual void charge(uint64_t steps) = 0;
  virtual const RenderOptions& options() const = 0;
  /// Throws unless a string of `bytes` fits RenderLimits::max_output_bytes.
  void check_string_size(size_t bytes) const;
  /// Throws unless a list of `items` fits RenderLimits::max_list_items.
  void check_list_size(size_t items) const;
};

using FilterFn = Value (*)(Interp&, const Value& input, const CallArgs& args);
using TestFn = bool (*)(Interp&, const Value& input, const CallArgs& args);

/// nullptr when jinja2 has no such filter / test or this interpreter lacks it.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
/// True for jinja2 filters / tests this interpreter does not implement (for the message).
bool is_known_unsupported_filter(std::string_view name);

/// `obj.name` as jinja2's sandboxed getattr: Python attributes first (str / dict / list
/// methods, bound to obj), then obj["name"]; Undefined when neither exists. Throws for
/// attributes of Undefined, as jinja2 does.
Value get_attribute(Interp& interp, const Value& obj, std::string_view name);
/// `obj[key]`: item first, then attribute for string keys; Undefined when absent.
Value get_item(Interp& interp, const Value& obj, const Value& key);

/// Globals of transformers' environment: range, dict, namespace, raise_exception,
/// strftime_now, plus jinja2's cycler and joiner.
Variables make_globals();

/// Python iteration: list items, dict keys, string characters; Undefined iterates empty.
/// Throws for values that are not iterable.
std::vector<Value> iterate(Interp& interp, const Value& v);

/// `a in b` (Python semantics; Undefined on the right is empty).
bool contains(const Value& container, const Value& item);

/// Python len() (Undefined -> 0). Throws for values without a length.
size_t py_len(const Value& v);

/// Python slicing obj[start:stop:step] of a list, tuple or string (missing parts = None).
Value slice(Interp& interp, const Value& obj, const Value& start, const Value& stop, const Value& step);

/// Python's printf-style `format % args` (args: a tuple, a dict for %(name)s, or one value).
/// escape_args: `Markup % args`, which HTML-escapes what %s / %r insert.
std::string percent_format(Interp& interp, std::string_view format, const Value& args, bool escape_args = false);

/// Python str(v) within the render's string budget.
std::string soft_str(Interp& interp, const Value& v);

/// Python int() / float() of a string, as the int / float filters use them (unset when
/// the text is not a number).
std::optional<int64_t> parse_py_int(std::string_view s, int base);
std::optional<double> parse_py_float(std::string_view s);

/// Positional-or-keyword argument binding for built-ins: `names` lists the parameters
/// in order. Throws for unknown keywords, too many positional arguments, or a duplicate.
class BoundArgs {
 public:
  BoundArgs(std::string_view function, const CallArgs& args, std::initializer_list<std::string_view> names);
  /// The argument, or `fallback` when it was not given.
  Value get(size_t index, const Value& fallback) const;
  bool has(size_t index) const { return given_[index]; }

 private:
  std::vector<Value> values_;
  std::vector<bool> given_;
};

}  // namespace hack::jinja
