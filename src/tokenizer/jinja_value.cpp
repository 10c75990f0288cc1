// Values of the Jinja interpreter with Python semantics (see jinja_value.h).
#include "hack/tokenizer/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_text.h"

namespace hack::jinja {
namespace {

int child_depth(const Value& v) { return v.depth(); }

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

void check_depth(int depth) {
  HACK_CHECK(depth <= kMaxValueDepth, "value nested deeper than {} levels", kMaxValueDepth);
}

// Appends with a byte budget so that printing shared data ([[s] * 1000] * 1000) cannot
// build unbounded text.
class BoundedText {
 public:
  BoundedText(std::string& out, size_t max_bytes) : out_(out), max_bytes_(max_bytes) {}
  void add(std::string_view s) {
    HACK_CHECK(s.size() <= max_bytes_ && out_.size() <= max_bytes_ - s.size(),
               "text too long (exceeds {} bytes)", max_bytes_);
    out_ += s;
  }
  void add(char c) { add(std::string_view(&c, 1)); }
  std::string& out() { return out_; }

 private:
  std::string& out_;
  size_t max_bytes_;
};

void repr_into(BoundedText& out, const Value& v);

void str_into(BoundedText& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kString:
      return out.add(v.as_string());
    default:
      return repr_into(out, v);
  }
}

void repr_into(BoundedText& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return out.add("Undefined");
    case Kind::kNone:
      return out.add("None");
    case Kind::kBool:
      return out.add(v.as_bool() ? "True" : "False");
    case Kind::kInt:
      return out.add(std::to_string(v.as_int()));
    case Kind::kFloat:
      return out.add(py_float_repr(v.as_double()));
    case Kind::kString: {
      std::string quoted = v.is_markup() ? "Markup(" : "";
      text::append_repr(quoted, v.as_string());
      if (v.is_markup()) quoted += ')';
      return out.add(quoted);
    }
    case Kind::kList: {
      const auto& list = v.as_list();
      if (list.is_generator) return out.add("<generator object>");
      if (v.is_view()) out.add(v.type_name()), out.add('(');
      out.add(list.is_tuple ? '(' : '[');
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i) out.add(", ");
        repr_into(out, list.items[i]);
      }
      if (list.is_tuple && list.items.size() == 1) out.add(',');
      out.add(list.is_tuple ? ')' : ']');
      if (v.is_view()) out.add(')');
      return;
    }
    case Kind::kDict: {
      out.add('{');
      bool first = true;
      for (const auto& [key, value] : v.as_dict().entries) {
        if (!first) out.add(", ");
        first = false;
        repr_into(out, key);
        out.add(": ");
        repr_into(out, value);
      }
      return out.add('}');
    }
    case Kind::kNamespace: {
      out.add("<Namespace {");
      bool first = true;
      for (const auto& [key, value] : v.as_namespace().attrs) {
        if (!first) out.add(", ");
        first = false;
        std::string quoted;
        text::append_repr(quoted, key);
        out.add(quoted);
        out.add(": ");
        repr_into(out, value);
      }
      return out.add("}>");
    }
    case Kind::kCallable:
      return out.add(fmt::format("<function {}>", v.as_callable().name));
    case Kind::kLoop: {
      const auto& loop = v.as_loop();
      return out.add(fmt::format("<LoopContext {}/{}>", loop.index0 + 1, loop.items->items.size()));
    }
  }
}

void json_string(BoundedText& out, std::string_view s, bool ensure_ascii) {
  std::string buf;
  buf.reserve(s.size() + 2);
  buf += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = text::next_code_point(s, pos);
    switch (cp) {
      case '"': buf += "\\\""; continue;
      case '\\': buf += "\\\\"; continue;
      case '\n': buf += "\\n"; continue;
      case '\r': buf += "\\r"; continue;
      case '\t': buf += "\\t"; continue;
      case '\b': buf += "\\b"; continue;
      case '\f': buf += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20) {
      buf += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp < 0x10000) {
        buf += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
      } else {
        const char32_t v = cp - 0x10000;
        buf += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                           static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      }
    } else {
      buf.append(s.substr(start, pos - start));
    }
  }
  buf += '"';
  out.add(buf);
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

// json.dumps turns keys into strings: str keys as is, numbers / bools / None converted.
std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Kind::kString: return key.as_string();
    case Kind::kBool: return key.as_bool() ? "true" : "false";
    case Kind::kInt: return std::to_string(key.as_int());
    case Kind::kFloat: return json_float(key.as_double());
    case Kind::kNone: return "null";
    default:
      fail("keys must be str, int, float, bool or None, not {}", key.type_name());
  }
}

