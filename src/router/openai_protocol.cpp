#include "hack/router/openai_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <utility>

#include "hack/core/error.h"
#include "hack/grammar/grammar.h"
#include "hack/grammar/json_schema.h"

namespace hack::server {

using Json = nlohmann::ordered_json;

namespace {

// Nesting deeper than this is refused before the DOM is built (tool schemas nest a few levels).
constexpr int kMaxJsonDepth = 64;
// vLLM clamps -inf logprobs to this so the JSON stays finite.
constexpr float kMinLogprob = -9999.0f;

// Carries a ProtocolError out of the nested parse helpers to parse_request.
struct Rejected {
  ProtocolError error;
};

[[noreturn]] void reject(std::string param, std::string message) {
  throw Rejected{ProtocolError{400, std::move(message), "invalid_request_error", std::move(param), std::nullopt}};
}

std::string type_name(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

int64_t read_int(const Json& v, const std::string& name, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) reject(name, fmt::format("{} must be at most {}, got {}", name, hi, u));
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // 5.0 is an integer to pydantic (and so to vLLM); 5.5 and 1e300 are not.
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
      reject(name, fmt::format("{} must be an integer, got {}", name, v.dump()));
    }
    x = static_cast<int64_t>(d);
  } else {
    reject(name, fmt::format("{} must be an integer, got {}", name, type_name(v)));
  }
  if (x < lo) reject(name, fmt::format("{} must be at least {}, got {}", name, lo, x));
  if (x > hi) reject(name, fmt::format("{} must be at most {}, got {}", name, hi, x));
  return x;
}

int read_int32(const Json& v, const std::string& name, int64_t lo, int64_t hi = std::numeric_limits<int32_t>::max()) {
  return static_cast<int>(read_int(v, name, lo, hi));
}

double read_number(const Json& v, const std::string& name) {
  if (!v.is_number()) reject(name, fmt::format("{} must be a number, got {}", name, type_name(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d)) reject(name, fmt::format("{} must be a finite number", name));
  return d;
}

float read_float_in(const Json& v, const std::string& name, double lo, double hi) {
  const double d = read_number(v, name);
  if (d < lo || d > hi) reject(name, fmt::format("{} must be in [{}, {}], got {}", name, lo, hi, d));
  return static_cast<float>(d);
}

bool read_bool(const Json& v, const std::string& name) {
  if (!v.is_boolean()) reject(name, fmt::format("{} must be a boolean, got {}", name, type_name(v)));
  return v.get<bool>();
}

std::string read_string(const Json& v, const std::string& name) {
  if (!v.is_string()) reject(name, fmt::format("{} must be a string, got {}", name, type_name(v)));
  return v.get<std::string>();
}

void check_token_id(int64_t id, const std::string& name, int vocab_size) {
  if (vocab_size > 0 && id >= vocab_size) {
    reject(name, fmt::format("{}: token id {} is out of vocabulary (size {})", name, id, vocab_size));
  }
}

// {"50256": -100, ...}: token ids as decimal strings (OpenAI's form), biases in [-100, 100];
// null = none. Sorted by id, so equal requests give equal parameters.
std::vector<std::pair<int, float>> read_logit_bias(const Json& v, const std::string& name, int vocab_size) {
  std::vector<std::pair<int, float>> out;
  if (v.is_null()) return out;
  if (!v.is_object()) {
    reject(name, fmt::format("{} must be an object mapping token ids to biases, got {}", name, type_name(v)));
  }
  for (const auto& [key, bias] : v.items()) {
    const bool digits =
        !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) reject(name, fmt::format("{}: '{}' is not a token id", name, key));
    const int64_t id = std::stoll(key);
    if (id > std::numeric_limits<int32_t>::max()) reject(name, fmt::format("{}: token id {} is out of range", name, key));
    check_token_id(id, name, vocab_size);
    const double b = read_number(bias, name);
    if (b < -100.0 || b > 100.0) reject(name, fmt::format("{}: the bias of token {} must be in [-100, 100], got {}", name, key, b));
    out.emplace_back(static_cast<int>(id), static_cast<float>(b));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> read_token_ids(const Json& v, const std::string& name, int vocab_size) {
  std::vector<int> ids;
  ids.reserve(v.size());
  for (const Json& x : v) {
    const int id = read_int32(x, name, 0);
    check_token_id(id, name, vocab_size);
    ids.push_back(id);
  }
  return ids;
}

void read_prompt(const Json& v, const ProtocolLimits& limits, CompletionRequest& r) {
  const std::string name = "prompt";
  if (v.is_string()) {
    r.prompt_text = v.get<std::string>();
    return;
  }
  if (!v.is_array()) {
    reject(name, fmt::format("prompt must be a string, a list of token ids, or a list with one string, got {}", type_name(v)));
  }
  if (v.empty()) reject(name, "prompt must not be empty");
  const Json& first = v.front();
  if (first.is_number()) {
    r.prompt_token_ids = read_token_ids(v, name, limits.vocab_size);
    return;
  }
  if (!first.is_string() && !first.is_array()) {
    reject(name, fmt::format("prompt must be a string, a list of token ids, or a list with one string, got a list of {}",
                             type_name(first)));
  }
  if (v.size() > 1) {
    if (v.size() > kMaxBatchPrompts)
      reject(name, fmt::format("a list of {} prompts; at most {} per request", v.size(), kMaxBatchPrompts));
    for (const Json& p : v) {
      if (p.is_string()) {
        r.batch.emplace_back(p.get<std::string>());
      } else if (p.is_array() && !p.empty()) {
        r.batch.emplace_back(read_token_ids(p, name, limits.vocab_size));
      } else {
        reject(name, fmt::format("each prompt of a list must be a string or a non-empty list of token ids, got {}",
                                 type_name(p)));
      }
    }
    return;
  }
  if (first.is_string()) {
    r.prompt_text = first.get<std::string>();
  } else {
    if (first.empty()) reject(name, "prompt must not be empty");
    r.prompt_token_ids = read_token_ids(first, name, limits.vocab_size);
  }
}

std::vector<std::string> read_stop(const Json& v, const ProtocolLimits& limits) {
  const std::string name = "stop";
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > static_cast<size_t>(limits.max_stop_strings)) {
      reject(name, fmt::format("stop may hold at most {} strings, got {}", limits.max_stop_strings, v.size()));
    }
    for (const Json& s : v) stops.push_back(read_string(s, name));
  } else {
    reject(name, fmt::format("stop must be a string or a list of strings, got {}", type_name(v)));
  }
  for (const std::string& s : stops) {
    if (s.empty()) reject(name, "stop strings must not be empty");
  }
  return stops;
}

