// JSON Schema, regex and choice to GBNF: the matcher accepts every instance generated from
// the schema, and every string it accepts (mutations of valid instances included) parses
// as JSON and validates under an independent checker written here from the schema.
#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/grammar/json_schema.h"
#include "hack/grammar/matcher.h"

using namespace hack::grammar;
using Json = nlohmann::ordered_json;

namespace {

GrammarMatcher matcher_for(const std::string& gbnf) {
  auto g = std::make_shared<const CompiledGrammar>(compile_gbnf(gbnf));
  return GrammarMatcher(std::make_shared<GrammarStateTable>(g, nullptr));
}

bool accepts(GrammarMatcher m, std::string_view s) { return m.accept_bytes(s) && m.can_end(); }

const Json kSchema = Json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0},
    "score": {"type": "number"},
    "role": {"enum": ["admin", "user", null]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
    "address": {"$ref": "#/$defs/address"},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "role", "tags"],
  "additionalProperties": false,
  "$defs": {
    "address": {"type": "object",
                "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "city": {"type": "string"}},
                "required": ["zip"]}
  }
})");

// The independent checker: what kSchema means, written directly.
bool valid_string(const Json& v, size_t lo, size_t hi) {
  if (!v.is_string()) return false;
  // Length in code points.
  size_t n = 0;
  for (unsigned char c : v.get<std::string>()) n += (c & 0xC0) != 0x80;
  return n >= lo && n <= hi;
}

