// Targeted tests of the Jinja interpreter: statements, whitespace control, Python value
// semantics, error messages with positions, and the render limits. Expected strings were
// produced by jinja2 configured like transformers (see scripts/make_chat_goldens.py); the
// goldens in chat_template_test.cpp cover the same ground much more widely.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "hack/tokenizer/jinja.h"
#include "hack/tokenizer/jinja_value.h"

namespace {

using hack::jinja::RenderOptions;
using hack::jinja::Template;
using hack::jinja::Value;

constexpr int64_t kNow = 1721989800;  // 2024-07-26 10:30:00 UTC

std::string render(const std::string& source, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object(),
                   RenderOptions options = {}) {
  const auto t = Template::parse(source, "test");
  hack::jinja::Variables variables;
  for (const auto& [key, value] : vars.items()) variables.emplace_back(key, hack::jinja::value_from_json(value));
  if (!options.now_unix_s) options.now_unix_s = kNow;
  return t.render(variables, options);
}

std::string parse_error(const std::string& source) {
  try {
    (void)Template::parse(source, "test");
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "(parsed)";
}

std::string render_error(const std::string& source, RenderOptions options = {}) {
  try {
    (void)render(source, nlohmann::ordered_json::object(), options);
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "(rendered)";
}

}  // namespace

TEST_CASE("whitespace control matches trim_blocks + lstrip_blocks", "[jinja]") {
  CHECK(render("{% if true %}\n  yes\n{% endif %}\nend") == "  yes\nend");
  CHECK(render("<{%- if true -%}>\n  x  \n<{%- endif -%}>") == "<>\n  x  \n<>");
  CHECK(render("a\n    {% for i in [1, 2] %}\n    {{ i }}\n    {% endfor %}\nb") == "a\n    1\n    2\nb");
  CHECK(render("a {{- ' b ' -}} c") == "a b c");
  CHECK(render("x{# c #}y") == "xy");
  CHECK(render("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
  CHECK(render("one trailing newline is dropped\n") == "one trailing newline is dropped");
  CHECK(render("a\r\nb\rc") == "a\nb\nc");
}

TEST_CASE("statements: if / for / set / macro / call / filter / with", "[jinja]") {
  CHECK(render("{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(b=5, a=4) }}") ==
        "1-2 1-3 4-5");
  CHECK(render("{% set ns = namespace(n=0) %}{% for x in 'abc' %}{% set ns.n = ns.n + loop.index %}{% endfor %}"
               "{{ ns.n }}") == "6");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% if not loop.last %},{% endif %}"
               "{% endfor %}") == "a1,b2");
  CHECK(render("{{ messages[::-1] | map(attribute='role') | join(',') }}",
               {{"messages", {{{"role", "a"}}, {{"role", "b"}}, {{"role", "c"}}}}}) == "c,b,a");
  CHECK(render("{% filter trim %}  z  {% endfilter %}") == "z");
  CHECK(render("{% set s %}a{{ 1 }}b{% endset %}{{ s }}") == "a1b");
  CHECK(render("{% for i in range(5) %}{% if i is odd %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
               "{% endif %}{{ i }}{% endfor %}") == "02");
  CHECK(render("{% macro w() %}[{{ caller('x') }}]{% endmacro %}{% call(v) w() %}<{{ v }}>{% endcall %}") == "[<x>]");
  CHECK(render("{% with a = 1 %}{{ a }}{% endwith %}{{ a is defined }}") == "1False");
  CHECK(render("{% generation %}g{% endgeneration %}") == "g");
  // a set inside a loop body does not leak; inside an if it does
  CHECK(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"
               "{% if true %}{% set x = 3 %}{% endif %}{{ x }}") == "13");
}

TEST_CASE("undefined behaves like jinja2's default Undefined", "[jinja]") {
  CHECK(render("{{ x }}|{{ x is defined }}|{{ x|default('d') }}|{% for i in x %}no{% endfor %}|{{ x|length }}|"
               "{{ 'y' if x else 'n' }}|{{ none.attr is defined }}") == "|False|d||0|n|False");
  CHECK_THROWS_WITH(render("{{ x.attr }}"), Catch::Contains("'x' is undefined"));
  CHECK_THROWS_WITH(render("{{ x.attr is defined }}"), Catch::Contains("'x' is undefined"));
  CHECK_THROWS_WITH(render("{{ x + 1 }}"), Catch::Contains("'x' is undefined"));
  CHECK(render("{{ 'a' ~ x ~ 'b' }}") == "ab");
}

