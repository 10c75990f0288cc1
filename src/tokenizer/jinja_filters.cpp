// Filters and tests of the Jinja interpreter, each a port of the jinja2 function of the
// same name (jinja2/filters.py, jinja2/tests.py) with transformers' tojson override.
// Filters that return generators in jinja2 (map, select, reverse, ...) return lists here;
// they print differently only if a template prints the generator object itself.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_builtins.h"
#include "hack/tokenizer/jinja_text.h"

namespace hack::jinja {
namespace {

int64_t int_arg(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{} must be an integer, not {}", what, v.type_name());
  return v.as_int();
}

// A string result that stays Markup when the filter's input was (soft_str keeps Markup).
Value like(const Value& input, std::string s) {
  return input.is_markup() ? Value::markup(std::move(s)) : Value::string(std::move(s));
}

std::optional<std::string> opt_str(Interp& interp, const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  return soft_str(interp, v);
}

// Lower-cases strings (jinja2's ignore_case) for case-insensitive comparisons.
Value ignore_case(const Value& v) { return v.is_string() ? Value::string(text::lower(v.as_string())) : v; }

// jinja2's make_attrgetter: "a.b.0" looks up each part with getitem (digits as ints).
class AttrGetter {
 public:
  AttrGetter(Interp& interp, const Value& attribute, bool lower_case, Value fallback = Value())
      : interp_(interp), lower_case_(lower_case), fallback_(std::move(fallback)) {
    if (attribute.is_none() || attribute.is_undefined()) return;
    if (attribute.is_int()) {
      parts_.push_back(attribute);
      return;
    }
    for (auto& part : text::split(soft_str(interp, attribute), std::string("."), -1)) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts_.push_back(digits && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::string(std::move(part)));
    }
  }
  Value operator()(Value item) const {
    for (const auto& part : parts_) {
      item = get_item(interp_, item, part);
      if (!fallback_.is_undefined() && item.is_undefined()) item = fallback_;
    }
    return lower_case_ ? ignore_case(item) : item;
  }

 private:
  Interp& interp_;
  bool lower_case_;
  Value fallback_;
  std::vector<Value> parts_;
};

void stable_sort_values(Interp& interp, std::vector<Value>& items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  uint64_t total = 0;
  for (const auto& k : keys) total += std::min<uint64_t>(k.weight(), UINT64_MAX / (2 * (keys.size() + 1)));
  interp.charge(items.size() * 4 + total / 4);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? py_less(keys[b], keys[a]) : py_less(keys[a], keys[b]);
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(items[i]);
  items = std::move(sorted);
}

Value make_list(Interp& interp, std::vector<Value> items) {
  interp.check_list_size(items.size());
  return Value::list(std::move(items));
}

// ---- filters ---------------------------------------------------------------------------

Value f_abs(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("abs", args, {});
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    HACK_CHECK(v.as_int() != INT64_MIN, "integer overflow in abs");
    return Value::integer(std::llabs(v.as_int()));
  }
  fail("bad operand type for abs(): '{}'", v.type_name());
}

Value f_attr(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("attr", args, {"name"});
  const std::string name = soft_str(interp, a.get(0, Value()));
  if (v.is_dict()) {
    // only real attributes (methods), never items
    if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy") {
      return get_attribute(interp, v, name);
    }
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return get_attribute(interp, v, name);
}

