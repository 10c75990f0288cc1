#include "hack/router/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "hack/core/error.h"
#include "hack/grammar/grammar.h"
#include "hack/grammar/json_schema.h"

namespace hack::server {

using Json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `marker` (text to hold).
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string make_call_id() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rd() % (sizeof(kAlnum) - 1)];
  return id;
}

bool is_arguments_key(std::string_view key) { return key == "arguments" || key == "parameters"; }

constexpr std::string_view kHermesToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kHermesToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call>";

std::string content_text(const Json& m) {
  const auto it = m.find("content");
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string_view tool_parser_name(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::none: return "none";
    case ToolParserKind::hermes: return "hermes";
    case ToolParserKind::llama3_json: return "llama3_json";
    case ToolParserKind::mistral: return "mistral";
  }
  return "none";
}

std::optional<ToolParserKind> parse_tool_parser_flag(std::string_view value) {
  if (value == "auto") return std::nullopt;
  for (ToolParserKind k : {ToolParserKind::none, ToolParserKind::hermes, ToolParserKind::llama3_json,
                           ToolParserKind::mistral}) {
    if (value == tool_parser_name(k)) return k;
  }
  fail("--tool-parser must be hermes, llama3_json, mistral, none or auto; got '{}'", value);
}

bool template_knows_tools(std::string_view source) { return source.find("tools") != std::string_view::npos; }

ToolParserKind detect_tool_parser(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolParserKind::hermes;
  if (source.find(kMistralOpen) != std::string_view::npos) return ToolParserKind::mistral;
  if (source.find(kPythonTag) != std::string_view::npos || source.find("ipython") != std::string_view::npos) {
    return ToolParserKind::llama3_json;
  }
  return template_knows_tools(source) ? ToolParserKind::none : ToolParserKind::hermes;
}

nlohmann::ordered_json render_tools_hermes(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools) {
  Json out = Json::array();
  const bool has_tools = tools.is_array() && !tools.empty();
  size_t first = 0;
  if (has_tools) {
    std::string system;
    if (!messages.empty() && messages[0].value("role", "") == "system") {
      system = content_text(messages[0]) + "\n\n";
      first = 1;
    }
    system += kHermesToolsHeader;
    for (const Json& t : tools) system += "\n" + t.dump();
    system += kHermesToolsFooter;
    out.push_back({{"role", "system"}, {"content", system}});
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string role = m.value("role", "");
    if (role == "tool") {
      // Qwen2.5: consecutive tool results become one user turn of <tool_response> blocks.
      const std::string block = "<tool_response>\n" + content_text(m) + "\n</tool_response>";
      const bool merge = i > first && messages[i - 1].value("role", "") == "tool";
      if (merge) {
        out.back()["content"] = out.back()["content"].get<std::string>() + "\n" + block;
      } else {
        out.push_back({{"role", "user"}, {"content", block}});
      }
      continue;
    }
    const auto calls = m.find("tool_calls");
    if (role == "assistant" && calls != m.end() && calls->is_array() && !calls->empty()) {
      std::string text = content_text(m);
      for (const Json& call : *calls) {
        const Json fn = call.value("function", Json::object());
        const Json args = fn.value("arguments", Json::object());
        const std::string name = fn.value("name", "");
        if (!text.empty()) text += "\n";
        text += "<tool_call>\n{\"name\": " + Json(name).dump() +
                ", \"arguments\": " + (args.is_string() ? args.get<std::string>() : args.dump()) + "}\n</tool_call>";
      }
      out.push_back({{"role", "assistant"}, {"content", text}});
      continue;
    }
    out.push_back(m);
  }
  return out;
}

// ---- the parser -------------------------------------------------------------------------

ToolCallParser::ToolCallParser(ToolParserKind kind)
    : kind_(kind), mode_(kind == ToolParserKind::none ? Mode::passthrough : Mode::text) {}

