// Chat templates on top of the Jinja interpreter: the variables and message preprocessing
// of transformers' render_jinja_template, and template lookup in a model directory.
#include "hack/tokenizer/chat_template.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "hack/core/error.h"
#include "hack/core/gguf_file.h"
#include "hack/core/read_file.h"

namespace hack {
namespace {

using nlohmann::ordered_json;

// transformers' _alias_reasoning_fields: a message's reasoning under any of these names
// (the first one not null) is re-exposed as {"thinking": r, **message, "reasoning_content": r}.
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

jinja::Value message_value(const ordered_json& message) {
  const ordered_json* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    const auto it = message.find(field);
    if (it != message.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (!reasoning) return jinja::value_from_json(message);
  ordered_json aliased = ordered_json::object();
  aliased["thinking"] = *reasoning;
  for (const auto& [key, value] : message.items()) aliased[key] = value;
  aliased["reasoning_content"] = *reasoning;
  return jinja::value_from_json(aliased);
}

jinja::Value optional_string(const std::optional<std::string>& s) {
  return s ? jinja::Value::string(*s) : jinja::Value::undefined("");
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
  ChatTemplate t;
  t.name_ = std::move(name);
  t.template_ = jinja::Template::parse(source, fmt::format("chat template '{}'", t.name_));
  t.source_ = std::move(source);
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
  HACK_CHECK(messages.is_array(), "chat template '{}': messages must be a JSON list, got {}", name_, messages.type_name());
  std::vector<jinja::Value> chat;
  chat.reserve(messages.size());
  for (const auto& message : messages) {
    HACK_CHECK(message.is_object(), "chat template '{}': chat messages must be objects, got {}", name_,
               message.type_name());
    chat.push_back(message_value(message));
  }
  HACK_CHECK(options.extra_kwargs.is_null() || options.extra_kwargs.is_object(),
             "chat template '{}': extra template arguments must be a JSON object", name_);

  // Same variables, in the same precedence, as render(messages=..., tools=..., documents=...,
  // add_generation_prompt=..., **{**special_tokens_map, **kwargs}).
  jinja::Variables vars;
  if (options.bos_token) vars.emplace_back("bos_token", optional_string(options.bos_token));
  if (options.eos_token) vars.emplace_back("eos_token", optional_string(options.eos_token));
  if (options.extra_kwargs.is_object()) {
    for (const auto& [key, value] : options.extra_kwargs.items()) {
      HACK_CHECK(key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt",
                 "chat template '{}': '{}' cannot be passed as an extra template argument", name_, key);
      vars.emplace_back(key, jinja::value_from_json(value));
    }
  }
  vars.emplace_back("messages", jinja::Value::list(std::move(chat)));
  vars.emplace_back("tools", jinja::value_from_json(options.tools));
  vars.emplace_back("documents", jinja::value_from_json(options.documents));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));

  jinja::RenderOptions render_options;
  render_options.limits = options.limits;
  render_options.now_unix_s = options.now_unix_s;
  return template_.render(vars, render_options);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const ChatRenderOptions& options) const {
  return render(ordered_json(messages), options);
}

std::string chat_template_from_config(const nlohmann::json& tokenizer_config, bool has_tools) {
  const auto it = tokenizer_config.find("chat_template");
  HACK_CHECK(it != tokenizer_config.end() && !it->is_null(),
             "the tokenizer config has no chat_template (pass a template file with --chat-template)");
  if (it->is_string()) return it->get<std::string>();
  HACK_CHECK(it->is_array(), "chat_template must be a string or a list of {{name, template}}, got {}", it->type_name());
  const nlohmann::json* fallback = nullptr;
  const nlohmann::json* tool_use = nullptr;
  for (const auto& entry : *it) {
    HACK_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") &&
                   entry["name"].is_string() && entry["template"].is_string(),
               "chat_template list entries must be {{\"name\": ..., \"template\": ...}}");
    if (entry["name"] == "default") fallback = &entry["template"];
    if (entry["name"] == "tool_use") tool_use = &entry["template"];
  }
  if (has_tools && tool_use) return tool_use->get<std::string>();
  HACK_CHECK(fallback != nullptr,
             "the tokenizer has several chat templates and none is named 'default' (pass one with --chat-template)");
  return fallback->get<std::string>();
}

std::optional<std::string> find_chat_template(const std::filesystem::path& model_dir, bool has_tools) {
  if (is_gguf_file(model_dir)) {  // llama.cpp's keys: tokenizer.chat_template[.tool_use]
    const GgufFile f = GgufFile::open(model_dir);
    const GgufValue* tool_use = has_tools ? f.find("tokenizer.chat_template.tool_use") : nullptr;
    const GgufValue* t = tool_use ? tool_use : f.find("tokenizer.chat_template");
    if (t == nullptr) return std::nullopt;
    return t->as_string("tokenizer.chat_template");
  }
  const auto jinja_file = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_file)) return read_file(jinja_file, "chat template");
  for (const char* name : {"chat_template.json", "tokenizer_config.json"}) {
    const auto path = model_dir / name;
    if (!std::filesystem::exists(path)) continue;
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(read_file(path, "tokenizer config"));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", path.string(), e.what());
    }
    if (config.contains("chat_template") && !config["chat_template"].is_null()) {
      return chat_template_from_config(config, has_tools);
    }
  }
  return std::nullopt;
}

}  // namespace hack
