/// @file tool_calls.h
/// @brief Tool calls in generated text: which syntax a model writes them in (from its chat
/// template or --tool-parser), an incremental parser that splits a stream of text into
/// content and OpenAI tool-call deltas, and the Hermes rendering of tools for chat
/// templates that do not know tools.
///
/// Formats (what vLLM's parsers of the same names accept):
///   hermes       text <tool_call>{"name": "f", "arguments": {...}}</tool_call> text ...
///   llama3_json  [<|python_tag|>]{"name": "f", "parameters": {...}}[; {...}]   (from the start only)
///   mistral      text [TOOL_CALLS][{"name": "f", "arguments": {...}}, {...}]
///
/// Streaming and whole responses run the same parser, so the deltas of a stream concatenate
/// to exactly the tool calls of the non-stream response.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hack::server {

enum class ToolParserKind { none, hermes, llama3_json, mistral };

/// "hermes" | "llama3_json" | "mistral" | "none".
std::string_view tool_parser_name(ToolParserKind kind);
/// The --tool-parser value: a kind, or nullopt for "auto". Throws hack::Error on anything else.
std::optional<ToolParserKind> parse_tool_parser_flag(std::string_view value);

/// Whether a chat template renders `tools` itself (it mentions the variable).
bool template_knows_tools(std::string_view template_source);
/// The syntax a template's model writes tool calls in, judged by the markers the template
/// contains: <tool_call> → hermes, [TOOL_CALLS] → mistral, <|python_tag|> or an ipython
/// role → llama3_json. A template that does not know tools gets hermes (the router renders
/// tools in Hermes form for it, render_tools_hermes); one that knows tools in another
/// syntax gets none.
ToolParserKind detect_tool_parser(std::string_view template_source);

/// GBNF that forces the reply to be tool calls in `kind`'s syntax (tool_choice "required",
/// or a named function): each call's name is one of `tools` (only `function` when not
/// empty) and its arguments JSON matching that tool's `parameters` schema
/// (grammar::json_schema_to_gbnf; absent parameters = any object). `parallel`: one or more
/// calls, else exactly one. Throws hack::Error for the mistral syntax (its [TOOL_CALLS] is a
/// special token, which no grammar can produce), for none, and for a schema the grammar
/// compiler refuses (naming the tool).
std::string forced_tool_calls_gbnf(ToolParserKind kind, const nlohmann::ordered_json& tools,
                                   const std::string& function, bool parallel);

/// For a template that does not know tools: `messages` rewritten the way Qwen2.5's template
/// (the Hermes format) renders them — the tool signatures in a "# Tools" section of the
/// system message (one is added when there is none), assistant tool_calls as
/// <tool_call>{"name", "arguments"}</tool_call> lines in its content, and tool results as a
/// user message of <tool_response> blocks (consecutive results merged). `tools` may be null
/// (then only the history is rewritten).
nlohmann::ordered_json render_tools_hermes(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools);

/// A parsed call. `arguments` is JSON text, as OpenAI's function.arguments.
struct ToolCall {
  std::string id;  ///< "call_<24 alphanumerics>"
  std::string name;
  std::string arguments;
};

/// A piece of one call, as OpenAI streams it: the first piece of call `index` carries its
/// id and name (type "function"), later ones only argument text.
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
};

/// What one piece of generated text settles into.
struct ToolParseStep {
  std::string content;  ///< text outside any call
  std::vector<ToolCallDelta> calls;
};

/// Splits generated text into content and tool calls as it arrives. Text that may begin a
/// call (a partial "<tool_call" marker) is held back until it is known not to be one; a
/// call's text never appears as content. A call whose JSON turns out malformed or nameless
/// before any of it was sent is given back as content, as the model wrote it.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolParserKind kind);

  /// Feeds the next piece of text.
  ToolParseStep feed(std::string_view text);
  /// Ends the text: what was held back (an unfinished marker, or an unfinished call whose
  /// name was never seen, as content; an unfinished call's arguments are closed as sent).
  ToolParseStep finish();

  /// The calls so far, arguments complete up to what has been fed.
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class Mode { text, between, object, after_object, passthrough };
  // Each consumes what it can of buf_; false when it needs more text.
  bool step_text(ToolParseStep& out);
  bool step_between(ToolParseStep& out);
  bool step_object(ToolParseStep& out);
  bool step_after_object(ToolParseStep& out);
  void on_value_end(size_t end);
  void close_object(size_t end, ToolParseStep& out);
  void open_call(ToolParseStep& out);
  void send_arguments(std::string_view piece, ToolParseStep& out);
  void stream_arguments(ToolParseStep& out);
  void reset_object();

  ToolParserKind kind_;
  Mode mode_;
  std::string buf_;     // unconsumed text
  size_t pos_ = 0;      // scan position in buf_ (object mode)
  bool at_start_ = true;  // llama3_json: nothing but whitespace seen yet
  std::string region_;  // the raw text of the current call region (marker + objects), for give-back

  // The JSON object being scanned (it starts at buf_[0]): depth, string state, and the
  // top-level key and value in view.
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  bool reading_key_ = false;
  size_t key_start_ = 0;
  std::string key_;            // the last top-level key read
  bool expect_value_ = false;  // after a top-level key's ':'
  char value_kind_ = 0;        // top-level value being read: 's' string, 'c' object/array, 'x' other; 0 none
  size_t value_start_ = 0;
  std::optional<std::string> name_;
  size_t args_start_ = std::string::npos, args_end_ = std::string::npos;  // raw object/array arguments
  size_t args_sent_ = 0;       // bytes of raw arguments streamed
  bool call_open_ = false;     // the current call's first delta was sent
  std::vector<ToolCall> calls_;
};

}  // namespace hack::server
