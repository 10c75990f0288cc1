/// @file openai_protocol.h
/// @brief The OpenAI-compatible API at the router's edge: request bodies of /v1/completions
/// and /v1/chat/completions parsed and validated into typed structs (behaving like vLLM's
/// OpenAI server; where it is silent, like OpenAI's API), the JSON of responses, stream
/// chunks, logprobs and errors, and the context-length check.
///
/// JSON stays in this file's implementation, except for the chat fields a template renders
/// as they came (tools, tool_calls, chat_template_kwargs), kept as nlohmann::ordered_json so
/// their key order survives into the prompt.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hack/model/sampler.h"
#include "hack/router/tool_calls.h"

namespace hack::server {

enum class Endpoint { kCompletions, kChatCompletions };

/// An error for one request, sent as {"error": {"message", "type", "param", "code"}}.
struct ProtocolError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;  ///< the offending field ("max_tokens", "messages.[0].role"); null when none
  std::optional<std::string> code;   ///< e.g. "context_length_exceeded"; null when none
};

/// `{"error": {...}}` for `error`.
std::string error_body(const ProtocolError& error);

/// Errors the router raises outside request parsing.
ProtocolError unauthorized_error();                            ///< 401, code "invalid_api_key"
ProtocolError overloaded_error();                              ///< 429: every node's queue is past its bound
ProtocolError unavailable_error(std::string message);          ///< 503: no healthy node
ProtocolError not_found_error(std::string_view path);          ///< 404 for an unknown route
ProtocolError internal_error(std::string message);             ///< 500, type "internal_server_error"

/// One chat message as the template sees it. Text parts of a list content are joined with
/// "\n" (vLLM's "string" content format).
struct ChatMessage {
  std::string role;                    ///< system | developer | user | assistant | tool
  std::optional<std::string> content;  ///< unset: null (an assistant message with tool_calls)
  std::optional<std::string> name;
  std::optional<std::string> tool_call_id;
  std::optional<std::string> reasoning_content;
  nlohmann::ordered_json tool_calls;   ///< list as sent, or null
};

/// A validated request of either endpoint. Optional fields are unset when the body omits
/// them (or sends null); to_sampling_params fills them from the model's defaults.
/// Most prompts in one /v1/completions request (choices = prompts × n).
inline constexpr size_t kMaxBatchPrompts = 64;

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  ///< as sent, or the first served model when omitted

  // /v1/completions: exactly one of prompt_text / prompt_token_ids is set, or — a list of
  // two or more prompts — neither, and `batch` holds them (each a text or token ids).
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int>> prompt_token_ids;
  std::vector<std::variant<std::string, std::vector<int>>> batch;
  bool echo = false;

  // /v1/chat/completions.
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;                 ///< list of tool schemas, or null
  nlohmann::ordered_json chat_template_kwargs;  ///< object, or null
  bool add_generation_prompt = true;
  /// tool_choice: "none" renders the tools but parses no calls (vLLM's default); "auto"
  /// parses calls when tools are given; "required" and a named function (tool_choice_function)
  /// force calls with a grammar (forced_tool_calls_gbnf, built by the router, which knows the
  /// tool-call syntax).
  bool tool_choice_none = false;
  bool tool_choice_required = false;
  std::string tool_choice_function;
  bool parallel_tool_calls = true;  ///< false: a forced reply holds exactly one call
  /// Set by the router once the request is admitted: the syntax to parse tool calls in
  /// (none unless tools are given and tool_choice is auto).
  ToolParserKind tool_parser = ToolParserKind::none;

  std::optional<int> max_tokens;  ///< chat: max_completion_tokens, else max_tokens
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<uint64_t> seed;  ///< a negative seed is kept as its two's complement
  std::vector<std::string> stop;
  std::vector<int> stop_token_ids;
  std::vector<std::pair<int, float>> logit_bias;  ///< {"token id": bias in [-100, 100]}, by id
  /// Structured output as GBNF (empty = none), compiled from the one of response_format
  /// (json_object, json_schema), guided_json, guided_regex, guided_choice, guided_grammar or
  /// structured_outputs the request gave; validated here, so a bad one is a 400 naming it.
  std::string grammar;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::optional<float> repetition_penalty;
  /// Top alternatives per token, -1 = no logprobs. Completions: `logprobs` (0..20);
  /// chat: `top_logprobs` (0..20) when `logprobs` is true.
  int logprobs = -1;
  int n = 1;
  std::string user;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  bool ignore_eos = false;
  int min_tokens = 0;
  bool skip_special_tokens = true;          ///< vLLM extension
  bool include_stop_str_in_output = false;  ///< vLLM extension
};

/// What the server accepts; a request past these gets a 400 naming the field.
struct ProtocolLimits {
  std::vector<std::string> served_models;  ///< empty: any model name is accepted
  int max_n = 16;
  int max_logprobs = 20;
  int max_stop_strings = 16;
  int vocab_size = 0;  ///< > 0: token ids in prompt / stop_token_ids must be below it
};

using ParseResult = std::variant<CompletionRequest, ProtocolError>;

/// Parses and validates a request body for `endpoint`. Never throws: malformed JSON, a body
/// that is not an object, an unknown field, a wrongly typed or out-of-range value, or an
/// unknown model give a ProtocolError (400, or 404 for the model).
ParseResult parse_request(std::string_view body, Endpoint endpoint, const ProtocolLimits& limits);

