// RouterServer in-process against fake prefill and decode nodes (HTTP only, no model).
//   - Its lifetime: destroying a router while many requests stream, wait and arrive cancels
//     them on their nodes and joins every thread it started before any of its state goes
//     (run under ASan/UBSan: no use after free), in far less time than the requests take.
//   - Its relay: streamed and whole responses carry the same text, logprobs and offsets, the
//     text being the tokenizer's decode of the node's tokens (echo and stop strings applied).
#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hack/core/error.h"
#include "hack/http/http_client.h"
#include "hack/http/http_server.h"
#include "hack/node/node_protocol.h"
#include "hack/router/router_server.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/test_support.h"
#include "unit/http/http_test_util.h"

using namespace hack::server;

namespace {

using test::Clock;
using test::eventually;
using test::seconds_since;
using test::Workers;

// A long request asks for this many tokens: 20 s of streaming at 20 ms a token.
constexpr int kLongTokens = 1000;

// The tokens the fake decode node generates, in order: hack-tiny word pieces (ids below 256
// are single bytes, 4091 and up special tokens).
int fake_token(int i) { return 1000 + i % 500; }

struct FakeNodeOptions {
  bool answer_cancels = true;  // false: play a hung node, leave /internal/cancel unanswered
  std::chrono::milliseconds token_interval{20};
  std::vector<int> script;  // when set: these tokens (up to max_tokens), then finish "stop"
};

// A prefill or decode node as the router sees it over HTTP, without a model: /health
// reports it idle; /internal/prefill answers at once; /internal/generate sends "accepted",
// then fake_token(0, 1, ...) one every token_interval until max_tokens ("finished") or
// until its connection closes; /internal/cancel is counted.
class FakeNode {
 public:
  explicit FakeNode(std::string role, FakeNodeOptions options = {})
      : role_(std::move(role)),
        options_(options),
        server_(HttpServerOptions{}, [this](HttpRequest req, std::shared_ptr<Responder> res) {
          handle(std::move(req), std::move(res));
        }) {}

  std::string address() const { return "127.0.0.1:" + std::to_string(server_.port()); }
  int port() const { return server_.port(); }

  std::atomic<int> health_polls{0}, cancels{0};
  std::atomic<bool> ready{true};  // what /health says (a decode node before its UCX self-probe: false)
  std::atomic<int> streams_open{0};
  std::atomic<int> long_streams_running{0};  // long streams (kLongTokens) that have sent a token

 private:
  void handle(HttpRequest req, std::shared_ptr<Responder> res) {
    if (req.path == "/health") {
      ++health_polls;
      NodeHealth h;
      h.role = role_;
      h.ucx_address = role_ == "decode" ? "127.0.0.1:1" : "";
      h.ready = ready;
      res->send(200, "application/json", to_json(h));
    } else if (req.path == "/internal/cancel") {
      ++cancels;
      if (options_.answer_cancels) {
        res->send(200, "application/json", "{}");
      } else {
        std::lock_guard lock(unanswered_mutex_);
        unanswered_.push_back(std::move(res));  // until the caller gives up or the node stops
      }
    } else if (req.path == "/internal/prefill") {
      const PrefillCall call = parse_prefill_call(req.body);
      PrefillReply reply;
      reply.first.sample.token = call.prompt.back();
      // Asked for prompt logprobs: token i gets -i / 8 (exact in binary), one alternative.
      if (call.params.prompt_logprobs >= 0) {
        for (size_t i = 1; i < call.prompt.size(); ++i) {
          reply.prompt_logprobs.push_back(hack::SampleResult{call.prompt[i], -static_cast<float>(i) / 8, {{7, -0.125f}}});
        }
      }
      res->send(200, "application/json", to_json(reply));
    } else if (req.path == "/internal/generate") {
      GenerateJob job = parse_generate_job(req.body);
      ++streams_open;
      workers_.start([this, res, job = std::move(job)] {
        stream_tokens(*res, job);
        --streams_open;
      });
    } else {
      res->send(404, "application/json", node_error_body("no such path"));
    }
  }

