#include "hack/router/responses_api.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <random>
#include <utility>

#include "hack/core/error.h"

namespace hack::server {

using Json = nlohmann::ordered_json;

namespace {

// OpenAI's bounds on metadata: 16 pairs, keys ≤ 64 characters, values ≤ 512.
constexpr size_t kMaxMetadataPairs = 16;
constexpr size_t kMaxMetadataKey = 64;
constexpr size_t kMaxMetadataValue = 512;

struct Rejected {
  ProtocolError error;
};

// A malformed request.
[[noreturn]] void reject(std::string param, std::string message) {
  throw Rejected{ProtocolError{400, std::move(message), "invalid_request_error", std::move(param), std::nullopt}};
}

// A well-formed request for something this server does not do.
[[noreturn]] void unsupported(std::string param, std::string message) {
  throw Rejected{
      ProtocolError{400, std::move(message), "invalid_request_error", std::move(param), "unsupported_parameter"}};
}

std::string type_name(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

std::string read_string(const Json& v, const std::string& name) {
  if (!v.is_string()) reject(name, fmt::format("{} must be a string, got {}", name, type_name(v)));
  return v.get<std::string>();
}

bool read_bool(const Json& v, const std::string& name) {
  if (!v.is_boolean()) reject(name, fmt::format("{} must be a boolean, got {}", name, type_name(v)));
  return v.get<bool>();
}

const Json& require(const Json& object, const char* key, const std::string& at) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) reject(at + "." + key, fmt::format("{}.{} is required", at, key));
  return *it;
}

void require_object(const Json& v, const std::string& name) {
  if (!v.is_object()) reject(name, fmt::format("{} must be an object, got {}", name, type_name(v)));
}

// Every key of `object` is one of `known`.
void check_keys(const Json& object, std::initializer_list<std::string_view> known, const std::string& at) {
  for (const auto& [key, v] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      reject(at + "." + key, fmt::format("Unrecognized field: {}.{}", at, key));
    }
  }
}

// Text of a content list: its text parts joined with "\n" (vLLM's "string" content format,
// as the chat parser joins chat parts). input_text and output_text both carry plain text.
std::string content_text(const Json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    reject(at, fmt::format("{} must be a string or a list of content parts, got {}", at, type_name(content)));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string pat = fmt::format("{}.[{}]", at, i);
    require_object(part, pat);
    const std::string type = read_string(require(part, "type", pat), pat + ".type");
    if (type == "input_image" || type == "input_file" || type == "input_audio") {
      unsupported(pat + ".type", fmt::format("{} content is not supported: this server serves text-only models "
                                             "(send input_text)",
                                             type));
    }
    if (type != "input_text" && type != "output_text") {
      unsupported(pat + ".type", fmt::format("content part type '{}' is not supported (input_text and output_text are)",
                                             type));
    }
    // output_text parts come back from an earlier Response with their annotations and logprobs.
    check_keys(part, {"type", "text", "annotations", "logprobs"}, pat);
    if (i > 0) text += '\n';
    text += read_string(require(part, "text", pat), pat + ".text");
  }
  return text;
}

Json read_message_item(const Json& item, const std::string& at) {
  check_keys(item, {"type", "role", "content", "id", "status", "phase"}, at);
  const std::string role = read_string(require(item, "role", at), at + ".role");
  static constexpr std::string_view kRoles[] = {"user", "system", "developer", "assistant"};
  if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles)) {
    reject(at + ".role", fmt::format("{}.role must be one of user, system, developer, assistant; got '{}'", at, role));
  }
  return {{"role", role}, {"content", content_text(require(item, "content", at), at + ".content")}};
}

