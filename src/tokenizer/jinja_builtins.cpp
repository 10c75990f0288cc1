// Built-ins of the Jinja interpreter other than filters and tests: attribute and item
// access as jinja2's sandbox does it (Python methods of str / dict / list, bound to the
// object), iteration, `in`, len(), slicing, printf formatting, and the globals
// transformers' environment provides (range, dict, namespace, raise_exception,
// strftime_now) plus jinja2's joiner.
#include "hack/tokenizer/jinja_builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_text.h"

namespace hack::jinja {
namespace {

// Python's str methods: `s.name` is a bound method for these names, Undefined otherwise.
constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join",
    "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace",
    "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines",
    "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"};
constexpr std::string_view kDictMethods[] = {"copy", "get", "items", "keys", "values"};
// Mutating methods the immutable sandbox refuses: attribute access gives an Undefined
// that fails when used.
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListMethods[] = {"copy", "count", "index"};
constexpr std::string_view kListUnsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

template <size_t N>
bool one_of(std::string_view name, const std::string_view (&names)[N]) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

std::string object_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return fmt::format("{} object", obj.type_name());
}

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_repr(obj), name));
}

[[noreturn]] void fail_undefined(const Value& v) { fail("{}", v.undefined_hint()); }

const std::string& need_string(const Value& v, std::string_view what) {
  if (!v.is_string()) fail("{} must be str, not {}", what, v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{} must be an integer, not {}", what, v.type_name());
  return v.as_int();
}

std::optional<std::string> optional_chars(const Value& v, std::string_view what) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  return need_string(v, what);
}

// Python index normalization for find/count start/end arguments (code point indexes).
std::pair<size_t, size_t> sub_range(std::string_view s, const BoundArgs& a, size_t start_i, size_t end_i) {
  const auto n = static_cast<int64_t>(text::length(s));
  auto norm = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = need_int(v, "slice index");
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  const int64_t b = norm(a.get(start_i, Value::none()), 0);
  const int64_t e = norm(a.get(end_i, Value::none()), n);
  return {static_cast<size_t>(b), static_cast<size_t>(std::max(b, e))};
}

// Prefix / suffix test with a str or a tuple of str, like str.startswith.
bool affix_match(std::string_view s, const Value& affix, bool prefix) {
  auto one = [&](const Value& v) {
    const std::string a = need_string(v, prefix ? "startswith first arg" : "endswith first arg");
    if (a.size() > s.size()) return false;
    return prefix ? s.substr(0, a.size()) == a : s.substr(s.size() - a.size()) == a;
  };
  if (affix.is_list() && affix.as_list().is_tuple) {
    return std::any_of(affix.as_list().items.begin(), affix.as_list().items.end(), one);
  }
  return one(affix);
}

