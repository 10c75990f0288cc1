// JSON Schema to GBNF: one rule per object, array and $ref target; primitives shared.
// Values carry no surrounding whitespace; containers put the bounded `ws` after each token.
#include "hack/grammar/json_schema.h"

#include <map>
#include <set>

#include "hack/core/error.h"
#include "hack/grammar/grammar.h"

namespace hack::grammar {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string> kIgnored = {"title", "description", "default", "examples", "$schema", "$id",
                                        "$comment", "readOnly", "writeOnly", "deprecated", "$defs", "definitions"};
const std::set<std::string> kHandled = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                        "items", "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                        "format", "anyOf", "oneOf", "allOf", "$ref", "nullable", "minimum",
                                        "maximum", "exclusiveMinimum", "exclusiveMaximum"};

class SchemaConverter {
 public:
  SchemaConverter(const Json& root, std::string prefix) : root_(root), p_(std::move(prefix)) {}

  std::string run() {
    const std::string top = visit(root_, "schema");
    rules_.emplace_back(p_ + "root", top);
    return text();
  }

  std::string run_json_object() {
    rules_.emplace_back(p_ + "root", primitive("object"));
    return text();
  }

 private:
  template <class... Args>
  [[noreturn]] void error(const std::string& where, fmt::format_string<Args...> format, Args&&... args) const {
    fail("json_schema: {}{}", where.empty() ? "" : where + ": ", fmt::format(format, std::forward<Args>(args)...));
  }

  std::string text() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

  std::string add_rule(const std::string& name, const std::string& body) {
    rules_.emplace_back(name, body);
    return name;
  }

  std::string fresh(const std::string& hint) {
    std::string clean;
    for (char c : hint) clean.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    if (clean.size() > 40) clean.resize(40);
    return fmt::format("{}{}-{}", p_, clean, counter_++);
  }

  std::string ws() { return primitive("ws"); }

  // Shared primitives, emitted on first use.
  std::string primitive(const std::string& name) {
    const std::string rule = p_ + name;
    if (!emitted_.insert(name).second) return rule;
    if (name == "ws") {
      add_rule(rule, "[ \\t\\n]{0,20}");
    } else if (name == "char") {
      add_rule(rule, "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})");
    } else if (name == "string") {
      add_rule(rule, "\"\\\"\" " + primitive("char") + "* \"\\\"\"");
    } else if (name == "int-part") {
      add_rule(rule, "\"0\" | [1-9] [0-9]{0,15}");
    } else if (name == "integer") {
      add_rule(rule, "\"-\"? " + primitive("int-part"));
    } else if (name == "number") {
      add_rule(rule, "\"-\"? " + primitive("int-part") + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?");
    } else if (name == "boolean") {
      add_rule(rule, "\"true\" | \"false\"");
    } else if (name == "null") {
      add_rule(rule, "\"null\"");
    } else if (name == "value") {
      emitted_.insert("value");
      add_rule(rule, p_ + "object | " + p_ + "array | " + primitive("string") + " | " + primitive("number") + " | " +
                         primitive("boolean") + " | " + primitive("null"));
      primitive("object");
      primitive("array");
    } else if (name == "object") {
      const std::string kv = primitive("string") + " " + ws() + " \":\" " + ws() + " " + p_ + "value " + ws();
      add_rule(rule, "\"{\" " + ws() + " (" + kv + " (\",\" " + ws() + " " + kv + ")*)? \"}\"");
      primitive("value");
    } else if (name == "array") {
      const std::string item = p_ + "value " + ws();
      add_rule(rule, "\"[\" " + ws() + " (" + item + " (\",\" " + ws() + " " + item + ")*)? \"]\"");
      primitive("value");
    } else if (name == "date") {
      add_rule(rule, "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])");
    } else if (name == "time") {
      add_rule(rule, "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                     "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])");
    } else if (name == "date-time") {
      add_rule(rule, primitive("date") + " \"T\" " + primitive("time"));
    } else if (name == "uuid") {
      add_rule(rule, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
    } else if (name == "email") {
      add_rule(rule, "[a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} (\".\" [a-zA-Z0-9-]{1,63}){1,4}");
    } else {
      fail("json_schema: internal: no primitive '{}'", name);
    }
    return rule;
  }

  static std::string json_literal(const Json& v) { return gbnf_literal(v.dump()); }

  std::string any_of(const Json& list, const std::string& where, const char* keyword) {
    if (!list.is_array() || list.empty()) error(where, "'{}' must be a non-empty array", keyword);
    std::string out = "(";
    for (size_t i = 0; i < list.size(); ++i) {
      out += (i ? " | " : "") + visit(list[i], fmt::format("{}.{}[{}]", where, keyword, i));
    }
    return out + ")";
  }

  int count(const Json& s, const char* key, const std::string& where) {
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > 100000) {
      error(where, "'{}' must be an integer in [0, 100000]", key);
    }
    return v.get<int>();
  }