ToolParseStep ToolCallParser::feed(std::string_view text) {
  buf_ += text;
  ToolParseStep out;
  for (bool more = true; more && !buf_.empty();) {
    switch (mode_) {
      case Mode::text: more = step_text(out); break;
      case Mode::between: more = step_between(out); break;
      case Mode::object: more = step_object(out); break;
      case Mode::after_object: more = step_after_object(out); break;
      case Mode::passthrough:
        out.content += buf_;
        buf_.clear();
        more = false;
        break;
    }
  }
  return out;
}

ToolParseStep ToolCallParser::finish() {
  ToolParseStep out;
  switch (mode_) {
    case Mode::text:
    case Mode::passthrough: out.content += buf_; break;
    case Mode::between: out.content += region_ + buf_; break;
    case Mode::after_object: break;  // whitespace or a partial closing tag of a finished call
    case Mode::object:
      if (call_open_) {
        // Cut off (length): the arguments end where the text did.
        if (args_start_ != std::string::npos) {
          send_arguments(std::string_view(buf_).substr(args_start_ + args_sent_), out);
        }
      } else {
        out.content += region_ + buf_;
      }
      break;
  }
  buf_.clear();
  region_.clear();
  mode_ = Mode::passthrough;
  return out;
}

bool ToolCallParser::step_text(ToolParseStep& out) {
  if (kind_ == ToolParserKind::llama3_json) {
    // A call only as the whole output: {"name": ...} or <|python_tag|>{...}, after whitespace.
    size_t i = 0;
    while (i < buf_.size() && is_space(buf_[i])) ++i;
    if (i == buf_.size()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with('{')) {
      region_ = buf_.substr(0, i);
      buf_.erase(0, i);
      mode_ = Mode::object;
      reset_object();
      return true;
    }
    if (rest.starts_with(kPythonTag)) {
      region_ = buf_.substr(0, i + kPythonTag.size());
      buf_.erase(0, i + kPythonTag.size());
      mode_ = Mode::between;
      return true;
    }
    if (kPythonTag.starts_with(rest)) return false;  // may still become the tag
    mode_ = Mode::passthrough;
    return true;
  }
  const std::string_view marker = kind_ == ToolParserKind::mistral ? kMistralOpen : kHermesOpen;
  const size_t at = buf_.find(marker);
  if (at != std::string::npos) {
    out.content += buf_.substr(0, at);
    region_ = std::string(marker);
    buf_.erase(0, at + marker.size());
    mode_ = Mode::between;
    return true;
  }
  const size_t hold = partial_marker_suffix(buf_, marker);
  out.content += buf_.substr(0, buf_.size() - hold);
  buf_.erase(0, buf_.size() - hold);
  return false;
}

bool ToolCallParser::step_between(ToolParseStep& out) {
  size_t i = 0;
  bool bracket = false;
  for (; i < buf_.size(); ++i) {
    if (is_space(buf_[i])) continue;
    if (kind_ == ToolParserKind::mistral && buf_[i] == '[' && !bracket) {
      bracket = true;
      continue;
    }
    break;
  }
  if (i == buf_.size()) return false;
  if (buf_[i] == '{') {
    region_ += buf_.substr(0, i);
    buf_.erase(0, i);
    mode_ = Mode::object;
    reset_object();
    return true;
  }
  // Not a call after all: what was taken for its start is content.
  out.content += region_;
  region_.clear();
  mode_ = kind_ == ToolParserKind::llama3_json ? Mode::passthrough : Mode::text;
  return true;
}

void ToolCallParser::reset_object() {
  pos_ = 0;
  depth_ = 0;
  in_string_ = escape_ = reading_key_ = expect_value_ = false;
  key_.clear();
  value_kind_ = 0;
  name_.reset();
  args_start_ = args_end_ = std::string::npos;
  args_sent_ = 0;
  call_open_ = false;
}

