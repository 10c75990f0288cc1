#include "src/router/served_model.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/model/config.h"
#include "hack/model/generation_config.h"
#include "src/router/request_state.h"

namespace hack::server::router {

ServedModel::ServedModel(const RouterConfig& config) : tokenizer(Tokenizer::load(config.model)) {
  HACK_CHECK(!config.model.empty(), "--model DIR is required (tokenizer, chat template, config.json)");
  const std::filesystem::path dir(config.model);
  const ModelConfig mc = load_model_config(dir);  // config.json, or a GGUF's metadata
  name = !config.served_name.empty() ? config.served_name : dir.lexically_normal().filename().string();
  if (name.empty()) name = dir.lexically_normal().parent_path().filename().string();
  HACK_CHECK(config.max_model_len >= 0, "--max-model-len must not be negative");
  max_model_len = config.max_model_len > 0 ? config.max_model_len : mc.max_position_embeddings;
  created_s = unix_seconds_now();
  const GenerationConfig gen = load_generation_config(dir);
  if (gen.temperature) defaults.temperature = *gen.temperature;
  if (gen.top_p) defaults.top_p = *gen.top_p;
  if (gen.top_k) defaults.top_k = *gen.top_k;
  if (gen.repetition_penalty) defaults.repetition_penalty = *gen.repetition_penalty;
  eos_ids = merge_eos_ids(mc.eos_token_ids, gen, tokenizer.eos_id());
  std::optional<std::string> source;
  if (!config.chat_template.empty()) {
    source = read_file(config.chat_template, "chat template");
  } else {
    source = find_chat_template(dir, /*has_tools=*/false);
  }
  if (source) chat_template.emplace(ChatTemplate::parse(*source, config.chat_template.empty() ? config.model
                                                                                             : config.chat_template));
  template_renders_tools = source && template_knows_tools(*source);
  const std::optional<ToolParserKind> flag_parser = parse_tool_parser_flag(config.tool_parser);
  tool_parser = flag_parser ? *flag_parser : source ? detect_tool_parser(*source) : ToolParserKind::none;
  spdlog::info("hack-router: tool calls parsed as {} ({}){}", tool_parser_name(tool_parser),
               flag_parser ? "--tool-parser" : "judged from the chat template",
               source && !template_renders_tools ? "; the chat template ignores tools: rendered in Hermes form" : "");
  limits.served_models = {name};
  limits.vocab_size = mc.vocab_size;
}

// Prompt token ids of a request, or the 400 explaining why there are none.
std::variant<std::vector<int>, ProtocolError> ServedModel::prompt_tokens(const CompletionRequest& r,
                                                                       std::string& prompt_text) const {
  if (r.endpoint == Endpoint::kCompletions) {
    if (r.prompt_token_ids) {
      prompt_text = tokenizer.decode(*r.prompt_token_ids, /*skip_special_tokens=*/false);
      return *r.prompt_token_ids;
    }
    prompt_text = *r.prompt_text;
    return tokenizer.encode(prompt_text, /*add_special_tokens=*/true);
  }
  if (!chat_template) {
    ProtocolError e;
    e.message = fmt::format("model {} has no chat template; start the router with --chat-template FILE", name);
    return e;
  }
  try {
    ChatRenderOptions ro;
    ro.add_generation_prompt = r.add_generation_prompt;
    if (!tokenizer.bos_token().empty()) ro.bos_token = tokenizer.bos_token();
    if (!tokenizer.eos_token().empty()) ro.eos_token = tokenizer.eos_token();
    ro.tools = r.tools;
    ro.extra_kwargs = r.chat_template_kwargs;
    nlohmann::ordered_json messages = chat_messages_json(r);
    // A template that ignores tools would drop them, and fail on a tool call's null content.
    if (!template_renders_tools) messages = render_tools_hermes(messages, r.tools);
    prompt_text = chat_template->render(messages, ro);
  } catch (const Error& e) {
    ProtocolError pe;
    pe.message = fmt::format("the chat template could not render these messages: {}", e.what());
    pe.param = "messages";
    return pe;
  }
  return tokenizer.encode(prompt_text, /*add_special_tokens=*/false);
}

}  // namespace hack::server::router
