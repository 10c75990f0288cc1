/// @file responses_api.h
/// @brief OpenAI's Responses API (POST /v1/responses) as a translation over the router's chat
/// completions path: a Responses request is validated and rewritten into the
/// /v1/chat/completions body it means (instructions → a system message, input items → chat
/// messages, function tools and tool_choice → chat tools, text.format → response_format), the
/// router runs that body as it runs any chat request (same admission, routing, retries, tool-call
/// parser and grammar), and what it answers — a chat.completion body, or chat chunks over SSE —
/// is turned back into a Response object or the Responses event stream
/// (response.created … response.completed, each with its sequence_number) as the official
/// `openai` client parses them.
///
/// Not served, each refused with a 400 that says so: stored responses (store: true,
/// previous_response_id, GET/DELETE /v1/responses/{id}, input_items, cancel), background mode,
/// conversations, prompt templates, hosted tools (web search, file search, …), non-text input
/// (images, files, audio), reasoning items and reasoning options, logprobs in the output.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hack/http/http_server.h"
#include "hack/router/openai_protocol.h"

namespace hack::server {

/// A validated Responses request: the chat completions body it runs as, and the request fields a
/// Response object reports back (as the client sent them, or OpenAI's defaults).
struct ResponsesRequest {
  std::string chat_body;  ///< JSON for parse_request(…, Endpoint::kChatCompletions, …)
  bool stream = false;
  std::optional<std::string> model;  ///< as sent; the Response reports the model the router resolved
  nlohmann::ordered_json instructions;       ///< string or null
  nlohmann::ordered_json max_output_tokens;  ///< integer or null
  nlohmann::ordered_json temperature;        ///< number or null (the model's default applies)
  nlohmann::ordered_json top_p;              ///< number or null
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  ///< function tools, Responses shape
  nlohmann::ordered_json tool_choice = "auto";
  bool parallel_tool_calls = true;
  nlohmann::ordered_json text_format = {{"type", "text"}};  ///< text.format
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  nlohmann::ordered_json user;               ///< string or null
};

using ResponsesParseResult = std::variant<ResponsesRequest, ProtocolError>;

/// Parses and validates a /v1/responses body. Never throws: malformed JSON, an unknown field, a
/// wrongly typed value, an unsupported item, tool or option give a ProtocolError (400) whose
/// param names the Responses field ("input[2].content[0].type", "tools[0].type").
ResponsesParseResult parse_responses_request(std::string_view body);

/// "resp_<32 hex>", random.
std::string make_response_id();

/// One Responses SSE event: its type and its JSON (which carries the type too).
struct ResponsesEvent {
  std::string type;
  std::string data;
};

/// Turns the chat chunks of one streamed choice, in order, into the Responses event stream:
/// response.created and response.in_progress first; output_item.added (+ content_part.added)
/// when text or a tool call starts, output_text.delta / function_call_arguments.delta as it
/// grows, the matching .done events when it ends; response.completed — or response.incomplete
/// (reason max_output_tokens) when the choice finished by length, or response.failed for an
/// error event — with the whole Response last. sequence_number counts every event from 0.
///
/// A non-streamed request runs streamed inside the router too, and its body is the Response of
/// the last event (response()), so a stream and a whole response agree by construction. Items
/// appear in the order the model wrote them; text that is only whitespace opens no message item
/// until something else follows (so the whitespace between two tool calls is not a message).
class ResponsesStreamTranslator {
 public:
  ResponsesStreamTranslator(ResponsesRequest request, std::string response_id, int64_t created_at);

  /// The events for one SSE data payload of the chat stream: a chunk, an error body, or
  /// "[DONE]" (which ends the stream: whatever is open is closed). Nothing once finished.
  /// Throws hack::Error on a payload that is none of these.
  std::vector<ResponsesEvent> on_chat_event(std::string_view data);
  bool finished() const { return finished_; }
  /// Once finished: the Response as its last event carries it.
  std::string response() const;
  /// Once finished by an error event: that error, its status from its type (503 for
  /// service_unavailable, 429 rate_limit_error, 400 invalid_request_error, else 500).
  const std::optional<ProtocolError>& failure() const { return failure_; }

 private:
  enum class Open { none, message, call };
  void start(const nlohmann::ordered_json* chunk, std::vector<ResponsesEvent>& out);
  void on_text(const std::string& text, std::vector<ResponsesEvent>& out);
  void on_call_delta(const nlohmann::ordered_json& delta, std::vector<ResponsesEvent>& out);
  void close_item(bool cut_off, std::vector<ResponsesEvent>& out);
  void finish(std::optional<ProtocolError> error, std::vector<ResponsesEvent>& out);
  void emit(std::vector<ResponsesEvent>& out, std::string type, nlohmann::ordered_json body);
  nlohmann::ordered_json response_json(const std::string& status) const;

  ResponsesRequest request_;
  std::string id_;
  int64_t created_at_;
  std::string model_;
  bool started_ = false, finished_ = false;
  int64_t sequence_ = 0;
  Open open_ = Open::none;
  std::string pending_space_;    // whitespace-only text while no item is open: not sent yet
  nlohmann::ordered_json item_;  // the item open now (a message's text is in text_)
  std::string text_;
  int call_index_ = -1;          // the open call's index among the chat tool calls
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  // finished items
  std::optional<std::string> finish_reason_;
  nlohmann::ordered_json usage_;  // Responses usage, null until the usage chunk
  std::string final_status_;
  std::optional<ProtocolError> failure_;
};

/// What the router does with a request to /v1/responses or a path under it: the chat
/// completions body to run, and a Responder that answers it in the Responses shape over `res`
/// (errors keep the standard error shape, their param renamed to the Responses field); or the
/// error to answer at once (a bad body, a stored-response path, a method other than POST).
struct ResponsesRoute {
  std::string chat_body;
  std::shared_ptr<Responder> responder;
};
std::variant<ResponsesRoute, ProtocolError> route_responses(const HttpRequest& request, std::shared_ptr<Responder> res);

}  // namespace hack::server
