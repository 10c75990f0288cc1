#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "hack/router/openai_protocol.h"
#include "hack/grammar/json_schema.h"

using namespace hack;
using namespace hack::server;
using Catch::Contains;
using nlohmann::json;

namespace {

ProtocolLimits limits() {
  ProtocolLimits l;
  l.served_models = {"hack-tiny", "other"};
  l.vocab_size = 1000;
  return l;
}

CompletionRequest parse_ok(const std::string& body, Endpoint e) {
  ParseResult r = parse_request(body, e, limits());
  if (const auto* err = std::get_if<ProtocolError>(&r)) FAIL("unexpected error: " << err->message << " body: " << body);
  return std::get<CompletionRequest>(r);
}

ProtocolError parse_err(const std::string& body, Endpoint e) {
  ParseResult r = parse_request(body, e, limits());
  if (!std::holds_alternative<ProtocolError>(r)) FAIL("accepted a bad body: " << body);
  return std::get<ProtocolError>(r);
}

constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

}  // namespace

TEST_CASE("completions: a full request parses into typed fields") {
  const auto r = parse_ok(R"({"model":"hack-tiny","prompt":"Hello","max_tokens":32,"temperature":0.5,"top_p":0.9,
    "top_k":40,"min_p":0.05,"seed":7,"stop":["\n\n","END"],"stop_token_ids":[2,3],"presence_penalty":0.5,
    "frequency_penalty":-0.5,"repetition_penalty":1.1,"logprobs":5,"n":2,"echo":false,"user":"u1",
    "stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"min_tokens":4})",
                          kCmpl);
  CHECK(r.endpoint == kCmpl);
  CHECK(r.model == "hack-tiny");
  REQUIRE(r.prompt_text);
  CHECK(*r.prompt_text == "Hello");
  CHECK_FALSE(r.prompt_token_ids);
  CHECK(r.max_tokens == 32);
  CHECK(r.temperature == 0.5f);
  CHECK(r.top_p == 0.9f);
  CHECK(r.top_k == 40);
  CHECK(r.min_p == 0.05f);
  CHECK(r.seed == 7u);
  CHECK(r.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r.stop_token_ids == std::vector<int>{2, 3});
  CHECK(r.presence_penalty == 0.5f);
  CHECK(r.frequency_penalty == -0.5f);
  CHECK(r.repetition_penalty == 1.1f);
  CHECK(r.logprobs == 5);
  CHECK(r.n == 2);
  CHECK_FALSE(r.echo);
  CHECK(r.user == "u1");
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.ignore_eos);
  CHECK(r.min_tokens == 4);
}

TEST_CASE("logit_bias: token ids as strings, sorted by id, carried into the sampling parameters") {
  const auto r = parse_ok(R"({"prompt":"x","logit_bias":{"42":-100,"7":2.5,"0":100}})", kCmpl);
  const std::vector<std::pair<int, float>> expect = {{0, 100.0f}, {7, 2.5f}, {42, -100.0f}};
  CHECK(r.logit_bias == expect);
  CHECK(to_sampling_params(r, 8).logit_bias == expect);
  CHECK(parse_ok(R"({"prompt":"x","logit_bias":null})", kCmpl).logit_bias.empty());
  CHECK(parse_ok(R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{"3":1}})", kChat).logit_bias ==
        std::vector<std::pair<int, float>>{{3, 1.0f}});
}

TEST_CASE("structured outputs: each field becomes one GBNF grammar in the sampling parameters") {
  const auto json_mode = parse_ok(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})", kChat);
  CHECK(json_mode.grammar == hack::grammar::json_object_gbnf());
  CHECK(to_sampling_params(json_mode, 8).grammar == json_mode.grammar);
  CHECK(parse_ok(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"}})", kChat).grammar.empty());
  const auto schema = parse_ok(
      R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}}}})",
      kChat);
  CHECK(schema.grammar == hack::grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(
                              R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})")));
  CHECK(parse_ok(R"({"prompt":"x","guided_json":{"type":"boolean"}})", kCmpl).grammar ==
        hack::grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type":"boolean"})")));
  CHECK(parse_ok(R"({"prompt":"x","guided_regex":"[0-9]+"})", kCmpl).grammar == hack::grammar::regex_to_gbnf("[0-9]+"));
  CHECK(parse_ok(R"({"prompt":"x","guided_choice":["a","b"]})", kCmpl).grammar == hack::grammar::choice_to_gbnf({"a", "b"}));
  CHECK(parse_ok(R"({"prompt":"x","guided_grammar":"root ::= \"z\""})", kCmpl).grammar == "root ::= \"z\"");
  CHECK(parse_ok(R"({"prompt":"x","structured_outputs":{"choice":["a","b"]}})", kCmpl).grammar ==
        hack::grammar::choice_to_gbnf({"a", "b"}));
}