bool ToolCallParser::step_object(ToolParseStep& out) {
  for (; pos_ < buf_.size(); ++pos_) {
    const char c = buf_[pos_];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (reading_key_) {
          reading_key_ = false;
          key_ = buf_.substr(key_start_, pos_ - key_start_);
        } else if (depth_ == 1 && value_kind_ == 's') {
          on_value_end(pos_ + 1);
        }
      }
      continue;
    }
    if (is_space(c)) continue;
    if (depth_ == 1 && expect_value_) {
      expect_value_ = false;
      value_start_ = pos_;
      value_kind_ = c == '"' ? 's' : (c == '{' || c == '[') ? 'c' : 'x';
      if (value_kind_ == 'c' && is_arguments_key(key_)) args_start_ = pos_;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        if (depth_ == 1 && value_kind_ == 0) {
          reading_key_ = true;
          key_start_ = pos_ + 1;
        }
        break;
      case '{':
      case '[': ++depth_; break;
      case '}':
      case ']':
        --depth_;
        if (depth_ == 1 && value_kind_ == 'c') on_value_end(pos_ + 1);
        if (depth_ == 0) {
          if (value_kind_ == 'x') on_value_end(pos_);
          close_object(pos_ + 1, out);
          return true;
        }
        break;
      case ':':
        if (depth_ == 1) expect_value_ = true;
        break;
      case ',':
        if (depth_ == 1 && value_kind_ == 'x') on_value_end(pos_);
        break;
      default: break;
    }
  }
  if (!call_open_ && name_) open_call(out);
  stream_arguments(out);
  return false;
}

void ToolCallParser::on_value_end(size_t end) {
  if (value_kind_ == 's' && key_ == "name") {
    const Json name = Json::parse(buf_.substr(value_start_, end - value_start_), nullptr, false);
    if (name.is_string()) name_ = name.get<std::string>();
  }
  if (value_kind_ == 'c' && is_arguments_key(key_)) args_end_ = end;
  value_kind_ = 0;
}

void ToolCallParser::open_call(ToolParseStep& out) {
  calls_.push_back(ToolCall{make_call_id(), *name_, ""});
  out.calls.push_back(ToolCallDelta{static_cast<int>(calls_.size()) - 1, calls_.back().id, *name_, ""});
  call_open_ = true;
}

void ToolCallParser::send_arguments(std::string_view piece, ToolParseStep& out) {
  if (piece.empty()) return;
  calls_.back().arguments += piece;
  args_sent_ += piece.size();
  const int index = static_cast<int>(calls_.size()) - 1;
  if (!out.calls.empty() && out.calls.back().index == index) {
    out.calls.back().arguments += piece;
  } else {
    out.calls.push_back(ToolCallDelta{index, std::nullopt, std::nullopt, std::string(piece)});
  }
}

// Raw object/array arguments go out as they arrive, once the call's name is known.
void ToolCallParser::stream_arguments(ToolParseStep& out) {
  if (!call_open_ || args_start_ == std::string::npos) return;
  const size_t end = args_end_ != std::string::npos ? args_end_ : pos_;
  if (args_start_ + args_sent_ < end) {
    send_arguments(std::string_view(buf_).substr(args_start_ + args_sent_, end - args_start_ - args_sent_), out);
  }
}

void ToolCallParser::close_object(size_t end, ToolParseStep& out) {
  const std::string text = buf_.substr(0, std::min(end, buf_.size()));
  const Json j = Json::parse(text, nullptr, false);
  const bool valid = !j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string();
  const bool given_back = !valid && !call_open_;
  if (given_back) {
    // Not a call: the model's text, as it wrote it.
    out.content += region_ + text;
  } else {
    if (!call_open_) {
      name_ = j["name"].get<std::string>();
      open_call(out);
    }
    if (args_start_ != std::string::npos) {
      stream_arguments(out);
    } else if (args_sent_ == 0 && valid) {
      const auto args = j.contains("arguments") ? j.find("arguments") : j.find("parameters");
      std::string value = "{}";
      if (args != j.end() && !args->is_null()) value = args->is_string() ? args->get<std::string>() : args->dump();
      send_arguments(value, out);
    }
  }
  region_.clear();
  buf_.erase(0, std::min(end, buf_.size()));
  reset_object();
  mode_ = !given_back ? Mode::after_object : kind_ == ToolParserKind::llama3_json ? Mode::passthrough : Mode::text;
}