std::string pad(Interp& interp, const std::string& s, int64_t width, const std::string& fill, char align) {
  const size_t len = text::length(s);
  if (width <= 0 || static_cast<size_t>(width) <= len) return s;
  HACK_CHECK(text::length(fill) == 1, "The fill character must be exactly one character long");
  const size_t total = static_cast<size_t>(width) - len;
  interp.check_string_size(total);
  interp.check_string_size(s.size() + total * fill.size());
  size_t left = 0;
  if (align == '>') left = total;
  if (align == '^') left = total / 2 + (total & static_cast<size_t>(width) & 1);
  std::string out;
  for (size_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (size_t i = left; i < total; ++i) out += fill;
  return out;
}

void no_args(std::string_view name, const CallArgs& args) { [[maybe_unused]] BoundArgs bound(name, args, {}); }

std::vector<Value> string_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string format_spec_apply(Interp& interp, const Value& v, std::string_view spec);

// str.format(*args, **kwargs): {} / {0} / {name}, .attr / [key] lookups, !r / !s, and a
// format spec subset ([[fill]align][sign][0][width][,][.precision][type]).
std::string str_format(Interp& interp, std::string_view f, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      HACK_CHECK(i + 1 < f.size() && f[i + 1] == '}', "Single '}}' encountered in format string");
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    HACK_CHECK(close != std::string_view::npos, "Single '{{' encountered in format string");
    std::string_view field = f.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec, conversion;
    if (const size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) {
      conversion = field.substr(bang + 1);
      field = field.substr(0, bang);
    }
    size_t name_end = 0;
    while (name_end < field.size() && field[name_end] != '.' && field[name_end] != '[') ++name_end;
    const std::string_view head = field.substr(0, name_end);
    Value v;
    if (head.empty()) {
      HACK_CHECK(auto_index < args.positional.size(), "Replacement index {} out of range for positional args tuple", auto_index);
      v = args.positional[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t idx = static_cast<size_t>(std::strtoull(std::string(head).c_str(), nullptr, 10));
      HACK_CHECK(idx < args.positional.size(), "Replacement index {} out of range for positional args tuple", idx);
      v = args.positional[idx];
    } else {
      const Value* found = nullptr;
      for (const auto& kw : args.keyword) {
        if (kw.first == head) found = &kw.second;
      }
      HACK_CHECK(found != nullptr, "KeyError: '{}'", head);
      v = *found;
    }
    size_t p = name_end;
    while (p < field.size()) {
      if (field[p] == '.') {
        size_t e = p + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = get_attribute(interp, v, field.substr(p + 1, e - p - 1));
        p = e;
      } else {
        const size_t e = field.find(']', p);
        HACK_CHECK(e != std::string_view::npos, "Missing ']' in format string");
        const std::string_view key = field.substr(p + 1, e - p - 1);
        const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = get_item(interp, v, numeric ? Value::integer(std::strtoll(std::string(key).c_str(), nullptr, 10))
                                        : Value::string(std::string(key)));
        p = e + 1;
      }
    }
    if (conversion == "r" || conversion == "a") {
      v = Value::string(py_repr(v, interp.options().limits.max_output_bytes));
    } else if (conversion == "s") {
      v = Value::string(soft_str(interp, v));
    } else if (!conversion.empty()) {
      fail("Unknown conversion specifier {}", conversion);
    }
    out += format_spec_apply(interp, v, spec);
    interp.check_string_size(out.size());
  }
  return out;
}

std::string format_spec_apply(Interp& interp, const Value& v, std::string_view spec) {
  if (spec.empty()) return soft_str(interp, v);
  size_t p = 0;
  std::string fill = " ";
  char align = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = std::string(1, spec[0]);
    align = spec[1];
    p = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    align = spec[0];
    p = 1;
  }
  char sign = 0;
  if (p < spec.size() && (spec[p] == '+' || spec[p] == '-' || spec[p] == ' ')) sign = spec[p++];
  bool zero = false;
  if (p < spec.size() && spec[p] == '0') {
    zero = true;
    ++p;
  }
  int64_t width = 0;
  while (p < spec.size() && spec[p] >= '0' && spec[p] <= '9') width = std::min<int64_t>(width * 10 + (spec[p++] - '0'), 1 << 20);
  char grouping = 0;
  if (p < spec.size() && (spec[p] == ',' || spec[p] == '_')) grouping = spec[p++];
  int precision = -1;
  if (p < spec.size() && spec[p] == '.') {
    ++p;
    precision = 0;
    while (p < spec.size() && spec[p] >= '0' && spec[p] <= '9') precision = std::min(precision * 10 + (spec[p++] - '0'), 100);
  }
  char type = 0;
  if (p < spec.size()) type = spec[p++];
  HACK_CHECK(p == spec.size(), "Invalid format specifier '{}'", spec);
  HACK_CHECK(!grouping || !v.is_string(), "Cannot specify '{}' with 's'.", grouping);
  std::string body;
  if (v.is_string() || type == 's') {
    HACK_CHECK(v.is_string(), "Unknown format code 's' for object of type '{}'", v.type_name());
    body = v.as_string();
    if (precision >= 0) body = body.substr(0, text::byte_offset(body, static_cast<size_t>(precision)));
    if (!align) align = '<';
  } else if (v.is_number()) {
    const char t = type ? type : (v.is_float() ? 'r' : 'd');
    std::string sgn = sign == '+' ? "+" : sign == ' ' ? " " : "";
    if (t == 'd') {
      HACK_CHECK(!v.is_float(), "Unknown format code 'd' for object of type 'float'");
      const int64_t i = v.as_int();
      body = (i < 0 ? "-" : sgn) + std::to_string(i < 0 ? -static_cast<uint64_t>(i) : static_cast<uint64_t>(i));
    } else if (t == 'f' || t == 'F' || t == 'e' || t == 'E' || t == 'g' || t == 'G' || t == '%') {
      double d = v.as_double();
      if (t == '%') d *= 100.0;
      const char ct = t == '%' ? 'f' : t;
      body = fmt::format(fmt::runtime(fmt::format("{{:{}.{}{}}}", sgn, precision < 0 ? 6 : precision, ct)), d);
      if (t == '%') body += '%';
    } else if (t == 'r') {
      body = py_float_repr(v.as_double());
      if (v.as_double() >= 0) body = sgn + body;
    } else if (t == 'x' || t == 'X' || t == 'o' || t == 'b') {
      HACK_CHECK(!v.is_float(), "Unknown format code '{}' for object of type 'float'", t);
      body = fmt::format(fmt::runtime(fmt::format("{{:{}{}}}", sgn, t)), v.as_int());
    } else {
      fail("Unknown format code '{}' for object of type '{}'", t, v.type_name());
    }
    if (grouping && (t == 'd' || t == 'f' || t == 'F' || t == 'r')) {
      // thousands separators in the integer part
      const size_t begin = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
      size_t end = begin;
      while (end < body.size() && body[end] >= '0' && body[end] <= '9') ++end;
      std::string grouped;
      for (size_t i = begin; i < end; ++i) {
        if (i > begin && (end - i) % 3 == 0) grouped += grouping;
        grouped += body[i];
      }
      body = body.substr(0, begin) + grouped + body.substr(end);
    }
    if (!align) align = zero ? '=' : '>';
    if (zero && fill == " " && align == '=') fill = "0";
  } else {
    body = soft_str(interp, v);
    if (!align) align = '<';
  }
  if (align == '=') {
    // Pad between the sign and the digits.
    size_t sign_len = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    const std::string digits = body.substr(sign_len);
    return body.substr(0, sign_len) + pad(interp, digits, width - static_cast<int64_t>(sign_len), fill, '>');
  }
  return pad(interp, body, width, fill, align);
}