TEST_CASE("completions: prompt forms") {
  CHECK(*parse_ok(R"({"prompt":[1,2,3]})", kCmpl).prompt_token_ids == std::vector<int>{1, 2, 3});
  CHECK(*parse_ok(R"({"prompt":["one"]})", kCmpl).prompt_text == "one");
  CHECK(*parse_ok(R"({"prompt":[[5,6]]})", kCmpl).prompt_token_ids == std::vector<int>{5, 6});
  CHECK(*parse_ok(R"({"prompt":""})", kCmpl).prompt_text == "");
  CHECK(parse_ok(R"({"prompt":"x","echo":true})", kCmpl).echo);
  // echo with logprobs asks the prefill for the prompt's logprobs (with as many alternatives).
  CHECK(to_sampling_params(parse_ok(R"({"prompt":"x","echo":true,"logprobs":2})", kCmpl), 5).prompt_logprobs == 2);
  CHECK(to_sampling_params(parse_ok(R"({"prompt":"x","echo":true})", kCmpl), 5).prompt_logprobs == -1);
  CHECK(to_sampling_params(parse_ok(R"({"prompt":"x","logprobs":2})", kCmpl), 5).prompt_logprobs == -1);
  // 5.0 is an integer to pydantic, so to vLLM.
  CHECK(*parse_ok(R"({"prompt":[5.0]})", kCmpl).prompt_token_ids == std::vector<int>{5});
}

TEST_CASE("defaults: model, explicit nulls, stop as string, negative seed") {
  const auto r = parse_ok(R"({"prompt":"x","max_tokens":null,"temperature":null,"stop":"###","seed":-1,
                              "stream_options":null,"logprobs":null,"suffix":null,"logit_bias":{}})",
                          kCmpl);
  CHECK(r.model == "hack-tiny");  // first served model when omitted
  CHECK_FALSE(r.max_tokens);
  CHECK_FALSE(r.temperature);
  CHECK(r.logprobs == -1);
  CHECK(r.n == 1);
  CHECK_FALSE(r.stream);
  CHECK(r.stop == std::vector<std::string>{"###"});
  CHECK(r.seed == ~uint64_t{0});
  CHECK(r.skip_special_tokens);
}

TEST_CASE("chat: messages, content parts, tools, logprobs") {
  const auto r = parse_ok(R"({"model":"other","messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
         "function":{"name":"f","arguments":"{}"}}],"refusal":null},
      {"role":"tool","tool_call_id":"c1","content":"42"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],
    "tool_choice":"auto","max_completion_tokens":20,"max_tokens":99,"logprobs":true,"top_logprobs":3,
    "chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true})",
                          kChat);
  CHECK(r.model == "other");
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[0].role == "system");
  CHECK(*r.messages[0].content == "Be brief.");
  CHECK(*r.messages[1].content == "a\nb");
  CHECK_FALSE(r.messages[2].content);
  CHECK(r.messages[2].tool_calls.size() == 1);
  CHECK(*r.messages[3].tool_call_id == "c1");
  CHECK(r.tools.size() == 1);
  CHECK_FALSE(r.tool_choice_none);
  CHECK(r.tool_parser == ToolParserKind::none);  // the router sets it at admission
  CHECK(r.chat_template_kwargs["enable_thinking"] == false);
  CHECK(r.max_tokens == 20);  // max_completion_tokens wins over max_tokens
  CHECK(r.logprobs == 3);

  const nlohmann::ordered_json m = chat_messages_json(r);
  REQUIRE(m.size() == 4);
  CHECK(m[1]["content"] == "a\nb");
  CHECK(m[2]["content"].is_null());
  CHECK(m[2]["tool_calls"][0]["function"]["name"] == "f");
  CHECK(m[3]["tool_call_id"] == "c1");
  CHECK_FALSE(m[0].contains("tool_calls"));

  CHECK(parse_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", kChat).logprobs == 0);
  CHECK(parse_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})", kChat).logprobs == -1);
  CHECK(parse_ok(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":9})", kChat).max_tokens == 9);
}