ChatMessage read_message(const Json& m, size_t i) {
  const std::string at = fmt::format("messages.[{}]", i);
  if (!m.is_object()) reject(at, fmt::format("{} must be an object, got {}", at, type_name(m)));
  ChatMessage msg;
  bool has_role = false;
  bool has_content = false;
  for (const auto& [key, v] : m.items()) {
    const std::string name = at + "." + key;
    if (key == "role") {
      msg.role = read_string(v, name);
      has_role = true;
      static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool"};
      if (std::find(std::begin(kRoles), std::end(kRoles), msg.role) == std::end(kRoles)) {
        reject(name, fmt::format("{} must be one of system, developer, user, assistant, tool; got '{}'", name, msg.role));
      }
    } else if (key == "content") {
      has_content = true;
      if (v.is_null()) continue;
      if (v.is_string()) {
        msg.content = v.get<std::string>();
      } else if (v.is_array()) {
        std::string text;
        for (size_t j = 0; j < v.size(); ++j) {
          const Json& part = v[j];
          const std::string pat = fmt::format("{}.[{}]", name, j);
          if (!part.is_object()) reject(pat, fmt::format("{} must be an object, got {}", pat, type_name(part)));
          const auto type = part.find("type");
          if (type == part.end()) reject(pat + ".type", fmt::format("{}.type is required", pat));
          const std::string t = read_string(*type, pat + ".type");
          if (t != "text") reject(pat + ".type", fmt::format("content part type '{}' is not supported (only 'text')", t));
          const auto txt = part.find("text");
          if (txt == part.end()) reject(pat + ".text", fmt::format("{}.text is required", pat));
          if (j > 0) text += '\n';
          text += read_string(*txt, pat + ".text");
        }
        msg.content = std::move(text);
      } else {
        reject(name, fmt::format("{} must be a string or a list of content parts, got {}", name, type_name(v)));
      }
    } else if (key == "name") {
      if (!v.is_null()) msg.name = read_string(v, name);
    } else if (key == "tool_call_id") {
      if (!v.is_null()) msg.tool_call_id = read_string(v, name);
    } else if (key == "reasoning_content") {
      if (!v.is_null()) msg.reasoning_content = read_string(v, name);
    } else if (key == "tool_calls") {
      if (v.is_null()) continue;
      if (!v.is_array()) reject(name, fmt::format("{} must be a list, got {}", name, type_name(v)));
      for (const Json& call : v) {
        if (!call.is_object()) reject(name, fmt::format("{} entries must be objects", name));
      }
      msg.tool_calls = v;
    } else if (key == "refusal" || key == "audio" || key == "function_call" || key == "annotations") {
      // Fields of a response message that clients copy back into the history unchanged.
      if (!v.is_null() && !(key == "annotations" && v.is_array() && v.empty())) {
        reject(name, fmt::format("{} is not supported", name));
      }
    } else {
      reject(name, fmt::format("Unrecognized message field: {}", name));
    }
  }
  if (!has_role) reject(at + ".role", fmt::format("{}.role is required", at));
  if (msg.role != "assistant" && (!has_content || !msg.content)) {
    reject(at + ".content", fmt::format("{}.content is required for role '{}'", at, msg.role));
  }
  return msg;
}