TEST_CASE("values print like Python", "[jinja]") {
  CHECK(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e22 }} {{ 123e-20 }} {{ 100.0 }} {{ 3.0e16 }} {{ -1.5e-5 }}") ==
        "1.0 0.30000000000000004 1e+22 1.23e-18 100.0 3e+16 -1.5e-05");
  CHECK(render(R"({{ ['it\'s', "say \"hi\"", 'both \' "', 'tab\t', 'é'] }})") ==
        R"(["it's", 'say "hi"', 'both \' "', 'tab\t', 'é'])");
  CHECK(render("{{ none }} {{ true }} {{ (1,) }} {{ {'a': none} }}") == "None True (1,) {'a': None}");
  CHECK(hack::jinja::py_float_repr(1e16) == "1e+16");
  CHECK(hack::jinja::py_float_repr(9999999999999998.0) == "9999999999999998.0");
  CHECK(hack::jinja::py_float_repr(0.0001) == "0.0001");
  CHECK(hack::jinja::py_float_repr(0.00001) == "1e-05");
  CHECK(hack::jinja::py_float_repr(-0.0) == "-0.0");
  CHECK(hack::jinja::py_float_repr(5e-324) == "5e-324");
}

TEST_CASE("tojson is json.dumps(ensure_ascii=False)", "[jinja]") {
  CHECK(render("{{ {'a': [1, 2.0, none, true], 'b': {'c': 'é\\n'}} | tojson(indent=2) }}") ==
        "{\n  \"a\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"b\": {\n    \"c\": \"é\\n\"\n  }\n}");
  CHECK(render("{{ v | tojson }}", {{"v", {{"k", {1, {{"x", "y"}}}}}}}) == R"({"k": [1, {"x": "y"}]})");
  CHECK(render("{{ 'é🚀' | tojson(ensure_ascii=true) }}") == R"("\u00e9\ud83d\ude80")");
  CHECK_THROWS_WITH(render("{{ nothing | tojson }}"), Catch::Contains("not JSON serializable"));
}

TEST_CASE("strftime_now is deterministic when the time is given", "[jinja]") {
  CHECK(render("{{ strftime_now('%d %b %Y') }}") == "26 Jul 2024");
  CHECK(render("{{ strftime_now('%Y-%m-%dT%H:%M:%S') }}") == "2024-07-26T10:30:00");
  RenderOptions live;
  live.now_unix_s.reset();
  CHECK(Template::parse("{{ strftime_now('%Y')|length }}", "t").render({}, live) == "4");
}

