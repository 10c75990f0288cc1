// The model the router serves, as its edge needs it: tokenizer, chat template, tool-call
// syntax, sampling defaults and EOS ids from generation_config.json, the name and length
// limits clients see; and a request's prompt as token ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "hack/router/openai_protocol.h"
#include "hack/router/router_server.h"
#include "hack/router/tool_calls.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack::server::router {

struct ServedModel {
  /// Loads tokenizer, template and configs from config.model (--chat-template overrides the
  /// template, --tool-parser the syntax). Throws hack::Error.
  explicit ServedModel(const RouterConfig& config);

  /// Prompt token ids of a request (completions: its ids or its text encoded; chat: the
  /// template's render), or the 400 explaining why there are none.
  std::variant<std::vector<int>, ProtocolError> prompt_tokens(const CompletionRequest& r, std::string& prompt_text) const;

  Tokenizer tokenizer;
  std::optional<ChatTemplate> chat_template;
  bool template_renders_tools = false;  // else tools and tool messages are rendered in Hermes form first
  ToolParserKind tool_parser = ToolParserKind::none;
  std::string name;                     // what clients call it
  int max_model_len = 0;
  int64_t created_s = 0;
  SamplingParams defaults;
  std::vector<int> eos_ids;  // the model's, as the nodes merge them (a migrated stream that ended on one is done)
  ProtocolLimits limits;
};

}  // namespace hack::server::router