Value call_str_method(Interp& interp, const std::string& s, std::string_view name, const CallArgs& args) {
  const size_t max_bytes = interp.options().limits.max_output_bytes;
  interp.charge(1 + s.size() / 64);
  if (name == "startswith" || name == "endswith") {
    BoundArgs a(name, args, {"prefix", "start", "end"});
    auto [b, e] = sub_range(s, a, 1, 2);
    const size_t bb = text::byte_offset(s, b);
    const std::string_view sub = std::string_view(s).substr(bb, text::byte_offset(s, e) - bb);
    return Value::boolean(affix_match(sub, a.get(0, Value()), name == "startswith"));
  }
  if (name == "split" || name == "rsplit") {
    BoundArgs a(name, args, {"sep", "maxsplit"});
    const auto sep = optional_chars(a.get(0, Value::none()), "sep");
    const int64_t maxsplit = need_int(a.get(1, Value::integer(-1)), "maxsplit");
    auto parts = name == "split" ? text::split(s, sep, maxsplit) : text::rsplit(s, sep, maxsplit);
    interp.check_list_size(parts.size());
    return Value::list(string_list(std::move(parts)));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArgs a(name, args, {"chars"});
    const auto chars = optional_chars(a.get(0, Value::none()), "chars");
    return Value::string(text::strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "upper") return no_args(name, args), Value::string(text::upper(s));
  if (name == "lower" || name == "casefold") return no_args(name, args), Value::string(text::lower(s));
  if (name == "title") return no_args(name, args), Value::string(text::title(s));
  if (name == "capitalize") return no_args(name, args), Value::string(text::capitalize(s));
  if (name == "swapcase") return no_args(name, args), Value::string(text::swapcase(s));
  if (name == "replace") {
    BoundArgs a(name, args, {"old", "new", "count"});
    return Value::string(text::replace(s, need_string(a.get(0, Value()), "replace() argument 1"),
                                       need_string(a.get(1, Value()), "replace() argument 2"),
                                       need_int(a.get(2, Value::integer(-1)), "count"), max_bytes));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    BoundArgs a(name, args, {"sub", "start", "end"});
    const std::string sub = need_string(a.get(0, Value()), fmt::format("{}() argument 1", name));
    auto [b, e] = sub_range(s, a, 1, 2);
    const size_t bb = text::byte_offset(s, b);
    const std::string_view window = std::string_view(s).substr(bb, text::byte_offset(s, e) - bb);
    if (name == "count") return Value::integer(static_cast<int64_t>(text::count(window, sub)));
    const size_t hit = name[0] == 'r' ? window.rfind(sub) : window.find(sub);
    if (hit == std::string_view::npos) {
      if (name == "index" || name == "rindex") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(b + text::code_point_index(window, hit)));
  }
  if (name == "join") {
    BoundArgs a(name, args, {"iterable"});
    const auto items = iterate(interp, a.get(0, Value()));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += s;
      out += need_string(items[i], fmt::format("sequence item {}", i));
      interp.check_string_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(str_format(interp, s, args));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return no_args(name, args), Value::boolean(text::is_digit(s));
  }
  if (name == "isalpha") return no_args(name, args), Value::boolean(text::is_alpha(s));
  if (name == "isalnum") return no_args(name, args), Value::boolean(text::is_alnum(s));
  if (name == "isspace") return no_args(name, args), Value::boolean(text::is_all_space(s));
  if (name == "islower") return no_args(name, args), Value::boolean(text::is_lower(s));
  if (name == "isupper") return no_args(name, args), Value::boolean(text::is_upper(s));
  if (name == "isascii") return no_args(name, args), Value::boolean(text::is_ascii(s));
  if (name == "splitlines") {
    BoundArgs a(name, args, {"keepends"});
    auto parts = text::splitlines(s, a.get(0, Value::boolean(false)).truthy());
    interp.check_list_size(parts.size());
    return Value::list(string_list(std::move(parts)));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    BoundArgs a(name, args, {"width", "fillchar"});
    const int64_t width = need_int(a.get(0, Value()), "width");
    const std::string fill = need_string(a.get(1, Value::string(" ")), "fillchar");
    return Value::string(pad(interp, s, width, fill, name == "center" ? '^' : name == "ljust" ? '<' : '>'));
  }
  if (name == "zfill") {
    BoundArgs a(name, args, {"width"});
    const int64_t width = need_int(a.get(0, Value()), "width");
    const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    const std::string digits = sign ? s.substr(1) : s;
    return Value::string((sign ? s.substr(0, 1) : "") + pad(interp, digits, width - (sign ? 1 : 0), "0", '>'));
  }
  if (name == "partition" || name == "rpartition") {
    BoundArgs a(name, args, {"sep"});
    const std::string sep = need_string(a.get(0, Value()), "sep");
    HACK_CHECK(!sep.empty(), "empty separator");
    const size_t hit = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (hit == std::string::npos) {
      if (name == "partition") return Value::tuple({Value::string(s), Value::string(""), Value::string("")});
      return Value::tuple({Value::string(""), Value::string(""), Value::string(s)});
    }
    return Value::tuple({Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    BoundArgs a(name, args, {"affix"});
    const std::string affix = need_string(a.get(0, Value()), name);
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value::string(s.substr(affix.size()));
    if (name == "removesuffix" && affix.size() <= s.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::string(s.substr(0, s.size() - affix.size()));
    }
    return Value::string(s);
  }
  fail("unsupported string method '{}'", name);
}

Value call_dict_method(Interp& interp, const Value& self, std::string_view name, const CallArgs& args) {
  const DictData& d = self.as_dict();
  interp.charge(1 + d.entries.size());
  if (name == "get") {
    BoundArgs a(name, args, {"key", "default"});
    const Value* v = d.find(a.get(0, Value()));
    return v ? *v : a.get(1, Value::none());
  }
  no_args(name, args);
  if (name == "copy") return self;
  std::vector<Value> out;
  out.reserve(d.entries.size());
  for (const auto& [key, value] : d.entries) {
    if (name == "items") {
      out.push_back(Value::tuple({key, value}));
    } else {
      out.push_back(name == "keys" ? key : value);
    }
  }
  return Value::dict_view(name == "items"  ? ListData::View::kItems
                         : name == "keys" ? ListData::View::kKeys
                                          : ListData::View::kValues,
                         std::move(out));
}

Value call_list_method(Interp& interp, const Value& self, std::string_view name, const CallArgs& args) {
  const auto& items = self.as_list().items;
  interp.charge(1 + items.size());
  if (name == "copy") return no_args(name, args), self;
  BoundArgs a(name, args, {"value"});
  const Value& needle = a.get(0, Value());
  if (name == "count") {
    return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return py_equal(v, needle); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_equal(items[i], needle)) return Value::integer(static_cast<int64_t>(i));
  }
  fail("{} is not in list", py_repr(needle, 200));
}

Value bind(const Value& self, std::string_view name, Value (*method)(Interp&, const Value&, std::string_view, const CallArgs&)) {
  std::string method_name(name);
  return Value::builtin(method_name, [self, method_name, method](Interp& interp, const CallArgs& args) {
    return method(interp, self, method_name, args);
  });
}

Value markup_escaped(const Value& v) {
  return v.is_string() && !v.is_markup() ? Value::markup(html_escape(v.as_string())) : v;
}

Value as_markup(const Value& v) {
  if (v.is_string()) return Value::markup(v.as_string());
  if (v.is_sequence()) {
    std::vector<Value> items;
    for (const auto& item : v.as_list().items) items.push_back(as_markup(item));
    return v.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  return v;
}

// Methods of a markupsafe.Markup: string results stay Markup, and the methods markupsafe
// wraps escape their string arguments (replace, strip, center, join, format, partition...).
Value markup_method(Interp& interp, const Value& self, std::string_view name, const CallArgs& args) {
  static constexpr std::string_view kEscapingArgs[] = {
      "capitalize", "title", "lower", "upper", "replace", "ljust", "rjust", "lstrip", "rstrip", "center",
      "strip", "swapcase", "zfill", "format", "partition", "rpartition"};
  static constexpr std::string_view kMarkupResult[] = {"split", "rsplit", "splitlines", "join"};
  const bool escaping = one_of(name, kEscapingArgs);
  if (!escaping && !one_of(name, kMarkupResult)) return call_str_method(interp, self.as_string(), name, args);
  CallArgs escaped = args;
  if (escaping) {
    for (auto& v : escaped.positional) v = markup_escaped(v);
    for (auto& kw : escaped.keyword) kw.second = markup_escaped(kw.second);
  } else if (name == "join" && !escaped.positional.empty()) {
    std::vector<Value> items;
    for (const auto& item : iterate(interp, escaped.positional[0])) items.push_back(markup_escaped(item));
    escaped.positional[0] = Value::list(std::move(items));
  }
  return as_markup(call_str_method(interp, self.as_string(), name, escaped));
}

Value str_method_thunk(Interp& interp, const Value& self, std::string_view name, const CallArgs& args) {
  if (self.is_markup()) return markup_method(interp, self, name, args);
  return call_str_method(interp, self.as_string(), name, args);
}

Value loop_attribute(const Value& obj, std::string_view name) {
  LoopData& loop = obj.as_loop();
  const auto& items = loop.items->items;
  const auto n = static_cast<int64_t>(items.size());
  const auto i = static_cast<int64_t>(loop.index0);
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(loop.depth0 + 1);
  if (name == "depth0") return Value::integer(loop.depth0);
  if (name == "previtem") {
    return i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
  }
  if (name == "cycle") {
    const size_t index = loop.index0;
    return Value::builtin("loop.cycle", [index](Interp&, const CallArgs& args) {
      HACK_CHECK(!args.positional.empty(), "no items for cycling given");
      return args.positional[index % args.positional.size()];
    });
  }
  if (name == "changed") {
    LoopData* raw = &loop;
    Value keep = obj;  // keeps the loop state alive while the bound method lives
    return Value::builtin("loop.changed", [raw, keep](Interp&, const CallArgs& args) {
      for (const auto& arg : args.positional) {
        // The loop keeps these; objects could make the loop state refer to itself.
        HACK_CHECK(!arg.holds_objects(), "loop.changed() takes plain data, not a {}", arg.type_name());
      }
      if (raw->changed_last && raw->changed_last->size() == args.positional.size() &&
          std::equal(args.positional.begin(), args.positional.end(), raw->changed_last->begin(), py_equal)) {
        return Value::boolean(false);
      }
      raw->changed_last = args.positional;
      return Value::boolean(true);
    });
  }
  return missing_attribute(obj, name);
}

bool is_slice_index(const Value& v) { return v.is_int() || v.is_bool(); }

}  // namespace

void Interp::check_string_size(size_t bytes) const {
  const size_t limit = options().limits.max_output_bytes;
  HACK_CHECK(bytes <= limit, "string too long ({} bytes; the limit is {})", bytes, limit);
}

void Interp::check_list_size(size_t items) const {
  const size_t limit = options().limits.max_list_items;
  HACK_CHECK(items <= limit, "list too long ({} items; the limit is {})", items, limit);
}

BoundArgs::BoundArgs(std::string_view function, const CallArgs& args, std::initializer_list<std::string_view> names)
    : values_(names.size()), given_(names.size(), false) {
  if (args.positional.size() > names.size()) {
    fail("{}() takes at most {} argument{} ({} given)", function, names.size(), names.size() == 1 ? "" : "s",
         args.positional.size());
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    values_[i] = args.positional[i];
    given_[i] = true;
  }
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) fail("{}() got an unexpected keyword argument '{}'", function, key);
    const auto i = static_cast<size_t>(it - names.begin());
    if (given_[i]) fail("{}() got multiple values for argument '{}'", function, key);
    values_[i] = value;
    given_[i] = true;
  }
}

