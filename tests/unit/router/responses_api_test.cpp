// /v1/responses translation (router/responses_api.h):
//   - requests: what each Responses field becomes in the chat completions body, checked by
//     parsing that body with the chat parser the router runs it through (so a translation the
//     router would refuse fails here); every refused field and item gets a 400 naming it;
//   - events: chat chunks made by the router's own chunk writers (openai_protocol.h) turn into
//     the Responses event sequence the official client parses, with consecutive
//     sequence_numbers, and the last event's Response holds exactly the items streamed.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/router/openai_protocol.h"
#include "hack/router/responses_api.h"

using namespace hack;
using namespace hack::server;
using Catch::Contains;
using nlohmann::json;

namespace {

ResponsesRequest parse_ok(const std::string& body) {
  ResponsesParseResult r = parse_responses_request(body);
  if (const auto* err = std::get_if<ProtocolError>(&r)) FAIL("unexpected error: " << err->message << " body: " << body);
  return std::get<ResponsesRequest>(r);
}

ProtocolError parse_err(const std::string& body) {
  ResponsesParseResult r = parse_responses_request(body);
  if (!std::holds_alternative<ProtocolError>(r)) FAIL("accepted a bad body: " << body);
  return std::get<ProtocolError>(r);
}

// The chat request the router runs for `body`, as its chat parser reads it.
CompletionRequest as_chat(const ResponsesRequest& r) {
  ProtocolLimits limits;
  limits.served_models = {"smol"};
  ParseResult parsed = parse_request(r.chat_body, Endpoint::kChatCompletions, limits);
  if (const auto* err = std::get_if<ProtocolError>(&parsed)) FAIL("chat parser refused " << r.chat_body << ": " << err->message);
  return std::get<CompletionRequest>(parsed);
}

}  // namespace

TEST_CASE("responses: a string input is one user message after the instructions' system message") {
  const ResponsesRequest r = parse_ok(R"({"model": "smol", "instructions": "Be brief.", "input": "Hi there",
      "max_output_tokens": 40, "temperature": 0.25, "top_p": 0.5, "seed": 7})");
  CHECK_FALSE(r.stream);
  CHECK(r.instructions == "Be brief.");
  CHECK(r.max_output_tokens == 40);
  const CompletionRequest c = as_chat(r);
  REQUIRE(c.messages.size() == 2);
  CHECK(c.messages[0].role == "system");
  CHECK(c.messages[0].content == "Be brief.");
  CHECK(c.messages[1].role == "user");
  CHECK(c.messages[1].content == "Hi there");
  CHECK(c.model == "smol");
  CHECK(c.max_tokens == 40);
  CHECK(c.temperature == 0.25f);
  CHECK(c.top_p == 0.5f);
  CHECK(c.seed == 7u);
  // Whole or not, the chat choice streams with its usage: the translator builds the Response.
  CHECK(c.stream);
  CHECK(c.include_usage);
  CHECK(c.n == 1);
  CHECK(c.grammar.empty());
  CHECK(c.tools.is_null());
}

