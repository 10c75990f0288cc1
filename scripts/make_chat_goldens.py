#!/usr/bin/env python3
"""Generates tests/fixtures/chat/goldens.json: chat templates rendered by Python jinja2,
configured exactly as transformers' apply_chat_template configures it, as the independent
reference for hackserve's own Jinja interpreter (tests/unit/tokenizer/chat_template_test.cpp).

The environment mirrors transformers.utils.chat_template_utils._compile_jinja_template:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
with transformers' tojson (json.dumps, ensure_ascii=False), raise_exception, strftime_now
(fixed to NOW here), dict and namespace globals; messages get transformers'
_alias_reasoning_fields preprocessing and tools / documents are always passed (None when
absent). When transformers is installed, every case is also rendered through its own
render_jinja_template and must agree.

Output:
  templates: name -> template text (embedded, so the test needs nothing else)
  cases:     {template, name, messages, options, expected | error}
  snippets:  {name, template, vars, expected | error} - small templates that pin down one
             construct each (filters, tests, whitespace control, operators, ...)
  error = {"raised": message} when the template called raise_exception(message), else
          {"python": message} (our message differs; only failure is required).

Usage: python3 scripts/make_chat_goldens.py   (from the repository root)
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "tests" / "fixtures" / "shared" / "tokenizers"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat" / "templates"
OUT = ROOT / "tests" / "fixtures" / "chat" / "goldens.json"

NOW = datetime.datetime(2024, 7, 26, 10, 30, 0)  # strftime_now() in every golden
NOW_UNIX_S = int(NOW.replace(tzinfo=datetime.timezone.utc).timestamp())


# ---- the transformers environment ----------------------------------------------------
def make_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")

    class GenerationTag(jinja2.ext.Extension):
        # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


ENV = make_env()
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def alias_reasoning_fields(chat):
    out = []
    for message in chat:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(template: str, messages, options: dict):
    """Returns {"expected": text} or {"error": {...}} like the C++ side must produce."""
    kwargs = {}
    for key in ("bos_token", "eos_token"):
        if options.get(key) is not None:
            kwargs[key] = options[key]
    kwargs.update(options.get("extra_kwargs") or {})
    try:
        text = ENV.from_string(template).render(
            messages=alias_reasoning_fields(messages),
            tools=options.get("tools"),
            documents=options.get("documents"),
            add_generation_prompt=options.get("add_generation_prompt", False),
            **kwargs,
        )
        return {"expected": text}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception()
            return {"error": {"raised": e.message}}
        return {"error": {"python": f"{type(e).__name__}: {e}"}}
    except Exception as e:  # TypeError etc. from the template's own operations
        return {"error": {"python": f"{type(e).__name__}: {e}"}}


def cross_check_with_transformers(template: str, messages, options: dict, result: dict):
    try:
        import transformers.utils.chat_template_utils as ctu
    except Exception:
        return
    if not hasattr(cross_check_with_transformers, "patched"):
        class FixedDatetime(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return NOW

        ctu.datetime = FixedDatetime
        ctu._cached_compile_jinja_template.cache_clear() if hasattr(ctu._cached_compile_jinja_template, "cache_clear") else None
        cross_check_with_transformers.patched = True
    kwargs = {}
    for key in ("bos_token", "eos_token"):
        if options.get(key) is not None:
            kwargs[key] = options[key]
    kwargs.update(options.get("extra_kwargs") or {})
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[messages],
            tools=options.get("tools"),
            documents=options.get("documents"),
            chat_template=template,
            add_generation_prompt=options.get("add_generation_prompt", False),
            **kwargs,
        )
        got = {"expected": rendered[0]}
    except Exception as e:  # noqa: BLE001
        got = {"error": str(e)}
    if "expected" in result or "expected" in got:
        if got.get("expected") != result.get("expected"):
            raise SystemExit(f"transformers disagrees with the reference environment:\n{got}\n{result}")
    cross_check_with_transformers.count = getattr(cross_check_with_transformers, "count", 0) + 1


# ---- templates -------------------------------------------------------------------------
def load_templates() -> dict:
    templates = {}
    for name in ("qwen3", "mistral"):
        cfg = SHARED / name / "tokenizer_config.json"
        if cfg.exists():
            data = json.loads(cfg.read_text())
            if isinstance(data.get("chat_template"), str):
                templates[name] = {"source": str(cfg.relative_to(ROOT.parent)), "template": data["chat_template"]}
    kjv = ROOT / "tests" / "fixtures" / "tokenizers" / "kjv-bpe" / "tokenizer_config.json"
    if kjv.exists():
        data = json.loads(kjv.read_text())
        if isinstance(data.get("chat_template"), str):
            templates["kjv-bpe"] = {"source": str(kjv.relative_to(ROOT)), "template": data["chat_template"]}
    for path in sorted(TEMPLATES.glob("*.jinja")):
        templates[path.stem] = {"source": str(path.relative_to(ROOT)), "template": path.read_text()}
    return templates


SPECIAL_TOKENS = {
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-v0.1": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "qwen2.5": {"eos_token": "<|im_end|>"},
    "qwen3": {"eos_token": "<|im_end|>"},
    "chatml": {"eos_token": "<|im_end|>"},
    "kjv-bpe": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "constructs": {"bos_token": "<s>"},
}


# ---- conversations ---------------------------------------------------------------------
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
        "return": {"type": "string"},
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — returns snippets (ünïcödé).",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}},
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def call(name, arguments, id_="call12345"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731


def conversations():
    """(name, messages, options) for every template; options default to no tools."""
    weather_call = call("get_weather", {"city": "Paris", "unit": "celsius"}, "abc123XYZ")
    yield "user", [U("Hello!")], {"add_generation_prompt": True}
    yield "user-no-gen", [U("Hello!")], {}
    yield "system-user", [S("You are terse."), U("What is 2+2?")], {"add_generation_prompt": True}
    yield "multi-turn", [S("Be nice."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")], {"add_generation_prompt": True}
    yield "assistant-last", [U("Hi"), A("Hello there.")], {}
    yield "assistant-last-gen", [U("Hi"), A("Hello there.")], {"add_generation_prompt": True}
    yield "empty-content", [U(""), A(""), U("")], {"add_generation_prompt": True}
    yield "unicode", [U("Grüße, 世界! 🚀 — «ñ» \u00a0 עברית"), A("¡Hola! 😀"), U("日本語で答えて")], {"add_generation_prompt": True}
    yield "whitespace", [U("  leading and trailing  \n\n"), A("\n\nanswer\n  "), U("\tline1\nline2\n")], {"add_generation_prompt": True}
    yield "special-chars", [U('Quotes "double" \'single\' \\backslash {{ braces }} {% tag %} {# c #} <|im_end|>'), A('{"json": [1, 2]}'), U("</s>[INST]")], {"add_generation_prompt": True}
    yield "long", [S("sys")] + [m for i in range(6) for m in (U(f"question {i}"), A(f"answer {i}"))] + [U("last")], {"add_generation_prompt": True}
    yield "system-only", [S("Only a system prompt.")], {"add_generation_prompt": True}
    yield "empty-messages", [], {"add_generation_prompt": True}
    yield "two-users", [U("one"), U("two")], {"add_generation_prompt": True}
    yield "assistant-first", [A("I start."), U("ok")], {"add_generation_prompt": True}
    yield "tools-user", [U("Weather in Paris?")], {"add_generation_prompt": True, "tools": TOOLS}
    yield "tools-system-user", [S("You can call tools."), U("Weather in Paris?")], {"add_generation_prompt": True, "tools": TOOLS}
    yield "tool-call-roundtrip", [
        S("You can call tools."), U("Weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "22 degrees, sunny"},
        A("It is 22°C and sunny in Paris."), U("Thanks! And London?"),
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "tool-call-null-content", [
        U("Weather in Paris?"),
        {"role": "assistant", "content": None, "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "22 degrees"},
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "tool-call-string-args", [
        U("Search for cats"),
        {"role": "assistant", "content": "", "tool_calls": [call("search", '{"query": "cats", "top_k": 2}', "srch12345")]},
        {"role": "tool", "tool_call_id": "srch12345", "content": '["cat facts", "cat pics"]'},
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "parallel-tool-calls", [
        U("Weather in Paris and Rome?"),
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            call("get_weather", {"city": "Paris"}, "paris1234"), call("get_weather", {"city": "Rome"}, "rome12345")]},
        {"role": "tool", "tool_call_id": "paris1234", "content": "20C"},
        {"role": "tool", "tool_call_id": "rome12345", "content": "28C"},
        A("Paris 20C, Rome 28C."),
    ], {"add_generation_prompt": False, "tools": TOOLS}
    yield "tool-args-types", [
        U("Do it"),
        {"role": "assistant", "content": "", "tool_calls": [call("search", {
            "query": "naïve café ☕", "top_k": 5, "ratio": 0.1, "big": 1e20, "tiny": 1.5e-7, "whole": 2.0,
            "neg": -3, "flag": True, "none": None, "list": [1, "two", [3.5]], "nested": {"z": 1, "a": {"b": []}}}, "types1234")]},
        {"role": "tool", "tool_call_id": "types1234", "content": "done"},
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "bad-tool-call-id", [
        U("Weather?"),
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Oslo"}, "short")]},
        {"role": "tool", "tool_call_id": "short", "content": "cold"},
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "tool-result-dict", [
        U("Weather?"),
        {"role": "assistant", "content": "", "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": {"temp": 22, "sky": "clear"}},
    ], {"add_generation_prompt": True, "tools": TOOLS}
    yield "content-parts", [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": "this"}]}], {"add_generation_prompt": True}
    yield "reasoning-content", [
        U("What is 7*6?"), {"role": "assistant", "content": "42", "reasoning_content": "7 times 6 is 42."}, U("And 8*6?"),
    ], {"add_generation_prompt": True}
    yield "reasoning-last-turn", [
        U("What is 7*6?"), {"role": "assistant", "content": "42", "reasoning_content": "\n7 times 6 is 42.\n"},
    ], {}
    yield "think-in-content", [
        U("Hi"), A("<think>\nThe user greets.\n</think>\n\nHello!"), U("Bye"), A("<think>short</think>Goodbye."),
    ], {}
    yield "thinking-alias", [U("Q"), {"role": "assistant", "content": "A", "thinking": "pondering"}, U("Q2")], {"add_generation_prompt": True}
    yield "enable-thinking-false", [U("Quick answer please")], {"add_generation_prompt": True, "extra_kwargs": {"enable_thinking": False}}
    yield "enable-thinking-true", [U("Think hard")], {"add_generation_prompt": True, "extra_kwargs": {"enable_thinking": True}}
    yield "multi-step-tools", [
        U("Plan a trip"),
        {"role": "assistant", "content": "<think>need weather</think>Let me check.", "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "<tool_response>sunny</tool_response>"},
        {"role": "assistant", "content": "", "reasoning_content": "now search", "tool_calls": [call("search", {"query": "Paris hotels"}, "srch12345")]},
        {"role": "tool", "tool_call_id": "srch12345", "content": "Hotel A"},
    ], {"add_generation_prompt": True, "tools": TOOLS, "extra_kwargs": {"enable_thinking": True}}
    yield "extra-fields", [{"role": "user", "content": "hi", "name": "alice"}, {"role": "assistant", "content": "yo", "name": "bot"}], {"add_generation_prompt": True}
    yield "date-string", [S("sys"), U("What day is it?")], {"add_generation_prompt": True, "extra_kwargs": {"date_string": "01 Jan 2025"}}
    yield "tools-in-system", [S("sys"), U("Weather?")], {"add_generation_prompt": True, "tools": [WEATHER_TOOL], "extra_kwargs": {"tools_in_user_message": False}}
    yield "tools-no-user", [S("sys")], {"add_generation_prompt": True, "tools": TOOLS}
    yield "builtin-tools", [U("Search it"), {"role": "assistant", "content": "", "tool_calls": [call("brave_search", {"query": "x"})]}],\
        {"add_generation_prompt": False, "extra_kwargs": {"builtin_tools": ["brave_search", "code_interpreter"]}}
    yield "null-content-user", [{"role": "user", "content": None}], {"add_generation_prompt": True}
    yield "unknown-role", [U("hi"), {"role": "narrator", "content": "Meanwhile..."}], {"add_generation_prompt": True}


# ---- snippets --------------------------------------------------------------------------
def snippets():
    """(name, template, vars) pinning down one construct each."""
    d = {"b": 2, "a": 1, "C": 3}
    people = [{"name": "bob", "age": 30, "tags": ["x"]}, {"name": "Alice", "age": 25}, {"name": "carol", "age": 35, "tags": []}]
    items = [
        # whitespace control
        ("ws-trim-blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
        ("ws-lstrip-blocks", "  {% if true %}\n    x\n  {% endif %}\n", {}),
        ("ws-minus", "a   {%- if true -%}   b   {%- endif -%}   c", {}),
        ("ws-var-minus", "a  {{- 'x' -}}  b\n  {{ 'y' }}  \n", {}),
        ("ws-plus", "  {%+ if true %}x{% endif +%}\ny", {}),
        ("ws-comment", "a\n  {# comment #}\nb {#- c -#} c\n{# x #}", {}),
        ("ws-no-lstrip-var", "  {{ 'v' }}\n  {% set x = 1 %}\nz", {}),
        ("ws-trailing-newline", "line\n", {}),
        ("ws-crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
        ("ws-inline-block", "x {% if true %}y{% endif %} z\n", {}),
        ("ws-raw", "{% raw %}{{ a }}{% b %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|", {}),
        ("ws-unicode-space", "a\u3000{%- if true %}b{% endif %}", {}),
        # literals and operators
        ("lit-numbers", "{{ 1 }} {{ -1 }} {{ 1.5 }} {{ 1e3 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 2.5e-3 }}", {}),
        ("lit-floats", "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2/2 }} {{ -0.0 }} {{ 1e300*1e10 }} {{ 123456789.123456789 }}", {}),
        ("lit-strings", "{{ 'a\\tb' }}|{{ \"q'q\" }}|{{ 'x' 'y' }}|{{ '\\u00e9\\x41\\101\\n' }}|{{ 'a\\qb' }}", {}),
        ("lit-containers", "{{ [1, 'a', none, true, 1.5] }} {{ {'k': \"it's\", 'n': [1]} }} {{ (1,) }} {{ (1, 2) }} {{ () }}", {}),
        ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -2 ** 2 }} {{ 7 / 2 }} {{ 1 + 2 * 3 }}", {}),
        ("arith-float-floor", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7 % -3 }} {{ -7.5 % -2 }}", {}),
        ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ x ~ [1] }}", {}),
        ("str-mul", "{{ 'ab' * 3 }}|{{ 3 * 'x' }}|{{ [1] * 2 }}|{{ 'a' * 0 }}", {}),
        ("str-add", "{{ 'a' + 'b' }} {{ [1] + [2] }}", {}),
        ("percent-format", "{{ '%s-%d-%05.2f|%-4s|%x' % ('a', 3, 3.14159, 'b', 255) }} {{ '%(k)s' % {'k': 'v'} }} {{ '%s' % 'x' }}", {}),
        ("compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'a' }} {{ 2 >= 2 }} {{ none == none }}", {}),
        ("logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ not 0 }} {{ none or [] }} {{ 1 if 0 else 2 }} [{{ 'a' if false }}]", {}),
        ("in", "{{ 'a' in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in undefined_var }}", {}),
        ("precedence-error", "{{ 1 + 2 ~ 3 }}", {}),
        ("precedence", "{{ (1 + 2) ~ 3 * 2 }} {{ 'a' ~ (1 - 1) }} {{ 1 - 2 - 3 }} {{ 2 ** 3 ** 2 }} {{ 7 - -1 }} {{ [1, 2]|length * 2 }} {{ 'ab' ~ 'c'|upper }} {{ -3|abs }} {{ not true and false }} {{ 2 * 3 ** 2 }} {{ (1 + 2) * 3 }}", {}),
        # subscripts and slices
        ("subscript", "{{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ d['a'] }} {{ d.b }} [{{ l[10] }}] [{{ d.zz }}] {{ s[1] }}", {"l": [1, 2, 3], "d": d, "s": "héllo"}),
        ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[5:] }} {{ l[3:0:-1] }} {{ s[::-1] }} {{ s[1:3] }} {{ s[:-1] }}", {"l": [0, 1, 2, 3, 4], "s": "héllo🚀"}),
        ("subscript-nested-slice", "{{ d[l[1:2]] }}|{{ ll[l[1:2]|first] }}|{{ l[l[0:1][0]] }}", {"d": {"a": 1}, "l": [0, 1, 2], "ll": [5, 6, 7]}),
        ("format-spec", "{{ '{:,}|{:_}|{:,.2f}|{:>10,}|{:+,}|{:,}|{!r:>6}|{:%}'.format(1234567, 1234567, 1234567.891, 12345, 1000, -1000, 'x', 0.25) }}", {}),
        ("slice-neg-step", "{{ l[-1:-4:-1] }} {{ l[10::-2] }} {{ l[:-10:-1] }} {{ l[1:1] }}", {"l": list(range(6))}),
        # tests
        ("tests-types", "{% for v in [1, 1.5, 'a', none, true, [1], {'a': 1}] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is none }}{{ v is boolean }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }};{% endfor %}", {}),
        ("tests-defined", "{{ x is defined }} {{ y is defined }} {{ x is undefined }} {{ d.a is defined }} {{ d.q is defined }} {{ none.q is defined }} {{ y is not defined }}", {"x": 1, "d": d}),
        ("tests-values", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq 1 }} {{ 'a' is equalto 'a' }} {{ 2 is gt 1 }} {{ 2 is lessthan 1 }} {{ 1 is in [1] }} {{ true is true }} {{ 1 is true }} {{ false is false }}", {}),
        ("tests-case", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ none is sameas none }} {{ 'trim' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}", {}),
        # filters
        ("f-trim", "[{{ '  a b \n'|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ none|trim }}] [{{ undefined_thing|trim }}]", {}),
        ("f-case", "{{ 'hello wORLD-foo (bar'|title }} {{ 'hello world'|capitalize }} {{ 'ÀbC'|lower }} {{ 'straße'|upper }} {{ 'it\\'s'|title }}", {}),
        ("f-length", "{{ 'héllo'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ undefined_thing|length }}", {}),
        ("f-default", "{{ x|default('dflt') }} {{ none|default('n') }} {{ ''|default('e', true) }} {{ 0|d('z', boolean=true) }} {{ 'v'|default('w') }}", {}),
        ("f-join", "{{ [1, 'a', none]|join(', ') }} {{ people|join('|', attribute='name') }} {{ 'abc'|join('-') }} {{ []|join }}", {"people": people}),
        ("f-replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}", {}),
        ("f-first-last", "{{ [3, 4]|first }} {{ [3, 4]|last }} {{ 'xyz'|first }} {{ 'xyz'|last }} [{{ []|first }}] {{ {'k': 1, 'j': 2}|first }}", {}),
        ("f-list-reverse", "{{ 'abc'|list }} {{ d|list }} {{ [1, 2, 3]|reverse|list }} {{ 'héllo'|reverse }} {{ (1, 2)|list }}", {"d": d}),
        ("f-items-dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(true) }} {{ d|dictsort(by='value', reverse=true) }}", {"d": d}),
        ("f-tojson", "{{ v|tojson }}\n{{ v|tojson(indent=2) }}\n{{ v|tojson(sort_keys=true) }}\n{{ v|tojson(separators=(',', ':')) }}\n{{ 'é'|tojson(ensure_ascii=true) }} {{ '🚀\\u0001\"\\\\'|tojson }}", {"v": {"z": [1, 2.5, None, True], "a": {"ü": "x\ny", "e": {}, "l": []}, "f": 1e-7}}),
        ("f-tojson-indent-str", "{{ [1, {'a': 2}]|tojson(indent='\\t') }}|{{ []|tojson(indent=2) }}|{{ [1]|tojson(indent=0) }}", {}),
        ("f-map-select", "{{ people|map(attribute='name')|list }} {{ people|selectattr('tags')|map(attribute='name')|join }} {{ people|rejectattr('age', 'gt', 28)|map(attribute='name')|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 0, 2]|select|list }} {{ [1, 2]|reject('eq', 1)|list }} {{ ['a', 'B']|map('upper')|list }} {{ people|map(attribute='tags', default='-')|list }} {{ people|selectattr('name', 'equalto', 'bob')|list|length }}", {"people": people}),
        ("f-sort-unique", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ people|sort(attribute='age', reverse=true)|map(attribute='name')|list }} {{ ['a', 'A', 'b', 'a']|unique|list }} {{ [3, 1, 3]|unique|list }}", {"people": people}),
        ("f-numbers", "{{ -3|abs }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.5|round(0, 'floor') }} {{ 2.1|round(0, 'ceil') }} {{ 3|round }} {{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int(7) }} {{ '0x1f'|int(0, 16) }} {{ '1.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ 4.9|int }} {{ true|int }}", {}),
        ("f-min-max-sum", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ people|max(attribute='age')|attr('items') is defined }} {{ [1, 2.5]|sum }} {{ people|sum(attribute='age') }} {{ [1]|sum(start=10) }}", {"people": people}),
        ("f-string-misc", "{{ 5|string ~ 'x' }} {{ [1]|string }} {{ '<a & \"b\">'|e }} {{ 'x'|safe }} {{ 'a b c'|wordcount }} {{ 'abc'|center(9) }}|", {}),
        ("f-indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(1, blank=true) }}|{{ 'x'|indent('>> ', first=true) }}", {}),
        ("f-truncate-batch", "{{ 'hello world foo bar baz'|truncate(12, leeway=0) }} {{ 'hello world'|truncate(8, true, '..', 0) }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }}", {}),
        ("f-format", "{{ '%s and %s'|format('a', 'b') }} {{ '%(x)s'|format(x=1) }}", {}),
        # string methods
        ("m-split-strip", "{{ '  a  b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '--x--'.strip('-') }} {{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x\\n\\n'.rstrip() }}|", {}),
        ("m-think-split", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreasoning here\n</think>\n\nanswer"}),
        ("m-predicates", "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'bc')) }} {{ 'abc'.startswith('b', 1) }} {{ '123'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'Ab'.islower() }}", {}),
        ("m-find-replace", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'aXa'.count('a') }} {{ ', '.join(['a', 'b']) }}", {}),
        ("m-case", "{{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Ab'.upper() }}{{ 'Ab'.lower() }} {{ \"they're bill's\".title() }}", {}),
        ("m-format", "{{ '{} is {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='hi') }} {{ '{:>5}|{:<4}|{:^5}|{:.2f}|{:05d}'.format('a', 'b', 'c', 3.14159, 42) }}", {}),
        ("m-misc", "{{ 'a-b'.partition('-') }} {{ 'x'.zfill(3) }} {{ 'ab'.center(6, '*') }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }} {{ 'prefix_x'.removeprefix('prefix_') }}", {}),
        ("m-dict", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": d}),
        ("m-list", "{{ [1, 2, 1].count(1) }} {{ ['a', 'b'].index('b') }}", {}),
        # statements
        ("for-loop-vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }};{% endfor %}", {}),
        ("for-else-filter", "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {}),
        ("for-unpack", "{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %} {% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %} {% for c in d %}{{ c }}{% endfor %}", {"d": d}),
        ("for-break-continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
        ("for-nested-loop", "{% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
        ("for-cycle-changed", "{% for x in [1, 1, 2] %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }} {% endfor %}", {}),
        ("scoping", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 10 %}{{ x }},{% endfor %}{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}", {}),
        ("namespace", "{% set ns = namespace(a=1, l=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.a }} {{ ns.l }} {{ ns.missing is defined }}", {}),
        ("set-tuple-block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% set blk %}X{{ a }}Y{% endset %}[{{ blk }}]{% set up | upper %}abc{% endset %}{{ up }}", {}),
        ("macro", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Z') }}", {}),
        ("macro-varargs-caller", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }} {% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner{% endcall %} {% macro w2() %}{{ caller(5) }}{% endmacro %}{% call(n) w2() %}n={{ n }}{% endcall %}", {}),
        ("macro-recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
        ("block-scopes", "{% set y = 0 %}{% set b %}{{ y }}{% set y = 1 %}{{ y }}{% endset %}[{{ y }}{{ b }}]{% filter upper %}{% set x = 1 %}{% endfilter %}[{{ x }}]{% generation %}{% set g = 1 %}{% endgeneration %}[{{ g }}]{% if true %}{% set z = 1 %}{% endif %}[{{ z }}]", {}),
        ("filter-block-with", "{% filter upper %}a{{ 'b' }}c{% endfilter %} {% with x = 3, y = 4 %}{{ x * y }}{% endwith %}{{ x is defined }}", {}),
        ("globals", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ strftime_now('%Y-%m-%d %H:%M %b %d') }} {% set j = joiner('+') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %}", {}),
        ("messages-reverse", "{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}:{{ m.role }} {% endfor %}", {"messages": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]}),
        ("print-values", "{{ none }} {{ true }} {{ false }} {{ undefined_thing }}|{{ d }} {{ [d] }} {{ 'a\\nb' }} {{ ['a\\nb', \"'\", '\"'] }} {{ ['é', '\\u00a0', '\\x7f'] }}", {"d": {"a": [1, {"b": None}]}}),
        ("generation", "{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
        # jinja2 / Python quirks a port must keep
        ("q-generators", "{{ 'T' if []|select('odd') else 'F' }} {{ [3, 1]|reverse|list }} {{ (x|selectattr('a')) is sequence }} {% set g = [1, 2]|map('string') %}{{ g|join('+') }} {{ [1, 2]|select('odd')|first }} [{{ 5|items is defined }}]", {"x": [{"a": 1}]}),
        ("q-generator-lazy-error", "{% set g = 5|items %}{% set u = none|unique %}ok{{ [[1], [1]]|unique is defined }}", {}),
        ("q-views", "{{ d.keys() }} {{ d.values() }} {{ d.items() }} {{ d.keys()|list }} [{{ d.keys()[0] }}] {{ 'a' in d.keys() }} {{ d.keys()|length }} {{ d.keys() == ['b', 'a'] }} {{ d.items()|first }}", {"d": {"b": 2, "a": 1}}),
        ("q-markup", "{{ ('<b>'|safe) + '<i>' }} {{ '<i>' + ('<b>'|safe) }} {{ ('a&b'|e) ~ '<' }} {{ ['x'|e, 'y'|safe] }} {{ ('<p>'|safe).replace('p', '<q>') }} {{ ('%s|'|safe) % '<' }} {{ 'a<b'|e|e }} {{ 'a<b'|forceescape|forceescape }} {{ ('x'|safe|upper) + '&' }} {{ ('ab'|safe)[0] + '<' }} {{ ('<'|safe).join(['&', 'x'|safe]) }} {{ ('x'|safe|title) + '<' }}", {}),
        ("q-neg-power", "{{ -1 ** y }}|{{ -x ** 2 }}|{{ -1 ** 0 }}|{{ -2 ** (1 + 1) }}|{{ -2.0 ** y }}|{{ -2 ** 2 }}", {"y": False, "x": -1}),
        ("q-percent-mapping", "{{ 'a' % [1, 2] }}|{{ '' % nothing }}|{{ '%s' % nothing }}|{{ '%s' % [1] }}|{{ '%s' % (1,) }}", {}),
        ("q-truncate-nonstr", "{{ [1, 2]|truncate(5, true, '.', 0) }} {{ 'abc'|truncate(5) }}", {}),
        ("raise", "{% if true %}{{ raise_exception('custom failure: ' ~ 42) }}{% endif %}", {}),
        # runtime errors (any failure is accepted from us; jinja2's message is recorded)
        ("err-undefined-attr", "{{ nothing.attr }}", {}),
        ("err-str-plus-none", "{{ 'a' + none }}", {}),
        ("err-undefined-plus", "{{ nothing + 1 }}", {}),
        ("err-tojson-undefined", "{{ nothing|tojson }}", {}),
        ("err-div-zero", "{{ 1 / 0 }}", {}),
        ("err-call-undefined", "{{ nothing() }}", {}),
        ("err-items-list", "{{ [1]|items|list }}", {}),
        ("err-range-too-big", "{{ range(1000000)|length }}", {}),
        ("err-unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
        ("err-compare", "{{ 1 < 'a' }}", {}),
        ("err-generator-length", "{{ [1, 2]|select('odd')|length }}", {}),
        ("err-generator-lazy", "{{ 5|items|list }}", {}),
        ("err-unhashable-in", "{{ [1] in {} }}", {}),
        ("err-undefined-int", "{{ nothing|int }}", {}),
        ("err-view-json", "{{ {'a': 1}.keys()|tojson }}", {}),
        ("err-truncate-bool", "{{ true|truncate(3) }}", {}),
    ]
    return items


def main():
    templates = load_templates()
    cases = []
    for tname, tdata in templates.items():
        for cname, messages, opts in conversations():
            options = {"add_generation_prompt": False, "tools": None, "documents": None, "extra_kwargs": {}}
            options.update(SPECIAL_TOKENS.get(tname, {}))
            options.update(opts)
            if tname == "constructs":
                options["extra_kwargs"] = {**options["extra_kwargs"], "extra": "kw"}
            result = render(tdata["template"], messages, options)
            cross_check_with_transformers(tdata["template"], messages, options, result)
            cases.append({"template": tname, "name": cname, "messages": messages, "options": options, **result})
    snips = []
    for sname, template, variables in snippets():
        try:
            text = ENV.from_string(template).render(**variables)
            result = {"expected": text}
        except jinja2.exceptions.TemplateError as e:
            result = {"error": {"raised": e.message}} if type(e) is jinja2.exceptions.TemplateError else \
                {"error": {"python": f"{type(e).__name__}: {e}"}}
        except Exception as e:  # noqa: BLE001
            result = {"error": {"python": f"{type(e).__name__}: {e}"}}
        snips.append({"name": sname, "template": template, "vars": variables, **result})
    golden = {
        "generator": "scripts/make_chat_goldens.py",
        "jinja2_version": jinja2.__version__,
        "now_unix_s": NOW_UNIX_S,
        "templates": templates,
        "cases": cases,
        "snippets": snips,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"{OUT.relative_to(ROOT)}: {len(templates)} templates, {len(cases)} cases ({n_err} errors), "
          f"{len(snips)} snippets; {getattr(cross_check_with_transformers, 'count', 0)} cases cross-checked "
          f"with transformers' render_jinja_template", file=sys.stderr)


if __name__ == "__main__":
    main()
