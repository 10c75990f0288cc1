#include "src/router/request_state.h"  // first: Asio's coroutine support (http/coro.h)
#include "hack/router/router_server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "hack/core/error.h"
#include "hack/model/gguf_model.h"
#include "hack/router/api_keys.h"
#include "hack/http/http_server.h"
#include "hack/node/metrics.h"
#include "hack/node/node_protocol.h"
#include "hack/router/openai_protocol.h"
#include "hack/router/responses_api.h"
#include "src/router/admission.h"
#include "src/router/answer.h"
#include "src/router/choice_runner.h"
#include "src/router/node_directory.h"
#include "src/router/served_model.h"

namespace hack::server {

void add_router_flags(FlagSet& flags, RouterConfig& c) {
  flags.add_string("host", &c.host, "address to bind the public API to");
  flags.add_int("port", &c.port, "port of the public API (0 = any free port)");
  flags.add_list("prefill", &c.prefill, "prefill node host:port (repeat the flag or give a comma list)");
  flags.add_list("decode", &c.decode, "decode node host:port (repeat the flag or give a comma list)");
  flags.add_string("model", &c.model, "model directory: tokenizer.json, chat template, config.json; or the GGUF file "
                   "the nodes load (its converted directory, model/gguf_model.h)");
  flags.add_string("served-model-name", &c.served_name, "model name clients use; default: the directory name");
  flags.add_string("chat-template", &c.chat_template, "Jinja file overriding the model's chat template");
  flags.add_string("tool-parser", &c.tool_parser,
                   "syntax of the model's tool calls: hermes|llama3_json|mistral|none|auto (auto: judged from the "
                   "chat template)");
  flags.add_int("max-model-len", &c.max_model_len, "longest prompt + completion; 0 = max_position_embeddings");
  flags.add_list("api-key", &c.api_keys, "accepted API key (Authorization: Bearer); repeatable; none = no auth");
  flags.add_string("api-key-file", &c.api_key_file, "file with one accepted API key per line");
  flags.add_secret("secret", &c.secret, "shared secret of the nodes' internal endpoints");
  flags.add_float("health-interval", &c.health_interval_s, "seconds between health polls of every node");
  flags.add_float("request-timeout", &c.request_timeout_s, "seconds a node connection may stay silent");
  flags.add_int("max-migrations", &c.max_migrations,
                "times a stream that fails after tokens is continued on another node pair before it fails");
  flags.add_float("stall-timeout-s", &c.stall_timeout_s,
                  "seconds without a token after which a stream whose node is unreachable or busy is migrated "
                  "(0 = never)");
  flags.add_int64("max-queue-tokens", &c.max_queue_tokens,
                  "answer 429 (Retry-After) when every prefill node has more than this many prompt tokens queued or "
                  "in prefill: bounds the time to first token of what is admitted (0 = never)");
  flags.add_int64("max-decode-queue-tokens", &c.max_decode_queue_tokens,
                  "answer 429 when every decode node has more than this many tokens to prefill or generate (0 = never)");
  flags.add_int64("prefix-affinity-tokens", &c.prefix_affinity_tokens,
                  "send a prompt to the prefill node that last got its prefix when that node's queue is within "
                  "this many tokens of the shortest (its prefix cache likely holds it); 0 = shortest queue only");
  flags.add_int("prefix-block-tokens", &c.prefix_block_tokens, "block size of the nodes' prefix caches (their --hack-block)");
  flags.add_int("http-threads", &c.http_threads, "HTTP I/O threads (client connections)");
  flags.add_int("io-threads", &c.io_threads,
                "threads that run every request's node calls, relay and stall timers (coroutines; no thread per "
                "request)");
  flags.add_int64("max-body-kb", &c.max_body_kb, "largest request body accepted, KiB");
  flags.add_float("header-timeout", &c.header_timeout_s, "seconds a client may take to send request headers");
  flags.add_bool("json-logs", &c.json_logs, "log one JSON object per line");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
}

namespace {
using namespace router;
}  // namespace

// The request lifecycle, unit by unit: HTTP dispatch and the tokenize endpoints (here),
// admission (admission.h), a request's choices as coroutines on the I/O threads (here), one
// choice's attempts with retry and migration (choice_runner.h), token relay and stop handling
// (token_relay.h), usage, metrics and the answer (answer.h); the nodes' health and the pick
// of a pair (node_directory.h); the model's tokenizer and template (served_model.h).
struct RouterServer::Impl {
  RouterConfig config;
  ServedModel model;
  ApiKeys keys;
  Metrics metrics;
  NodeDirectory nodes;
  std::atomic<int> running{0}, waiting{0};