TEST_CASE("responses: a list input — messages, content parts, a function call round trip") {
  const ResponsesRequest r = parse_ok(R"({"stream": true, "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                      {"type": "input_text", "text": "Paris?"}]},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
      {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}",
       "id": "fc_1", "status": "completed"},
      {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "Rainy, 12 C"},
      {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "10:00"}]},
      {"role": "user", "content": "Thanks"}]})");
  CHECK(r.stream);
  const CompletionRequest c = as_chat(r);
  REQUIRE(c.messages.size() == 6);
  CHECK(c.messages[0].role == "developer");
  CHECK(c.messages[1].content == "Weather in\nParis?");  // parts joined as the chat parser joins them
  // The calls join the assistant message before them, in order.
  CHECK(c.messages[2].role == "assistant");
  CHECK(c.messages[2].content == "Let me look.");
  REQUIRE(c.messages[2].tool_calls.size() == 2);
  CHECK(c.messages[2].tool_calls[0]["id"] == "call_a");
  CHECK(c.messages[2].tool_calls[0]["function"]["name"] == "get_weather");
  CHECK(c.messages[2].tool_calls[0]["function"]["arguments"] == "{\"city\": \"Paris\"}");
  CHECK(c.messages[2].tool_calls[1]["id"] == "call_b");
  CHECK(c.messages[3].role == "tool");
  CHECK(c.messages[3].tool_call_id == "call_a");
  CHECK(c.messages[3].content == "Rainy, 12 C");
  CHECK(c.messages[4].content == "10:00");
  CHECK(c.messages[5].content == "Thanks");

  // A call with no assistant message before it starts one with null content.
  const CompletionRequest d = as_chat(parse_ok(R"({"input": [{"role": "user", "content": "x"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]})"));
  REQUIRE(d.messages.size() == 2);
  CHECK(d.messages[1].role == "assistant");
  CHECK_FALSE(d.messages[1].content);
  CHECK(d.messages[1].tool_calls.size() == 1);
}