Value BoundArgs::get(size_t index, const Value& fallback) const {
  return given_[index] ? values_[index] : fallback;
}

std::string soft_str(Interp& interp, const Value& v) {
  return py_str(v, interp.options().limits.max_output_bytes);
}

Value get_attribute(Interp&, const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      fail_undefined(obj);
    case Kind::kDict: {
      if (one_of(name, kDictMethods)) return bind(obj, name, call_dict_method);
      if (one_of(name, kDictUnsafe)) {
        return Value::undefined(fmt::format("access to attribute '{}' of 'dict' object is unsafe", name));
      }
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return missing_attribute(obj, name);
    }
    case Kind::kNamespace: {
      if (const Value* v = obj.as_namespace().find(name)) return *v;
      return missing_attribute(obj, name);
    }
    case Kind::kString:
      if (one_of(name, kStrMethods)) return bind(obj, name, str_method_thunk);
      return missing_attribute(obj, name);
    case Kind::kList:
      if (one_of(name, kListMethods)) return bind(obj, name, call_list_method);
      if (one_of(name, kListUnsafe)) {
        return Value::undefined(fmt::format("access to attribute '{}' of 'list' object is unsafe", name));
      }
      return missing_attribute(obj, name);
    case Kind::kLoop:
      return loop_attribute(obj, name);
    default:
      return missing_attribute(obj, name);
  }
}