// A function_call item becomes a tool call of an assistant message: of the previous message
// when that is the assistant's (its text, or calls before this one), else of a new one.
void add_function_call(const Json& item, const std::string& at, Json& messages) {
  check_keys(item, {"type", "call_id", "name", "arguments", "id", "status"}, at);
  Json call = {{"id", read_string(require(item, "call_id", at), at + ".call_id")},
               {"type", "function"},
               {"function",
                {{"name", read_string(require(item, "name", at), at + ".name")},
                 {"arguments", read_string(require(item, "arguments", at), at + ".arguments")}}}};
  if (!messages.empty() && messages.back()["role"] == "assistant") {
    Json& last = messages.back();
    if (!last.contains("tool_calls")) last["tool_calls"] = Json::array();
    last["tool_calls"].push_back(std::move(call));
    return;
  }
  messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array({std::move(call)})}});
}

Json read_function_call_output(const Json& item, const std::string& at) {
  check_keys(item, {"type", "call_id", "output", "id", "status"}, at);
  return {{"role", "tool"},
          {"tool_call_id", read_string(require(item, "call_id", at), at + ".call_id")},
          {"content", content_text(require(item, "output", at), at + ".output")}};
}

// `input` (a string, or a list of items) as chat messages, after the instructions.
Json read_input(const Json& input, const Json& instructions) {
  Json messages = Json::array();
  if (instructions.is_string()) messages.push_back({{"role", "system"}, {"content", instructions}});
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) reject("input", fmt::format("input must be a string or a list of items, got {}", type_name(input)));
  if (input.empty()) reject("input", "input must not be empty");
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string at = fmt::format("input.[{}]", i);
    require_object(item, at);
    const auto type = item.find("type");
    const std::string t = type == item.end() || type->is_null() ? "message" : read_string(*type, at + ".type");
    if (t == "message") {
      messages.push_back(read_message_item(item, at));
    } else if (t == "function_call") {
      add_function_call(item, at, messages);
    } else if (t == "function_call_output") {
      messages.push_back(read_function_call_output(item, at));
    } else if (t == "item_reference") {
      unsupported(at + ".type", "item_reference is not supported: this server stores no items; send the item itself");
    } else if (t == "reasoning") {
      unsupported(at + ".type", "reasoning items are not supported: this server's models produce none");
    } else {
      unsupported(at + ".type", fmt::format("input items of type '{}' are not supported (message, function_call and "
                                            "function_call_output are)",
                                            t));
    }
  }
  return messages;
}

// Function tools in the Responses shape ({type, name, description, parameters, strict}) and
// their chat form ({type, function: {name, description, parameters, strict}}).
Json read_tools(const Json& tools, Json& chat_tools) {
  if (!tools.is_array()) reject("tools", fmt::format("tools must be a list, got {}", type_name(tools)));
  chat_tools = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = fmt::format("tools.[{}]", i);
    require_object(t, at);
    const std::string type = read_string(require(t, "type", at), at + ".type");
    if (type != "function") {
      unsupported(at + ".type", fmt::format("'{}' tools are not supported: this server runs function tools only, "
                                            "which the client executes",
                                            type));
    }
    check_keys(t, {"type", "name", "description", "parameters", "strict"}, at);
    Json fn = {{"name", read_string(require(t, "name", at), at + ".name")}};
    if (t.contains("description") && !t["description"].is_null()) {
      fn["description"] = read_string(t["description"], at + ".description");
    }
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      require_object(t["parameters"], at + ".parameters");
      fn["parameters"] = t["parameters"];
    }
    if (t.contains("strict") && !t["strict"].is_null()) fn["strict"] = read_bool(t["strict"], at + ".strict");
    chat_tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return tools;
}