/// Parses a request body as JSON nested at most 64 levels (what every endpoint accepts) into
/// `out`. Returns the message of a client error ("Invalid JSON body: …", "JSON body nested
/// deeper than 64 levels"), or nullopt when `out` holds the body.
std::optional<std::string> parse_json_body(std::string_view body, nlohmann::ordered_json& out);

/// Messages as the chat template takes them (ChatTemplate::render).
nlohmann::ordered_json chat_messages_json(const CompletionRequest& request);

/// Sampling parameters of `request` with `max_tokens` (from fit_max_tokens); fields the
/// request leaves unset come from `defaults` (the model's generation_config, else OpenAI's:
/// temperature 1, top_p 1). temperature 0 is greedy.
SamplingParams to_sampling_params(const CompletionRequest& request, int max_tokens, const SamplingParams& defaults = {});

/// The max_tokens to generate for a prompt of `prompt_tokens`: the request's, or the rest of
/// the context when it set none. A 400 (code "context_length_exceeded", naming both
/// lengths) when the prompt plus the completion do not fit in `max_model_len`, or when
/// the prompt is empty.
std::variant<int, ProtocolError> fit_max_tokens(const CompletionRequest& request, int prompt_tokens, int max_model_len);

// ---- responses -------------------------------------------------------------------------

// Finish reasons are hack::FinishReason (engine.h), named by finish_reason_name().

/// "cmpl-<32 hex>" / "chatcmpl-<32 hex>", random.
std::string make_request_id(Endpoint endpoint);

/// What every response and chunk of one request shares.
struct ResponseMeta {
  std::string id;
  std::string model;
  int64_t created = 0;  ///< unix seconds
  /// Streams with stream_options.include_usage: every chunk but the last has "usage": null.
  bool usage_null_in_chunks = false;
};

/// One alternative at a token position.
struct TopLogprob {
  std::string token;  ///< the token decoded on its own
  float logprob = 0.0f;
};

/// The sampled token at one position, with its alternatives (best first).
struct PositionLogprobs {
  std::string token;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
  bool none = false;  ///< the prompt's first token (echo): logprob and top_logprobs are null
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

/// One finished choice of a non-stream response.
struct Choice {
  int index = 0;
  std::string text;
  FinishReason finish_reason = FinishReason::stop;
  std::optional<std::vector<PositionLogprobs>> logprobs;  ///< set when the request asked for them
  std::vector<ToolCall> tool_calls;  ///< chat: parsed from the text (then `text` is what is left)
};

/// text_completion body. With logprobs, text_offset counts code points from the start of
/// `text` (plus `text_offset_base`, e.g. the echoed prompt's length when its tokens have no
/// logprobs; 0 when echo's logprobs start the list).
std::string completion_response(const ResponseMeta& meta, std::span<const Choice> choices, const Usage& usage,
                                size_t text_offset_base = 0);
/// chat.completion body: choices[{index, message{role: "assistant", content, tool_calls}, logprobs,
/// finish_reason}]. With tool calls, content is null when no text is left and tool_calls lists
/// {id, type: "function", function: {name, arguments}}.
std::string chat_completion_response(const ResponseMeta& meta, std::span<const Choice> choices, const Usage& usage);

/// One streamed piece of a choice: new text, its tokens' logprobs, and the finish reason
/// on the choice's last piece.
struct ChoiceDelta {
  int index = 0;
  std::string text;
  std::optional<std::vector<PositionLogprobs>> logprobs;
  std::optional<FinishReason> finish_reason;
  size_t text_offset = 0;  ///< completions logprobs: code points emitted before this piece
  std::vector<ToolCallDelta> tool_calls;  ///< chat: pieces of tool calls (sent instead of content)
};

/// The JSON of one chunk (framed on the wire by sse_format_event in sse.h; the stream ends
/// with sse_format_event("[DONE]")).
std::string completion_chunk(const ResponseMeta& meta, const ChoiceDelta& delta);
/// The first chunk of every chat choice: delta {"role": "assistant", "content": ""}.
std::string chat_role_chunk(const ResponseMeta& meta, int index);
/// A chat content chunk: delta {"content": text}; a piece with no text and a finish
/// reason (the last one) has an empty delta {}. A piece with tool calls has delta
/// {"tool_calls": [{index, id, type, function: {name, arguments}}]} (id, type and name on a
/// call's first piece only), as OpenAI streams them.
std::string chat_chunk(const ResponseMeta& meta, const ChoiceDelta& delta);
/// The usage chunk sent before [DONE] when include_usage: empty choices.
std::string usage_chunk(const ResponseMeta& meta, Endpoint endpoint, const Usage& usage);

/// Code points in UTF-8 `text` (what text_offset counts).
size_t count_code_points(std::string_view text);

/// GET /v1/models body.
std::string models_response(std::span<const std::string> models, int64_t created, int max_model_len);
/// GET /v1/models/{id}: one model object.
std::string model_response(const std::string& model, int64_t created, int max_model_len);
/// 404 model_not_found, as OpenAI answers an unknown model id.
ProtocolError model_not_found_error(std::string_view model);

}  // namespace hack::server