  void stream_tokens(Responder& res, const GenerateJob& job) {
    const bool long_request = job.params.max_tokens == kLongTokens;
    res.start_sse();
    NodeEvent accepted;
    accepted.kind = NodeEventKind::accepted;
    res.send_event(to_json(accepted));
    const bool scripted = !options_.script.empty();
    const int n = scripted ? std::min(job.params.max_tokens, static_cast<int>(options_.script.size())) : job.params.max_tokens;
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_for(options_.token_interval);
      NodeEvent token;
      token.kind = NodeEventKind::token;
      token.index = i;
      token.sample.token = scripted ? options_.script[static_cast<size_t>(i)] : fake_token(i);
      token.sample.logprob = -0.25f * static_cast<float>(i % 4);
      if (!res.send_event(to_json(token))) {
        if (long_request && i > 0) --long_streams_running;
        return;
      }
      if (long_request && i == 0) ++long_streams_running;
    }
    if (long_request) --long_streams_running;
    NodeEvent finished;
    finished.kind = NodeEventKind::finished;
    finished.prompt_tokens = static_cast<int>(job.prompt.size());
    finished.completion_tokens = n;
    if (scripted && n < job.params.max_tokens) finished.finish_reason = hack::FinishReason::stop;
    res.send_event(to_json(finished));
    res.end();
  }

  std::string role_;
  FakeNodeOptions options_;
  std::mutex unanswered_mutex_;
  std::vector<std::shared_ptr<Responder>> unanswered_;
  Workers workers_;     // joined after server_ has stopped (their Responders are closed by then)
  HttpServer server_;
};

std::string model_dir() { return (hack::test::source_dir() / "models" / "hack-tiny").string(); }

RouterConfig router_config(const FakeNode& prefill, const FakeNode& decode) {
  RouterConfig c;
  c.port = 0;
  c.model = model_dir();
  c.prefill = {prefill.address()};
  c.decode = {decode.address()};
  c.health_interval_s = 0.2f;  // polls run during the test, and through shutdown
  c.http_threads = 4;
  return c;
}

std::string completion_body(int max_tokens, bool stream, int n = 1) {
  nlohmann::json j = {{"model", "hack-tiny"}, {"prompt", "In the beginning God created"},
                      {"max_tokens", max_tokens}, {"stream", stream}, {"n", n}};
  return j.dump();
}

HttpClientRequest completion_request(int port, std::string body) {
  HttpClientRequest r;
  r.host = "127.0.0.1";
  r.port = port;
  r.method = "POST";
  r.target = "/v1/completions";
  r.body = std::move(body);
  r.timeout_s = 60;
  return r;
}

// The router logs every request at info; the churn below makes hundreds.
struct QuietLogs {
  spdlog::level::level_enum saved = spdlog::get_level();
  QuietLogs() { spdlog::set_level(spdlog::level::warn); }
  ~QuietLogs() { spdlog::set_level(saved); }
};

// What destroying a router under load looked like from outside.
struct Shutdown {
  double stop_s = 0;          // how long ~RouterServer took
  int long_completed = 0;     // long requests answered in full (they were cut: 0)
  int churn_failed_early = 0; // short requests that failed before shutdown began
  int decode_cancels = 0;     // /internal/cancel calls the decode node got
  int cancels_after = 0;      // ... and some time after ~RouterServer returned
  int polls = 0, polls_after = 0;  // health polls of both nodes, likewise
  bool streams_ended = false; // the decode node saw every stream closed
};

// Long requests (kLongTokens: 20 s each), all in flight when the router
// goes: streamed, non-streamed (the client waits for the whole body), and n = 2 (a thread
// per choice inside the request thread).
constexpr int kStreamed = 16, kWhole = 4, kTwoChoices = 4;
constexpr int kLongCalls = kStreamed + kWhole + 2 * kTwoChoices;  // node calls they make
// Short requests (2 tokens) back to back, so request threads keep finishing and being
// reaped, and new ones keep arriving while the router shuts down.
constexpr int kChurnClients = 2;