TEST_CASE("responses: function tools, tool_choice and text.format become their chat forms") {
  const std::string tool = R"({"type": "function", "name": "get_weather", "description": "Weather now",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true})";
  SECTION("tools with tool_choice auto (the default)") {
    const ResponsesRequest r = parse_ok(R"({"input": "x", "tools": [)" + tool + "]}");
    CHECK(r.tool_choice == "auto");
    CHECK(r.tools[0]["name"] == "get_weather");  // reported back in the Responses shape
    const CompletionRequest c = as_chat(r);
    REQUIRE(c.tools.size() == 1);
    CHECK(c.tools[0]["type"] == "function");
    CHECK(c.tools[0]["function"]["name"] == "get_weather");
    CHECK(c.tools[0]["function"]["description"] == "Weather now");
    CHECK(c.tools[0]["function"]["parameters"]["required"][0] == "city");
    CHECK_FALSE(c.tool_choice_none);
    CHECK_FALSE(c.tool_choice_required);
    CHECK(c.tool_choice_function.empty());
  }
  SECTION("a named function, one call") {
    const CompletionRequest c = as_chat(parse_ok(R"({"input": "x", "parallel_tool_calls": false,
        "tool_choice": {"type": "function", "name": "get_weather"}, "tools": [)" + tool + "]}"));
    CHECK(c.tool_choice_function == "get_weather");
    CHECK_FALSE(c.parallel_tool_calls);
  }
  SECTION("required and none") {
    CHECK(as_chat(parse_ok(R"({"input": "x", "tool_choice": "required", "tools": [)" + tool + "]}")).tool_choice_required);
    CHECK(as_chat(parse_ok(R"({"input": "x", "tool_choice": "none", "tools": [)" + tool + "]}")).tool_choice_none);
    // Without tools "none" and "auto" say nothing; "required" is the chat parser's 400.
    CHECK_FALSE(as_chat(parse_ok(R"({"input": "x", "tool_choice": "none"})")).tool_choice_none);
    ParseResult p = parse_request(parse_ok(R"({"input": "x", "tool_choice": "required"})").chat_body,
                                  Endpoint::kChatCompletions, ProtocolLimits{});
    REQUIRE(std::holds_alternative<ProtocolError>(p));
    CHECK_THAT(std::get<ProtocolError>(p).message, Contains("needs tools"));
  }
  SECTION("text.format json_schema compiles to a grammar; json_object too; text is none") {
    const ResponsesRequest r = parse_ok(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "city",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, "strict": true}}})");
    CHECK(r.text_format["name"] == "city");
    CHECK_FALSE(as_chat(r).grammar.empty());
    CHECK_FALSE(as_chat(parse_ok(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")).grammar.empty());
    CHECK(as_chat(parse_ok(R"({"input": "x", "text": {"format": {"type": "text"}, "verbosity": "medium"}})")).grammar.empty());
  }
}

TEST_CASE("responses: what is not served, and what is malformed, is a 400 naming the field") {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
    bool unsupported;
  };
  const Case cases[] = {
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id", "keeps no responses", true},
      {R"({"input": "x", "store": true})", "store", "keeps no responses", true},
      {R"({"input": "x", "background": true})", "background", "background mode", true},
      {R"({"input": "x", "conversation": "conv_1"})", "conversation", "not supported", true},
      {R"({"input": "x", "prompt": {"id": "pmpt_1"}})", "prompt", "not supported", true},
      {R"({"input": "x", "include": ["message.output_text.logprobs"]})", "include", "message.output_text.logprobs", true},
      {R"({"input": "x", "top_logprobs": 3})", "top_logprobs", "not supported", true},
      {R"({"input": "x", "reasoning": {"effort": "high"}})", "reasoning.effort", "not supported", true},
      {R"({"input": "x", "truncation": "auto"})", "truncation", "not supported", true},
      {R"({"input": "x", "max_tool_calls": 2})", "max_tool_calls", "not supported", true},
      {R"({"input": "x", "service_tier": "priority"})", "service_tier", "priority", true},
      {R"({"input": "x", "text": {"verbosity": "low"}})", "text.verbosity", "low", true},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
          {"type": "input_image", "image_url": "http://x/y.png"}]}]})",
       "input.[0].content.[1].type", "text-only", true},
      {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input.[0].type", "stores no items", true},
      {R"({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]})", "input.[0].type", "reasoning", true},
      {R"({"input": [{"type": "web_search_call", "id": "ws_1"}]})", "input.[0].type", "web_search_call", true},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools.[0].type", "function tools only", true},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "allowed_tools",
          "mode": "auto", "tools": []}})", "tool_choice.type", "allowed_tools", true},
      {R"({"model": "smol"})", "input", "input is required", false},
      {R"({"input": []})", "input", "must not be empty", false},
      {R"({"input": 5})", "input", "string or a list", false},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input.[0].role", "must be one of", false},
      {R"({"input": [{"role": "user"}]})", "input.[0].content", "is required", false},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input.[0].call_id", "is required", false},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input.[0].output", "is required", false},
      {R"({"input": [{"role": "user", "content": "x", "colour": "red"}]})", "input.[0].colour", "Unrecognized", false},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "at least 1", false},
      {R"({"input": "x", "max_output_tokens": 2.5})", "max_output_tokens", "integer", false},
      {R"({"input": "x", "temperature": "hot"})", "temperature", "number", false},
      {R"({"input": "x", "stream": "yes"})", "stream", "boolean", false},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools.[0].name", "is required", false},
      {R"({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})", "tools.[0].function", "Unrecognized", false},
      {R"({"input": "x", "tool_choice": "sometimes"})", "tool_choice", "sometimes", false},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}})", "text.format.name", "is required", false},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})", "text.format.schema", "is required", false},
      {R"({"input": "x", "text": {"format": {"type": "yaml"}}})", "text.format.type", "yaml", false},
      {R"({"input": "x", "metadata": {"k": 5}})", "metadata.k", "string", false},
      {R"({"input": "x", "messages": []})", "messages", "Unrecognized request argument", false},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const ProtocolError e = parse_err(c.body);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == std::optional<std::string>(c.param));
    CHECK_THAT(e.message, Contains(c.says));
    CHECK(e.code == (c.unsupported ? std::optional<std::string>("unsupported_parameter") : std::nullopt));
  }
  const ProtocolError bad_json = parse_err("{\"input\": ");
  CHECK_THAT(bad_json.message, Contains("Invalid JSON"));
  CHECK_FALSE(bad_json.param);
  // Explicit nulls and false are "not given" (the official client sends neither unless asked).
  const ResponsesRequest r = parse_ok(R"({"input": "x", "store": false, "background": false,
      "previous_response_id": null, "include": [], "top_logprobs": 0, "reasoning": {"effort": null},
      "truncation": "disabled", "service_tier": "auto", "metadata": {"k": "v"}, "user": "u",
      "stream_options": {"include_obfuscation": false}})");
  CHECK(r.metadata["k"] == "v");
  CHECK(as_chat(r).user == "u");
}

