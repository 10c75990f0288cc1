#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "hack/router/tool_calls.h"

using namespace hack::server;

namespace {

// A parse as a client sees it: content, and each call assembled from its deltas the way the
// openai client accumulates a stream (id/name from the first delta, arguments appended).
struct Assembled {
  std::string content;
  std::vector<ToolCall> calls;
  bool well_formed = true;  // every call's first delta had id and name, later ones neither
};

void apply(Assembled& a, const ToolParseStep& step) {
  a.content += step.content;
  for (const ToolCallDelta& d : step.calls) {
    if (d.index == static_cast<int>(a.calls.size())) {
      if (!d.id || !d.name) a.well_formed = false;
      a.calls.push_back(ToolCall{d.id.value_or(""), d.name.value_or(""), d.arguments});
    } else if (d.index == static_cast<int>(a.calls.size()) - 1) {
      if (d.id || d.name) a.well_formed = false;
      a.calls.back().arguments += d.arguments;
    } else {
      a.well_formed = false;
    }
  }
}

Assembled parse_pieces(ToolParserKind kind, const std::vector<std::string>& pieces) {
  ToolCallParser p(kind);
  Assembled a;
  for (const std::string& s : pieces) apply(a, p.feed(s));
  apply(a, p.finish());
  // The parser's own record equals what the deltas assembled to.
  REQUIRE(p.calls().size() == a.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    CHECK(p.calls()[i].id == a.calls[i].id);
    CHECK(p.calls()[i].name == a.calls[i].name);
    CHECK(p.calls()[i].arguments == a.calls[i].arguments);
  }
  return a;
}

Assembled parse_whole(ToolParserKind kind, const std::string& text) { return parse_pieces(kind, {text}); }

// Every split of `text` into two pieces, and into single bytes, gives the whole-text parse.
void check_every_split(ToolParserKind kind, const std::string& text) {
  const Assembled whole = parse_whole(kind, text);
  CHECK(whole.well_formed);
  auto same = [&](const Assembled& a, const std::string& how) {
    INFO(how << " of " << text);
    CHECK(a.well_formed);
    CHECK(a.content == whole.content);
    REQUIRE(a.calls.size() == whole.calls.size());
    for (size_t i = 0; i < a.calls.size(); ++i) {
      CHECK(a.calls[i].name == whole.calls[i].name);
      CHECK(a.calls[i].arguments == whole.calls[i].arguments);
    }
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    same(parse_pieces(kind, {text.substr(0, cut), text.substr(cut)}), "split at " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  same(parse_pieces(kind, bytes), "byte by byte");
}

nlohmann::json args_of(const ToolCall& c) { return nlohmann::json::parse(c.arguments); }

}  // namespace

TEST_CASE("tool calls: hermes calls between text, every split") {
  const std::string text =
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"units\": "
      "[\"c\", {\"x\": \"}\"}]}}\n</tool_call>\n<tool_call>{\"arguments\": {\"q\": \"a\\\"b\"}, \"name\": \"search\"}"
      "</tool_call> done";
  const Assembled a = parse_whole(ToolParserKind::hermes, text);
  CHECK(a.content == "Let me check.\n done");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].name == "get_weather");
  CHECK(args_of(a.calls[0]) == nlohmann::json::parse(R"({"city": "Paris", "units": ["c", {"x": "}"}]})"));
  CHECK(a.calls[0].id.starts_with("call_"));
  CHECK(a.calls[0].id.size() == 29);
  CHECK(a.calls[0].id != a.calls[1].id);
  CHECK(a.calls[1].name == "search");
  CHECK(args_of(a.calls[1]) == nlohmann::json{{"q", "a\"b"}});
  check_every_split(ToolParserKind::hermes, text);
}