  // Every client request runs as a coroutine on a strand of `io` (config.io_threads threads):
  // node calls, token relay and stall timers wait without holding a thread. Open requests
  // are listed here so that shutdown can cancel them, and waits until the last has returned
  // before any other member goes.
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> io_work;
  std::vector<std::thread> io_threads;
  HttpConnectionPool node_connections{io.get_executor()};  // keep-alive connections to the nodes
  Admission admission{config, model, nodes};
  ChoiceRunner runner{config, model, nodes, metrics, node_connections};
  std::mutex requests_mutex;
  std::condition_variable requests_cv;  // a request ended
  std::map<uint64_t, std::shared_ptr<RequestContext>> requests;  // open, by arrival number
  uint64_t next_request = 0;
  bool stopping = false;  // set once shutdown has begun: no new request starts

  std::unique_ptr<HttpServer> http;

  explicit Impl(const RouterConfig& c)
      : config(c), model(config), keys(ApiKeys::from_flags(config.api_keys, config.api_key_file)), nodes(config, metrics) {
    HttpServerOptions ho;
    ho.host = config.host;
    ho.port = config.port;
    ho.threads = config.http_threads;
    HACK_CHECK(config.max_body_kb > 0, "--max-body-kb must be positive");
    ho.max_body_bytes = static_cast<size_t>(config.max_body_kb) << 10;
    ho.header_timeout_s = config.header_timeout_s;
    HACK_CHECK(config.io_threads > 0, "--io-threads must be positive");
    io_work.emplace(io.get_executor());
    http = std::make_unique<HttpServer>(ho, [this](HttpRequest req, std::shared_ptr<Responder> res) {
      handle(std::move(req), std::move(res));
    });
    // After the listener (a constructor that throws must leave no thread joinable); requests
    // that came in between wait in `io`'s queue.
    for (int i = 0; i < config.io_threads; ++i) io_threads.emplace_back([this] { run_io(); });
    nodes.start_polling();
    spdlog::info("hack-router: model {} (max length {}), {} prefill + {} decode nodes, {} I/O threads, API {}:{}{}",
                 model.name, model.max_model_len, config.prefill.size(), config.decode.size(), config.io_threads,
                 config.host, http->port(), keys.enabled() ? ", API keys required" : "");
  }

  ~Impl() {
    http.reset();  // no new requests; open ones see their clients close and cancel
    stop_requests();
    node_connections.clear();
    io_work.reset();
    for (std::thread& t : io_threads) t.join();
  }

  // ---- HTTP -----------------------------------------------------------------------------

  void handle(HttpRequest req, std::shared_ptr<Responder> res) {
    const std::string& path = req.path;
    if (path == "/health" || path == "/health/live") {
      const size_t p = nodes.prefill_pool().healthy_count(), d = nodes.decode_pool().healthy_count();
      const bool ready = p > 0 && d > 0;
      const std::string body = fmt::format(R"({{"status":"{}","prefill_nodes_healthy":{},"decode_nodes_healthy":{}}})",
                                           ready ? "ok" : "unavailable", p, d);
      res->send(ready || path == "/health/live" ? 200 : 503, "application/json", body);
      return;
    }
    if (path == "/metrics") {
      metrics.set_num_requests_running(running.load());
      metrics.set_num_requests_waiting(waiting.load());
      res->send(200, "text/plain; version=0.0.4", metrics.serialize());
      return;
    }
    const bool known = path == "/v1/models" || path.starts_with("/v1/models/") || path == "/v1/completions" ||
                       path == "/v1/chat/completions" || path == "/tokenize" || path == "/detokenize" ||
                       path == "/v1/responses" || path.starts_with("/v1/responses/");
    if (!known) {
      send_error(*res, not_found_error(path));
      return;
    }
    if (!keys.authorized(req.header("authorization"))) {
      metrics.count_request_error("unauthorized");
      send_error(*res, unauthorized_error());
      return;
    }
    if (path == "/v1/responses" || path.starts_with("/v1/responses/")) {  // runs as a chat request (responses_api.h)
      auto route = route_responses(req, res);
      if (auto* e = std::get_if<ProtocolError>(&route)) {
        metrics.count_request_error("invalid_request");
        return send_error(*res, *e);
      }
      req.body = std::move(std::get<ResponsesRoute>(route).chat_body);
      return start_request(std::move(req), std::get<ResponsesRoute>(route).responder, Endpoint::kChatCompletions);
    }
    if (path == "/v1/models") {
      if (req.method != "GET") return send_error(*res, method_error(req.method, path));
      res->send(200, "application/json", models_response(std::span<const std::string>(&model.name, 1), model.created_s,
                                                         model.max_model_len));
      return;
    }
    if (path.starts_with("/v1/models/")) {
      if (req.method != "GET") return send_error(*res, method_error(req.method, path));
      const std::string id = path.substr(std::string_view("/v1/models/").size());
      if (id != model.name) return send_error(*res, model_not_found_error(id));
      res->send(200, "application/json", model_response(model.name, model.created_s, model.max_model_len));
      return;
    }
    if (req.method != "POST") return send_error(*res, method_error(req.method, path));
    if (path == "/tokenize" || path == "/detokenize") {
      try {
        res->send(200, "application/json", path == "/tokenize" ? tokenize(req.body) : detokenize(req.body));
      } catch (const ProtocolError& e) {
        send_error(*res, e);
      }
      return;
    }
    const Endpoint endpoint = path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions;
    start_request(std::move(req), std::move(res), endpoint);
  }