TEST_CASE("malformed requests: status and param of each") {
  struct Case {
    Endpoint endpoint;
    std::string body;
    int status;
    std::string param;  // "" = null
    std::string message_part;
  };
  const std::vector<Case> cases = {
      // Body shape.
      {kCmpl, "", 400, "", "Invalid JSON"},
      {kCmpl, "{\"prompt\": \"x\",", 400, "", "Invalid JSON"},
      {kCmpl, "{\"prompt\": \"x\"} trailing", 400, "", "Invalid JSON"},
      {kCmpl, "[1,2]", 400, "", "must be a JSON object"},
      {kCmpl, "\"text\"", 400, "", "must be a JSON object"},
      {kCmpl, "null", 400, "", "must be a JSON object"},
      {kCmpl, std::string(100, '[') + std::string(100, ']'), 400, "", "nested deeper"},
      {kCmpl, "{\"prompt\": \"\xff\"}", 400, "", "Invalid JSON"},
      // Missing / unknown fields.
      {kCmpl, R"({"max_tokens":5})", 400, "prompt", "required"},
      {kCmpl, R"({"prompt":null})", 400, "prompt", "null"},
      {kChat, R"({"model":"hack-tiny"})", 400, "messages", "required"},
      {kChat, R"({"messages":null})", 400, "messages", "null"},
      {kCmpl, R"({"prompt":"x","frobnicate":1})", 400, "frobnicate", "Unrecognized request argument"},
      {kCmpl, R"({"prompt":"x","messages":[]})", 400, "messages", "Unrecognized"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"prompt":"x"})", 400, "prompt", "Unrecognized"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"echo":true})", 400, "echo", "Unrecognized"},
      {kCmpl, R"({"prompt":"x","top_logprobs":2})", 400, "top_logprobs", "Unrecognized"},
      // Model.
      {kCmpl, R"({"prompt":"x","model":"gpt-4"})", 404, "model", "does not exist"},
      {kCmpl, R"({"prompt":"x","model":5})", 400, "model", "string"},
      // Prompt.
      {kCmpl, R"({"prompt":["a",5]})", 400, "prompt", "each prompt of a list"},
      {kCmpl, R"({"prompt":[[1],[]]})", 400, "prompt", "each prompt of a list"},
      {kCmpl, R"({"prompt":[]})", 400, "prompt", "empty"},
      {kCmpl, R"({"prompt":[[]]})", 400, "prompt", "empty"},
      {kCmpl, R"({"prompt":42})", 400, "prompt", "must be a string"},
      {kCmpl, R"({"prompt":{"text":"x"}})", 400, "prompt", "must be a string"},
      {kCmpl, R"({"prompt":[1,"a"]})", 400, "prompt", "integer"},
      {kCmpl, R"({"prompt":[-1]})", 400, "prompt", "at least 0"},
      {kCmpl, R"({"prompt":[1000]})", 400, "prompt", "out of vocabulary"},
      {kCmpl, R"({"prompt":[1.5]})", 400, "prompt", "integer"},
      {kCmpl, R"({"prompt":[true]})", 400, "prompt", "list of boolean"},
      // max_tokens.
      {kCmpl, R"({"prompt":"x","max_tokens":-1})", 400, "max_tokens", "at least 1"},
      {kCmpl, R"({"prompt":"x","max_tokens":0})", 400, "max_tokens", "at least 1"},
      {kCmpl, R"({"prompt":"x","max_tokens":"10"})", 400, "max_tokens", "integer"},
      {kCmpl, R"({"prompt":"x","max_tokens":10.5})", 400, "max_tokens", "integer"},
      {kCmpl, R"({"prompt":"x","max_tokens":1e300})", 400, "max_tokens", "integer"},
      {kCmpl, R"({"prompt":"x","max_tokens":99999999999999999999999})", 400, "max_tokens", ""},
      {kCmpl, R"({"prompt":"x","max_tokens":18446744073709551615})", 400, "max_tokens", "at most"},
      {kCmpl, R"({"prompt":"x","max_tokens":4294967296})", 400, "max_tokens", "at most"},
      {kCmpl, R"({"prompt":"x","max_tokens":true})", 400, "max_tokens", "boolean"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-5})", 400,
       "max_completion_tokens", "at least 1"},
      // Sampling ranges.
      {kCmpl, R"({"prompt":"x","temperature":-0.1})", 400, "temperature", "[0, 2]"},
      {kCmpl, R"({"prompt":"x","temperature":2.5})", 400, "temperature", "[0, 2]"},
      {kCmpl, R"({"prompt":"x","temperature":"hot"})", 400, "temperature", "number"},
      {kCmpl, R"({"prompt":"x","temperature":1e999})", 400, "", "Invalid JSON"},  // overflow: a JSON error
      {kCmpl, R"({"prompt":"x","top_p":0})", 400, "top_p", "(0, 1]"},
      {kCmpl, R"({"prompt":"x","top_p":1.01})", 400, "top_p", "(0, 1]"},
      {kCmpl, R"({"prompt":"x","top_k":-2})", 400, "top_k", "at least -1"},
      {kCmpl, R"({"prompt":"x","top_k":1.5})", 400, "top_k", "integer"},
      {kCmpl, R"({"prompt":"x","min_p":1.5})", 400, "min_p", "[0, 1]"},
      {kCmpl, R"({"prompt":"x","presence_penalty":2.1})", 400, "presence_penalty", "[-2, 2]"},
      {kCmpl, R"({"prompt":"x","frequency_penalty":-3})", 400, "frequency_penalty", "[-2, 2]"},
      {kCmpl, R"({"prompt":"x","repetition_penalty":0})", 400, "repetition_penalty", "(0, 2]"},
      {kCmpl, R"({"prompt":"x","seed":"abc"})", 400, "seed", "integer"},
      {kCmpl, R"({"prompt":"x","seed":1e30})", 400, "seed", "integer"},
      {kCmpl, R"({"prompt":"x","n":0})", 400, "n", "at least 1"},
      {kCmpl, R"({"prompt":"x","n":17})", 400, "n", "at most 16"},
      {kCmpl, R"({"prompt":"x","best_of":3,"n":2})", 400, "best_of", "not supported"},
      {kCmpl, R"({"prompt":"x","min_tokens":-1})", 400, "min_tokens", "at least 0"},
      {kCmpl, R"({"prompt":"x","min_tokens":10,"max_tokens":5})", 400, "min_tokens", "less than or equal"},
      {kCmpl, R"({"prompt":"x","ignore_eos":1})", 400, "ignore_eos", "boolean"},
      {kCmpl, R"({"prompt":"x","echo":"yes"})", 400, "echo", "boolean"},
      {kCmpl, R"({"prompt":"x","user":5})", 400, "user", "string"},
      {kCmpl, R"({"prompt":"x","logit_bias":[5]})", 400, "logit_bias", "object"},
      {kCmpl, R"({"prompt":"x","logit_bias":{"five":1}})", 400, "logit_bias", "not a token id"},
      {kCmpl, R"({"prompt":"x","logit_bias":{"-5":1}})", 400, "logit_bias", "not a token id"},
      {kCmpl, R"({"prompt":"x","logit_bias":{"1000":1}})", 400, "logit_bias", "out of vocabulary"},
      {kCmpl, R"({"prompt":"x","logit_bias":{"5":101}})", 400, "logit_bias", "[-100, 100]"},
      {kCmpl, R"({"prompt":"x","logit_bias":{"5":"1"}})", 400, "logit_bias", "number"},
      {kCmpl, R"({"prompt":"x","suffix":"end"})", 400, "suffix", "not supported"},
      // Stop.
      {kCmpl, R"({"prompt":"x","stop":5})", 400, "stop", "string or a list"},
      {kCmpl, R"({"prompt":"x","stop":["a",1]})", 400, "stop", "string"},
      {kCmpl, R"({"prompt":"x","stop":[""]})", 400, "stop", "empty"},
      {kCmpl, R"({"prompt":"x","stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
       400, "stop", "at most 16"},
      {kCmpl, R"({"prompt":"x","stop_token_ids":[1,-2]})", 400, "stop_token_ids", "at least 0"},
      {kCmpl, R"({"prompt":"x","stop_token_ids":[5000]})", 400, "stop_token_ids", "out of vocabulary"},
      {kCmpl, R"({"prompt":"x","stop_token_ids":3})", 400, "stop_token_ids", "list"},
      // Logprobs.
      {kCmpl, R"({"prompt":"x","logprobs":21})", 400, "logprobs", "at most 20"},
      {kCmpl, R"({"prompt":"x","logprobs":-1})", 400, "logprobs", "at least 0"},
      {kCmpl, R"({"prompt":"x","logprobs":true})", 400, "logprobs", "integer"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", 400, "logprobs", "boolean"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", 400, "top_logprobs",
       "`logprobs` must be set to true"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", 400, "top_logprobs",
       "at most 20"},
      // Streaming.
      {kCmpl, R"({"prompt":"x","stream":"true"})", 400, "stream", "boolean"},
      {kCmpl, R"({"prompt":"x","stream_options":{"include_usage":true}})", 400, "stream_options", "stream=True"},
      {kCmpl, R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})", 400,
       "stream_options.include_usage", "boolean"},
      {kCmpl, R"({"prompt":"x","stream":true,"stream_options":{"bogus":true}})", 400, "stream_options.bogus",
       "Unrecognized"},
      {kCmpl, R"({"prompt":"x","stream":true,"stream_options":[]})", 400, "stream_options", "object"},
      // Messages.
      {kChat, R"({"messages":[]})", 400, "messages", "empty"},
      {kChat, R"({"messages":"hi"})", 400, "messages", "list"},
      {kChat, R"({"messages":["hi"]})", 400, "messages.[0]", "object"},
      {kChat, R"({"messages":[{"content":"x"}]})", 400, "messages.[0].role", "required"},
      {kChat, R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages.[0].role", "one of"},
      {kChat, R"({"messages":[{"role":7,"content":"x"}]})", 400, "messages.[0].role", "string"},
      {kChat, R"({"messages":[{"role":"user"}]})", 400, "messages.[0].content", "required"},
      {kChat, R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":null}]})", 400,
       "messages.[1].content", "required"},
      {kChat, R"({"messages":[{"role":"user","content":5}]})", 400, "messages.[0].content", "string or a list"},
      {kChat, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400,
       "messages.[0].content.[0].type", "not supported"},
      {kChat, R"({"messages":[{"role":"user","content":[{"text":"x"}]}]})", 400, "messages.[0].content.[0].type",
       "required"},
      {kChat, R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", 400, "messages.[0].content.[0].text",
       "required"},
      {kChat, R"({"messages":[{"role":"user","content":["x"]}]})", 400, "messages.[0].content.[0]", "object"},
      {kChat, R"({"messages":[{"role":"user","content":"x","mood":"happy"}]})", 400, "messages.[0].mood",
       "Unrecognized"},
      {kChat, R"({"messages":[{"role":"assistant","content":"x","tool_calls":{}}]})", 400, "messages.[0].tool_calls",
       "list"},
      {kChat, R"({"messages":[{"role":"assistant","content":"x","refusal":"no"}]})", 400, "messages.[0].refusal",
       "not supported"},
      // Chat extras.
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", 400, "tools", "list"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", 400,
       "tools.[0].function", "object"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", 400, "tool_choice",
       "needs tools"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"f"}}})",
       400, "tool_choice", "needs tools"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function"}})", 400, "tool_choice",
       "must be {"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"any"})", 400, "tool_choice", "got 'any'"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":3})", 400, "tool_choice", "string or an object"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"functions":[]})", 400, "functions", "use tools"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"function_call":"auto"})", 400, "function_call", "use tools"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", 400,
       "response_format", "'xml' is not supported"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a"}}})",
       400, "response_format", "schema is required"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"a":{"not":{}}}}}}})",
       400, "response_format", "unsupported keyword 'not'"},
      {kCmpl, R"({"prompt":"x","guided_json":{"type":"integer","multipleOf":2}})", 400, "guided_json", "'multipleOf'"},
      {kCmpl, R"({"prompt":"x","guided_json":"{bad"})", 400, "guided_json", "not valid JSON"},
      {kCmpl, R"({"prompt":"x","guided_regex":"(a"})", 400, "guided_regex", "unclosed"},
      {kCmpl, R"({"prompt":"x","guided_choice":[]})", 400, "guided_choice", "non-empty"},
      {kCmpl, R"({"prompt":"x","guided_grammar":"root ::= undefined"})", 400, "guided_grammar", "undefined rule"},
      {kCmpl, R"({"prompt":"x","structured_outputs":{"structural_tag":{}}})", 400, "structured_outputs", "not supported"},
      {kCmpl, R"({"prompt":"x","guided_regex":"a","guided_choice":["b"]})", 400, "guided_choice", "only one"},
      {kChat, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})", 400, "chat_template_kwargs",
       "object"},
  };
  for (const Case& c : cases) {
    INFO("body: " << c.body);
    const ProtocolError e = parse_err(c.body, c.endpoint);
    CHECK(e.status == c.status);
    if (c.param.empty()) {
      CHECK_FALSE(e.param);
    } else {
      CHECK(e.param.value_or("<null>") == c.param);
    }
    CHECK_THAT(e.message, Contains(c.message_part));
    CHECK(e.type == "invalid_request_error");
  }
}