namespace {

ResponseMeta chat_meta() { return ResponseMeta{"chatcmpl-1", "smol", 1700000000, /*usage_null_in_chunks=*/true}; }

ChoiceDelta text_delta(std::string text) {
  ChoiceDelta d;
  d.text = std::move(text);
  return d;
}

ChoiceDelta call_delta(int index, std::optional<std::string> id, std::optional<std::string> name, std::string args) {
  ChoiceDelta d;
  d.tool_calls.push_back(ToolCallDelta{index, std::move(id), std::move(name), std::move(args)});
  return d;
}

ChoiceDelta finish_delta(FinishReason reason) {
  ChoiceDelta d;
  d.finish_reason = reason;
  return d;
}

// The chat stream of one choice, as the router writes it: role chunk, `deltas`, usage, [DONE].
std::vector<std::string> chat_stream(const std::vector<ChoiceDelta>& deltas, Usage usage = {12, 9}) {
  std::vector<std::string> events = {chat_role_chunk(chat_meta(), 0)};
  for (const ChoiceDelta& d : deltas) events.push_back(chat_chunk(chat_meta(), d));
  events.push_back(usage_chunk(chat_meta(), Endpoint::kChatCompletions, usage));
  events.push_back("[DONE]");
  return events;
}

struct Translated {
  std::vector<json> events;
  std::vector<std::string> types;
  json response;  // the last event's
};

Translated translate(const std::vector<std::string>& chat, ResponsesRequest request = {}) {
  ResponsesStreamTranslator t(std::move(request), "resp_test", 1);
  Translated out;
  for (const std::string& c : chat) {
    for (const ResponsesEvent& e : t.on_chat_event(c)) {
      json j = json::parse(e.data);
      CHECK(j["type"] == e.type);
      out.types.push_back(e.type);
      out.events.push_back(std::move(j));
    }
  }
  REQUIRE(t.finished());
  CHECK(t.on_chat_event("[DONE]").empty());  // nothing after the end
  out.response = json::parse(t.response());
  CHECK(out.response == out.events.back()["response"]);
  for (size_t i = 0; i < out.events.size(); ++i) CHECK(out.events[i]["sequence_number"] == i);
  return out;
}

}  // namespace

TEST_CASE("responses events: text streams as one message item between created and completed") {
  const Translated t = translate(chat_stream({text_delta("Paris"), text_delta(" is the capital."),
                                              finish_delta(FinishReason::stop)}));
  const std::vector<std::string> expected = {
      "response.created",           "response.in_progress",      "response.output_item.added",
      "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done",  "response.content_part.done", "response.output_item.done",
      "response.completed"};
  CHECK(t.types == expected);
  CHECK(t.events[0]["response"]["status"] == "in_progress");
  CHECK(t.events[0]["response"]["model"] == "smol");  // the model the router resolved
  CHECK(t.events[0]["response"]["created_at"] == 1700000000);
  CHECK(t.events[0]["response"]["output"].empty());
  const std::string item_id = t.events[2]["item"]["id"];
  CHECK(item_id.starts_with("msg_"));
  for (size_t i = 3; i <= 7; ++i) CHECK(t.events[i]["item_id"] == item_id);
  CHECK(t.events[4]["delta"] == "Paris");
  CHECK(t.events[6]["text"] == "Paris is the capital.");
  const json& r = t.response;
  CHECK(r["id"] == "resp_test");
  CHECK(r["object"] == "response");
  CHECK(r["status"] == "completed");
  CHECK(r["incomplete_details"].is_null());
  REQUIRE(r["output"].size() == 1);
  CHECK(r["output"][0] == t.events[8]["item"]);
  CHECK(r["output"][0]["status"] == "completed");
  CHECK(r["output"][0]["role"] == "assistant");
  CHECK(r["output"][0]["content"][0]["type"] == "output_text");
  CHECK(r["output"][0]["content"][0]["text"] == "Paris is the capital.");
  CHECK(r["usage"] == json::parse(R"({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
      "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 21})"));
  CHECK(r["store"] == false);
  CHECK(r["text"]["format"]["type"] == "text");
}