Value get_item(Interp& interp, const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      fail_undefined(obj);
    case Kind::kDict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Kind::kList:
      if (!obj.is_sequence()) return Value::undefined(fmt::format("'{}' object is not subscriptable", obj.type_name()));
      if (is_slice_index(key)) {
        const auto& items = obj.as_list().items;
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return Value::undefined(fmt::format("'{}' has no element {}", object_repr(obj), key.as_int()));
      }
      break;
    case Kind::kString:
      if (is_slice_index(key)) {
        const std::string& s = obj.as_string();
        const auto n = static_cast<int64_t>(text::length(s));
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          size_t pos = text::byte_offset(s, static_cast<size_t>(i));
          std::string ch;
          text::append_code_point(ch, text::next_code_point(s, pos));
          return obj.is_markup() ? Value::markup(std::move(ch)) : Value::string(std::move(ch));
        }
        return Value::undefined(fmt::format("'str object' has no element {}", key.as_int()));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.is_dict()) return missing_attribute(obj, key.as_string());
    return get_attribute(interp, obj, key.as_string());
  }
  return Value::undefined(fmt::format("'{}' has no element {}", object_repr(obj), py_repr(key, 200)));
}

std::vector<Value> iterate(Interp& interp, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      if (v.as_list().deferred_error) fail("{}", *v.as_list().deferred_error);
      interp.charge(v.as_list().items.size() / 16);
      return v.as_list().items;
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& entry : v.as_dict().entries) keys.push_back(entry.first);
      return keys;
    }
    case Kind::kString: {
      const std::string& s = v.as_string();
      interp.charge(s.size() / 16);
      std::vector<Value> chars;
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t start = pos;
        text::next_code_point(s, pos);
        chars.push_back(Value::string(s.substr(start, pos - start)));
      }
      return chars;
    }
    default:
      fail("'{}' object is not iterable", v.type_name());
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
      if (container.as_list().deferred_error) fail("{}", *container.as_list().deferred_error);
      return std::any_of(container.as_list().items.begin(), container.as_list().items.end(),
                         [&](const Value& v) { return py_equal(v, item); });
    case Kind::kDict:
      if (item.is_list() && !item.as_list().is_tuple) fail("unhashable type: 'list'");
      if (item.is_dict() || item.is_namespace()) fail("unhashable type: '{}'", item.type_name());
      return container.as_dict().find(item) != nullptr;
    default:
      fail("argument of type '{}' is not iterable", container.type_name());
  }
}