TEST_CASE("tool calls: hermes text without calls passes through, a partial marker is held then released") {
  ToolCallParser p(ToolParserKind::hermes);
  CHECK(p.feed("a < b and <tool").content == "a < b and ");
  CHECK(p.feed("box>").content == "<toolbox>");
  CHECK(p.feed(" x <tool_").content == " x ");
  CHECK(p.finish().content == "<tool_");
  CHECK(p.calls().empty());
  check_every_split(ToolParserKind::hermes, "no calls <here> <tool_cal at all <");
}

// Qwen2.5-Coder-1.5B (Q4_K_M), asked with tool_choice auto, often answers with the call as a
// ```json block instead of <tool_call> tags. vLLM's hermes parser (Hermes2ProToolParser) looks
// only for <tool_call>: text without the tag is returned whole as content, and so is it here —
// the client gets the block as text, finish_reason "stop", no tool_calls. Guessing calls out of
// prose would turn every JSON example a model writes into a call nobody asked for.
TEST_CASE("tool calls: hermes leaves a ```json fenced call without <tool_call> tags as content") {
  const std::string fenced =
      "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n```";
  for (const std::string& text : {fenced, "Sure:\n" + fenced + "\nDone.", std::string("{\"name\": \"f\", \"arguments\": {}}")}) {
    const Assembled a = parse_whole(ToolParserKind::hermes, text);
    CHECK(a.calls.empty());
    CHECK(a.content == text);
    check_every_split(ToolParserKind::hermes, text);
  }
  // the same block inside tags is a call
  const Assembled tagged = parse_whole(ToolParserKind::hermes, "<tool_call>\n" + fenced.substr(8, fenced.size() - 12) +
                                                                   "\n</tool_call>");
  REQUIRE(tagged.calls.size() == 1);
  CHECK(tagged.calls[0].name == "get_weather");
  CHECK(args_of(tagged.calls[0]) == nlohmann::json{{"city", "Paris"}, {"unit", "celsius"}});
  CHECK(tagged.content.empty());
}

TEST_CASE("tool calls: hermes arguments stream in pieces once the name is known") {
  ToolCallParser p(ToolParserKind::hermes);
  ToolParseStep s = p.feed("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ");
  REQUIRE(s.calls.size() == 1);
  CHECK(s.calls[0].index == 0);
  CHECK(s.calls[0].name == "f");
  CHECK(s.calls[0].arguments == "{\"a\": ");
  CHECK(s.content.empty());
  s = p.feed("12}");
  REQUIRE(s.calls.size() == 1);
  CHECK_FALSE(s.calls[0].id);
  CHECK(s.calls[0].arguments == "12}");
  s = p.feed("}</tool_call>");
  CHECK(s.calls.empty());
  CHECK(s.content.empty());
  CHECK(p.calls()[0].arguments == "{\"a\": 12}");
}

TEST_CASE("tool calls: malformed or nameless hermes calls come back as content") {
  for (const std::string& text : {std::string("x<tool_call>{\"arguments\": {}}</tool_call>y"),
                                 std::string("x<tool_call>not json</tool_call>"),
                                 std::string("x<tool_call>{\"name\": 3}</tool_call>")}) {
    const Assembled a = parse_whole(ToolParserKind::hermes, text);
    CHECK(a.calls.empty());
    CHECK(a.content == text);
  }
  // Arguments given as a JSON string are unwrapped; missing arguments are {}.
  const Assembled a = parse_whole(ToolParserKind::hermes,
                                  "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>"
                                  "<tool_call>{\"name\": \"g\"}</tool_call>");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].arguments == "{\"k\": 1}");
  CHECK(a.calls[1].arguments == "{}");
  check_every_split(ToolParserKind::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>");
}

TEST_CASE("tool calls: an unfinished call keeps what was sent, an unnamed one is content") {
  Assembled a = parse_whole(ToolParserKind::hermes, "hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2");
  CHECK(a.content == "hi ");
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].arguments == "{\"a\": [1, 2");
  a = parse_whole(ToolParserKind::hermes, "hi <tool_call>{\"argu");
  CHECK(a.calls.empty());
  CHECK(a.content == "hi <tool_call>{\"argu");
}