Shutdown shut_down_under_load(const FakeNode& prefill, const FakeNode& decode) {
  auto router = std::make_unique<RouterServer>(router_config(prefill, decode));
  const int port = router->port();

  // Catch2 assertions are not thread-safe: the clients record, the test thread checks.
  std::atomic<int> streams_receiving{0};  // streamed clients that got 3 chunks
  std::atomic<int> long_completed{0}, churn_completed{0}, churn_failed_early{0};
  std::atomic<bool> shutting_down{false};

  std::vector<std::thread> clients;
  for (int i = 0; i < kStreamed + kTwoChoices; ++i) {
    const int n = i < kStreamed ? 1 : 2;
    clients.emplace_back([&, n] {
      int chunks = 0;
      try {
        http_stream(completion_request(port, completion_body(kLongTokens, /*stream=*/true, n)),
                    [&](std::string_view data) {
                      if (data == "[DONE]") ++long_completed;
                      if (++chunks == 3) ++streams_receiving;
                      return true;
                    });
      } catch (const std::exception&) {
        // the router went away mid-stream, as intended
      }
    });
  }
  for (int i = 0; i < kWhole; ++i) {
    clients.emplace_back([&] {
      try {
        if (http_request(completion_request(port, completion_body(kLongTokens, /*stream=*/false))).status == 200) {
          ++long_completed;
        }
      } catch (const std::exception&) {
      }
    });
  }
  for (int i = 0; i < kChurnClients; ++i) {
    clients.emplace_back([&] {
      for (;;) {
        try {
          if (http_request(completion_request(port, completion_body(2, /*stream=*/false))).status != 200) break;
          ++churn_completed;
        } catch (const std::exception&) {
          break;
        }
      }
      if (!shutting_down) ++churn_failed_early;
    });
  }

  // CHECK, not REQUIRE: the router and the clients are stopped below either way.
  CHECK(eventually(
      [&] {
        return streams_receiving >= kStreamed + kTwoChoices && decode.long_streams_running >= kLongCalls &&
               churn_completed >= 10;
      },
      30));

  Shutdown s;
  shutting_down = true;
  const auto t0 = Clock::now();
  router.reset();
  s.stop_s = seconds_since(t0);
  // The router's cancels and health polls wait for their answers (or time out): once every
  // router thread has been joined, no more come.
  s.decode_cancels = decode.cancels;
  s.polls = decode.health_polls + prefill.health_polls;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  s.cancels_after = decode.cancels;
  s.polls_after = decode.health_polls + prefill.health_polls;
  for (std::thread& t : clients) t.join();
  s.long_completed = long_completed;
  s.churn_failed_early = churn_failed_early;
  s.streams_ended = eventually([&] { return decode.streams_open == 0; }, 5);
  return s;
}

}  // namespace

TEST_CASE("destroying the router with requests in flight cancels them on their nodes and joins every request thread",
          "[server][router]") {
  QuietLogs quiet;
  FakeNode prefill("prefill"), decode("decode");
  const Shutdown s = shut_down_under_load(prefill, decode);
  INFO("router stopped in " << s.stop_s << " s; the decode node got " << s.decode_cancels << " cancels");
  // Cancelled, the long requests end at once; left to run they would take 20 s. The bound
  // only has to separate the two (ASan, 2 cores).
  CHECK(s.stop_s < 10);
  CHECK(s.long_completed == 0);
  CHECK(s.churn_failed_early == 0);
  CHECK(s.decode_cancels >= kLongCalls);  // every call in flight was cancelled on its decode node
  CHECK(s.cancels_after == s.decode_cancels);
  CHECK(s.polls_after == s.polls);  // the health thread is gone too
  CHECK(s.streams_ended);           // the router closed its node connections
}

TEST_CASE("a decode node that never answers cancels does not hold up the router's shutdown", "[server][router]") {
  QuietLogs quiet;
  FakeNode prefill("prefill"), decode("decode", FakeNodeOptions{.answer_cancels = false});
  const Shutdown s = shut_down_under_load(prefill, decode);
  // Each cancel waits out its 2 s timeout: on the request's own thread, all at once. On the
  // HTTP io threads (4) the 28 calls' cancels would take 14 s one after another.
  INFO("router stopped in " << s.stop_s << " s; the decode node got " << s.decode_cancels << " cancels");
  CHECK(s.stop_s < 8);
  CHECK(s.long_completed == 0);
  CHECK(s.churn_failed_early == 0);
  CHECK(s.decode_cancels >= kLongCalls);
  CHECK(s.polls_after == s.polls);
  CHECK(s.streams_ended);
}