size_t py_len(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return text::length(v.as_string());
    case Kind::kList:
      if (v.is_generator()) fail("object of type 'generator' has no len()");
      return v.as_list().items.size();
    case Kind::kDict: return v.as_dict().entries.size();
    case Kind::kLoop: return v.as_loop().items->items.size();
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

Value slice(Interp& interp, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  if ((!obj.is_list() && !obj.is_string()) || (obj.is_list() && !obj.is_sequence())) {
    return Value::undefined(fmt::format("'{}' cannot be sliced", object_repr(obj)));
  }
  auto index_or_none = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!is_slice_index(v)) fail("slice indices must be integers or None, not {}", v.type_name());
    return v.as_int();
  };
  const auto start_o = index_or_none(start_v);
  const auto stop_o = index_or_none(stop_v);
  const int64_t step = index_or_none(step_v).value_or(1);
  HACK_CHECK(step != 0, "slice step cannot be zero");

  std::u32string cps;
  const bool is_str = obj.is_string();
  if (is_str) cps = text::decode(obj.as_string());
  const auto n = static_cast<int64_t>(is_str ? cps.size() : obj.as_list().items.size());
  // PySlice_AdjustIndices
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t start = adjust(start_o, step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(stop_o, step < 0 ? -1 : n);
  // Element count first (PySlice_AdjustIndices + slicelength), so huge steps cannot overflow.
  int64_t count = 0;
  if (step > 0 && start < stop) count = (stop - start - 1) / step + 1;
  if (step < 0 && start > stop) count = step == INT64_MIN ? 1 : (start - stop - 1) / -step + 1;
  std::vector<int64_t> picks;
  picks.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) picks.push_back(start + k * step);
  interp.charge(picks.size() / 16);
  if (is_str) {
    std::u32string out;
    out.reserve(picks.size());
    for (int64_t i : picks) out += cps[static_cast<size_t>(i)];
    return obj.is_markup() ? Value::markup(text::encode(out)) : Value::string(text::encode(out));
  }
  std::vector<Value> items;
  items.reserve(picks.size());
  for (int64_t i : picks) items.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  return obj.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

std::optional<int64_t> parse_py_int(std::string_view s, int base) {
  const std::string t = text::strip(s, std::nullopt, true, true);
  std::string digits;
  size_t p = 0;
  bool negative = false;
  if (p < t.size() && (t[p] == '+' || t[p] == '-')) negative = t[p++] == '-';
  if (p + 1 < t.size() && t[p] == '0') {
    const char b = static_cast<char>(t[p + 1] | 0x20);
    if ((b == 'x' && base == 16) || (b == 'o' && base == 8) || (b == 'b' && base == 2)) p += 2;
  }
  bool last_underscore = true;  // no leading underscore
  for (; p < t.size(); ++p) {
    if (t[p] == '_') {
      if (last_underscore) return std::nullopt;
      last_underscore = true;
      continue;
    }
    digits += t[p];
    last_underscore = false;
  }
  if (digits.empty() || last_underscore) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno == ERANGE || *end != '\0' || digits[0] == '-' || digits[0] == '+' || digits[0] == ' ') return std::nullopt;
  return negative ? -v : v;
}

std::optional<double> parse_py_float(std::string_view s) {
  const std::string t = text::strip(s, std::nullopt, true, true);
  if (t.empty()) return std::nullopt;
  std::string lowered = text::lower(t);
  size_t p = (lowered[0] == '+' || lowered[0] == '-') ? 1 : 0;
  const std::string word = lowered.substr(p);
  const double sign = lowered[0] == '-' ? -1.0 : 1.0;
  if (word == "inf" || word == "infinity") return sign * HUGE_VAL;
  if (word == "nan") return std::nan("");
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      // only between digits
      if (i == 0 || i + 1 >= t.size() || !(t[i - 1] >= '0' && t[i - 1] <= '9') || !(t[i + 1] >= '0' && t[i + 1] <= '9')) {
        return std::nullopt;
      }
      continue;
    }
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return std::nullopt;
    clean += c;
  }
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end == clean.c_str() || *end != '\0') return std::nullopt;
  return d;
}