  // ---- /tokenize and /detokenize (vLLM's shapes) ---------------------------------------------

  static ProtocolError bad_request(std::string message, std::string param) {
    ProtocolError e;
    e.message = std::move(message);
    if (!param.empty()) e.param = std::move(param);
    return e;
  }

  // {"prompt": text, "add_special_tokens": true} or {"messages": [...], "add_generation_prompt":
  // true} → {"count", "max_model_len", "tokens"}: the ids a completion of it would be given.
  std::string tokenize(const std::string& body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad_request("the body must be a JSON object", "");
    if (j.contains("model") && !(j["model"].is_string() && j["model"] == model.name))
      throw model_not_found_error(j["model"].is_string() ? j["model"].get<std::string>() : j["model"].dump());
    std::vector<int> ids;
    if (j.contains("messages")) {
      nlohmann::json chat = {{"model", model.name}, {"messages", j["messages"]}};
      for (const char* key : {"add_generation_prompt", "tools", "chat_template_kwargs"})
        if (j.contains(key)) chat[key] = j[key];
      ParseResult parsed = parse_request(chat.dump(), Endpoint::kChatCompletions, model.limits);
      if (auto* e = std::get_if<ProtocolError>(&parsed)) throw *e;
      std::string text;
      auto tokens = model.prompt_tokens(std::get<CompletionRequest>(parsed), text);
      if (auto* e = std::get_if<ProtocolError>(&tokens)) throw *e;
      ids = std::get<std::vector<int>>(std::move(tokens));
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      bool special = true;
      if (j.contains("add_special_tokens")) {
        if (!j["add_special_tokens"].is_boolean()) throw bad_request("add_special_tokens must be a boolean", "add_special_tokens");
        special = j["add_special_tokens"].get<bool>();
      }
      ids = model.tokenizer.encode(j["prompt"].get<std::string>(), special);
    } else {
      throw bad_request("send \"prompt\" (a string) or \"messages\" (a chat)", "prompt");
    }
    return nlohmann::json{{"count", ids.size()}, {"max_model_len", model.max_model_len}, {"tokens", ids}}.dump();
  }

  // {"tokens": [ids]} → {"prompt": text}.
  std::string detokenize(const std::string& body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad_request("the body must be a JSON object", "");
    if (j.contains("model") && !(j["model"].is_string() && j["model"] == model.name))
      throw model_not_found_error(j["model"].is_string() ? j["model"].get<std::string>() : j["model"].dump());
    if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad_request("tokens must be a list of token ids", "tokens");
    std::vector<int> ids;
    for (const auto& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.limits.vocab_size)
        throw bad_request(fmt::format("tokens: {} is not a token id of this model (0..{})", t.dump(), model.limits.vocab_size - 1),
                          "tokens");
      ids.push_back(t.get<int>());
    }
    return nlohmann::json{{"prompt", model.tokenizer.decode(ids, /*skip_special_tokens=*/false)}}.dump();
  }

  // ---- request coroutines ----------------------------------------------------------------