TEST_CASE("a decode node not ready at the router's first poll is routed to once ready, whatever the health interval",
          "[server][router]") {
  FakeNode prefill("prefill"), decode("decode");
  decode.ready = false;
  RouterConfig config = router_config(prefill, decode);
  config.health_interval_s = 1000;  // the next regular poll would be in 17 minutes
  RouterServer router(config);
  auto router_health = [&] {
    HttpClientRequest r;
    r.host = "127.0.0.1";
    r.port = router.port();
    r.target = "/health";
    r.timeout_s = 10;
    return http_request(r).status;
  };
  CHECK(router_health() == 503);  // no decode node ready
  decode.ready = true;
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = router_health();
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(status == 200);
  CHECK(http_request(completion_request(router.port(), completion_body(2, /*stream=*/false))).status == 200);
}

TEST_CASE("a router whose port is taken throws hack::Error instead of aborting", "[server][router]") {
  QuietLogs quiet;
  FakeNode prefill("prefill"), decode("decode");
  RouterConfig c = router_config(prefill, decode);
  c.port = decode.port();
  REQUIRE_THROWS_AS(std::make_unique<RouterServer>(c), hack::Error);
}

namespace {

// Choice 0 of a completion as the client sees it: the whole response, or its chunks joined.
struct ChoiceSeen {
  std::string text;
  std::vector<std::string> tokens;  // logprobs.tokens
  std::vector<size_t> offsets;      // logprobs.text_offset
  std::string finish_reason;
};

void add_logprobs(const nlohmann::json& logprobs, ChoiceSeen& seen) {
  if (logprobs.is_null()) return;
  for (const auto& t : logprobs.at("tokens")) seen.tokens.push_back(t.get<std::string>());
  for (const auto& o : logprobs.at("text_offset")) seen.offsets.push_back(o.get<size_t>());
}

ChoiceSeen whole_choice(int port, nlohmann::json body) {
  body["stream"] = false;
  const HttpResponse r = http_request(completion_request(port, body.dump()));
  INFO(r.body);
  REQUIRE(r.status == 200);
  const nlohmann::json choice = nlohmann::json::parse(r.body).at("choices").at(0);
  ChoiceSeen seen;
  seen.text = choice.at("text").get<std::string>();
  add_logprobs(choice.at("logprobs"), seen);
  seen.finish_reason = choice.at("finish_reason").get<std::string>();
  return seen;
}

ChoiceSeen streamed_choice(int port, nlohmann::json body) {
  body["stream"] = true;
  ChoiceSeen seen;
  bool done = false;
  const HttpResponse r = http_stream(completion_request(port, body.dump()), [&](std::string_view data) {
    if (data == "[DONE]") {
      done = true;
      return true;
    }
    const nlohmann::json choice = nlohmann::json::parse(data).at("choices").at(0);
    seen.text += choice.at("text").get<std::string>();
    add_logprobs(choice.at("logprobs"), seen);
    if (!choice.at("finish_reason").is_null()) seen.finish_reason = choice["finish_reason"].get<std::string>();
    return true;
  });
  REQUIRE(r.status == 200);
  REQUIRE(done);
  return seen;
}

}  // namespace