std::string percent_format(Interp& interp, std::string_view f, const Value& args, bool escape_args) {
  std::vector<Value> positional;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.as_list().is_tuple) {
    positional = args.as_list().items;
  } else if (args.is_dict() || args.is_undefined() || args.is_sequence()) {
    // Python treats anything with __getitem__ (dicts, lists, jinja2's Undefined) as a
    // mapping: "%s" still takes the whole value, and unused arguments are no error.
    if (args.is_dict()) mapping = &args.as_dict();
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    HACK_CHECK(i + 1 < f.size(), "incomplete format");
    ++i;
    Value v;
    bool have_value = false;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      HACK_CHECK(close != std::string_view::npos && mapping, "format requires a mapping");
      const Value* found = mapping->find(f.substr(i + 1, close - i - 1));
      HACK_CHECK(found != nullptr, "KeyError: '{}'", f.substr(i + 1, close - i - 1));
      v = *found;
      have_value = true;
      used_mapping = true;
      i = close + 1;
      HACK_CHECK(i < f.size(), "incomplete format");
    }
    std::string flags;
    while (i < f.size() && std::string_view("-+ #0").find(f[i]) != std::string_view::npos) flags += f[i++];
    int64_t width = 0;
    while (i < f.size() && f[i] >= '0' && f[i] <= '9') width = std::min<int64_t>(width * 10 + (f[i++] - '0'), 1 << 20);
    int precision = -1;
    if (i < f.size() && f[i] == '.') {
      ++i;
      precision = 0;
      while (i < f.size() && f[i] >= '0' && f[i] <= '9') precision = std::min(precision * 10 + (f[i++] - '0'), 100);
    }
    HACK_CHECK(i < f.size(), "incomplete format");
    const char conv = f[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have_value) {
      HACK_CHECK(next_arg < positional.size(), "not enough arguments for format string");
      v = positional[next_arg++];
    }
    std::string body;
    switch (conv) {
      case 's': body = soft_str(interp, v); break;
      case 'r':
      case 'a': body = py_repr(v, interp.options().limits.max_output_bytes); break;
      case 'd':
      case 'i':
      case 'u': {
        HACK_CHECK(v.is_number(), "%{} format: a real number is required, not {}", conv, v.type_name());
        const double d = v.as_double();
        HACK_CHECK(std::isfinite(d), "cannot convert float infinity or NaN to integer");
        HACK_CHECK(!v.is_float() || std::fabs(d) < 9.2e18, "%{} format: number too large", conv);
        const int64_t n = v.is_float() ? static_cast<int64_t>(std::trunc(d)) : v.as_int();
        body = std::to_string(n);
        if (n >= 0 && flags.find('+') != std::string::npos) body = "+" + body;
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        HACK_CHECK(v.is_number(), "must be real number, not {}", v.type_name());
        body = fmt::format(fmt::runtime(fmt::format("{{:{}.{}{}}}", flags.find('+') != std::string::npos ? "+" : "",
                                                    precision < 0 ? 6 : precision, conv)),
                           v.as_double());
        precision = -1;
        break;
      }
      case 'x': case 'X': case 'o': {
        HACK_CHECK(v.is_int() || v.is_bool(), "%{} format: an integer is required, not {}", conv, v.type_name());
        body = fmt::format(fmt::runtime(fmt::format("{{:{}}}", conv)), v.as_int());
        break;
      }
      case 'c': {
        if (v.is_string()) {
          HACK_CHECK(text::length(v.as_string()) == 1, "%c requires int or char");
          body = v.as_string();
        } else {
          const int64_t cp = need_int(v, "%c");
          HACK_CHECK(cp >= 0 && cp <= 0x10FFFF, "%c arg not in range(0x110000)");
          text::append_code_point(body, static_cast<char32_t>(cp));
        }
        break;
      }
      default:
        fail("unsupported format character '{}'", conv);
    }
    if (precision >= 0 && (conv == 's' || conv == 'r' || conv == 'a')) {
      body = body.substr(0, text::byte_offset(body, static_cast<size_t>(precision)));
    }
    if (escape_args && (conv == 's' || conv == 'r' || conv == 'a') && !v.is_markup()) body = html_escape(body);
    const bool left = flags.find('-') != std::string::npos;
    const bool zero = !left && flags.find('0') != std::string::npos && conv != 's' && conv != 'r' && conv != 'c';
    if (zero) {
      const bool sign = !body.empty() && (body[0] == '-' || body[0] == '+');
      out += sign ? body.substr(0, 1) : "";
      out += pad(interp, sign ? body.substr(1) : body, width - (sign ? 1 : 0), "0", '>');
    } else {
      out += pad(interp, body, width, " ", left ? '<' : '>');
    }
    interp.check_string_size(out.size());
  }
  HACK_CHECK(used_mapping || mapping || args.is_undefined() || (args.is_sequence() && !args.as_list().is_tuple) ||
                 next_arg == positional.size(),
             "not all arguments converted during string formatting");
  return out;
}