void json_into(BoundedText& out, const Value& v, const JsonOptions& opt, int level) {
  const std::string item_sep = opt.item_separator.value_or(opt.indent ? "," : ", ");
  const std::string key_sep = opt.key_separator.value_or(": ");
  auto newline = [&](int lvl) {
    if (!opt.indent) return;
    out.add('\n');
    for (int i = 0; i < lvl; ++i) out.add(*opt.indent);
  };
  switch (v.kind()) {
    case Kind::kNone: return out.add("null");
    case Kind::kBool: return out.add(v.as_bool() ? "true" : "false");
    case Kind::kInt: return out.add(std::to_string(v.as_int()));
    case Kind::kFloat: return out.add(json_float(v.as_double()));
    case Kind::kString: return json_string(out, v.as_string(), opt.ensure_ascii);
    case Kind::kList: {
      if (!v.is_sequence()) fail("Object of type {} is not JSON serializable", v.type_name());
      const auto& items = v.as_list().items;
      if (items.empty()) return out.add("[]");
      out.add('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.add(item_sep);
        newline(level + 1);
        json_into(out, items[i], opt, level + 1);
      }
      newline(level);
      return out.add(']');
    }
    case Kind::kDict: {
      const auto& entries = v.as_dict().entries;
      if (entries.empty()) return out.add("{}");
      std::vector<size_t> order(entries.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (opt.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return py_less(entries[a].first, entries[b].first);
        });
      }
      out.add('{');
      bool first = true;
      for (size_t i : order) {
        if (!first) out.add(item_sep);
        first = false;
        newline(level + 1);
        json_string(out, json_key(entries[i].first), opt.ensure_ascii);
        out.add(key_sep);
        json_into(out, entries[i].second, opt, level + 1);
      }
      newline(level);
      return out.add('}');
    }
    case Kind::kUndefined:
      fail("Object of type Undefined is not JSON serializable");
    case Kind::kNamespace:
      fail("Object of type Namespace is not JSON serializable");
    case Kind::kCallable:
      fail("Object of type function is not JSON serializable");
    case Kind::kLoop:
      fail("Object of type LoopContext is not JSON serializable");
  }
}

}  // namespace

const Value* DictData::find(const Value& key) const {
  for (const auto& entry : entries) {
    if (py_equal(entry.first, key)) return &entry.second;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& entry : entries) {
    if (entry.first.is_string() && entry.first.as_string() == key) return &entry.second;
  }
  return nullptr;
}

const Value* NamespaceData::find(std::string_view name) const {
  for (const auto& attr : attrs) {
    if (attr.first == name) return &attr.second;
  }
  return nullptr;
}

void NamespaceData::set(std::string name, Value value) {
  for (auto& attr : attrs) {
    if (attr.first == name) {
      attr.second = std::move(value);
      return;
    }
  }
  attrs.emplace_back(std::move(name), std::move(value));
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.ref_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ref_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.b_ = true;
  return v;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value Value::list(std::vector<Value> items) {
  int depth = 0;
  bool objects = false;
  uint64_t weight = 1;
  for (const auto& item : items) {
    depth = std::max(depth, child_depth(item));
    objects = objects || item.holds_objects();
    weight = saturating_add(weight, item.weight());
  }
  check_depth(depth + 1);
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->depth = depth + 1;
  data->holds_objects = objects;
  data->weight = weight;
  Value v;
  v.kind_ = Kind::kList;
  v.ref_ = std::move(data);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  const_cast<ListData&>(v.as_list()).is_tuple = true;
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  const_cast<ListData&>(v.as_list()).is_generator = true;
  return v;
}

Value Value::failed_generator(std::string error) {
  Value v = generator({});
  const_cast<ListData&>(v.as_list()).deferred_error = std::make_shared<const std::string>(std::move(error));
  return v;
}

Value Value::dict_view(ListData::View view, std::vector<Value> items) {
  Value v = list(std::move(items));
  const_cast<ListData&>(v.as_list()).view = view;
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> entries) {
  int depth = 0;
  bool objects = false;
  uint64_t weight = 1;
  for (const auto& entry : entries) {
    depth = std::max({depth, child_depth(entry.first), child_depth(entry.second)});
    objects = objects || entry.first.holds_objects() || entry.second.holds_objects();
    weight = saturating_add(weight, saturating_add(entry.first.weight(), entry.second.weight()));
  }
  check_depth(depth + 1);
  auto data = std::make_shared<DictData>();
  data->entries = std::move(entries);
  data->depth = depth + 1;
  data->holds_objects = objects;
  data->weight = weight;
  Value v;
  v.kind_ = Kind::kDict;
  v.ref_ = std::move(data);
  return v;
}

Value Value::ns(std::shared_ptr<NamespaceData> data) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ref_ = std::move(data);
  return v;
}

Value Value::callable(std::shared_ptr<const CallableData> data) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ref_ = std::move(data);
  return v;
}