TEST_CASE("streamed and whole completions through the router carry the same text, logprobs and offsets",
          "[server][router]") {
  QuietLogs quiet;
  const FakeNodeOptions fast{.token_interval = std::chrono::milliseconds(1)};
  FakeNode prefill("prefill", fast), decode("decode", fast);
  RouterServer router(router_config(prefill, decode));
  constexpr int kTokens = 24;
  std::vector<int> ids;
  for (int i = 0; i < kTokens; ++i) ids.push_back(fake_token(i));
  // The reference: the whole id list decoded at once (the router decodes token by token).
  const std::string generated = hack::Tokenizer::load(model_dir()).decode(ids, /*skip_special_tokens=*/true);
  const std::string prompt = "In the beginning God created";
  INFO("generated: '" << generated << "'");
  REQUIRE(generated.size() > 8);
  nlohmann::json body = {{"model", "hack-tiny"}, {"prompt", prompt}, {"max_tokens", kTokens}};

  SECTION("plain") {
    const ChoiceSeen whole = whole_choice(router.port(), body), streamed = streamed_choice(router.port(), body);
    CHECK(whole.text == generated);
    CHECK(streamed.text == generated);
    CHECK(whole.finish_reason == "length");
    CHECK(streamed.finish_reason == "length");
  }
  SECTION("echo") {
    body["echo"] = true;
    const ChoiceSeen whole = whole_choice(router.port(), body), streamed = streamed_choice(router.port(), body);
    CHECK(whole.text == prompt + generated);
    CHECK(streamed.text == whole.text);
  }
  SECTION("logprobs") {
    body["logprobs"] = 1;
    const ChoiceSeen whole = whole_choice(router.port(), body), streamed = streamed_choice(router.port(), body);
    CHECK(whole.text == generated);
    CHECK(streamed.text == generated);
    REQUIRE(whole.tokens.size() == kTokens);
    CHECK(whole.offsets.front() == 0);
    CHECK(whole.offsets.back() + whole.tokens.back().size() == generated.size());  // ASCII: code points = bytes
    CHECK(streamed.tokens == whole.tokens);
    CHECK(streamed.offsets == whole.offsets);
  }
  SECTION("echo with logprobs: the prompt's logprobs first, its first token null") {
    body["echo"] = true;
    body["logprobs"] = 1;
    const HttpResponse r = http_request(completion_request(router.port(), body.dump()));
    REQUIRE(r.status == 200);
    const nlohmann::json lp = nlohmann::json::parse(r.body)["choices"][0]["logprobs"];
    const size_t n_prompt = hack::Tokenizer::load(model_dir()).encode(prompt, true).size();
    REQUIRE(lp["tokens"].size() == n_prompt + kTokens);
    CHECK(lp["token_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][0].is_null());
    CHECK(lp["token_logprobs"][1] == -0.125);
    CHECK(lp["token_logprobs"][n_prompt - 1] == -static_cast<double>(n_prompt - 1) / 8);
    CHECK(lp["text_offset"][0] == 0);
    const ChoiceSeen whole = whole_choice(router.port(), body), streamed = streamed_choice(router.port(), body);
    CHECK(whole.text == prompt + generated);
    CHECK(streamed.text == whole.text);
    CHECK(streamed.tokens == whole.tokens);
    CHECK(streamed.offsets == whole.offsets);
    // Generated offsets continue after the prompt tokens' text (BOS included, as vLLM counts).
    CHECK(whole.offsets[n_prompt] == whole.offsets[n_prompt - 1] + whole.tokens[n_prompt - 1].size());
  }
  SECTION("a stop string") {
    const std::string stop = generated.substr(generated.size() / 2, 3);
    INFO("stop: '" << stop << "'");
    body["stop"] = {stop};
    const ChoiceSeen whole = whole_choice(router.port(), body), streamed = streamed_choice(router.port(), body);
    const std::string expected = generated.substr(0, generated.find(stop));
    CHECK(whole.text == expected);
    CHECK(streamed.text == expected);
    CHECK(whole.finish_reason == "stop");
    CHECK(streamed.finish_reason == "stop");
  }
}

namespace {

// A chat request's choice 0 as the client sees it: content, and tool calls assembled from
// their deltas as the openai client does (id, type and name from a call's first delta).
struct ChatSeen {
  std::string content;
  nlohmann::json tool_calls = nlohmann::json::array();
  std::string finish_reason;
};

HttpClientRequest chat_request(int port, const nlohmann::json& body) {
  HttpClientRequest r = completion_request(port, body.dump());
  r.target = "/v1/chat/completions";
  return r;
}

}  // namespace

TEST_CASE("tool calls through the router: streamed deltas assemble to the whole response's tool_calls",
          "[server][router]") {
  QuietLogs quiet;
  const std::string text =
      "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  FakeNodeOptions options{.token_interval = std::chrono::milliseconds(1)};
  const hack::Tokenizer tokenizer = hack::Tokenizer::load(model_dir());
  options.script = tokenizer.encode(text, /*add_special_tokens=*/false);
  REQUIRE(tokenizer.decode(options.script, true) == text);
  FakeNode prefill("prefill", options), decode("decode", options);
  RouterServer router(router_config(prefill, decode));
  nlohmann::json body = {
      {"model", "hack-tiny"},
      {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
      {"tools", nlohmann::json::parse(R"([{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])")},
      {"max_tokens", 200}};

  SECTION("whole and streamed agree") {
    const HttpResponse r = http_request(chat_request(router.port(), body));
    INFO(r.body);
    REQUIRE(r.status == 200);
    const nlohmann::json choice = nlohmann::json::parse(r.body).at("choices").at(0);
    CHECK(choice["finish_reason"] == "tool_calls");
    CHECK(choice["message"]["content"] == "Sure.");
    const nlohmann::json& calls = choice["message"]["tool_calls"];
    REQUIRE(calls.size() == 2);
    CHECK(calls[0]["type"] == "function");
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(nlohmann::json::parse(calls[0]["function"]["arguments"].get<std::string>()) ==
          nlohmann::json{{"city", "Paris"}});
    CHECK(calls[1]["function"]["name"] == "get_time");

    body["stream"] = true;
    ChatSeen seen;
    bool well_formed = true;
    const HttpResponse s = http_stream(chat_request(router.port(), body), [&](std::string_view data) {
      if (data == "[DONE]") return true;
      const nlohmann::json c = nlohmann::json::parse(data).at("choices").at(0);
      const nlohmann::json& delta = c.at("delta");
      if (delta.contains("content") && delta["content"].is_string()) seen.content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls")) {
        if (delta.contains("content")) well_formed = false;  // a tool-call delta carries no text
        for (const auto& d : delta["tool_calls"]) {
          const size_t index = d.at("index").get<size_t>();
          if (index == seen.tool_calls.size()) {
            if (!d.contains("id") || d.value("type", "") != "function" || !d["function"].contains("name")) well_formed = false;
            seen.tool_calls.push_back(d);
            seen.tool_calls.back().erase("index");
          } else if (index + 1 == seen.tool_calls.size()) {
            if (d.contains("id") || d["function"].contains("name")) well_formed = false;
            auto& args = seen.tool_calls.back()["function"]["arguments"];
            args = args.get<std::string>() + d["function"]["arguments"].get<std::string>();
          } else {
            well_formed = false;
          }
        }
      }
      if (!c.at("finish_reason").is_null()) seen.finish_reason = c["finish_reason"].get<std::string>();
      return true;
    });
    REQUIRE(s.status == 200);
    CHECK(well_formed);
    CHECK(seen.content == "Sure.");
    CHECK(seen.finish_reason == "tool_calls");
    // Ids are random per response; everything else is the same.
    auto without_ids = [](nlohmann::json list) {
      for (auto& c : list) {
        CHECK(c.at("id").get<std::string>().starts_with("call_"));
        c.erase("id");
      }
      return list;
    };
    CHECK(without_ids(seen.tool_calls) == without_ids(calls));
  }
  SECTION("tool_choice none: the text is content") {
    body["tool_choice"] = "none";
    const HttpResponse r = http_request(chat_request(router.port(), body));
    REQUIRE(r.status == 200);
    const nlohmann::json choice = nlohmann::json::parse(r.body).at("choices").at(0);
    CHECK(choice["message"]["content"] == text);
    CHECK_FALSE(choice["message"].contains("tool_calls"));
    CHECK(choice["finish_reason"] == "stop");
  }
  SECTION("no tools: the text is content") {
    body.erase("tools");
    const HttpResponse r = http_request(chat_request(router.port(), body));
    REQUIRE(r.status == 200);
    CHECK(nlohmann::json::parse(r.body)["choices"][0]["message"]["content"] == text);
  }
}

namespace {

HttpClientRequest responses_request(int port, const nlohmann::json& body) {
  HttpClientRequest r = completion_request(port, body.dump());
  r.target = "/v1/responses";
  return r;
}

// A Response without what is random per response: its id, its items' ids and call ids.
nlohmann::json without_ids(nlohmann::json response) {
  response.erase("id");
  response.erase("created_at");
  for (auto& item : response["output"]) {
    item.erase("id");
    item.erase("call_id");
  }
  return response;
}

}  // namespace

TEST_CASE("/v1/responses through the router: the whole Response is the stream's last event, refusals keep it serving",
          "[server][router]") {
  QuietLogs quiet;
  const std::string text =
      "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  FakeNodeOptions options{.token_interval = std::chrono::milliseconds(1)};
  const hack::Tokenizer tokenizer = hack::Tokenizer::load(model_dir());
  options.script = tokenizer.encode(text, /*add_special_tokens=*/false);
  REQUIRE(tokenizer.decode(options.script, true) == text);
  FakeNode prefill("prefill", options), decode("decode", options);
  RouterServer router(router_config(prefill, decode));
  nlohmann::json body = {
      {"model", "hack-tiny"},
      {"instructions", "Call tools."},
      {"input", "Weather in Paris?"},
      {"tools", nlohmann::json::parse(R"([{"type": "function", "name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])")},
      {"max_output_tokens", 200}};

  const HttpResponse r = http_request(responses_request(router.port(), body));
  INFO(r.body);
  REQUIRE(r.status == 200);
  const nlohmann::json whole = nlohmann::json::parse(r.body);
  CHECK(std::string(whole["id"]).starts_with("resp_"));
  CHECK(whole["object"] == "response");
  CHECK(whole["status"] == "completed");
  CHECK(whole["model"] == "hack-tiny");
  CHECK(whole["instructions"] == "Call tools.");
  CHECK(whole["max_output_tokens"] == 200);
  const nlohmann::json& out = whole["output"];
  REQUIRE(out.size() == 3);
  CHECK(out[0]["type"] == "message");
  CHECK(out[0]["content"][0]["text"] == "Sure.");
  CHECK(out[1]["type"] == "function_call");
  CHECK(out[1]["name"] == "get_weather");
  CHECK(nlohmann::json::parse(out[1]["arguments"].get<std::string>()) == nlohmann::json{{"city", "Paris"}});
  CHECK(std::string(out[1]["call_id"]).starts_with("call_"));
  CHECK(out[2]["name"] == "get_time");
  CHECK(whole["usage"]["output_tokens"] == options.script.size());
  CHECK(whole["usage"]["input_tokens"].get<int>() > 0);
  CHECK(whole["usage"]["total_tokens"] ==
        whole["usage"]["input_tokens"].get<int>() + whole["usage"]["output_tokens"].get<int>());

  body["stream"] = true;
  std::vector<nlohmann::json> events;
  const HttpResponse s = http_stream(responses_request(router.port(), body), [&](std::string_view data) {
    events.push_back(nlohmann::json::parse(data));
    return true;
  });
  REQUIRE(s.status == 200);
  REQUIRE(events.size() > 4);
  for (size_t i = 0; i < events.size(); ++i) CHECK(events[i]["sequence_number"] == i);
  CHECK(events.front()["type"] == "response.created");
  CHECK(events.back()["type"] == "response.completed");
  CHECK(without_ids(events.back()["response"]) == without_ids(whole));

  // Refused with a 400 in the standard error shape; the router keeps serving.
  HttpClientRequest get = responses_request(router.port(), {});
  get.method = "GET";
  get.body.clear();
  get.target = "/v1/responses/resp_123";
  const HttpResponse stored = http_request(get);
  CHECK(stored.status == 400);
  CHECK(nlohmann::json::parse(stored.body)["error"]["code"] == "unsupported_parameter");
  const HttpResponse previous = http_request(
      responses_request(router.port(), {{"input", "x"}, {"previous_response_id", whole["id"]}}));
  CHECK(previous.status == 400);
  CHECK(nlohmann::json::parse(previous.body)["error"]["param"] == "previous_response_id");
  // The chat path's own 400s name the Responses field (messages → input).
  const HttpResponse too_long = http_request(
      responses_request(router.port(), {{"input", "x"}, {"max_output_tokens", 100000000}}));
  CHECK(too_long.status == 400);
  const nlohmann::json err = nlohmann::json::parse(too_long.body)["error"];
  CHECK(err["code"] == "context_length_exceeded");
  CHECK(err["param"] == "input");
  body["stream"] = false;
  CHECK(http_request(responses_request(router.port(), body)).status == 200);
}