// "none" | "auto" | "required" | {"type": "function", "name"} and its chat form.
Json read_tool_choice(const Json& v, Json& chat_choice) {
  const std::string name = "tool_choice";
  if (v.is_string()) {
    const std::string c = v.get<std::string>();
    if (c != "none" && c != "auto" && c != "required") {
      reject(name, fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a function, got '{}'", c));
    }
    chat_choice = v;
    return v;
  }
  require_object(v, name);
  const std::string type = read_string(require(v, "type", name), name + ".type");
  if (type != "function") {
    unsupported(name + ".type", fmt::format("tool_choice of type '{}' is not supported (\"none\", \"auto\", "
                                            "\"required\" and {{\"type\": \"function\", \"name\": ...}} are)",
                                            type));
  }
  check_keys(v, {"type", "name"}, name);
  const std::string fn = read_string(require(v, "name", name), name + ".name");
  chat_choice = {{"type", "function"}, {"function", {{"name", fn}}}};
  return v;
}

// text: {format: {type: text | json_object | json_schema, ...}, verbosity}. Sets the chat
// response_format (null for text) and returns the format the Response reports.
Json read_text(const Json& v, Json& response_format) {
  require_object(v, "text");
  check_keys(v, {"format", "verbosity"}, "text");
  if (v.contains("verbosity") && !v["verbosity"].is_null()) {
    const std::string verbosity = read_string(v["verbosity"], "text.verbosity");
    if (verbosity != "medium") {
      unsupported("text.verbosity", fmt::format("text.verbosity '{}' is not supported (only 'medium')", verbosity));
    }
  }
  Json format = {{"type", "text"}};
  if (!v.contains("format") || v["format"].is_null()) return format;
  const Json& f = v["format"];
  require_object(f, "text.format");
  const std::string type = read_string(require(f, "type", "text.format"), "text.format.type");
  if (type == "text") {
    check_keys(f, {"type"}, "text.format");
    return format;
  }
  if (type == "json_object") {
    check_keys(f, {"type"}, "text.format");
    response_format = {{"type", "json_object"}};
    return f;
  }
  if (type != "json_schema") {
    reject("text.format.type", fmt::format("text.format.type must be text, json_object or json_schema, got '{}'", type));
  }
  check_keys(f, {"type", "name", "schema", "description", "strict"}, "text.format");
  Json schema = {{"name", read_string(require(f, "name", "text.format"), "text.format.name")}};
  const Json& s = require(f, "schema", "text.format");
  require_object(s, "text.format.schema");
  schema["schema"] = s;
  if (f.contains("description") && !f["description"].is_null()) {
    schema["description"] = read_string(f["description"], "text.format.description");
  }
  if (f.contains("strict") && !f["strict"].is_null()) schema["strict"] = read_bool(f["strict"], "text.format.strict");
  response_format = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return f;
}

Json read_metadata(const Json& v) {
  require_object(v, "metadata");
  if (v.size() > kMaxMetadataPairs) {
    reject("metadata", fmt::format("metadata holds at most {} pairs, got {}", kMaxMetadataPairs, v.size()));
  }
  for (const auto& [key, value] : v.items()) {
    if (key.size() > kMaxMetadataKey) {
      reject("metadata", fmt::format("metadata keys are at most {} characters, '{}' has {}", kMaxMetadataKey, key,
                                     key.size()));
    }
    const std::string s = read_string(value, "metadata." + key);
    if (s.size() > kMaxMetadataValue) {
      reject("metadata." + key, fmt::format("metadata values are at most {} characters, got {}", kMaxMetadataValue, s.size()));
    }
  }
  return v;
}

int read_max_output_tokens(const Json& v) {
  const std::string name = "max_output_tokens";
  if (!v.is_number_integer()) reject(name, fmt::format("{} must be an integer, got {}", name, type_name(v)));
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  if (huge || v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    reject(name, fmt::format("{} must be at most {}, got {}", name, std::numeric_limits<int32_t>::max(), v.dump()));
  }
  if (v.get<int64_t>() < 1) reject(name, fmt::format("{} must be at least 1, got {}", name, v.get<int64_t>()));
  return v.get<int>();
}

ResponsesRequest parse_body(const Json& body) {
  if (!body.is_object()) reject("", fmt::format("Request body must be a JSON object, got {}", type_name(body)));
  ResponsesRequest r;
  Json chat = Json::object();
  Json input, chat_tools, chat_tool_choice, response_format;
  bool has_input = false, tool_choice_given = false;
  for (const auto& [key, v] : body.items()) {
    if (v.is_null()) continue;  // explicit null is "not given"
    if (key == "model") {
      r.model = read_string(v, key);
    } else if (key == "input") {
      input = v;
      has_input = true;
    } else if (key == "instructions") {
      r.instructions = read_string(v, key);
    } else if (key == "max_output_tokens") {
      r.max_output_tokens = read_max_output_tokens(v);
    } else if (key == "temperature" || key == "top_p") {
      // Ranges are the chat parser's (same names, so its errors name these fields).
      if (!v.is_number()) reject(key, fmt::format("{} must be a number, got {}", key, type_name(v)));
      (key == "temperature" ? r.temperature : r.top_p) = v;
    } else if (key == "seed") {
      if (!v.is_number_integer()) reject(key, fmt::format("seed must be an integer, got {}", type_name(v)));
      chat["seed"] = v;
    } else if (key == "stream") {
      r.stream = read_bool(v, key);
    } else if (key == "stream_options") {
      require_object(v, key);
      check_keys(v, {"include_obfuscation"}, key);
      // Obfuscation pads deltas against length side channels; this server never adds it.
      if (v.contains("include_obfuscation") && !v["include_obfuscation"].is_null()) {
        read_bool(v["include_obfuscation"], "stream_options.include_obfuscation");
      }
    } else if (key == "tools") {
      r.tools = read_tools(v, chat_tools);
    } else if (key == "tool_choice") {
      r.tool_choice = read_tool_choice(v, chat_tool_choice);
      tool_choice_given = true;
    } else if (key == "parallel_tool_calls") {
      r.parallel_tool_calls = read_bool(v, key);
    } else if (key == "text") {
      r.text_format = read_text(v, response_format);
    } else if (key == "metadata") {
      r.metadata = read_metadata(v);
    } else if (key == "user") {
      r.user = read_string(v, key);
    } else if (key == "safety_identifier" || key == "prompt_cache_key") {
      // Hints: an end-user id for abuse monitoring (nothing here uses it), and a cache
      // routing key (the nodes find shared prefixes by their tokens).
      read_string(v, key);
    } else if (key == "service_tier") {
      const std::string tier = read_string(v, key);
      if (tier != "auto" && tier != "default") {
        unsupported(key, fmt::format("service_tier '{}' is not supported (auto and default are)", tier));
      }
    } else if (key == "truncation") {
      const std::string t = read_string(v, key);
      if (t == "auto") unsupported(key, "truncation 'auto' is not supported: an input past the context is refused");
      if (t != "disabled") reject(key, fmt::format("truncation must be 'disabled' or 'auto', got '{}'", t));
    } else if (key == "store") {
      if (read_bool(v, key)) {
        unsupported(key, "store is not supported: this server keeps no responses; send store=false (or omit it) and "
                         "the whole conversation in input");
      }
    } else if (key == "background") {
      if (read_bool(v, key)) unsupported(key, "background mode is not supported: send the request in the foreground");
    } else if (key == "previous_response_id") {
      unsupported(key, "previous_response_id is not supported: this server keeps no responses; send the earlier "
                       "turns (messages, function_call and function_call_output items) in input");
    } else if (key == "conversation") {
      unsupported(key, "conversations are not supported: send the earlier turns in input");
    } else if (key == "prompt") {
      unsupported(key, "prompt templates are not supported: send instructions and input");
    } else if (key == "include") {
      if (!v.is_array()) reject(key, fmt::format("include must be a list, got {}", type_name(v)));
      if (!v.empty()) {
        unsupported(key, fmt::format("include '{}' is not supported: this server adds nothing to the output",
                                     v[0].is_string() ? v[0].get<std::string>() : v[0].dump()));
      }
    } else if (key == "top_logprobs") {
      if (!v.is_number_integer()) reject(key, fmt::format("top_logprobs must be an integer, got {}", type_name(v)));
      if (v.get<int64_t>() != 0) unsupported(key, "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)");
    } else if (key == "max_tool_calls") {
      unsupported(key, "max_tool_calls is not supported");
    } else if (key == "reasoning") {
      require_object(v, key);
      for (const auto& [field, x] : v.items()) {
        if (!x.is_null()) {
          unsupported("reasoning." + field, fmt::format("reasoning.{} is not supported: this server's models do not "
                                                        "reason separately",
                                                        field));
        }
      }
    } else {
      reject(key, fmt::format("Unrecognized request argument supplied: {}", key));
    }
  }
  if (!has_input) reject("input", "input is required");
  Json messages = read_input(input, r.instructions);

  if (r.model) chat["model"] = *r.model;
  chat["messages"] = std::move(messages);
  const bool has_tools = chat_tools.is_array() && !chat_tools.empty();
  if (has_tools) chat["tools"] = std::move(chat_tools);
  // Without tools, "none" and "auto" mean nothing; "required" and a name are the chat
  // parser's 400 ("needs tools").
  if (tool_choice_given && (has_tools || chat_tool_choice.is_object() || chat_tool_choice == "required")) {
    chat["tool_choice"] = chat_tool_choice;
  }
  if (has_tools) chat["parallel_tool_calls"] = r.parallel_tool_calls;
  if (!r.max_output_tokens.is_null()) chat["max_completion_tokens"] = r.max_output_tokens;
  if (!r.temperature.is_null()) chat["temperature"] = r.temperature;
  if (!r.top_p.is_null()) chat["top_p"] = r.top_p;
  if (!response_format.is_null()) chat["response_format"] = std::move(response_format);
  if (r.user.is_string()) chat["user"] = r.user;
  // Whole or streamed, the router streams the chat choice and the translator builds the
  // Response from its chunks (ResponsesStreamTranslator): one path, so both agree.
  chat["stream"] = true;
  chat["stream_options"] = {{"include_usage", true}};
  r.chat_body = chat.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

std::string random_hex(int words) {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < words; ++i) s += fmt::format("{:08x}", static_cast<uint32_t>(rd()));
  return s;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

Json output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

int status_of_error_type(const std::string& type) {
  if (type == "service_unavailable") return 503;
  if (type == "rate_limit_error") return 429;
  if (type == "invalid_request_error") return 400;
  return 500;
}

// The chat parser's field names in an error, as the Responses request names them.
std::optional<std::string> responses_param(const std::optional<std::string>& param) {
  if (!param) return param;
  const std::string& p = *param;
  if (p == "messages" || p.starts_with("messages.")) return "input";
  if (p == "max_completion_tokens") return "max_output_tokens";
  if (p == "response_format" || p.starts_with("response_format.")) return "text.format";
  if (p.starts_with("tools.")) {  // tools.[i].function.x → tools.[i].x
    const size_t fn = p.find(".function");
    if (fn != std::string::npos) return p.substr(0, fn) + p.substr(fn + std::string_view(".function").size());
  }
  return p;
}

// The chat path's answer as a Responses answer: chunks are translated (and, for a whole
// response, collected until the stream ends); errors before the stream pass through in the
// standard shape with their param renamed.
class ResponsesResponder final : public Responder {
 public:
  ResponsesResponder(std::shared_ptr<Responder> inner, ResponsesRequest request)
      : inner_(std::move(inner)),
        stream_(request.stream),
        translator_(std::move(request), make_response_id(),
                    std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                        .count()) {}

  bool send(int status, std::string_view content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> extra_headers) override {
    if (status >= 400) {
      const Json j = Json::parse(body, nullptr, false);
      if (!j.is_discarded() && j.contains("error") && j["error"].is_object()) {
        Json renamed = j;
        Json& param = renamed["error"]["param"];
        if (param.is_string()) param = *responses_param(param.get<std::string>());
        body = dump(renamed);
      }
      return inner_->send(status, content_type, std::move(body), std::move(extra_headers));
    }
    // The chat body always streams, so a whole 2xx answer is not the chat path's.
    spdlog::error("/v1/responses: unexpected whole answer {} from the chat path", status);
    return inner_->send(500, "application/json", error_body(internal_error("unexpected answer from the chat path")));
  }

  bool start_sse(std::vector<std::pair<std::string, std::string>> extra_headers) override {
    return stream_ ? inner_->start_sse(std::move(extra_headers)) : !inner_->closed();
  }

  bool send_event(std::string_view data, std::string_view /*event: the chat path names none*/) override {
    std::vector<ResponsesEvent> events;
    {
      std::lock_guard lock(mutex_);
      try {
        events = translator_.on_chat_event(data);
      } catch (const std::exception& e) {
        spdlog::error("/v1/responses: untranslatable chat event: {}", e.what());
        events = translator_.on_chat_event(error_body(internal_error("untranslatable chat event")));
      }
    }
    if (!stream_) return !inner_->closed();
    bool ok = true;
    for (const ResponsesEvent& e : events) ok = inner_->send_event(e.data, e.type) && ok;
    return ok;
  }

  bool end() override {
    if (stream_) return inner_->end();
    std::string body;
    std::optional<ProtocolError> failure;
    {
      std::lock_guard lock(mutex_);
      if (!translator_.finished()) translator_.on_chat_event("[DONE]");
      failure = translator_.failure();
      if (!failure) body = translator_.response();
    }
    if (failure) return inner_->send(failure->status, "application/json", error_body(*failure));
    return inner_->send(200, "application/json", std::move(body));
  }

  bool closed() const override { return inner_->closed(); }
  void on_client_closed(std::function<void()> fn) override { inner_->on_client_closed(std::move(fn)); }

 private:
  std::shared_ptr<Responder> inner_;
  const bool stream_;
  std::mutex mutex_;
  ResponsesStreamTranslator translator_;
};

}  // namespace

ResponsesParseResult parse_responses_request(std::string_view body) {
  try {
    Json j;
    if (std::optional<std::string> error = parse_json_body(body, j)) reject("", std::move(*error));
    return parse_body(j);
  } catch (Rejected& r) {
    if (r.error.param && r.error.param->empty()) r.error.param.reset();
    return std::move(r.error);
  } catch (const std::exception& e) {
    return ProtocolError{400, fmt::format("Invalid request: {}", e.what()), "invalid_request_error", std::nullopt,
                         std::nullopt};
  }
}

std::string make_response_id() { return "resp_" + random_hex(4); }

// ---- the event stream ---------------------------------------------------------------------

ResponsesStreamTranslator::ResponsesStreamTranslator(ResponsesRequest request, std::string response_id,
                                                     int64_t created_at)
    : request_(std::move(request)), id_(std::move(response_id)), created_at_(created_at) {}

Json ResponsesStreamTranslator::response_json(const std::string& status) const {
  Json j = {{"id", id_},
            {"object", "response"},
            {"created_at", created_at_},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", request_.instructions},
            {"max_output_tokens", request_.max_output_tokens},
            {"max_tool_calls", nullptr},
            {"metadata", request_.metadata},
            {"model", model_},
            {"output", status == "in_progress" ? Json::array() : output_},
            {"parallel_tool_calls", request_.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", nullptr},
            {"service_tier", "default"},
            {"store", false},
            {"temperature", request_.temperature},
            {"text", {{"format", request_.text_format}}},
            {"tool_choice", request_.tool_choice},
            {"tools", request_.tools},
            {"top_logprobs", 0},
            {"top_p", request_.top_p},
            {"truncation", "disabled"},
            {"usage", status == "in_progress" ? Json(nullptr) : usage_},
            {"user", request_.user}};
  if (status == "incomplete") j["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (status == "failed" && failure_) j["error"] = {{"code", "server_error"}, {"message", failure_->message}};
  return j;
}

void ResponsesStreamTranslator::emit(std::vector<ResponsesEvent>& out, std::string type, Json body) {
  Json j = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : body.items()) j[key] = std::move(value);
  out.push_back(ResponsesEvent{std::move(type), dump(j)});
}

void ResponsesStreamTranslator::start(const Json* chunk, std::vector<ResponsesEvent>& out) {
  started_ = true;
  model_ = request_.model.value_or("");
  if (chunk) {
    if (chunk->contains("model") && (*chunk)["model"].is_string()) model_ = (*chunk)["model"].get<std::string>();
    if (chunk->contains("created") && (*chunk)["created"].is_number_integer()) {
      created_at_ = (*chunk)["created"].get<int64_t>();
    }
  }
  emit(out, "response.created", {{"response", response_json("in_progress")}});
  emit(out, "response.in_progress", {{"response", response_json("in_progress")}});
}

void ResponsesStreamTranslator::on_text(const std::string& text, std::vector<ResponsesEvent>& out) {
  if (open_ == Open::call) close_item(false, out);
  std::string delta = text;
  if (open_ == Open::none) {
    if (all_space(text)) {
      pending_space_ += text;
      return;
    }
    delta = pending_space_ + text;
    pending_space_.clear();
    open_ = Open::message;
    text_.clear();
    item_ = {{"id", "msg_" + random_hex(4)}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"},
             {"content", Json::array()}};
    const auto index = static_cast<int64_t>(output_.size());
    emit(out, "response.output_item.added", {{"output_index", index}, {"item", item_}});
    emit(out, "response.content_part.added",
         {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", output_text_part("")}});
  }
  text_ += delta;
  emit(out, "response.output_text.delta",
       {{"item_id", item_["id"]},
        {"output_index", static_cast<int64_t>(output_.size())},
        {"content_index", 0},
        {"delta", delta},
        {"logprobs", Json::array()}});
}

void ResponsesStreamTranslator::on_call_delta(const Json& d, std::vector<ResponsesEvent>& out) {
  HACK_CHECK(d.contains("index") && d["index"].is_number_integer(), "a tool-call delta without an index");
  const int index = d["index"].get<int>();
  const Json fn = d.value("function", Json::object());
  if (open_ != Open::call || call_index_ != index) {
    if (open_ != Open::none) close_item(false, out);
    pending_space_.clear();  // whitespace between items is no message
    HACK_CHECK(d.contains("id") && fn.contains("name"), "tool call {} starts without its id and name", index);
    open_ = Open::call;
    call_index_ = index;
    item_ = {{"id", "fc_" + random_hex(4)}, {"type", "function_call"}, {"status", "in_progress"},
             {"arguments", ""},             {"call_id", d["id"]},       {"name", fn["name"]}};
    emit(out, "response.output_item.added", {{"output_index", static_cast<int64_t>(output_.size())}, {"item", item_}});
  }
  const std::string args = fn.contains("arguments") && fn["arguments"].is_string() ? fn["arguments"].get<std::string>() : "";
  if (args.empty()) return;
  item_["arguments"] = item_["arguments"].get<std::string>() + args;
  emit(out, "response.function_call_arguments.delta",
       {{"item_id", item_["id"]}, {"output_index", static_cast<int64_t>(output_.size())}, {"delta", args}});
}

void ResponsesStreamTranslator::close_item(bool cut_off, std::vector<ResponsesEvent>& out) {
  const auto index = static_cast<int64_t>(output_.size());
  item_["status"] = cut_off ? "incomplete" : "completed";
  if (open_ == Open::message) {
    const Json part = output_text_part(text_);
    emit(out, "response.output_text.done",
         {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", Json::array()}});
    emit(out, "response.content_part.done",
         {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item_["content"] = Json::array({part});
  } else if (open_ == Open::call) {
    emit(out, "response.function_call_arguments.done",
         {{"item_id", item_["id"]}, {"output_index", index}, {"arguments", item_["arguments"]}});
  }
  emit(out, "response.output_item.done", {{"output_index", index}, {"item", item_}});
  output_.push_back(std::move(item_));
  item_ = nullptr;
  open_ = Open::none;
  call_index_ = -1;
}

void ResponsesStreamTranslator::finish(std::optional<ProtocolError> error, std::vector<ResponsesEvent>& out) {
  const bool cut_off = finish_reason_ == "length";
  if (open_ != Open::none) close_item(cut_off, out);
  pending_space_.clear();
  finished_ = true;
  if (error) {
    failure_ = std::move(error);
    final_status_ = "failed";
  } else {
    final_status_ = cut_off ? "incomplete" : "completed";
  }
  emit(out, "response." + final_status_, {{"response", response_json(final_status_)}});
}

std::vector<ResponsesEvent> ResponsesStreamTranslator::on_chat_event(std::string_view data) {
  std::vector<ResponsesEvent> out;
  if (finished_) return out;
  if (data == "[DONE]") {
    if (!started_) start(nullptr, out);
    finish(std::nullopt, out);
    return out;
  }
  const Json j = Json::parse(data.begin(), data.end(), nullptr, false);
  HACK_CHECK(!j.is_discarded() && j.is_object(), "a chat stream event that is not a JSON object: {}", data.substr(0, 200));
  if (j.contains("error")) {
    const Json& e = j["error"];
    ProtocolError error;
    error.message = e.value("message", std::string("generation failed"));
    error.type = e.value("type", std::string("internal_server_error"));
    error.status = status_of_error_type(error.type);
    if (e.contains("code") && e["code"].is_string()) error.code = e["code"].get<std::string>();
    if (!started_) start(nullptr, out);
    finish(std::move(error), out);
    return out;
  }
  if (!started_) start(&j, out);
  if (j.contains("usage") && j["usage"].is_object()) {
    const Json& u = j["usage"];
    const int64_t input = u.value("prompt_tokens", int64_t{0}), output = u.value("completion_tokens", int64_t{0});
    // cached_tokens: the router does not learn how much of the prompt the nodes' prefix
    // caches served, so it reports none (as for chat completions, which omit the detail).
    usage_ = {{"input_tokens", input},
              {"input_tokens_details", {{"cached_tokens", 0}}},
              {"output_tokens", output},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", input + output}};
  }
  HACK_CHECK(j.contains("choices") && j["choices"].is_array(), "a chat chunk without choices");
  for (const Json& choice : j["choices"]) {
    const Json delta = choice.value("delta", Json::object());
    if (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) {
      on_text(delta["content"].get<std::string>(), out);
    }
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      for (const Json& d : delta["tool_calls"]) on_call_delta(d, out);
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      finish_reason_ = choice["finish_reason"].get<std::string>();
    }
  }
  return out;
}

std::string ResponsesStreamTranslator::response() const {
  HACK_CHECK(finished_, "the Response is not finished");
  return dump(response_json(final_status_));
}

// ---- routing --------------------------------------------------------------------------------

std::variant<ResponsesRoute, ProtocolError> route_responses(const HttpRequest& request, std::shared_ptr<Responder> res) {
  if (request.path != "/v1/responses") {
    // /v1/responses/{id}[/input_items | /cancel]: all about stored responses.
    return ProtocolError{400,
                         fmt::format("{} is not served: this server keeps no responses (store, retrieve, delete, "
                                     "cancel and input_items are not supported); send the whole conversation in "
                                     "input with POST /v1/responses",
                                     request.path),
                         "invalid_request_error", std::nullopt, "unsupported_parameter"};
  }
  if (request.method != "POST") {
    return ProtocolError{405, fmt::format("method {} is not allowed on {}", request.method, request.path),
                         "invalid_request_error", std::nullopt, std::nullopt};
  }
  ResponsesParseResult parsed = parse_responses_request(request.body);
  if (auto* e = std::get_if<ProtocolError>(&parsed)) return *e;
  ResponsesRequest r = std::get<ResponsesRequest>(std::move(parsed));
  std::string chat_body = r.chat_body;
  return ResponsesRoute{std::move(chat_body), std::make_shared<ResponsesResponder>(std::move(res), std::move(r))};
}

}  // namespace hack::server