TEST_CASE("parse errors name the construct and its line and column", "[jinja]") {
  CHECK(parse_error("line1\nline2\n  {% extends 'base.html' %}") ==
        "test: unsupported Jinja tag 'extends' at line 3, column 6");
  for (const char* tag : {"include", "import", "from", "block", "autoescape", "do"}) {
    INFO(tag);
    CHECK_THAT(parse_error(std::string("{% ") + tag + " x %}"), Catch::Contains(std::string("unsupported Jinja tag '") + tag));
  }
  CHECK(parse_error("{{ x | nosuch }}") == "test: no filter named 'nosuch' at line 1, column 8");
  CHECK_THAT(parse_error("{{ x | groupby('a') }}"), Catch::Contains("unsupported Jinja filter 'groupby'"));
  CHECK_THAT(parse_error("{{ x is nosuch }}"), Catch::Contains("no test named 'nosuch'"));
  CHECK_THAT(parse_error("a\n{% if x %}\nb"),
             Catch::Contains("expected 'elif' or 'else' or 'endif' to close 'if' opened at line 2"));
  CHECK_THAT(parse_error("{% for x in y %}{% endif %}"), Catch::Contains("unexpected tag 'endif'"));
  CHECK_THAT(parse_error("{% endfor %}"), Catch::Contains("unexpected tag 'endfor' (nothing to close) at line 1"));
  CHECK_THAT(parse_error("{% frobnicate %}"), Catch::Contains("unknown Jinja tag 'frobnicate'"));
  CHECK_THAT(parse_error("{% for x in y recursive %}{% endfor %}"), Catch::Contains("'recursive' loops"));
  CHECK_THAT(parse_error("{% break %}"), Catch::Contains("'break' outside of a loop"));
  CHECK_THAT(parse_error("{{ x"), Catch::Contains("unclosed variable tag"));
  CHECK_THAT(parse_error("ok\n{# never closed"), Catch::Contains("missing end of comment tag at line 2, column 1"));
  CHECK_THAT(parse_error("{{ 'abc }}"), Catch::Contains("unexpected char"));
  CHECK_THAT(parse_error("{{ a @ b }}"), Catch::Contains("unexpected char '@' at line 1, column 6"));
  CHECK_THAT(parse_error("{{ }}"), Catch::Contains("expected an expression"));
  CHECK_THAT(parse_error("{{ (1] }}"), Catch::Contains("unexpected ']'"));
  CHECK_THAT(parse_error("{% set 1 = 2 %}"), Catch::Contains("cannot assign"));
  CHECK_THAT(parse_error("{{ 'a' '\\xZZ' }}"), Catch::Contains("truncated \\x escape"));
  CHECK_THAT(parse_error("{{ f(a=1, 2) }}"), Catch::Contains("positional argument follows keyword argument"));
  CHECK_THAT(parse_error("{{ 99999999999999999999 }}"), Catch::Contains("integer literal too large"));
  CHECK_THAT(parse_error("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"), Catch::Contains("nested too deeply"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 1000; ++i) chain += " + 1";
  CHECK_THAT(parse_error(chain + " }}"), Catch::Contains("nested too deeply"));
}

TEST_CASE("runtime errors name the construct and line and raise_exception carries its text", "[jinja]") {
  CHECK_THAT(render_error("ok\n{{ 'a' + none }}"),
             Catch::Contains("can only concatenate str (not \"NoneType\") to str at line 2"));
  CHECK_THAT(render_error("{{ 1 // 0 }}"), Catch::Contains("integer division or modulo by zero at line 1"));
  CHECK_THAT(render_error("{{ 3() }}"), Catch::Contains("'int' object is not callable"));
  CHECK_THAT(render_error("{% set x = 1 %}{% set x.y = 2 %}"), Catch::Contains("non-namespace"));
  CHECK_THAT(render_error("{{ 'x'.encode() }}"), Catch::Contains("unsupported string method 'encode'"));
  try {
    (void)render("{% if true %}\n  {{ raise_exception('Roles must alternate') }}\n{% endif %}");
    FAIL("no exception");
  } catch (const hack::jinja::TemplateRaised& e) {
    CHECK(e.message() == "Roles must alternate");
    CHECK_THAT(e.what(), Catch::Contains("test raised an exception: Roles must alternate (at line 2"));
  }
}

TEST_CASE("render limits stop runaway templates with an error", "[jinja]") {
  RenderOptions small;
  small.limits.max_output_bytes = 1000;
  CHECK_THAT(render_error("{% for i in range(1000) %}xx{% endfor %}", small), Catch::Contains("exceeds 1000 bytes"));
  CHECK_THAT(render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                          "{% endfor %}",
                          small),
             Catch::Contains("too long"));
  CHECK_THAT(render_error("{{ 'a' * 1000000000000 }}", small), Catch::Contains("string too long"));
  CHECK_THAT(render_error("{{ ([1] * 100000000000)|length }}"), Catch::Contains("list too long"));

  RenderOptions few_steps;
  few_steps.limits.max_steps = 10000;
  CHECK_THAT(render_error("{% for i in range(100000) %}{% endfor %}", few_steps), Catch::Contains("step budget"));
  CHECK_THAT(render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", few_steps),
             Catch::Contains("step budget"));

  CHECK_THAT(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
             Catch::Contains("nested deeper than 100"));
  RenderOptions shallow;
  shallow.limits.max_eval_depth = 50;
  CHECK_THAT(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", shallow),
             Catch::Contains("nested too deeply"));
  CHECK_THAT(render_error("{% set ns = namespace(a=1) %}{% set ns.self = ns %}"),
             Catch::Contains("cannot hold a Namespace"));
  CHECK_THAT(render_error("{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}"),
             Catch::Contains("nested deeper than 256"));
}

TEST_CASE("values convert to and from JSON", "[jinja]") {
  const auto json = nlohmann::ordered_json::parse(R"({"z": [1, 2.5, null, true, "s"], "a": {}})");
  const Value v = hack::jinja::value_from_json(json);
  CHECK(v.is_dict());
  CHECK(hack::jinja::value_to_json(v) == json);
  CHECK(hack::jinja::py_repr(v) == "{'z': [1, 2.5, None, True, 's'], 'a': {}}");
  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 300; ++i) deep = nlohmann::ordered_json::array({deep});
  CHECK_THROWS_AS(hack::jinja::value_from_json(deep), hack::Error);
}

TEST_CASE("jinja2 quirks are kept: generators, Markup, block scopes", "[jinja]") {
  // select / map / unique / reverse return generators: always truthy, no len()
  CHECK(render("{{ 'T' if []|select('odd') else 'F' }} {{ [3, 1]|reverse|join }}") == "T 13");
  CHECK_THROWS_WITH(render("{{ [1, 2]|select('odd')|length }}"), Catch::Contains("has no len()"));
  // ... whose errors only surface when iterated
  CHECK(render("{% set g = 5|items %}ok") == "ok");
  CHECK_THROWS_WITH(render("{{ 5|items|list }}"), Catch::Contains("Can only get item pairs from a mapping"));
  // Markup + str escapes the str
  CHECK(render("{{ ('<b>'|safe) + '<i>' }} {{ ('a'|e) ~ '<' }}") == "<b>&lt;i&gt; a<");
  // set / filter blocks have their own scope; if does not
  CHECK(render("{% set b %}{% set y = 1 %}{% endset %}[{{ y }}]{% if true %}{% set z = 2 %}{% endif %}[{{ z }}]") ==
        "[][2]");
  // `-1 ** y` is Python's -(1 ** y) in jinja2's generated code
  CHECK(render("{{ -1 ** y }} {{ -x ** 2 }}", {{"y", false}, {"x", -1}}) == "-1 1");
}
