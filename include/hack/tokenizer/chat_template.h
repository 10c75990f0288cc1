/// @file chat_template.h
/// @brief Chat templates: turn a list of chat messages into the prompt text a model was
/// trained on, by rendering the Jinja `chat_template` of its tokenizer_config.json exactly
/// as transformers' apply_chat_template(tokenize=False) does.
///
/// Rendering goes through our own Jinja subset interpreter (jinja.h); a template using a
/// construct it lacks fails at parse() with the construct, line and column. Such a model
/// can still be served by passing a hand-written template file (`--chat-template FILE`):
/// read the file and give its text to ChatTemplate::parse.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "hack/tokenizer/jinja.h"

namespace hack {

/// What a template sees besides `messages` (the variables transformers passes).
struct ChatRenderOptions {
  /// End with the header that opens the assistant's reply.
  bool add_generation_prompt = false;
  /// Special tokens; unset ones are undefined in the template (transformers only passes
  /// the tokens a tokenizer has).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  /// JSON tool schemas (a list), or null: transformers always passes `tools` and
  /// `documents`, as None when absent, and templates test `tools is not none`.
  nlohmann::ordered_json tools;
  nlohmann::ordered_json documents;
  /// Any other template keyword arguments (an object or null), e.g. {"enable_thinking":
  /// false}, {"date_string": "26 Jul 2024"}, {"pad_token": "<pad>"}. They override
  /// bos_token / eos_token like transformers' kwargs override special tokens.
  nlohmann::ordered_json extra_kwargs;
  /// The time strftime_now() formats (UTC); unset = now, in local time.
  std::optional<int64_t> now_unix_s;
  jinja::RenderLimits limits;
};

/// A parsed chat template, reusable across requests (render is const and thread-safe).
class ChatTemplate {
 public:
  /// Parses template text; `name` labels errors ("chat template 'qwen3': ..."). Throws
  /// hack::Error for syntax errors and unsupported Jinja constructs, naming line/column.
  static ChatTemplate parse(std::string source, std::string name);

  /// Renders `messages` (a JSON list of message objects: role, content as string / null /
  /// list of parts, tool_calls with function.arguments as object or string, tool_call_id,
  /// reasoning_content, ...). Before rendering, like transformers, a message's reasoning
  /// given as `reasoning_content`, `thinking` or `reasoning` is made visible under both
  /// `reasoning_content` and `thinking`.
  /// Throws hack::Error naming the template and line on failure, and jinja::TemplateRaised
  /// (a hack::Error) carrying the template's own text when it calls raise_exception().
  /// Key order of JSON objects is what tojson prints, so pass ordered_json parsed from the
  /// request to reproduce transformers' output for tool schemas and arguments.
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;
  /// Same, for nlohmann::json input (its object keys are sorted, so tojson output is too).
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& options) const;

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  std::string name_;
  std::string source_;
  jinja::Template template_;
};

/// The template text of a tokenizer_config.json, chosen as transformers does: the
/// `chat_template` string, or from a list of {"name", "template"} entries the one named
/// "tool_use" when has_tools and it exists, else "default". Throws hack::Error when there
/// is none (or no default among several).
std::string chat_template_from_config(const nlohmann::json& tokenizer_config, bool has_tools);

/// The chat template of a model directory, looked up as transformers loads it:
/// chat_template.jinja, then chat_template.json ({"chat_template": ...}), then
/// tokenizer_config.json. nullopt when none of them has one. For a GGUF file: its
/// tokenizer.chat_template (tokenizer.chat_template.tool_use first when has_tools).
std::optional<std::string> find_chat_template(const std::filesystem::path& model_dir, bool has_tools);

}  // namespace hack