  static std::string repeat_bounds(int lo, int hi) { return hi < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi); }

  std::string visit(const Json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) error(where, "the schema 'false' matches nothing");
      return primitive("value");
    }
    if (!s.is_object()) error(where, "a schema must be an object or a boolean");
    for (const auto& [key, v] : s.items()) {
      if (!kIgnored.count(key) && !kHandled.count(key)) error(where, "unsupported keyword '{}'", key);
    }
    std::string expr = visit_typed(s, where);
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
      expr = "(" + expr + " | " + primitive("null") + ")";
    }
    return expr;
  }

  std::string visit_typed(const Json& s, const std::string& where) {
    if (s.contains("$ref")) return ref(s["$ref"], where);
    if (s.contains("const")) return json_literal(s["const"]);
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) error(where, "'enum' must be a non-empty array");
      std::string out = "(";
      for (size_t i = 0; i < e.size(); ++i) out += (i ? " | " : "") + json_literal(e[i]);
      return out + ")";
    }
    if (s.contains("anyOf")) return any_of(s["anyOf"], where, "anyOf");
    if (s.contains("oneOf")) return any_of(s["oneOf"], where, "oneOf");
    if (s.contains("allOf")) {
      const Json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) error(where, "'allOf' is supported with exactly one schema");
      return visit(a[0], where + ".allOf[0]");
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("additionalProperties")) return object(s, where);
      if (s.contains("items")) return array(s, where);
      return primitive("value");
    }
    const Json& type = s["type"];
    if (type.is_array()) {
      std::string out = "(";
      for (size_t i = 0; i < type.size(); ++i) {
        if (!type[i].is_string()) error(where, "'type' entries must be strings");
        out += (i ? " | " : "") + of_type(type[i].get<std::string>(), s, where);
      }
      return out + ")";
    }
    if (!type.is_string()) error(where, "'type' must be a string or a list of strings");
    return of_type(type.get<std::string>(), s, where);
  }

  std::string of_type(const std::string& type, const Json& s, const std::string& where) {
    if (type == "object") return object(s, where);
    if (type == "array") return array(s, where);
    if (type == "string") return string(s, where);
    if (type == "boolean") return primitive("boolean");
    if (type == "null") return primitive("null");
    if (type == "number" || type == "integer") {
      // Bounds: only the sign is enforced (a lower bound >= 0 forbids '-').
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k) && !s[k].is_number()) error(where, "'{}' must be a number", k);
      }
      const bool non_negative = (s.contains("minimum") && s["minimum"].get<double>() >= 0) ||
                                (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].get<double>() >= 0);
      if (!non_negative) return primitive(type);
      if (type == "integer") return primitive("int-part");
      return "(" + primitive("int-part") + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)";
    }
    error(where, "unsupported type '{}'", type);
  }

  std::string string(const Json& s, const std::string& where) {
    const std::string quote = "\"\\\"\"";
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) error(where, "'pattern' must be a string");
      try {
        return "(" + quote + " " + regex_expression(s["pattern"].get<std::string>(), true) + " " + quote + ")";
      } catch (const Error& e) {
        error(where, "pattern: {}", e.what());
      }
    }
    if (s.contains("format") && s["format"].is_string()) {
      const std::string f = s["format"].get<std::string>();
      if (f == "date" || f == "time" || f == "date-time" || f == "uuid" || f == "email") {
        return "(" + quote + " " + primitive(f) + " " + quote + ")";
      }
    }
    const int lo = s.contains("minLength") ? count(s, "minLength", where) : 0;
    const int hi = s.contains("maxLength") ? count(s, "maxLength", where) : -1;
    if (hi >= 0 && hi < lo) error(where, "maxLength < minLength");
    if (lo == 0 && hi < 0) return primitive("string");
    return "(" + quote + " " + primitive("char") + repeat_bounds(lo, hi) + " " + quote + ")";
  }

  std::string array(const Json& s, const std::string& where) {
    const std::string item = s.contains("items") ? visit(s["items"], where + ".items") : primitive("value");
    const int lo = s.contains("minItems") ? count(s, "minItems", where) : 0;
    const int hi = s.contains("maxItems") ? count(s, "maxItems", where) : -1;
    if (hi >= 0 && hi < lo) error(where, "maxItems < minItems");
    const std::string w = ws();
    const std::string more = "(\",\" " + w + " " + item + " " + w + ")";
    std::string body;
    if (hi == 0) {
      body = "\"[\" " + w + " \"]\"";
    } else {
      const std::string tail = more + repeat_bounds(std::max(lo, 1) - 1, hi < 0 ? -1 : hi - 1);
      const std::string items = item + " " + w + " " + tail;
      body = "\"[\" " + w + " " + (lo == 0 ? "(" + items + ")?" : items) + " \"]\"";
    }
    return add_rule(fresh(where_hint(where, "array")), body);
  }

  std::string object(const Json& s, const std::string& where) {
    const std::string w = ws();
    std::vector<std::pair<std::string, bool>> props;  // (key-value expression, required)
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) error(where, "'required' must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) error(where, "'required' entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) error(where, "'properties' must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        const std::string value = visit(sub, where + ".properties." + name);
        props.emplace_back(gbnf_literal(Json(name).dump()) + " " + w + " \":\" " + w + " " + value + " " + w,
                           required.count(name) > 0);
      }
    }
    for (const std::string& r : required) {
      if (!s.contains("properties") || !s["properties"].contains(r)) {
        error(where, "required property '{}' is not in 'properties'", r);
      }
    }
    // Additional properties: false by default when properties are listed (strict, as xgrammar).
    std::string extra;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        const std::string value = a.is_boolean() ? primitive("value") : visit(a, where + ".additionalProperties");
        extra = primitive("string") + " " + w + " \":\" " + w + " " + value + " " + w;
      }
    } else if (!s.contains("properties")) {
      extra = primitive("string") + " " + w + " \":\" " + w + " " + primitive("value") + " " + w;
    }
    // first[i]: properties i.. when none is written yet; rest[i]: when one is (so each
    // written property starts with ","). Linear in the number of properties.
    const std::string base = fresh(where_hint(where, "object"));
    const size_t n = props.size();
    std::vector<std::string> first(n + 1), rest(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      first[i] = fmt::format("{}-first-{}", base, i);
      rest[i] = fmt::format("{}-rest-{}", base, i);
    }
    add_rule(rest[n], extra.empty() ? "\"\"" : "(\",\" " + w + " " + extra + ")*");
    add_rule(first[n], extra.empty() ? "\"\"" : "(" + extra + " " + rest[n] + ")?");
    for (size_t k = n; k-- > 0;) {
      const auto& [kv, req] = props[k];
      const std::string with_comma = "\",\" " + w + " " + kv + " " + rest[k + 1];
      add_rule(rest[k], req ? with_comma : with_comma + " | " + rest[k + 1]);
      add_rule(first[k], req ? kv + " " + rest[k + 1] : kv + " " + rest[k + 1] + " | " + first[k + 1]);
    }
    return add_rule(base, "\"{\" " + w + " " + first[0] + " \"}\"");
  }

  static std::string where_hint(const std::string& where, const char* kind) {
    const size_t dot = where.rfind('.');
    return (dot == std::string::npos ? where : where.substr(dot + 1)) + "-" + kind;
  }

  std::string ref(const Json& r, const std::string& where) {
    if (!r.is_string()) error(where, "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    const auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') error(where, "only local $ref ('#/...') is supported, got '{}'", target);
    const Json* node = &root_;
    if (target.size() > 1) {
      try {
        node = &root_.at(Json::json_pointer(target.substr(1)));
      } catch (const std::exception&) {
        error(where, "$ref '{}' does not resolve", target);
      }
    }
    // Named before visiting, so recursive schemas refer to themselves.
    const std::string name = fresh("ref-" + target.substr(target.rfind('/') + 1));
    refs_.emplace(target, name);
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    const std::string body = visit(*node, target);
    rules_[slot].second = body;
    return name;
  }

  const Json& root_;
  std::string p_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> emitted_;
  std::map<std::string, std::string> refs_;
  int counter_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const GbnfOptions& options) {
  return SchemaConverter(schema, options.rule_prefix).run();
}

std::string json_object_gbnf(const GbnfOptions& options) {
  static const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  return SchemaConverter(empty, options.rule_prefix).run_json_object();
}

}  // namespace hack::grammar