TEST_CASE("tool calls: llama3_json, with and without <|python_tag|>, several separated by semicolons") {
  const std::string text =
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
      "{\"name\": \"time\", \"parameters\": {}}";
  const Assembled a = parse_whole(ToolParserKind::llama3_json, text);
  CHECK(a.content.empty());
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].name == "get_weather");
  CHECK(args_of(a.calls[0]) == nlohmann::json{{"city", "Oslo"}});
  CHECK(a.calls[1].name == "time");
  CHECK(a.calls[1].arguments == "{}");
  check_every_split(ToolParserKind::llama3_json, text);
  check_every_split(ToolParserKind::llama3_json, " {\"name\": \"f\", \"parameters\": {\"x\": 1}}");
  // Only a whole output is a call: text first, or JSON that names nothing, is content.
  for (const std::string& plain : {std::string("The answer is {\"name\": \"f\"}"), std::string("{\"a\": 1} and more"),
                                  std::string("<|python")}) {
    const Assembled b = parse_whole(ToolParserKind::llama3_json, plain);
    CHECK(b.calls.empty());
    CHECK(b.content == plain);
    check_every_split(ToolParserKind::llama3_json, plain);
  }
}

TEST_CASE("tool calls: mistral [TOOL_CALLS] list") {
  const std::string text =
      "Sure.[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": \"b\", \"arguments\": {\"s\": \"]\"}}]";
  const Assembled a = parse_whole(ToolParserKind::mistral, text);
  CHECK(a.content == "Sure.");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].name == "a");
  CHECK(args_of(a.calls[1]) == nlohmann::json{{"s", "]"}});
  check_every_split(ToolParserKind::mistral, text);
}

TEST_CASE("tool calls: parser none passes everything through") {
  const Assembled a = parse_whole(ToolParserKind::none, "<tool_call>{\"name\": \"f\"}</tool_call>");
  CHECK(a.calls.empty());
  CHECK(a.content == "<tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST_CASE("tool calls: parser chosen from the chat template and the flag") {
  CHECK(detect_tool_parser("{% if tools %}<tool_call>{% endif %}") == ToolParserKind::hermes);
  CHECK(detect_tool_parser("{{ '[TOOL_CALLS]' }}{{ tools }}") == ToolParserKind::mistral);
  CHECK(detect_tool_parser("{% if tools %}<|start_header_id|>ipython{% endif %}") == ToolParserKind::llama3_json);
  CHECK(detect_tool_parser("{{ messages }}") == ToolParserKind::hermes);  // rendered in Hermes form by us
  CHECK(detect_tool_parser("{% if tools %}<|tool|>{% endif %}") == ToolParserKind::none);
  CHECK(parse_tool_parser_flag("auto") == std::nullopt);
  CHECK(parse_tool_parser_flag("mistral") == ToolParserKind::mistral);
  CHECK_THROWS(parse_tool_parser_flag("qwen"));
}

TEST_CASE("tool calls: Hermes rendering of tools, calls and results for a template without tools") {
  const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "20 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}
  ])");
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}])");
  const auto out = render_tools_hermes(messages, tools);
  REQUIRE(out.size() == 4);
  const std::string system = out[0]["content"];
  CHECK(system.starts_with("Be brief.\n\n# Tools"));
  CHECK(system.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"w\"") != std::string::npos);
  CHECK(out[2]["content"] == "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  CHECK(out[3]["role"] == "user");
  CHECK(out[3]["content"] == "<tool_response>\n20 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>");
  // Without tools only the history changes, and a system message is not invented.
  CHECK(render_tools_hermes(messages, nullptr).size() == 4);
  CHECK(render_tools_hermes(messages, nullptr)[0]["content"] == "Be brief.");
}