TEST_CASE("error_body has the OpenAI shape") {
  const ProtocolError e = parse_err(R"({"prompt":"x","n":99})", kCmpl);
  const json j = json::parse(error_body(e));
  REQUIRE(j.size() == 1);
  const json& err = j.at("error");
  CHECK(err.at("message").get<std::string>().find("at most 16") != std::string::npos);
  CHECK(err.at("type") == "invalid_request_error");
  CHECK(err.at("param") == "n");
  CHECK(err.at("code").is_null());

  const json nf = json::parse(error_body(parse_err(R"({"prompt":"x","model":"nope"})", kCmpl)));
  CHECK(nf["error"]["code"] == "model_not_found");
  const json bad = json::parse(error_body(parse_err("{", kCmpl)));
  CHECK(bad["error"]["param"].is_null());

  CHECK(unauthorized_error().status == 401);
  CHECK(overloaded_error().status == 429);
  CHECK(unavailable_error("no decode node").status == 503);
  CHECK(not_found_error("/v2/x").status == 404);
  CHECK(internal_error("boom").status == 500);
}

TEST_CASE("to_sampling_params: request overrides defaults, temperature 0 stays greedy") {
  SamplingParams defaults;
  defaults.temperature = 0.6f;  // e.g. from generation_config.json
  defaults.top_p = 0.9f;
  defaults.top_k = 50;
  auto r = parse_ok(R"({"prompt":"x","temperature":0,"stop_token_ids":[7],"ignore_eos":true,"min_tokens":3,
                        "logprobs":2,"seed":11,"presence_penalty":0.25})",
                    kCmpl);
  SamplingParams p = to_sampling_params(r, 12, defaults);
  CHECK(p.temperature == 0.0f);
  CHECK(p.top_p == 0.9f);  // unset in the request: the model's default
  CHECK(p.top_k == 50);
  CHECK(p.max_tokens == 12);
  CHECK(p.min_tokens == 3);
  CHECK(p.stop_token_ids == std::vector<int>{7});
  CHECK(p.ignore_eos);
  CHECK(p.logprobs == 2);
  CHECK(p.seed == 11u);
  CHECK(p.presence_penalty == 0.25f);
  CHECK_NOTHROW(p.validate(1000));

  // OpenAI defaults without generation_config: temperature 1, top_p 1; no logprobs.
  auto plain = to_sampling_params(parse_ok(R"({"prompt":"x","min_tokens":40})", kCmpl), 16);
  CHECK(plain.temperature == 1.0f);
  CHECK(plain.top_p == 1.0f);
  CHECK(plain.logprobs == -1);
  CHECK(plain.min_tokens == 16);  // clamped to a defaulted max_tokens
  CHECK_NOTHROW(plain.validate(1000));
}