Variables make_globals() {
  Variables g;
  g.emplace_back("range", Value::builtin("range", [](Interp& interp, const CallArgs& args) {
    HACK_CHECK(args.keyword.empty(), "range() takes no keyword arguments");
    HACK_CHECK(!args.positional.empty() && args.positional.size() <= 3, "range expected 1 to 3 arguments, got {}",
               args.positional.size());
    int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) {
      stop = need_int(args.positional[0], "range() argument");
    } else {
      start = need_int(args.positional[0], "range() argument");
      stop = need_int(args.positional[1], "range() argument");
      if (args.positional.size() == 3) step = need_int(args.positional[2], "range() argument");
    }
    HACK_CHECK(step != 0, "range() arg 3 must not be zero");
    // The sandbox refuses ranges of more than MAX_RANGE = 100000 items.
    // Exact in unsigned arithmetic (stop - start can exceed INT64_MAX).
    uint64_t ucount = 0;
    if (step > 0 && stop > start) {
      ucount = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
    } else if (step < 0 && stop < start) {
      const uint64_t ustep = static_cast<uint64_t>(-(step + 1)) + 1;
      ucount = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / ustep + 1;
    }
    HACK_CHECK(ucount <= 100000, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    const auto count = static_cast<int64_t>(ucount);
    interp.charge(static_cast<uint64_t>(count) / 16);
    std::vector<Value> items;
    items.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) items.push_back(Value::integer(start + i * step));
    return Value::list(std::move(items));
  }));
  g.emplace_back("dict", Value::builtin("dict", [](Interp& interp, const CallArgs& args) {
    HACK_CHECK(args.positional.size() <= 1, "dict expected at most 1 argument, got {}", args.positional.size());
    std::vector<std::pair<Value, Value>> entries;
    auto put = [&](Value key, Value value) {
      interp.charge(1 + entries.size() / 16);
      for (auto& e : entries) {
        if (py_equal(e.first, key)) {
          e.second = std::move(value);
          return;
        }
      }
      entries.emplace_back(std::move(key), std::move(value));
    };
    if (!args.positional.empty()) {
      const Value& src = args.positional[0];
      if (src.is_dict()) {
        for (const auto& e : src.as_dict().entries) put(e.first, e.second);
      } else {
        for (const Value& pair : iterate(interp, src)) {
          HACK_CHECK(pair.is_list() && pair.as_list().items.size() == 2,
                     "dictionary update sequence element has wrong length or type");
          put(pair.as_list().items[0], pair.as_list().items[1]);
        }
      }
    }
    for (const auto& [key, value] : args.keyword) put(Value::string(key), value);
    return Value::dict(std::move(entries));
  }));
  g.emplace_back("namespace", Value::builtin("namespace", [](Interp& interp, const CallArgs& args) {
    HACK_CHECK(args.positional.size() <= 1, "namespace expected at most 1 positional argument");
    auto ns = std::make_shared<NamespaceData>();
    auto put = [&](const std::string& name, const Value& value) {
      interp.charge(1 + ns->attrs.size() / 16);
      HACK_CHECK(!value.holds_objects(), "a namespace attribute cannot hold a {}", value.type_name());
      HACK_CHECK(name.empty() || name[0] != '_',
                 "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'", name);
      ns->set(name, value);
    };
    if (!args.positional.empty()) {
      const Value& src = args.positional[0];
      HACK_CHECK(src.is_dict(), "namespace() argument must be a mapping, not {}", src.type_name());
      for (const auto& e : src.as_dict().entries) {
        HACK_CHECK(e.first.is_string(), "namespace attribute names must be strings");
        put(e.first.as_string(), e.second);
      }
    }
    for (const auto& [key, value] : args.keyword) put(key, value);
    return Value::ns(std::move(ns));
  }));
  g.emplace_back("raise_exception", Value::builtin("raise_exception", [](Interp& interp, const CallArgs& args) -> Value {
    BoundArgs a("raise_exception", args, {"message"});
    const std::string message = soft_str(interp, a.get(0, Value()));
    throw TemplateRaised(message, message);
  }));
  g.emplace_back("strftime_now", Value::builtin("strftime_now", [](Interp& interp, const CallArgs& args) {
    BoundArgs a("strftime_now", args, {"format"});
    std::string format = need_string(a.get(0, Value()), "strftime_now() argument");
    std::tm tm{};
    int64_t micros = 0;
    if (interp.options().now_unix_s) {
      const std::time_t t = static_cast<std::time_t>(*interp.options().now_unix_s);
      gmtime_r(&t, &tm);
    } else {
      const auto now = std::chrono::system_clock::now();
      const std::time_t t = std::chrono::system_clock::to_time_t(now);
      micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
      localtime_r(&t, &tm);
    }
    // datetime.strftime handles %f, %z and %Z itself (naive datetime: empty zone).
    std::string expanded;
    for (size_t i = 0; i < format.size(); ++i) {
      if (format[i] == '%' && i + 1 < format.size()) {
        const char c = format[i + 1];
        if (c == 'f') {
          expanded += fmt::format("{:06d}", micros);
          ++i;
          continue;
        }
        if (c == 'z' || c == 'Z') {
          ++i;
          continue;
        }
        expanded += format[i];
        expanded += c;
        ++i;
        continue;
      }
      expanded += format[i];
    }
    interp.check_string_size(expanded.size() * 16);
    std::string out(expanded.size() * 16 + 64, '\0');
    expanded += '\x01';  // a sentinel, so an empty result is not taken for an error
    const size_t n = std::strftime(out.data(), out.size(), expanded.c_str(), &tm);
    HACK_CHECK(n > 0, "strftime_now: format too long");
    out.resize(n - 1);
    return Value::string(std::move(out));
  }));
  g.emplace_back("joiner", Value::builtin("joiner", [](Interp&, const CallArgs& args) {
    BoundArgs a("joiner", args, {"sep"});
    const std::string sep = a.has(0) ? py_str(a.get(0, Value())) : ", ";
    auto used = std::make_shared<bool>(false);
    return Value::builtin("joiner", [sep, used](Interp&, const CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  }));
  return g;
}

}  // namespace hack::jinja