bool valid_instance(const std::string& text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception&) {
    return false;
  }
  if (!j.is_object()) return false;
  for (const char* k : {"name", "age", "role", "tags"}) {
    if (!j.contains(k)) return false;
  }
  for (const auto& [k, v] : j.items()) {
    if (k == "name") {
      if (!valid_string(v, 1, 12)) return false;
    } else if (k == "age") {
      if (!v.is_number_integer() || v.get<long long>() < 0) return false;
    } else if (k == "score") {
      if (!v.is_number()) return false;
    } else if (k == "role") {
      if (!(v.is_null() || v == "admin" || v == "user")) return false;
    } else if (k == "tags") {
      if (!v.is_array() || v.empty() || v.size() > 3) return false;
      for (const Json& t : v) {
        if (!valid_string(t, 0, 5)) return false;
      }
    } else if (k == "address") {
      if (!v.is_object() || !v.contains("zip")) return false;
      for (const auto& [ak, av] : v.items()) {
        if (ak == "zip") {
          if (!av.is_string() || !std::regex_match(av.get<std::string>(), std::regex("[0-9]{5}"))) return false;
        } else if (ak == "city") {
          if (!av.is_string()) return false;
        } else {
          return false;
        }
      }
    } else if (k == "active") {
      if (!v.is_boolean()) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string random_text(std::mt19937& rng, int lo, int hi) {
  static const std::vector<std::string> pieces = {"a", "Z", "7", " ", "\xC3\xA9", "\xE2\x82\xAC", "\"", "\\", "\n", "/"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(lo, hi)(rng);
  for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
  return s;
}

// A valid instance of kSchema, properties in schema order, random optional ones.
Json random_instance(std::mt19937& rng) {
  Json j = Json::object();
  j["name"] = random_text(rng, 1, 12);
  j["age"] = static_cast<int>(rng() % 100000);
  if (rng() % 2) j["score"] = std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
  const int role = static_cast<int>(rng() % 3);
  j["role"] = role == 0 ? Json("admin") : role == 1 ? Json("user") : Json(nullptr);
  j["tags"] = Json::array();
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) j["tags"].push_back(random_text(rng, 0, 5));
  if (rng() % 2) {
    Json a = Json::object();
    a["zip"] = fmt::format("{:05}", rng() % 100000);
    if (rng() % 2) a["city"] = random_text(rng, 0, 8);
    j["address"] = a;
  }
  if (rng() % 2) j["active"] = rng() % 2 == 0;
  return j;
}

}  // namespace

TEST_CASE("json_schema: generated instances are accepted, accepted mutations validate", "[grammar]") {
  const uint64_t seed = 20261125;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::string gbnf = json_schema_to_gbnf(kSchema);
  INFO(gbnf);
  const GrammarMatcher start = matcher_for(gbnf);
  int accepted_mutants = 0, rejected_mutants = 0;
  for (int i = 0; i < 300; ++i) {
    const Json inst = random_instance(rng);
    const std::string compact = inst.dump();
    const std::string pretty = inst.dump(2);
    REQUIRE(valid_instance(compact));
    CHECK(accepts(start, compact));
    CHECK(accepts(start, pretty));
    for (int k = 0; k < 20; ++k) {
      std::string m = compact;
      const size_t at = rng() % m.size();
      static const std::string alphabet = "{}[],:\"0123456789.-eE abtrufnl\\";
      switch (rng() % 3) {
        case 0: m.erase(at, 1); break;
        case 1: m.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        default: m[at] = alphabet[rng() % alphabet.size()];
      }
      if (accepts(start, m)) {
        ++accepted_mutants;
        INFO(m);
        CHECK(valid_instance(m));
      } else {
        ++rejected_mutants;
      }
    }
  }
  // The corpus exercises both sides.
  CHECK(accepted_mutants > 100);
  CHECK(rejected_mutants > 1000);
}

TEST_CASE("json_schema: property order, optional properties and strictness", "[grammar]") {
  const GrammarMatcher m = matcher_for(json_schema_to_gbnf(Json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},"c":{"type":"null"}},"required":["b"]})")));
  CHECK(accepts(m, R"({"b":true})"));
  CHECK(accepts(m, R"({"a":1,"b":false,"c":null})"));
  CHECK(accepts(m, R"({ "a" : -0 , "b":true })"));
  CHECK_FALSE(accepts(m, R"({"a":1})"));               // b is required
  CHECK_FALSE(accepts(m, R"({"b":true,"a":1})"));      // fixed order
  CHECK_FALSE(accepts(m, R"({"b":true,"d":1})"));      // no additional properties
  CHECK_FALSE(accepts(m, R"({"a":01,"b":true})"));     // no leading zeros
  CHECK_FALSE(accepts(m, "{" + std::string(21, ' ') + R"("b":true})"));  // whitespace is bounded
  const GrammarMatcher open = matcher_for(json_schema_to_gbnf(Json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})")));
  CHECK(accepts(open, R"({"a":1,"x":[1,{"y":"z"}]})"));
  CHECK(accepts(open, R"({"x":2})"));
}