bool ToolCallParser::step_after_object(ToolParseStep& out) {
  size_t i = 0;
  while (i < buf_.size() && is_space(buf_[i])) ++i;
  if (i == buf_.size()) return false;
  const std::string_view rest = std::string_view(buf_).substr(i);
  switch (kind_) {
    case ToolParserKind::hermes:
      if (rest.starts_with(kHermesClose)) {
        buf_.erase(0, i + kHermesClose.size());
        mode_ = Mode::text;
        return true;
      }
      if (kHermesClose.starts_with(rest)) return false;
      break;
    case ToolParserKind::mistral:
    case ToolParserKind::llama3_json: {
      // Calls are separated by ',' (inside mistral's list) or ';' (llama3_json).
      if (rest.front() == (kind_ == ToolParserKind::mistral ? ',' : ';')) {
        buf_.erase(0, i + 1);
        return true;
      }
      if (rest.front() == '{') {
        buf_.erase(0, i);
        mode_ = Mode::object;
        reset_object();
        return true;
      }
      if (kind_ == ToolParserKind::llama3_json) {  // the reply was calls only: the rest passes through
        mode_ = Mode::passthrough;
        return true;
      }
      if (rest.front() == ']') buf_.erase(0, i + 1);  // mistral's list ends
      break;
    }
    case ToolParserKind::none: break;
  }
  mode_ = Mode::text;  // text after the calls
  (void)out;
  return true;
}

std::string forced_tool_calls_gbnf(ToolParserKind kind, const nlohmann::ordered_json& tools,
                                   const std::string& function, bool parallel) {
  HACK_CHECK(kind == ToolParserKind::hermes || kind == ToolParserKind::llama3_json,
             "tool_choice 'required' or a named function needs the hermes or llama3_json tool-call syntax "
             "(this router parses {}{})",
             tool_parser_name(kind),
             kind == ToolParserKind::mistral ? ": mistral's [TOOL_CALLS] is a special token no grammar can produce" : "");
  // {"name": "f", "arguments": ARGS} (hermes) or {"name": "f", "parameters": ARGS} (llama3_json).
  const char* args_key = kind == ToolParserKind::hermes ? "arguments" : "parameters";
  std::string rules, alternatives;
  int n = 0;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!function.empty() && name != function) continue;
    const nlohmann::ordered_json schema =
        fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : nlohmann::ordered_json{{"type", "object"}};
    const std::string prefix = fmt::format("tool{}-", i);
    try {
      rules += grammar::json_schema_to_gbnf(schema, grammar::GbnfOptions{prefix});
    } catch (const Error& e) {
      throw Error(fmt::format("tools.[{}].function.parameters: {}", i, e.what()));
    }
    rules += "\n";
    if (n++ > 0) alternatives += " | ";
    alternatives += grammar::gbnf_literal(fmt::format("{{\"name\": \"{}\", \"{}\": ", name, args_key)) + " " + prefix +
                    "root " + grammar::gbnf_literal("}");
  }
  HACK_CHECK(n > 0, "tool_choice: no function named '{}' in tools", function);
  std::string root;
  if (kind == ToolParserKind::hermes) {
    root = "call ::= " + grammar::gbnf_literal("<tool_call>\n") + " (" + alternatives + ") " +
           grammar::gbnf_literal("\n</tool_call>") + "\n";
    root += parallel ? "root ::= call (" + grammar::gbnf_literal("\n") + " call)*\n" : "root ::= call\n";
  } else {
    root = "call ::= " + alternatives + "\n";
    root += parallel ? "root ::= call (" + grammar::gbnf_literal("; ") + " call)*\n" : "root ::= call\n";
  }
  return root + rules;
}

}  // namespace hack::server