  void run_io() {
    while (true) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {  // a request's coroutines catch their own; this is a bug
        spdlog::error("hack-router: io thread: {}", e.what());
      }
    }
  }

  // Runs the request as a coroutine on a strand of its own (it waits on its nodes for as
  // long as it generates, holding no thread while it waits).
  void start_request(HttpRequest req, std::shared_ptr<Responder> res, Endpoint endpoint) {
    auto ctx = std::make_shared<RequestContext>();
    uint64_t id;
    {
      std::lock_guard lock(requests_mutex);
      if (stopping) return send_error(*res, unavailable_error("the router is shutting down"));
      id = next_request++;
      requests.emplace(id, ctx);
    }
    res->on_client_closed([ctx] { ctx->cancel(); });
    asio::co_spawn(
        asio::make_strand(io),
        [this, id, req = std::move(req), res = std::move(res), ctx, endpoint]() -> Task<void> {
          co_await serve_request(req, *res, *ctx, endpoint);
        },
        [this, id](std::exception_ptr) { end_request(id); });
  }

  void end_request(uint64_t id) {
    {
      std::lock_guard lock(requests_mutex);
      requests.erase(id);
    }
    requests_cv.notify_all();
  }

  Task<void> serve_request(const HttpRequest& req, Responder& res, RequestContext& ctx, Endpoint endpoint) {
    try {
      co_await complete(req, res, ctx, endpoint);
    } catch (const std::exception& e) {
      spdlog::error("request failed: {}", e.what());
      send_error(res, internal_error(e.what()));
    }
  }

  // Cancels every open request on its nodes (their calls close their connections and end at
  // once) and waits for every request coroutine to return: after this no request touches
  // this object.
  void stop_requests() {
    std::unique_lock lock(requests_mutex);
    stopping = true;
    for (auto& [id, ctx] : requests) ctx->cancel();
    requests_cv.wait(lock, [&] { return requests.empty(); });
  }

  static ProtocolError method_error(const std::string& method, const std::string& path) {
    ProtocolError e;
    e.status = 405;
    e.message = fmt::format("method {} is not allowed on {}", method, path);
    return e;
  }

  // ---- one request ----------------------------------------------------------------------

  Task<void> complete(const HttpRequest& http_req, Responder& res, RequestContext& ctx, Endpoint endpoint) {
    auto admitted = admission.admit(http_req.body, endpoint, Clock::now());
    if (auto* no = std::get_if<Rejection>(&admitted)) {
      metrics.count_request_error(no->metric);
      send_error(res, no->error);
      co_return;
    }
    const std::vector<AdmittedRequest>& parts = std::get<std::vector<AdmittedRequest>>(admitted);
    const AdmittedRequest& req = parts.front();
    const CompletionRequest& r = req.request;
    size_t prompt_tokens = 0;
    for (const AdmittedRequest& p : parts) prompt_tokens += p.prompt.size();
    spdlog::info("request {}: {} prompt(s), {} prompt tokens, max_tokens {}, n {}, stream {}", req.meta.id, parts.size(),
                 prompt_tokens, req.params.max_tokens, r.n, r.stream);
    metrics.add_prompt_tokens(prompt_tokens * static_cast<size_t>(r.n));
    if (r.stream) res.start_sse();
    std::vector<ChoiceOutcome> outcomes = co_await run_choices(ctx, parts, r.stream ? &res : nullptr);
    metrics.observe_e2e_request_latency_s(seconds_since(req.t_arrival));
    answer_request(res, ctx, req, static_cast<int>(prompt_tokens), std::move(outcomes), metrics);
  }

  // Runs every part's choices, as coroutines side by side on the request's strand when
  // there are several. Choice i of part p is reported as index p·n + i (OpenAI's order) and
  // sampled as choice i of a single request, so a list of prompts answers as the same
  // prompts sent one by one.
  Task<std::vector<ChoiceOutcome>> run_choices(RequestContext& ctx, const std::vector<AdmittedRequest>& parts,
                                               Responder* stream) {
    RequestGauge gauge(waiting, running);
    const int n = parts.front().request.n;
    const size_t total = parts.size() * static_cast<size_t>(n);
    std::vector<ChoiceOutcome> outcomes(total);
    if (total == 1) {
      outcomes[0] = co_await runner.run_choice(ctx, parts[0], 0, 0, gauge, stream);
      co_return outcomes;
    }
    const auto ex = co_await asio::this_coro::executor;
    CoEvent all_done(ex);
    size_t left = total;
    for (size_t p = 0; p < parts.size(); ++p) {
      for (int i = 0; i < n; ++i) {
        const int index = static_cast<int>(p) * n + i;
        asio::co_spawn(
            ex,
            [&, p, i, index]() -> Task<void> {
              outcomes[static_cast<size_t>(index)] = co_await runner.run_choice(ctx, parts[p], i, index, gauge, stream);
            },
            [&, index](std::exception_ptr e) {
              if (e) {  // run_choice reports failures in its outcome; this is a bug, but the request must end
                try {
                  std::rethrow_exception(e);
                } catch (const std::exception& what) {
                  outcomes[static_cast<size_t>(index)].error = internal_error(what.what());
                }
              }
              if (--left == 0) all_done.set();
            });
      }
    }
    co_await all_done.wait();
    co_return outcomes;
  }

};

namespace {

// --model FILE.gguf: the directory the nodes convert it into, served under the file's name.
RouterConfig with_model_resolved(RouterConfig c) {
  resolve_model_flags(c.model, c.served_name);
  return c;
}

}  // namespace

RouterServer::RouterServer(const RouterConfig& config) : impl_(std::make_unique<Impl>(with_model_resolved(config))) {}
RouterServer::~RouterServer() = default;
int RouterServer::port() const { return impl_->http->port(); }

}  // namespace hack::server