TEST_CASE("responses events: tool calls are function_call items, whitespace between them is no message") {
  ResponsesRequest req = parse_ok(R"({"input": "x", "tools": [{"type": "function", "name": "get_weather"}]})");
  const Translated t = translate(
      chat_stream({text_delta("Sure."), call_delta(0, "call_a", "get_weather", "{\"city\": "),
                   call_delta(0, std::nullopt, std::nullopt, "\"Paris\"}"), text_delta("\n"),
                   call_delta(1, "call_b", "get_time", "{}"), finish_delta(FinishReason::tool_calls)}),
      req);
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  CHECK(t.types == expected);
  const json& out = t.response["output"];
  REQUIRE(out.size() == 3);
  CHECK(out[0]["type"] == "message");
  CHECK(out[0]["content"][0]["text"] == "Sure.");
  CHECK(out[1]["type"] == "function_call");
  CHECK(std::string(out[1]["id"]).starts_with("fc_"));
  CHECK(out[1]["call_id"] == "call_a");
  CHECK(out[1]["name"] == "get_weather");
  CHECK(out[1]["arguments"] == "{\"city\": \"Paris\"}");
  CHECK(out[1]["status"] == "completed");
  CHECK(t.events[8]["item"]["arguments"] == "");  // added with no arguments yet
  CHECK(t.events[8]["output_index"] == 1);
  CHECK(t.events[11]["arguments"] == "{\"city\": \"Paris\"}");
  CHECK(out[2]["call_id"] == "call_b");
  CHECK(out[2]["arguments"] == "{}");
  CHECK(t.events[13]["output_index"] == 2);
  CHECK(t.response["status"] == "completed");
  CHECK(t.response["tools"][0]["name"] == "get_weather");
  CHECK(t.response["tool_choice"] == "auto");
}

TEST_CASE("responses events: cut off by max_output_tokens is incomplete, an error event fails the response") {
  SECTION("length") {
    const Translated t = translate(chat_stream({text_delta("Once upon"), finish_delta(FinishReason::length)}));
    CHECK(t.types.back() == "response.incomplete");
    CHECK(t.response["status"] == "incomplete");
    CHECK(t.response["incomplete_details"]["reason"] == "max_output_tokens");
    CHECK(t.response["output"][0]["status"] == "incomplete");
  }
  SECTION("whitespace only: no item at all") {
    const Translated t = translate(chat_stream({text_delta(" \n"), finish_delta(FinishReason::stop)}));
    CHECK(t.response["output"].empty());
    CHECK(t.types.size() == 3);
  }
  SECTION("an error after some text") {
    ResponsesStreamTranslator t(ResponsesRequest{}, "resp_test", 1);
    std::vector<std::string> types;
    for (const std::string& c : {chat_role_chunk(chat_meta(), 0), chat_chunk(chat_meta(), text_delta("Hel")),
                                 error_body(unavailable_error("no healthy decode node")), std::string("[DONE]")}) {
      for (const ResponsesEvent& e : t.on_chat_event(c)) types.push_back(e.type);
    }
    REQUIRE(t.finished());
    CHECK(types.back() == "response.failed");
    const json r = json::parse(t.response());
    CHECK(r["status"] == "failed");
    CHECK(r["error"]["code"] == "server_error");
    CHECK(r["error"]["message"] == "no healthy decode node");
    CHECK(r["output"][0]["content"][0]["text"] == "Hel");
    REQUIRE(t.failure());
    CHECK(t.failure()->status == 503);
  }
  SECTION("garbage is an error, not a crash") {
    ResponsesStreamTranslator t(ResponsesRequest{}, "resp_test", 1);
    CHECK_THROWS_AS(t.on_chat_event("not json"), hack::Error);
  }
}