Value Value::builtin(std::string name, std::function<Value(Interp&, const CallArgs&)> fn) {
  auto data = std::make_shared<CallableData>();
  data->name = std::move(name);
  data->fn = std::move(fn);
  return callable(std::move(data));
}

Value Value::loop(std::shared_ptr<LoopData> data) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.ref_ = std::move(data);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::kBool: return b_ ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(i_);
    case Kind::kFloat: return f_;
    default: return 0.0;
  }
}

std::string_view Value::undefined_hint() const {
  if (kind_ != Kind::kUndefined || !ref_) return "undefined value";
  return *static_cast<const std::string*>(ref_.get());
}

int Value::depth() const {
  switch (kind_) {
    case Kind::kList: return as_list().depth;
    case Kind::kDict: return as_dict().depth;
    case Kind::kNamespace: {
      // Namespaces never hold namespaces (the evaluator enforces it), so this is shallow.
      int d = 0;
      for (const auto& attr : as_namespace().attrs) d = std::max(d, attr.second.depth());
      return d + 1;
    }
    default: return 0;
  }
}

uint64_t Value::weight() const {
  switch (kind_) {
    case Kind::kString: return 1 + as_string().size() / 64;
    case Kind::kList: return as_list().weight;
    case Kind::kDict: return as_dict().weight;
    case Kind::kNamespace: {
      uint64_t w = 1;
      for (const auto& attr : as_namespace().attrs) w = saturating_add(w, attr.second.weight());
      return w;
    }
    default: return 1;
  }
}

bool Value::holds_objects() const {
  switch (kind_) {
    case Kind::kNamespace:
    case Kind::kCallable:
    case Kind::kLoop: return true;
    case Kind::kList: return as_list().holds_objects;
    case Kind::kDict: return as_dict().holds_objects;
    default: return false;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return as_list().is_generator || !as_list().items.empty();
    case Kind::kDict: return !as_dict().entries.empty();
    default: return true;
  }
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList:
      switch (as_list().view) {
        case ListData::View::kKeys: return "dict_keys";
        case ListData::View::kValues: return "dict_values";
        case ListData::View::kItems: return "dict_items";
        default: break;
      }
      return as_list().is_generator ? "generator" : as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
    case Kind::kLoop: return "LoopContext";
  }
  return "object";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out like CPython's repr:
  // fixed notation when the decimal exponent is in [-4, 16), else d.ddde+XX.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // digits = 0.DIGITS * 10^decpt
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

void append_py_str(std::string& out, const Value& v, size_t max_bytes) {
  BoundedText text(out, max_bytes);
  str_into(text, v);
}

std::string py_str(const Value& v, size_t max_bytes) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_py_str(out, v, max_bytes);
  return out;
}

std::string py_repr(const Value& v, size_t max_bytes) {
  std::string out;
  BoundedText text(out, max_bytes);
  repr_into(text, v);
  return out;
}

std::string to_json(const Value& v, const JsonOptions& options, size_t max_bytes) {
  std::string out;
  BoundedText text(out, max_bytes);
  json_into(text, v, options, 0);
  return out;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.is_generator || y.is_generator) return &x == &y;
      if (x.view != y.view) return false;
      if (x.view == ListData::View::kValues) return &x == &y;
      if (x.view != ListData::View::kNone) {  // keys / items views compare as sets
        if (x.items.size() != y.items.size()) return false;
        for (const auto& item : x.items) {
          if (std::none_of(y.items.begin(), y.items.end(), [&](const Value& o) { return py_equal(item, o); })) return false;
        }
        return true;
      }
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!py_equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.find(key);
        if (!other || !py_equal(value, *other)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (a.is_sequence() && b.is_sequence() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

namespace {
Value from_json(const nlohmann::ordered_json& json, int depth) {
  check_depth(depth);
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> entries;
      entries.reserve(json.size());
      for (const auto& [key, value] : json.items()) {
        entries.emplace_back(Value::string(key), from_json(value, depth + 1));
      }
      return Value::dict(std::move(entries));
    }
    default: fail("cannot use JSON value of type {} in a template", json.type_name());
  }
}
}  // namespace

Value value_from_json(const nlohmann::ordered_json& json) { return from_json(json, 0); }

nlohmann::ordered_json value_to_json(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return v.as_bool();
    case Kind::kInt: return v.as_int();
    case Kind::kFloat: return v.as_double();
    case Kind::kString: return v.as_string();
    case Kind::kList: {
      auto out = nlohmann::ordered_json::array();
      for (const auto& item : v.as_list().items) out.push_back(value_to_json(item));
      return out;
    }
    case Kind::kDict: {
      auto out = nlohmann::ordered_json::object();
      for (const auto& [key, value] : v.as_dict().entries) out[json_key(key)] = value_to_json(value);
      return out;
    }
    default: fail("a {} cannot be converted to JSON", v.type_name());
  }
}

}  // namespace hack::jinja