TEST_CASE("fit_max_tokens: context length check and defaults") {
  const auto cmpl = parse_ok(R"({"prompt":"x"})", kCmpl);
  const auto chat = parse_ok(R"({"messages":[{"role":"user","content":"x"}]})", kChat);
  const auto chat_100 = parse_ok(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100})", kChat);

  CHECK(std::get<int>(fit_max_tokens(cmpl, 10, 2048)) == 16);    // completions default
  CHECK(std::get<int>(fit_max_tokens(cmpl, 2040, 2048)) == 8);   // ... capped by the context
  CHECK(std::get<int>(fit_max_tokens(chat, 10, 2048)) == 2038);  // chat: the rest of the context
  CHECK(std::get<int>(fit_max_tokens(chat_100, 1948, 2048)) == 100);

  const auto over = fit_max_tokens(chat_100, 1949, 2048);
  REQUIRE(std::holds_alternative<ProtocolError>(over));
  const ProtocolError& e = std::get<ProtocolError>(over);
  CHECK(e.status == 400);
  CHECK(e.code == "context_length_exceeded");
  CHECK(e.param == "messages");
  CHECK(e.message ==
        "This model's maximum context length is 2048 tokens. However, you requested 2049 tokens (1949 in the "
        "messages, 100 in the completion). Please reduce the length of the messages or completion.");

  const auto full = fit_max_tokens(chat, 2048, 2048);
  REQUIRE(std::holds_alternative<ProtocolError>(full));
  CHECK_THAT(std::get<ProtocolError>(full).message, Contains("2048 tokens") && Contains("resulted in 2048 tokens"));

  const auto empty = fit_max_tokens(cmpl, 0, 2048);
  REQUIRE(std::holds_alternative<ProtocolError>(empty));
  CHECK(std::get<ProtocolError>(empty).param == "prompt");
}