std::vector<ChatMessage> read_messages(const Json& v) {
  if (!v.is_array()) reject("messages", fmt::format("messages must be a list, got {}", type_name(v)));
  if (v.empty()) reject("messages", "messages must not be empty");
  std::vector<ChatMessage> messages;
  messages.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) messages.push_back(read_message(v[i], i));
  return messages;
}

Json read_tools(const Json& v) {
  if (!v.is_array()) reject("tools", fmt::format("tools must be a list, got {}", type_name(v)));
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("tools.[{}]", i);
    const Json& t = v[i];
    if (!t.is_object()) reject(at, fmt::format("{} must be an object", at));
    const auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      reject(at + ".type", fmt::format("{}.type must be 'function'", at));
    }
    const auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) reject(at + ".function", fmt::format("{}.function must be an object", at));
    const auto fname = fn->find("name");
    if (fname == fn->end() || !fname->is_string()) {
      reject(at + ".function.name", fmt::format("{}.function.name must be a string", at));
    }
  }
  return v;
}

// "none" | "auto" | "required" | {"type": "function", "function": {"name"}} (the last two are
// checked against tools once the whole body is read).
void read_tool_choice(const Json& v, CompletionRequest& r) {
  const std::string name = "tool_choice";
  if (v.is_string()) {
    const std::string c = v.get<std::string>();
    if (c == "none" || c == "auto") {
      r.tool_choice_none = c == "none";
      return;
    }
    if (c == "required") {
      r.tool_choice_required = true;
      return;
    }
    reject(name, fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a named function, got '{}'", c));
  }
  if (v.is_object()) {
    const auto fn = v.find("function");
    if (v.value("type", std::string()) != "function" || fn == v.end() || !fn->is_object() ||
        !fn->contains("name") || !(*fn)["name"].is_string()) {
      reject(name, "tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    r.tool_choice_function = (*fn)["name"].get<std::string>();
    return;
  }
  reject(name, fmt::format("tool_choice must be a string or an object, got {}", type_name(v)));
}

void read_stream_options(const Json& v, CompletionRequest& r) {
  if (!v.is_object()) reject("stream_options", fmt::format("stream_options must be an object, got {}", type_name(v)));
  for (const auto& [key, x] : v.items()) {
    const std::string name = "stream_options." + key;
    if (key == "include_usage") {
      if (!x.is_null()) r.include_usage = read_bool(x, name);
    } else if (key == "continuous_usage_stats") {
      if (!x.is_null()) read_bool(x, name);  // accepted as vLLM does; usage comes once, at the end
    } else {
      reject(name, fmt::format("Unrecognized request argument supplied: {}", name));
    }
  }
}

// The GBNF of one structured-output field; a bad schema, regex or grammar is a 400 naming
// the field. response_format {"type": "text"} gives "" (no constraint).
std::string read_structured_output(const std::string& field, const Json& v) {
  namespace g = hack::grammar;
  auto schema_of = [&](const Json& s, const std::string& where) {
    if (s.is_string()) {  // vLLM accepts guided_json as JSON text too
      try {
        return g::json_schema_to_gbnf(Json::parse(s.get<std::string>()));
      } catch (const Json::parse_error& e) {
        reject(field, fmt::format("{} is not valid JSON: {}", where, e.what()));
      }
    }
    if (!s.is_object() && !s.is_boolean()) reject(field, fmt::format("{} must be a JSON Schema object, got {}", where, type_name(s)));
    return g::json_schema_to_gbnf(s);
  };
  std::string gbnf;
  try {
    if (field == "response_format") {
      if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
        reject(field, "response_format must be an object with a string \"type\"");
      }
      const std::string type = v["type"].get<std::string>();
      if (type == "text") return "";
      if (type == "json_object") return g::json_object_gbnf();
      if (type != "json_schema") {
        reject(field, fmt::format("response_format type '{}' is not supported (text, json_object and json_schema are)", type));
      }
      if (!v.contains("json_schema") || !v["json_schema"].is_object()) {
        reject(field, "response_format json_schema needs a \"json_schema\" object");
      }
      const Json& js = v["json_schema"];
      if (!js.contains("schema")) reject(field, "response_format.json_schema.schema is required");
      return schema_of(js["schema"], "response_format.json_schema.schema");
    }
    if (field == "guided_json") {
      gbnf = schema_of(v, field);
    } else if (field == "guided_regex") {
      gbnf = g::regex_to_gbnf(read_string(v, field));
    } else if (field == "guided_choice") {
      if (!v.is_array() || v.empty()) reject(field, "guided_choice must be a non-empty list of strings");
      std::vector<std::string> choices;
      for (const Json& c : v) {
        if (!c.is_string()) reject(field, fmt::format("guided_choice entries must be strings, got {}", type_name(c)));
        choices.push_back(c.get<std::string>());
      }
      gbnf = g::choice_to_gbnf(choices);
    } else if (field == "guided_grammar") {
      gbnf = read_string(v, field);
    } else {  // structured_outputs: {"json" | "regex" | "choice" | "grammar": ...}, exactly one
      if (!v.is_object() || v.size() != 1) {
        reject(field, "structured_outputs must be an object with exactly one of json, regex, choice, grammar");
      }
      const std::string key = v.begin().key();
      static const std::map<std::string, std::string> kAlias = {
          {"json", "guided_json"}, {"regex", "guided_regex"}, {"choice", "guided_choice"}, {"grammar", "guided_grammar"}};
      const auto it = kAlias.find(key);
      if (it == kAlias.end()) reject(field, fmt::format("structured_outputs.{} is not supported (json, regex, choice, grammar are)", key));
      return read_structured_output(it->second, v.begin().value());
    }
    g::compile_gbnf(gbnf);  // schemas, regexes and choices compile by construction; user GBNF may not
  } catch (const Error& e) {
    reject(field, fmt::format("{}: {}", field, e.what()));
  }
  return gbnf;
}

struct Seen {
  std::optional<int> max_tokens;
  std::optional<int> max_completion_tokens;
  std::optional<bool> chat_logprobs;
  std::optional<int> top_logprobs;
  std::optional<int> best_of;
  bool stream_options = false;
  bool prompt = false;
  bool messages = false;
  bool min_tokens = false;
  std::vector<std::string> structured;  // the structured-output fields given
};

// The fields only /v1/completions has; false for a key that is not one of them.
bool read_completions_field(const std::string& key, const Json& v, const ProtocolLimits& limits, CompletionRequest& r,
                            Seen& seen) {
  if (key == "prompt") {
    read_prompt(v, limits, r);
    seen.prompt = true;
  } else if (key == "echo") {
    r.echo = read_bool(v, key);
  } else if (key == "suffix") {
    if (!read_string(v, key).empty()) reject(key, "suffix is not supported");
  } else if (key == "best_of") {
    seen.best_of = read_int32(v, key, 1, limits.max_n);
  } else if (key == "logprobs") {
    r.logprobs = read_int32(v, key, 0, limits.max_logprobs);
  } else {
    return false;
  }
  return true;
}

// The fields only /v1/chat/completions has (messages, tools, chat logprobs).
bool read_chat_field(const std::string& key, const Json& v, const ProtocolLimits& limits, CompletionRequest& r,
                     Seen& seen) {
  if (key == "messages") {
    r.messages = read_messages(v);
    seen.messages = true;
  } else if (key == "tools") {
    r.tools = read_tools(v);
  } else if (key == "tool_choice") {
    read_tool_choice(v, r);
  } else if (key == "functions" || key == "function_call") {
    reject(key, fmt::format("{} is deprecated and not supported: use tools and tool_choice", key));
  } else if (key == "parallel_tool_calls") {
    r.parallel_tool_calls = read_bool(v, key);
  } else if (key == "chat_template_kwargs") {
    if (!v.is_object()) reject(key, fmt::format("chat_template_kwargs must be an object, got {}", type_name(v)));
    r.chat_template_kwargs = v;
  } else if (key == "add_generation_prompt") {
    r.add_generation_prompt = read_bool(v, key);
  } else if (key == "max_completion_tokens") {
    seen.max_completion_tokens = read_int32(v, key, 1);
  } else if (key == "top_logprobs") {
    seen.top_logprobs = read_int32(v, key, 0, limits.max_logprobs);
  } else if (key == "logprobs") {
    seen.chat_logprobs = read_bool(v, key);
  } else {
    return false;
  }
  return true;
}

// The structured-output fields (one grammar per request) of either endpoint.
bool read_structured_field(const std::string& key, const Json& v, CompletionRequest& r, Seen& seen) {
  if (key == "response_format" || key == "guided_json" || key == "guided_regex" || key == "guided_choice" ||
      key == "guided_grammar" || key == "structured_outputs") {
    std::string gbnf = read_structured_output(key, v);
    if (!gbnf.empty()) {
      seen.structured.push_back(key);
      r.grammar = std::move(gbnf);
    }
  } else if (key == "guided_decoding_backend" || key == "guided_whitespace_pattern") {
    read_string(v, key);  // vLLM's backend choice: there is one here; whitespace is bounded by the grammar
  } else {
    return false;
  }
  return true;
}

// The fields both endpoints share: model, sampling, stopping, streaming.
bool read_shared_field(const std::string& key, const Json& v, const ProtocolLimits& limits, CompletionRequest& r,
                       Seen& seen) {
  if (key == "model") {
    r.model = read_string(v, key);
  } else if (key == "max_tokens") {
    seen.max_tokens = read_int32(v, key, 1);
  } else if (key == "temperature") {
    r.temperature = read_float_in(v, key, 0.0, 2.0);
  } else if (key == "top_p") {
    const double p = read_number(v, key);
    if (!(p > 0.0 && p <= 1.0)) reject(key, fmt::format("top_p must be in (0, 1], got {}", p));
    r.top_p = static_cast<float>(p);
  } else if (key == "top_k") {
    r.top_k = read_int32(v, key, -1);
  } else if (key == "min_p") {
    r.min_p = read_float_in(v, key, 0.0, 1.0);
  } else if (key == "seed") {
    if (v.is_number_unsigned()) {
      r.seed = v.get<uint64_t>();
    } else {
      r.seed = static_cast<uint64_t>(read_int(v, key, std::numeric_limits<int64_t>::min(),
                                              std::numeric_limits<int64_t>::max()));
    }
  } else if (key == "stop") {
    r.stop = read_stop(v, limits);
  } else if (key == "stop_token_ids") {
    if (!v.is_array()) reject(key, fmt::format("stop_token_ids must be a list of integers, got {}", type_name(v)));
    r.stop_token_ids = read_token_ids(v, key, limits.vocab_size);
  } else if (key == "presence_penalty") {
    r.presence_penalty = read_float_in(v, key, -2.0, 2.0);
  } else if (key == "frequency_penalty") {
    r.frequency_penalty = read_float_in(v, key, -2.0, 2.0);
  } else if (key == "repetition_penalty") {
    const double p = read_number(v, key);
    if (!(p > 0.0 && p <= 2.0)) reject(key, fmt::format("repetition_penalty must be in (0, 2], got {}", p));
    r.repetition_penalty = static_cast<float>(p);
  } else if (key == "n") {
    r.n = read_int32(v, key, 1, limits.max_n);
  } else if (key == "user") {
    r.user = read_string(v, key);
  } else if (key == "stream") {
    r.stream = read_bool(v, key);
  } else if (key == "stream_options") {
    read_stream_options(v, r);
    seen.stream_options = true;
  } else if (key == "ignore_eos") {
    r.ignore_eos = read_bool(v, key);
  } else if (key == "min_tokens") {
    r.min_tokens = read_int32(v, key, 0);
    seen.min_tokens = true;
  } else if (key == "skip_special_tokens") {
    r.skip_special_tokens = read_bool(v, key);
  } else if (key == "include_stop_str_in_output") {
    r.include_stop_str_in_output = read_bool(v, key);
  } else if (key == "logit_bias") {
    r.logit_bias = read_logit_bias(v, key, limits.vocab_size);
  } else {
    return false;
  }
  return true;
}

// What a chat request needs beyond its fields: messages, a consistent tool_choice, logprobs.
void check_chat(CompletionRequest& r, const Seen& seen) {
  if (!seen.messages) reject("messages", "messages is required");
  if (r.tool_choice_required || !r.tool_choice_function.empty()) {
    const std::string what = r.tool_choice_required ? "tool_choice 'required'"
                                                    : fmt::format("tool_choice naming function '{}'", r.tool_choice_function);
    if (!r.tools.is_array() || r.tools.empty()) reject("tool_choice", what + " needs tools");
    if (!r.tool_choice_function.empty() &&
        std::none_of(r.tools.begin(), r.tools.end(),
                     [&](const Json& t) { return t["function"]["name"] == r.tool_choice_function; }))
      reject("tool_choice", fmt::format("no function named '{}' in tools", r.tool_choice_function));
    if (!seen.structured.empty())
      reject("tool_choice", fmt::format("{} cannot be combined with {}: only one constraint per request", what,
                                        seen.structured.front()));
  }
  if (seen.top_logprobs && !seen.chat_logprobs.value_or(false)) {
    reject("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.");
  }
  if (seen.chat_logprobs.value_or(false)) r.logprobs = seen.top_logprobs.value_or(0);
}

// Checks across fields either endpoint has, and the model (404 when not served).
void check_shared(CompletionRequest& r, const Seen& seen, const ProtocolLimits& limits) {
  if (seen.structured.size() > 1) {
    reject(seen.structured[1], fmt::format("only one structured-output constraint per request, got {} and {}",
                                           seen.structured[0], seen.structured[1]));
  }
  if (seen.stream_options && !r.stream) {
    reject("stream_options", "Stream options can only be defined when `stream=True`.");
  }
  if (seen.min_tokens && r.max_tokens && r.min_tokens > *r.max_tokens) {
    reject("min_tokens", fmt::format("min_tokens must be less than or equal to max_tokens={}, got {}", *r.max_tokens,
                                     r.min_tokens));
  }
  if (r.model.empty()) {
    if (!limits.served_models.empty()) r.model = limits.served_models.front();
  } else if (!limits.served_models.empty() &&
             std::find(limits.served_models.begin(), limits.served_models.end(), r.model) ==
                 limits.served_models.end()) {
    throw Rejected{ProtocolError{404, fmt::format("The model `{}` does not exist.", r.model), "invalid_request_error",
                                 "model", "model_not_found"}};
  }
}

CompletionRequest parse_body(const Json& body, Endpoint endpoint, const ProtocolLimits& limits) {
  if (!body.is_object()) {
    reject("", fmt::format("Request body must be a JSON object, got {}", type_name(body)));
  }
  const bool chat = endpoint == Endpoint::kChatCompletions;
  CompletionRequest r;
  r.endpoint = endpoint;
  Seen seen;
  for (const auto& [key, v] : body.items()) {
    if (v.is_null()) {
      // Explicit null is "not given" (pydantic Optional), except for the required fields.
      if (key == "prompt" && !chat) reject("prompt", "prompt must not be null");
      if (key == "messages" && chat) reject("messages", "messages must not be null");
      continue;
    }
    const bool known = (chat ? read_chat_field(key, v, limits, r, seen) : read_completions_field(key, v, limits, r, seen)) ||
                       read_structured_field(key, v, r, seen) || read_shared_field(key, v, limits, r, seen);
    if (!known) reject(key, fmt::format("Unrecognized request argument supplied: {}", key));
  }
  if (!chat && !seen.prompt) reject("prompt", "prompt is required");
  r.max_tokens = seen.max_completion_tokens ? seen.max_completion_tokens : seen.max_tokens;
  if (chat) {
    check_chat(r, seen);
  } else if (seen.best_of && *seen.best_of != r.n) {
    reject("best_of", "best_of is not supported unless it equals n");
  }
  check_shared(r, seen, limits);
  return r;
}

std::string dump(const Json& j) {
  // Generated text is valid UTF-8 from the detokenizer; replace rather than throw if not.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json nullable(const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); }

float finite_logprob(float lp) { return std::isnan(lp) || lp < kMinLogprob ? kMinLogprob : lp; }

Json utf8_bytes(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
Json completion_logprobs(const std::vector<PositionLogprobs>& tokens, size_t text_offset) {
  Json out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (const PositionLogprobs& t : tokens) {
    out["tokens"].push_back(t.token);
    out["text_offset"].push_back(text_offset);
    text_offset += count_code_points(t.token);
    if (t.none) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      continue;
    }
    out["token_logprobs"].push_back(finite_logprob(t.logprob));
    Json top = Json::object();
    for (const TopLogprob& alt : t.top) {
      if (!top.contains(alt.token)) top[alt.token] = finite_logprob(alt.logprob);
    }
    out["top_logprobs"].push_back(std::move(top));
  }
  return out;
}

// {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
Json chat_logprobs(const std::vector<PositionLogprobs>& tokens) {
  Json content = Json::array();
  for (const PositionLogprobs& t : tokens) {
    Json top = Json::array();
    for (const TopLogprob& alt : t.top) {
      top.push_back({{"token", alt.token}, {"logprob", finite_logprob(alt.logprob)}, {"bytes", utf8_bytes(alt.token)}});
    }
    content.push_back({{"token", t.token},
                       {"logprob", finite_logprob(t.logprob)},
                       {"bytes", utf8_bytes(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

Json envelope(const ResponseMeta& meta, std::string_view object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

Json finish_json(const std::optional<FinishReason>& f) { return f ? Json(finish_reason_name(*f)) : Json(nullptr); }

std::string chunk(const ResponseMeta& meta, std::string_view object, Json choice) {
  Json j = envelope(meta, object);
  j["choices"] = Json::array({std::move(choice)});
  if (meta.usage_null_in_chunks) j["usage"] = nullptr;
  return dump(j);
}

ProtocolError make_error(int status, std::string message, std::string type, std::optional<std::string> code) {
  return ProtocolError{status, std::move(message), std::move(type), std::nullopt, std::move(code)};
}

}  // namespace

std::string error_body(const ProtocolError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"param", nullable(e.param)}, {"code", nullable(e.code)}};
  return dump(Json{{"error", std::move(err)}});
}

ProtocolError unauthorized_error() {
  return make_error(401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                    "invalid_request_error", "invalid_api_key");
}
ProtocolError overloaded_error() {
  return make_error(429, "The server is overloaded: every node's queue is full. Retry after the Retry-After delay.",
                    "rate_limit_error", "server_overloaded");
}
ProtocolError unavailable_error(std::string message) {
  return make_error(503, std::move(message), "service_unavailable", std::nullopt);
}
ProtocolError not_found_error(std::string_view path) {
  return make_error(404, fmt::format("Unknown endpoint: {}", path), "invalid_request_error", std::nullopt);
}
ProtocolError internal_error(std::string message) {
  return make_error(500, std::move(message), "internal_server_error", std::nullopt);
}

std::optional<std::string> parse_json_body(std::string_view body, Json& out) {
  struct TooDeep {};
  const Json::parser_callback_t depth_limit = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};  // stops the parse at the first level too deep
    return true;
  };
  try {
    out = Json::parse(body.begin(), body.end(), depth_limit);
  } catch (const TooDeep&) {
    return fmt::format("JSON body nested deeper than {} levels", kMaxJsonDepth);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number overflow
    return fmt::format("Invalid JSON body: {}", e.what());
  }
  return std::nullopt;
}

ParseResult parse_request(std::string_view body, Endpoint endpoint, const ProtocolLimits& limits) {
  try {
    Json j;
    if (std::optional<std::string> error = parse_json_body(body, j)) reject("", std::move(*error));
    return parse_body(j, endpoint, limits);
  } catch (Rejected& r) {
    if (r.error.param && r.error.param->empty()) r.error.param.reset();
    return std::move(r.error);
  } catch (const std::exception& e) {
    return ProtocolError{400, fmt::format("Invalid request: {}", e.what()), "invalid_request_error", std::nullopt,
                         std::nullopt};
  }
}

nlohmann::ordered_json chat_messages_json(const CompletionRequest& request) {
  Json out = Json::array();
  for (const ChatMessage& m : request.messages) {
    Json j = {{"role", m.role}, {"content", nullable(m.content)}};
    if (m.name) j["name"] = *m.name;
    if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
    if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    out.push_back(std::move(j));
  }
  return out;
}

SamplingParams to_sampling_params(const CompletionRequest& r, int max_tokens, const SamplingParams& defaults) {
  SamplingParams p = defaults;
  if (r.temperature) p.temperature = *r.temperature;
  if (r.top_p) p.top_p = *r.top_p;
  if (r.top_k) p.top_k = *r.top_k;
  if (r.min_p) p.min_p = *r.min_p;
  if (r.seed) p.seed = *r.seed;
  if (r.presence_penalty) p.presence_penalty = *r.presence_penalty;
  if (r.frequency_penalty) p.frequency_penalty = *r.frequency_penalty;
  if (r.repetition_penalty) p.repetition_penalty = *r.repetition_penalty;
  p.max_tokens = max_tokens;
  p.min_tokens = std::min(r.min_tokens, max_tokens);
  p.stop_token_ids = r.stop_token_ids;
  p.logit_bias = r.logit_bias;
  p.grammar = r.grammar;
  p.ignore_eos = r.ignore_eos;
  p.logprobs = r.logprobs;
  // echo with logprobs: the prompt's own logprobs too, from the prefill.
  if (r.endpoint == Endpoint::kCompletions && r.echo && r.logprobs >= 0) p.prompt_logprobs = r.logprobs;
  return p;
}

std::variant<int, ProtocolError> fit_max_tokens(const CompletionRequest& r, int prompt_tokens, int max_model_len) {
  const bool chat = r.endpoint == Endpoint::kChatCompletions;
  const std::string param = chat ? "messages" : "prompt";
  if (prompt_tokens <= 0) {
    return ProtocolError{400, "The prompt is empty: it must hold at least one token.", "invalid_request_error", param,
                         std::nullopt};
  }
  if (r.max_tokens) {
    const int64_t total = int64_t{prompt_tokens} + *r.max_tokens;
    if (total > max_model_len) {
      return ProtocolError{
          400,
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                      "messages, {} in the completion). Please reduce the length of the messages or completion.",
                      max_model_len, total, prompt_tokens, *r.max_tokens),
          "invalid_request_error", param, "context_length_exceeded"};
    }
    return *r.max_tokens;
  }
  if (prompt_tokens >= max_model_len) {
    return ProtocolError{
        400,
        fmt::format("This model's maximum context length is {} tokens. However, your messages resulted in {} tokens, "
                    "which leaves no room for the completion. Please reduce the length of the messages.",
                    max_model_len, prompt_tokens),
        "invalid_request_error", param, "context_length_exceeded"};
  }
  const int rest = max_model_len - prompt_tokens;
  return chat ? rest : std::min(rest, 16);  // /v1/completions defaults to 16, as OpenAI and vLLM
}


std::string make_request_id(Endpoint endpoint) {
  std::random_device rd;
  std::string id = endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", static_cast<uint32_t>(rd()));
  return id;
}

std::string completion_response(const ResponseMeta& meta, std::span<const Choice> choices, const Usage& usage,
                                size_t text_offset_base) {
  Json j = envelope(meta, "text_completion");
  Json list = Json::array();
  for (const Choice& c : choices) {
    list.push_back({{"index", c.index},
                    {"text", c.text},
                    {"logprobs", c.logprobs ? completion_logprobs(*c.logprobs, text_offset_base) : Json(nullptr)},
                    {"finish_reason", finish_reason_name(c.finish_reason)}});
  }
  j["choices"] = std::move(list);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string chat_completion_response(const ResponseMeta& meta, std::span<const Choice> choices, const Usage& usage) {
  Json j = envelope(meta, "chat.completion");
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json message = {{"role", "assistant"}, {"content", c.text}};
    if (!c.tool_calls.empty()) {
      if (c.text.empty()) message["content"] = nullptr;
      Json calls = Json::array();
      for (const ToolCall& t : c.tool_calls) {
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    list.push_back({{"index", c.index},
                    {"message", std::move(message)},
                    {"logprobs", c.logprobs ? chat_logprobs(*c.logprobs) : Json(nullptr)},
                    {"finish_reason", finish_reason_name(c.finish_reason)}});
  }
  j["choices"] = std::move(list);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string completion_chunk(const ResponseMeta& meta, const ChoiceDelta& d) {
  return chunk(meta, "text_completion",
               {{"index", d.index},
                {"text", d.text},
                {"logprobs", d.logprobs ? completion_logprobs(*d.logprobs, d.text_offset) : Json(nullptr)},
                {"finish_reason", finish_json(d.finish_reason)}});
}

std::string chat_role_chunk(const ResponseMeta& meta, int index) {
  return chunk(meta, "chat.completion.chunk",
               {{"index", index},
                {"delta", {{"role", "assistant"}, {"content", ""}}},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}});
}

std::string chat_chunk(const ResponseMeta& meta, const ChoiceDelta& d) {
  Json delta = Json::object();
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& t : d.tool_calls) {
      Json call = {{"index", t.index}};
      if (t.id) call["id"] = *t.id;
      if (t.name) call["type"] = "function";
      Json fn = Json::object();
      if (t.name) fn["name"] = *t.name;
      fn["arguments"] = t.arguments;
      call["function"] = std::move(fn);
      calls.push_back(std::move(call));
    }
    delta["tool_calls"] = std::move(calls);
  } else if (!d.text.empty() || !d.finish_reason) {
    delta["content"] = d.text;
  }
  return chunk(meta, "chat.completion.chunk",
               {{"index", d.index},
                {"delta", std::move(delta)},
                {"logprobs", d.logprobs ? chat_logprobs(*d.logprobs) : Json(nullptr)},
                {"finish_reason", finish_json(d.finish_reason)}});
}

std::string usage_chunk(const ResponseMeta& meta, Endpoint endpoint, const Usage& usage) {
  Json j = envelope(meta, endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

size_t count_code_points(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

namespace {

Json model_object(const std::string& m, int64_t created, int max_model_len) {
  return {{"id", m},          {"object", "model"}, {"created", created},
          {"owned_by", "hackserve"}, {"root", m}, {"parent", nullptr}, {"max_model_len", max_model_len}};
}

}  // namespace

std::string models_response(std::span<const std::string> models, int64_t created, int max_model_len) {
  Json data = Json::array();
  for (const std::string& m : models) data.push_back(model_object(m, created, max_model_len));
  return dump(Json{{"object", "list"}, {"data", std::move(data)}});
}

std::string model_response(const std::string& model, int64_t created, int max_model_len) {
  return dump(model_object(model, created, max_model_len));
}

ProtocolError model_not_found_error(std::string_view model) {
  return make_error(404, fmt::format("The model `{}` does not exist.", model), "invalid_request_error",
                    "model_not_found");
}

}  // namespace hack::server