Value f_batch_eager(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("batch", args, {"linecount", "fill_with"});
  const int64_t n = int_arg(a.get(0, Value()), "linecount");
  HACK_CHECK(n > 0, "batch size must be positive");
  const Value& fill = a.get(1, Value::none());
  std::vector<Value> out, tmp;
  for (const Value& item : iterate(interp, v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (!fill.is_none()) {
      HACK_CHECK(n <= static_cast<int64_t>(interp.options().limits.max_list_items), "batch size too large");
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  interp.check_list_size(out.size());
  return Value::generator(std::move(out));
}

Value f_capitalize(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("capitalize", args, {});
  return like(v, text::capitalize(soft_str(interp, v)));
}

Value f_center(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("center", args, {"width"});
  CallArgs call;
  call.positional.push_back(a.get(0, Value::integer(80)));
  return get_attribute(interp, like(v, soft_str(interp, v)), "center").as_callable().fn(interp, call);
}

Value f_default(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("default", args, {"default_value", "boolean"});
  if (v.is_undefined() || (a.get(1, Value::boolean(false)).truthy() && !v.truthy())) {
    return a.get(0, Value::string(""));
  }
  return v;
}

Value f_dictsort(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) fail("{}", v.undefined_hint());
  HACK_CHECK(v.is_dict(), "dictsort expects a mapping, got {}", v.type_name());
  const bool case_sensitive = a.get(0, Value::boolean(false)).truthy();
  const std::string by = soft_str(interp, a.get(1, Value::string("key")));
  HACK_CHECK(by == "key" || by == "value", "You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items, keys;
  for (const auto& [key, value] : v.as_dict().entries) {
    items.push_back(Value::tuple({key, value}));
    const Value& k = by == "key" ? key : value;
    keys.push_back(case_sensitive ? k : ignore_case(k));
  }
  stable_sort_values(interp, items, keys, a.get(2, Value::boolean(false)).truthy());
  return Value::list(std::move(items));
}

Value f_escape(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("escape", args, {});
  if (v.is_markup()) return v;
  std::string out = html_escape(soft_str(interp, v));
  interp.check_string_size(out.size());
  return Value::markup(std::move(out));
}

Value f_forceescape(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("forceescape", args, {});
  std::string out = html_escape(soft_str(interp, v));
  interp.check_string_size(out.size());
  return Value::markup(std::move(out));
}

Value f_first(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("first", args, {});
  if (v.is_list() && !v.is_generator()) {
    const auto& items = v.as_list().items;
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  auto items = iterate(interp, v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("last", args, {});
  if (v.is_generator()) fail("'generator' object is not reversible");
  if (v.is_list() && !v.is_generator()) {
    const auto& items = v.as_list().items;
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  auto items = iterate(interp, v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("float", args, {"default"});
  if (v.is_undefined()) fail("{}", v.undefined_hint());
  const Value fallback = a.get(0, Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    if (auto d = parse_py_float(v.as_string())) return Value::number(*d);
  }
  return fallback;
}

Value f_format(Interp& interp, const Value& v, const CallArgs& args) {
  HACK_CHECK(args.positional.empty() || args.keyword.empty(), "can't handle positional and keyword arguments at the same time");
  Value packed;
  if (!args.keyword.empty()) {
    std::vector<std::pair<Value, Value>> entries;
    for (const auto& [key, value] : args.keyword) entries.emplace_back(Value::string(key), value);
    packed = Value::dict(std::move(entries));
  } else {
    packed = Value::tuple(args.positional);
  }
  return like(v, percent_format(interp, soft_str(interp, v), packed, v.is_markup()));
}

Value f_indent(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("indent", args, {"width", "first", "blank"});
  if (!v.is_string() && !v.is_undefined()) fail("indent expects a string, got {}", v.type_name());
  const Value& width = a.get(0, Value::integer(4));
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else {
    const int64_t n = int_arg(width, "indent width");
    interp.check_string_size(static_cast<size_t>(std::max<int64_t>(n, 0)));
    indention.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  if (v.is_undefined()) fail("{}", v.undefined_hint());
  const std::string s = soft_str(interp, v) + "\n";
  const auto lines = text::splitlines(s, false);
  interp.check_string_size(s.size() + (lines.size() + 1) * indention.size());
  std::string rv;
  if (a.get(2, Value::boolean(false)).truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
  }
  if (a.get(1, Value::boolean(false)).truthy()) rv = indention + rv;
  return like(v, std::move(rv));
}

Value f_int(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("int", args, {"default", "base"});
  const Value fallback = a.get(0, Value::integer(0));
  const int64_t base = int_arg(a.get(1, Value::integer(10)), "base");
  if (v.is_undefined()) fail("{}", v.undefined_hint());
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    if (base >= 2 && base <= 36) {
      if (auto i = parse_py_int(v.as_string(), static_cast<int>(base))) return Value::integer(*i);
    }
    if (auto d = parse_py_float(v.as_string())) {
      if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value::integer(static_cast<int64_t>(std::trunc(*d)));
    }
  }
  return fallback;
}

Value f_items_eager(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("items", args, {});
  if (v.is_undefined()) return Value::generator({});
  HACK_CHECK(v.is_dict(), "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [key, value] : v.as_dict().entries) out.push_back(Value::tuple({key, value}));
  return Value::generator(std::move(out));
}

Value f_join(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("join", args, {"d", "attribute"});
  const std::string sep = soft_str(interp, a.get(0, Value::string("")));
  const AttrGetter getter(interp, a.get(1, Value::none()), false);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(interp, v)) {
    if (!first) out += sep;
    first = false;
    append_py_str(out, getter(item), interp.options().limits.max_output_bytes);
    interp.check_string_size(out.size());
  }
  interp.charge(out.size() / 64);
  return Value::string(std::move(out));
}

Value f_length(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("length", args, {});
  return Value::integer(static_cast<int64_t>(py_len(v)));
}

Value f_list(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("list", args, {});
  if (v.is_sequence() && !v.as_list().is_tuple) return v;
  return make_list(interp, iterate(interp, v));
}

Value f_lower(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("lower", args, {});
  return like(v, text::lower(soft_str(interp, v)));
}

Value f_upper(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("upper", args, {});
  return like(v, text::upper(soft_str(interp, v)));
}

Value f_map_eager(Interp& interp, const Value& v, const CallArgs& args) {
  if (!v.truthy()) return Value::generator({});
  std::vector<Value> out;
  const auto items = iterate(interp, v);
  if (args.positional.empty()) {
    Value attribute, fallback;
    bool has_attribute = false;
    for (const auto& [key, value] : args.keyword) {
      if (key == "attribute") {
        attribute = value, has_attribute = true;
      } else if (key == "default") {
        fallback = value;
      } else {
        fail("Unexpected keyword argument '{}'", key);
      }
    }
    HACK_CHECK(has_attribute, "map requires a filter argument");
    const AttrGetter getter(interp, attribute, false, fallback.is_none() ? Value() : fallback);
    for (const Value& item : items) out.push_back(getter(item));
    return Value::generator(std::move(out));
  }
  const std::string name = soft_str(interp, args.positional[0]);
  const FilterFn fn = find_filter(name);
  HACK_CHECK(fn != nullptr, "No filter named '{}'", name);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    interp.charge(1);
    out.push_back(fn(interp, item, rest));
  }
  return Value::generator(std::move(out));
}

Value min_or_max(Interp& interp, const Value& v, const CallArgs& args, bool want_max, std::string_view name) {
  BoundArgs a(name, args, {"case_sensitive", "attribute"});
  const auto items = iterate(interp, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const AttrGetter key(interp, a.get(1, Value::none()), !a.get(0, Value::boolean(false)).truthy());
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? py_less(best_key, k) : py_less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_max(Interp& interp, const Value& v, const CallArgs& args) { return min_or_max(interp, v, args, true, "max"); }
Value f_min(Interp& interp, const Value& v, const CallArgs& args) { return min_or_max(interp, v, args, false, "min"); }

bool call_test(Interp& interp, const std::string& name, const Value& item, const CallArgs& args) {
  const TestFn fn = find_test(name);
  HACK_CHECK(fn != nullptr, "No test named '{}'", name);
  interp.charge(1 + item.weight() / 16);
  return fn(interp, item, args);
}

Value select_or_reject(Interp& interp, const Value& v, const CallArgs& args, bool select, bool by_attr) {
  if (!v.truthy()) return Value::generator({});
  size_t off = 0;
  std::optional<AttrGetter> getter;
  if (by_attr) {
    HACK_CHECK(!args.positional.empty(), "Missing parameter for attribute name");
    getter.emplace(interp, args.positional[0], false);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs rest;
  if (args.positional.size() > off) {
    test = soft_str(interp, args.positional[off]);
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(off + 1), args.positional.end());
    rest.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(interp, v)) {
    const Value subject = getter ? (*getter)(item) : item;
    const bool ok = test ? call_test(interp, *test, subject, rest) : subject.truthy();
    if (ok == select) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value f_select_eager(Interp& i, const Value& v, const CallArgs& a) { return select_or_reject(i, v, a, true, false); }
Value f_reject_eager(Interp& i, const Value& v, const CallArgs& a) { return select_or_reject(i, v, a, false, false); }
Value f_selectattr_eager(Interp& i, const Value& v, const CallArgs& a) { return select_or_reject(i, v, a, true, true); }
Value f_rejectattr_eager(Interp& i, const Value& v, const CallArgs& a) { return select_or_reject(i, v, a, false, true); }

Value f_replace(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("replace", args, {"old", "new", "count"});
  const Value& count = a.get(2, Value::none());
  const int64_t n = count.is_none() ? -1 : int_arg(count, "count");
  const std::string s = soft_str(interp, v);
  interp.charge(s.size() / 64);
  return Value::string(text::replace(s, soft_str(interp, a.get(0, Value())), soft_str(interp, a.get(1, Value())), n,
                                     interp.options().limits.max_output_bytes));
}

Value f_reverse(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("reverse", args, {});
  if (v.is_string()) {
    std::u32string cps = text::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(text::encode(cps));
  }
  auto items = iterate(interp, v);
  std::reverse(items.begin(), items.end());
  // reversed(list) is an iterator; a generator has no reversed() so jinja2 falls back to a list
  return v.is_generator() ? Value::list(std::move(items)) : Value::generator(std::move(items));
}

Value f_round(Interp&, const Value& v, const CallArgs& args) {
  BoundArgs a("round", args, {"precision", "method"});
  const int64_t precision = std::clamp<int64_t>(int_arg(a.get(0, Value::integer(0)), "precision"), -400, 400);
  const Value& method_v = a.get(1, Value::string("common"));
  const std::string method = method_v.is_string() ? method_v.as_string() : "";
  HACK_CHECK(method == "common" || method == "ceil" || method == "floor", "method must be common, ceil or floor");
  HACK_CHECK(v.is_number(), "type {} doesn't define __round__ method", v.type_name());
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value::integer(v.as_int());
      // round(int, -n): nearest multiple of 10^n, ties to even
      const double p = std::pow(10.0, static_cast<double>(-precision));
      const double r = std::nearbyint(static_cast<double>(v.as_int()) / p) * p;
      HACK_CHECK(std::fabs(r) < 9.2e18, "integer overflow in round");
      return Value::integer(static_cast<int64_t>(r));
    }
    const double d = v.as_double();
    if (!std::isfinite(d)) return Value::number(d);
    if (precision > 300) return Value::number(d);
    if (precision >= 0) {
      // Correctly rounded (half-even on the exact binary value), like CPython's round().
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return Value::number(std::strtod(buf, nullptr));
    }
    const double p = std::pow(10.0, static_cast<double>(-precision));
    return Value::number(std::nearbyint(d / p) * p);
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double scaled = v.as_double() * p;
  return Value::number((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / p);
}

Value f_safe(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("safe", args, {});
  return Value::markup(soft_str(interp, v));
}

Value f_sort(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("sort", args, {"reverse", "case_sensitive", "attribute"});
  auto items = iterate(interp, v);
  const bool lower = !a.get(1, Value::boolean(false)).truthy();
  const Value& attribute = a.get(2, Value::none());
  std::vector<AttrGetter> getters;
  if (attribute.is_string() && attribute.as_string().find(',') != std::string::npos) {
    for (const auto& part : text::split(attribute.as_string(), std::string(","), -1)) {
      getters.emplace_back(interp, Value::string(text::strip(part, std::nullopt, true, true)), lower);
    }
  } else {
    getters.emplace_back(interp, attribute, lower);
  }
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    if (getters.size() == 1) {
      keys.push_back(getters[0](item));
    } else {
      std::vector<Value> parts;
      for (const auto& g : getters) parts.push_back(g(item));
      keys.push_back(Value::list(std::move(parts)));
    }
  }
  stable_sort_values(interp, items, keys, a.get(0, Value::boolean(false)).truthy());
  return Value::list(std::move(items));
}

Value f_string(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("string", args, {});
  return like(v, soft_str(interp, v));
}

Value f_sum(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("sum", args, {"attribute", "start"});
  const AttrGetter getter(interp, a.get(0, Value::none()), false);
  Value total = a.get(1, Value::integer(0));
  for (const Value& raw : iterate(interp, v)) {
    const Value item = getter(raw);
    HACK_CHECK(total.is_number() && item.is_number(), "unsupported operand type(s) for +: '{}' and '{}'",
               total.type_name(), item.type_name());
    if (total.is_float() || item.is_float()) {
      total = Value::number(total.as_double() + item.as_double());
    } else {
      int64_t r = 0;
      HACK_CHECK(!__builtin_add_overflow(total.as_int(), item.as_int(), &r), "integer overflow in sum");
      total = Value::integer(r);
    }
  }
  return total;
}

Value f_title(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("title", args, {});
  return Value::string(text::title_filter(soft_str(interp, v)));
}

// transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
Value f_tojson(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions opt;
  opt.ensure_ascii = a.get(0, Value::boolean(false)).truthy();
  const Value& indent = a.get(1, Value::none());
  if (indent.is_string()) {
    opt.indent = indent.as_string();
  } else if (!indent.is_none()) {
    const int64_t n = int_arg(indent, "indent");
    opt.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 1024)), ' ');
  }
  const Value& separators = a.get(2, Value::none());
  if (!separators.is_none()) {
    HACK_CHECK(separators.is_list() && separators.as_list().items.size() == 2, "separators must be a pair of strings");
    opt.item_separator = soft_str(interp, separators.as_list().items[0]);
    opt.key_separator = soft_str(interp, separators.as_list().items[1]);
  }
  opt.sort_keys = a.get(3, Value::boolean(false)).truthy();
  std::string out = to_json(v, opt, interp.options().limits.max_output_bytes);
  interp.charge(out.size() / 64);
  return Value::string(std::move(out));
}

Value f_trim(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("trim", args, {"chars"});
  return like(v, text::strip(soft_str(interp, v), opt_str(interp, a.get(0, Value::none())), true, true));
}

Value f_truncate(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("truncate", args, {"length", "killwords", "end", "leeway"});
  if (!v.is_string()) {
    // jinja2 does not convert: len(s) decides, and only short sized values come back as is.
    const auto n = static_cast<int64_t>(py_len(v));
    const Value& leeway = a.get(3, Value::none());
    int64_t limit = 0;
    if (__builtin_add_overflow(int_arg(a.get(0, Value::integer(255)), "length"),
                               leeway.is_none() ? 5 : int_arg(leeway, "leeway"), &limit) ||
        n <= limit) {
      return v;
    }
    fail("truncate expects a string, got {}", v.type_name());
  }
  const std::string s = soft_str(interp, v);
  const int64_t length = int_arg(a.get(0, Value::integer(255)), "length");
  const bool killwords = a.get(1, Value::boolean(false)).truthy();
  const std::string end = soft_str(interp, a.get(2, Value::string("...")));
  const Value& leeway_v = a.get(3, Value::none());
  const int64_t leeway = leeway_v.is_none() ? 5 : int_arg(leeway_v, "leeway");
  const auto end_len = static_cast<int64_t>(text::length(end));
  HACK_CHECK(length >= end_len, "expected length >= {}, got {}", end_len, length);
  HACK_CHECK(leeway >= 0, "expected leeway >= 0, got {}", leeway);
  int64_t limit = 0;
  if (__builtin_add_overflow(length, leeway, &limit) || static_cast<int64_t>(text::length(s)) <= limit) {
    return Value::string(s);
  }
  std::string head = s.substr(0, text::byte_offset(s, static_cast<size_t>(length - end_len)));
  if (killwords) return Value::string(head + end);
  const auto parts = text::rsplit(head, std::string(" "), 1);
  return Value::string(parts[0] + end);
}

Value f_unique_eager(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("unique", args, {"case_sensitive", "attribute"});
  const AttrGetter key(interp, a.get(1, Value::none()), !a.get(0, Value::boolean(false)).truthy());
  std::vector<Value> out, seen;
  for (const Value& item : iterate(interp, v)) {
    Value k = key(item);
    if ((k.is_list() && !k.as_list().is_tuple) || k.is_dict() || k.is_namespace()) {
      fail("unhashable type: '{}'", k.type_name());
    }
    interp.charge(1 + seen.size() * (1 + k.weight() / 16) / 16);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); })) {
      seen.push_back(std::move(k));
      out.push_back(item);
    }
  }
  return Value::generator(std::move(out));
}

Value f_wordcount(Interp& interp, const Value& v, const CallArgs& args) {
  BoundArgs a("wordcount", args, {});
  const std::string s = soft_str(interp, v);
  int64_t words = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = text::next_code_point(s, pos);
    std::string one;
    text::append_code_point(one, cp);
    const bool word_char = cp == '_' || text::is_alnum(one);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::integer(words);
}


// jinja2's generator filters run lazily: their errors surface when the result is iterated.
template <Value (*Eager)(Interp&, const Value&, const CallArgs&)>
Value lazily(Interp& interp, const Value& v, const CallArgs& args) {
  try {
    return Eager(interp, v, args);
  } catch (const TemplateRaised&) {
    throw;
  } catch (const hack::Error& e) {
    return Value::failed_generator(e.what());
  }
}

// ---- tests -----------------------------------------------------------------------------

int64_t mod_int(const Value& v, int64_t m) {
  HACK_CHECK(v.is_int() || v.is_bool(), "unsupported operand type(s) for %: '{}' and 'int'", v.type_name());
  HACK_CHECK(m != 0, "integer division or modulo by zero");
  if (m == -1) return 0;
  const int64_t r = v.as_int() % m;
  return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r;
}

double mod_number(const Value& v, const Value& m) {
  HACK_CHECK(v.is_number() && m.is_number(), "unsupported operand type(s) for %: '{}' and '{}'", v.type_name(), m.type_name());
  if (!v.is_float() && !m.is_float()) return static_cast<double>(mod_int(v, m.as_int()));
  HACK_CHECK(m.as_double() != 0.0, "float modulo");
  double r = std::fmod(v.as_double(), m.as_double());
  if (r != 0 && ((r < 0) != (m.as_double() < 0))) r += m.as_double();
  return r;
}

const Value& test_arg(const CallArgs& args, std::string_view test) {
  BoundArgs a(test, args, {"other"});
  HACK_CHECK(a.has(0), "{}() missing 1 required positional argument", test);
  return args.positional.empty() ? args.keyword[0].second : args.positional[0];
}

void no_test_args(std::string_view test, const CallArgs& args) { [[maybe_unused]] BoundArgs a(test, args, {}); }

bool t_odd(Interp&, const Value& v, const CallArgs& a) { no_test_args("odd", a); return mod_number(v, Value::integer(2)) == 1; }
bool t_even(Interp&, const Value& v, const CallArgs& a) { no_test_args("even", a); return mod_number(v, Value::integer(2)) == 0; }
bool t_divisibleby(Interp&, const Value& v, const CallArgs& a) { return mod_number(v, test_arg(a, "divisibleby")) == 0; }
bool t_defined(Interp&, const Value& v, const CallArgs& a) { no_test_args("defined", a); return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, const CallArgs& a) { no_test_args("undefined", a); return v.is_undefined(); }
bool t_none(Interp&, const Value& v, const CallArgs& a) { no_test_args("none", a); return v.is_none(); }
bool t_boolean(Interp&, const Value& v, const CallArgs& a) { no_test_args("boolean", a); return v.is_bool(); }
bool t_false(Interp&, const Value& v, const CallArgs& a) { no_test_args("false", a); return v.is_bool() && !v.as_bool(); }
bool t_true(Interp&, const Value& v, const CallArgs& a) { no_test_args("true", a); return v.is_bool() && v.as_bool(); }
bool t_integer(Interp&, const Value& v, const CallArgs& a) { no_test_args("integer", a); return v.is_int(); }
bool t_float(Interp&, const Value& v, const CallArgs& a) { no_test_args("float", a); return v.is_float(); }
bool t_number(Interp&, const Value& v, const CallArgs& a) { no_test_args("number", a); return v.is_number(); }
bool t_string(Interp&, const Value& v, const CallArgs& a) { no_test_args("string", a); return v.is_string(); }
bool t_mapping(Interp&, const Value& v, const CallArgs& a) { no_test_args("mapping", a); return v.is_dict(); }
bool t_sequence(Interp&, const Value& v, const CallArgs& a) {
  no_test_args("sequence", a);
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}
bool t_iterable(Interp&, const Value& v, const CallArgs& a) {
  no_test_args("iterable", a);
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_loop();
}
bool t_callable(Interp&, const Value& v, const CallArgs& a) {
  no_test_args("callable", a);
  return v.is_callable() || v.is_loop() || v.is_undefined();
}
bool t_lower(Interp& i, const Value& v, const CallArgs& a) { no_test_args("lower", a); return text::is_lower(soft_str(i, v)); }
bool t_upper(Interp& i, const Value& v, const CallArgs& a) { no_test_args("upper", a); return text::is_upper(soft_str(i, v)); }
bool t_escaped(Interp&, const Value&, const CallArgs& a) { no_test_args("escaped", a); return false; }
bool t_filter(Interp&, const Value& v, const CallArgs& a) {
  no_test_args("filter", a);
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interp&, const Value& v, const CallArgs& a) {
  no_test_args("test", a);
  return v.is_string() && find_test(v.as_string()) != nullptr;
}
bool t_sameas(Interp&, const Value& v, const CallArgs& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kUndefined: return false;  // two Undefined objects are distinct
    case Kind::kNone: return true;
    case Kind::kBool: return v.as_bool() == other.as_bool();
    case Kind::kInt: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;  // CPython's small ints
    case Kind::kFloat: return false;
    default: return v.identity() == other.identity();
  }
}
bool t_in(Interp& i, const Value& v, const CallArgs& a) {
  const Value& seq = test_arg(a, "in");
  i.charge(seq.weight() / 16);
  return contains(seq, v);
}
bool t_eq(Interp&, const Value& v, const CallArgs& a) { return py_equal(v, test_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, const CallArgs& a) { return !py_equal(v, test_arg(a, "ne")); }
bool t_lt(Interp&, const Value& v, const CallArgs& a) { return py_less(v, test_arg(a, "lt")); }
bool t_gt(Interp&, const Value& v, const CallArgs& a) { return py_less(test_arg(a, "gt"), v); }
bool t_le(Interp&, const Value& v, const CallArgs& a) {
  const Value& o = test_arg(a, "le");
  return py_less(v, o) || py_equal(v, o);
}
bool t_ge(Interp&, const Value& v, const CallArgs& a) {
  const Value& o = test_arg(a, "ge");
  return py_less(o, v) || py_equal(v, o);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};
constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"batch", lazily<f_batch_eager>},
    {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
    {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
    {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
    {"float", f_float},       {"forceescape", f_forceescape}, {"format", f_format},
    {"indent", f_indent},     {"int", f_int},           {"items", lazily<f_items_eager>},
    {"join", f_join},         {"last", f_last},         {"length", f_length},
    {"list", f_list},         {"lower", f_lower},       {"map", lazily<f_map_eager>},
    {"max", f_max},           {"min", f_min},           {"reject", lazily<f_reject_eager>},
    {"rejectattr", lazily<f_rejectattr_eager>}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round},       {"safe", f_safe},         {"select", lazily<f_select_eager>},
    {"selectattr", lazily<f_selectattr_eager>}, {"sort", f_sort},     {"string", f_string},
    {"sum", f_sum},           {"title", f_title},       {"tojson", f_tojson},
    {"trim", f_trim},         {"truncate", f_truncate}, {"unique", lazily<f_unique_eager>},
    {"upper", f_upper},       {"wordcount", f_wordcount},
};

constexpr std::string_view kUnsupportedFilters[] = {
    "filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "urlencode", "urlize", "wordwrap", "xmlattr"};

struct TestEntry {
  std::string_view name;
  TestFn fn;
};
constexpr TestEntry kTests[] = {
    {"odd", t_odd},         {"even", t_even},         {"divisibleby", t_divisibleby},
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},
    {"boolean", t_boolean}, {"false", t_false},       {"true", t_true},
    {"integer", t_integer}, {"float", t_float},       {"number", t_number},
    {"string", t_string},   {"mapping", t_mapping},   {"sequence", t_sequence},
    {"iterable", t_iterable}, {"callable", t_callable}, {"lower", t_lower},
    {"upper", t_upper},     {"escaped", t_escaped},   {"filter", t_filter},
    {"test", t_test},       {"sameas", t_sameas},     {"in", t_in},
    {"==", t_eq},           {"eq", t_eq},             {"equalto", t_eq},
    {"!=", t_ne},           {"ne", t_ne},             {"<", t_lt},
    {"lt", t_lt},           {"lessthan", t_lt},       {"<=", t_le},
    {"le", t_le},           {">", t_gt},              {"gt", t_gt},
    {"greaterthan", t_gt},  {">=", t_ge},             {"ge", t_ge},
};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

bool is_known_unsupported_filter(std::string_view name) {
  return std::find(std::begin(kUnsupportedFilters), std::end(kUnsupportedFilters), name) != std::end(kUnsupportedFilters);
}

}  // namespace hack::jinja