TEST_CASE("non-stream responses") {
  const ResponseMeta meta{"cmpl-abc", "hack-tiny", 1700000000, false};
  std::vector<Choice> choices(2);
  choices[0] = {0, "Hello", FinishReason::length, std::nullopt};
  choices[1] = {1, "Hé!", FinishReason::stop,
                std::vector<PositionLogprobs>{{"H", -0.5f, {{"H", -0.5f}, {"J", -1.5f}}},
                                          {"é", -std::numeric_limits<float>::infinity(), {}},
                                          {"!", -0.25f, {{"!", -0.25f}}}}};
  const json j = json::parse(completion_response(meta, choices, Usage{5, 7}, 3));
  CHECK(j["id"] == "cmpl-abc");
  CHECK(j["object"] == "text_completion");
  CHECK(j["created"] == 1700000000);
  CHECK(j["model"] == "hack-tiny");
  REQUIRE(j["choices"].size() == 2);
  CHECK(j["choices"][0]["index"] == 0);
  CHECK(j["choices"][0]["text"] == "Hello");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["choices"][0]["logprobs"].is_null());
  const json& lp = j["choices"][1]["logprobs"];
  CHECK(lp["tokens"] == json({"H", "é", "!"}));
  CHECK(lp["token_logprobs"] == json({-0.5, -9999.0, -0.25}));  // -inf clamped as vLLM does
  CHECK(lp["top_logprobs"][0] == json({{"H", -0.5}, {"J", -1.5}}));
  CHECK(lp["text_offset"] == json({3, 4, 5}));  // code points, from the base
  CHECK(j["usage"] == json({{"prompt_tokens", 5}, {"completion_tokens", 7}, {"total_tokens", 12}}));

  const ResponseMeta cmeta{"chatcmpl-x", "hack-tiny", 1, false};
  const json c = json::parse(chat_completion_response(cmeta, choices, Usage{1, 2}));
  CHECK(c["object"] == "chat.completion");
  CHECK(c["choices"][0]["message"] == json({{"role", "assistant"}, {"content", "Hello"}}));
  CHECK(c["choices"][1]["finish_reason"] == "stop");
  const json& content = c["choices"][1]["logprobs"]["content"];
  REQUIRE(content.size() == 3);
  CHECK(content[1]["token"] == "é");
  CHECK(content[1]["bytes"] == json({0xC3, 0xA9}));
  CHECK(content[0]["top_logprobs"][1] == json({{"token", "J"}, {"logprob", -1.5}, {"bytes", {74}}}));
  CHECK(c["usage"]["total_tokens"] == 3);

  // Tool calls: content null when no text is left, finish_reason tool_calls.
  std::vector<Choice> calls(2);
  calls[0].finish_reason = FinishReason::tool_calls;
  calls[0].tool_calls = {ToolCall{"call_a", "f", "{\"x\": 1}"}, ToolCall{"call_b", "g", "{}"}};
  calls[1].index = 1;
  calls[1].text = "Let me look.";
  calls[1].finish_reason = FinishReason::tool_calls;
  calls[1].tool_calls = {ToolCall{"call_c", "f", "{}"}};
  const json t = json::parse(chat_completion_response(cmeta, calls, Usage{1, 2}));
  CHECK(t["choices"][0]["message"] == json::parse(R"({"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
      {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]})"));
  CHECK(t["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(t["choices"][1]["message"]["content"] == "Let me look.");
  CHECK(t["choices"][1]["message"]["tool_calls"].size() == 1);
}

TEST_CASE("stream chunks") {
  ResponseMeta meta{"chatcmpl-s", "hack-tiny", 9, true};
  const json role = json::parse(chat_role_chunk(meta, 0));
  CHECK(role["object"] == "chat.completion.chunk");
  CHECK(role["choices"][0]["delta"] == json({{"role", "assistant"}, {"content", ""}}));
  CHECK(role["choices"][0]["finish_reason"].is_null());
  CHECK(role.contains("usage"));
  CHECK(role["usage"].is_null());

  ChoiceDelta d;
  d.text = "Hi";
  const json mid = json::parse(chat_chunk(meta, d));
  CHECK(mid["choices"][0]["delta"] == json({{"content", "Hi"}}));
  CHECK(mid["choices"][0]["finish_reason"].is_null());

  ChoiceDelta last;
  last.index = 1;
  last.finish_reason = FinishReason::length;
  const json end = json::parse(chat_chunk(meta, last));
  CHECK(end["choices"][0]["index"] == 1);
  CHECK(end["choices"][0]["delta"] == json::object());
  CHECK(end["choices"][0]["finish_reason"] == "length");

  // Tool calls stream as OpenAI sends them: the first piece of a call names it, later pieces
  // carry arguments only, and no content key appears beside them.
  ChoiceDelta first_call;
  first_call.tool_calls = {ToolCallDelta{0, "call_x", "get_weather", "{\"ci"}};
  const json fc = json::parse(chat_chunk(meta, first_call));
  CHECK(fc["choices"][0]["delta"] ==
        json::parse(R"({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"ci"}}]})"));
  ChoiceDelta more_args;
  more_args.tool_calls = {ToolCallDelta{0, std::nullopt, std::nullopt, "ty\": 1}"}};
  more_args.finish_reason = FinishReason::tool_calls;
  const json ma = json::parse(chat_chunk(meta, more_args));
  CHECK(ma["choices"][0]["delta"] == json::parse(R"({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": 1}"}}]})"));
  CHECK(ma["choices"][0]["finish_reason"] == "tool_calls");

  const json usage = json::parse(usage_chunk(meta, kChat, Usage{3, 4}));
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"]["total_tokens"] == 7);
  CHECK(usage["object"] == "chat.completion.chunk");

  meta.usage_null_in_chunks = false;
  ChoiceDelta t;
  t.text = "ab";
  t.text_offset = 10;
  t.logprobs = std::vector<PositionLogprobs>{{"a", -1.0f, {}}, {"b", -2.0f, {}}};
  t.finish_reason = FinishReason::stop;
  const json tc = json::parse(completion_chunk(meta, t));
  CHECK(tc["object"] == "text_completion");
  CHECK_FALSE(tc.contains("usage"));
  CHECK(tc["choices"][0]["text"] == "ab");
  CHECK(tc["choices"][0]["finish_reason"] == "stop");
  CHECK(tc["choices"][0]["logprobs"]["text_offset"] == json({10, 11}));

}

TEST_CASE("request ids, models body, code points") {
  const std::string a = make_request_id(kCmpl);
  const std::string b = make_request_id(kChat);
  CHECK(a.rfind("cmpl-", 0) == 0);
  CHECK(a.size() == 5 + 32);
  CHECK(b.rfind("chatcmpl-", 0) == 0);
  CHECK(a.substr(5) != b.substr(9));
  CHECK(a.find_first_not_of("0123456789abcdef", 5) == std::string::npos);

  const std::vector<std::string> models = {"hack-tiny"};
  const json m = json::parse(models_response(models, 42, 4096));
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "hack-tiny");
  CHECK(m["data"][0]["object"] == "model");
  CHECK(m["data"][0]["created"] == 42);
  CHECK(m["data"][0]["max_model_len"] == 4096);

  CHECK(count_code_points("") == 0);
  CHECK(count_code_points("aé€😀") == 4);
}