TEST_CASE("json_schema: strings, formats, anyOf, const, recursion", "[grammar]") {
  auto m = [](const char* schema) { return matcher_for(json_schema_to_gbnf(Json::parse(schema))); };
  CHECK(accepts(m(R"({"type":"string","format":"date"})"), R"("2024-02-29")"));
  CHECK_FALSE(accepts(m(R"({"type":"string","format":"date"})"), R"("2024-13-01")"));
  CHECK(accepts(m(R"({"type":"string","format":"date-time"})"), R"("2024-02-29T12:30:00.5Z")"));
  CHECK(accepts(m(R"({"type":"string","format":"uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK(accepts(m(R"({"type":"string","format":"email"})"), R"("a.b@example.com")"));
  CHECK_FALSE(accepts(m(R"({"type":"string","format":"email"})"), R"("nobody")"));
  CHECK(accepts(m(R"({"type":"string","pattern":"^a\\d+(x|yz)?$"})"), R"("a12yz")"));
  CHECK_FALSE(accepts(m(R"({"type":"string","pattern":"^a\\d+(x|yz)?$"})"), R"("a12y")"));
  CHECK(accepts(m(R"({"type":"string","pattern":"q\"\\\\"})"), R"("q\"\\")"));  // JSON-escaped in the output
  CHECK(accepts(m(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"const":"k"},"maxItems":2}]})"), R"(["k","k"])"));
  CHECK_FALSE(accepts(m(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"const":"k"},"maxItems":2}]})"), R"(["k","k","k"])"));
  CHECK(accepts(m(R"({"type":["string","null"]})"), "null"));
  CHECK(accepts(m(R"({"type":"array","maxItems":0})"), "[]"));
  const char* tree = R"({"$ref":"#/definitions/node","definitions":{"node":{"type":"object",
      "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/definitions/node"}}},"required":["v"]}}})";
  CHECK(accepts(m(tree), R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  CHECK(accepts(matcher_for(json_object_gbnf()), R"({"a": [1, 2.5e-3, true, null, {"b": "c"}]})"));
  CHECK_FALSE(accepts(matcher_for(json_object_gbnf()), R"([1])"));
}

TEST_CASE("json_schema: unsupported keywords and bad values are named", "[grammar]") {
  auto error_of = [](const char* schema) -> std::string {
    try {
      json_schema_to_gbnf(Json::parse(schema));
    } catch (const hack::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of(R"({"type":"object","properties":{"a":{"type":"integer","multipleOf":3}}})"),
             Catch::Contains("schema.properties.a") && Catch::Contains("'multipleOf'"));
  CHECK_THAT(error_of(R"({"not":{"type":"string"}})"), Catch::Contains("unsupported keyword 'not'"));
  CHECK_THAT(error_of(R"({"type":"strin"})"), Catch::Contains("unsupported type 'strin'"));
  CHECK_THAT(error_of(R"({"$ref":"#/$defs/missing"})"), Catch::Contains("does not resolve"));
  CHECK_THAT(error_of(R"({"$ref":"http://x/y"})"), Catch::Contains("only local $ref"));
  CHECK_THAT(error_of(R"({"type":"string","pattern":"(a)\\1"})"), Catch::Contains("backreferences"));
  CHECK_THAT(error_of(R"({"type":"object","required":["x"]})"), Catch::Contains("'x'"));
  CHECK_THAT(error_of(R"({"type":"array","minItems":3,"maxItems":1})"), Catch::Contains("maxItems < minItems"));
}

TEST_CASE("regex and choice grammars", "[grammar]") {
  const GrammarMatcher phone = matcher_for(regex_to_gbnf(R"(^\(\d{3}\) \d{3}-\d{4}$)"));
  CHECK(accepts(phone, "(555) 123-4567"));
  CHECK_FALSE(accepts(phone, "555-123-4567"));
  const GrammarMatcher words = matcher_for(regex_to_gbnf(R"([A-Z][a-z]*( [a-z]+)*\.)"));
  CHECK(accepts(words, "Hello big world."));
  CHECK_FALSE(accepts(words, "hello."));
  const GrammarMatcher any = matcher_for(regex_to_gbnf(R"(a.c|[^x-z]{2}\w\s?)"));
  CHECK(accepts(any, "a\xE2\x82\xAC" "c"));
  CHECK(accepts(any, "ab_ "));
  CHECK_FALSE(accepts(any, "xb_"));
  const GrammarMatcher choice = matcher_for(choice_to_gbnf({"yes", "no", "maybe \"so\""}));
  CHECK(accepts(choice, "yes"));
  CHECK(accepts(choice, "maybe \"so\""));
  CHECK_FALSE(accepts(choice, "ye"));
  CHECK_THROWS_WITH(regex_to_gbnf("(?=a)"), Catch::Contains("lookaround"));
  CHECK_THROWS_WITH(choice_to_gbnf({}), Catch::Contains("empty"));
  // A prefix keeps every rule name apart, so the rules embed in a larger grammar.
  const std::string embedded = json_schema_to_gbnf(Json::parse(R"({"type":"object","properties":{"x":{"type":"number"}}})"),
                                                   GbnfOptions{"tool-"});
  CHECK(accepts(matcher_for("root ::= \"<call>\" tool-root \"</call>\"\n" + embedded), R"(<call>{"x":1.5}</call>)"));
}
