/// @file jinja.h
/// @brief A Jinja subset interpreter written for chat templates: lexer -> parser -> AST ->
/// tree-walking evaluator, rendering the way transformers' apply_chat_template renders with
/// jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its
/// tojson / raise_exception / strftime_now / namespace / dict globals).
///
/// Supported: {{ }}, {# #}, whitespace control (-, +), if/elif/else, for (loop.*, else,
/// inline if, tuple unpacking, break/continue), set (names, tuples, ns.attr, block set),
/// macro / call / caller, filter blocks, with, raw, generation; the expression grammar of
/// jinja2 (arithmetic, comparisons, and/or/not, in, is-tests, ternaries, ~, subscripts,
/// slices, calls with keywords, filters) and the filters, tests and str/dict/list methods
/// templates use (see jinja_filters.cpp, jinja_builtins.cpp). Python quirks that change
/// output are kept: generator-returning filters are always truthy, have no len() and defer
/// their errors; Markup (|safe, |e) escapes what is added to it; `-1 ** x` is -(1 ** x).
///
/// Not supported (rejected at parse time): extends / block / include / import / from /
/// autoescape / trans, recursive loops, *args / **kwargs in calls, the filters groupby,
/// slice, striptags, urlize, urlencode, wordwrap, xmlattr, pprint, random, filesizeformat.
/// Known differences (none seen in real chat templates): integers are 64-bit (overflow is
/// an error, Python would grow), generators and range() are computed eagerly and print
/// without an address / as a list, dict views have no set operations, upper()/lower()
/// use simple case mapping (plus ß and İ), names are ASCII identifiers, and the cycler /
/// lipsum globals are absent.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_value.h"

namespace hack::jinja {

namespace ast {
struct Program;
}

/// Bounds on one render, each exceeded bound -> hack::Error. Defaults fit any real chat
/// (a 1M-token conversation is ~4 MiB of text) yet stop runaway templates.
struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // also the bound on any one string built
  size_t max_list_items = 1'000'000;           // on any one list built by the template
  uint64_t max_steps = 50'000'000;             // expression / statement / element steps
  int max_call_depth = 100;                    // nested macro calls
  int max_eval_depth = 1000;                   // nested evaluation frames of all kinds
};

struct RenderOptions {
  RenderLimits limits;
  /// What strftime_now() formats; unset = the current local time. Set for reproducible
  /// output (tests): the time is taken as UTC.
  std::optional<int64_t> now_unix_s;
};

/// Raised by the template itself through raise_exception(message); message() is exactly
/// the template's text.
class TemplateRaised : public hack::Error {
 public:
  TemplateRaised(const std::string& what, std::string message)
      : hack::Error(what), message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

/// Variables a template sees, in addition to the built-in globals.
using Variables = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  /// Parses `source`. `name` prefixes error messages. Throws hack::Error naming the
  /// construct, line and column for syntax errors and unsupported features.
  static Template parse(std::string_view source, std::string name = "template");

  /// Renders with `variables` (later entries win over earlier ones and over globals).
  /// Throws hack::Error (TemplateRaised for raise_exception) naming the template, the
  /// construct and the line.
  std::string render(const Variables& variables, const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const ast::Program> program_;
  std::string name_;
};

}  // namespace hack::jinja
