#include "hack/router/async_node_call.h"  // first: Asio's coroutine support (http/coro.h)
#include "hack/router/router_server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/model/config.h"
#include "hack/model/generation_config.h"
#include "hack/model/gguf_model.h"
#include "hack/router/api_keys.h"
#include "hack/http/http_server.h"
#include "hack/node/metrics.h"
#include "hack/node/node_protocol.h"
#include "hack/router/openai_protocol.h"
#include "hack/router/responses_api.h"
#include "hack/router/routing.h"
#include "hack/router/stop_strings.h"
#include "hack/router/tool_calls.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

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
                  "answer 429 when every node's queue is past this many tokens (0 = never)");
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

using Clock = std::chrono::steady_clock;

// Seconds between health polls while a node answers that it is not ready yet.
constexpr double kStartingRepollS = 0.25;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A node-side request id: random, so ids of several routers do not collide.
uint64_t random_id() {
  std::random_device rd;
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd()) >> 1;  // fits JSON readers that take ids as signed
}

std::vector<NodeAddress> parse_nodes(const std::vector<std::string>& specs, const char* flag) {
  std::vector<NodeAddress> nodes;
  for (const std::string& spec : specs) {
    for (const std::string& one : split_list(spec)) nodes.push_back(parse_node_address(one, fmt::format("--{}", flag)));
  }
  HACK_CHECK(!nodes.empty(), "give at least one --{} node (host:port)", flag);
  return nodes;
}

void send_error(Responder& res, const ProtocolError& e) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.status == 429) headers.emplace_back("Retry-After", "1");
  res.send(e.status, "application/json", error_body(e), std::move(headers));
}

// The calls of one client request (n choices, retries), so a closed connection or a
// shutdown can cancel them all.
class RequestContext {
 public:
  void add(AsyncDisaggregatedCall* call) {
    std::lock_guard lock(mutex_);
    if (cancelled_) call->cancel();
    calls_.insert(call);
  }
  void remove(AsyncDisaggregatedCall* call) {
    std::lock_guard lock(mutex_);
    calls_.erase(call);
  }
  // Once: calls added later are cancelled by add(), so a second cancel would only repeat
  // the nodes' cancel round trips.
  void cancel() {
    std::lock_guard lock(mutex_);
    if (cancelled_) return;
    cancelled_ = true;
    for (AsyncDisaggregatedCall* c : calls_) c->cancel();
  }
  bool cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }

 private:
  mutable std::mutex mutex_;
  bool cancelled_ = false;
  std::set<AsyncDisaggregatedCall*> calls_;
};

// What one choice produced.
struct ChoiceOutcome {
  Choice choice;
  int completion_tokens = 0;
  std::optional<ProtocolError> error;
};

int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A request that passed validation and admission, as its choices run it.
struct AdmittedRequest {
  CompletionRequest request;
  std::vector<int> prompt;
  std::string prompt_text;  // echoed; completions' text offsets start after it
  SamplingParams params;    // choice 0's (choice_params)
  ResponseMeta meta;
  Clock::time_point t_arrival;
};

// Why a request was turned away before it reached a node: the answer, and the error
// metric it counts under.
struct Rejection {
  ProtocolError error;
  const char* metric;
};

// Choice i > 0 of a seeded request samples with seed + i: the choices differ, and replay.
SamplingParams choice_params(const SamplingParams& params, int index) {
  SamplingParams p = params;
  if (p.seed && index > 0) p.seed = *p.seed + static_cast<uint64_t>(index);
  return p;
}

// A request in the router's gauges: waiting from admission until the first token of any of
// its choices, running from then until it ends.
class RequestGauge {
 public:
  RequestGauge(std::atomic<int>& waiting, std::atomic<int>& running) : waiting_(waiting), running_(running) {
    ++waiting_;
  }
  ~RequestGauge() {
    if (first_token_seen_) {
      --running_;
    } else {
      --waiting_;
    }
  }
  RequestGauge(const RequestGauge&) = delete;
  RequestGauge& operator=(const RequestGauge&) = delete;

  // Moves the request to running; true for its first token only.
  bool first_token() {
    if (first_token_seen_.exchange(true)) return false;
    --waiting_;
    ++running_;
    return true;
  }

 private:
  std::atomic<int>& waiting_;
  std::atomic<int>& running_;
  std::atomic<bool> first_token_seen_{false};
};

// The chunks of one choice of a streamed response; does nothing for a whole response.
class ChoiceStream {
 public:
  ChoiceStream(Responder* res, const ResponseMeta& meta, int index, bool chat)
      : res_(res), meta_(meta), index_(index), chat_(chat) {}

  bool streaming() const { return res_ != nullptr; }

  // The opening chunks: chat's role, completions' echoed prompt.
  void open(const std::string& echo) {
    if (!res_) return;
    if (chat_) res_->send_event(chat_role_chunk(meta_, index_));
    if (!echo.empty()) send(echo, std::nullopt, std::nullopt);
    offset_ = count_code_points(echo);  // as completion_response's text_offset_base
  }

  // Text goes in one chunk and tool-call pieces in the next (a delta holds one or the
  // other, as OpenAI sends them); logprobs and the finish reason ride on the last.
  // The echoed prompt's logprobs, after its text: offsets from 0, as the whole response's,
  // counted over the tokens' text (a BOS token's text is not in the echoed prompt).
  void send_prompt_logprobs(std::vector<PositionLogprobs> lps) {
    if (!res_) return;
    offset_ = 0;
    for (const PositionLogprobs& l : lps) offset_ += count_code_points(l.token);
    ChoiceDelta d{index_, "", std::move(lps), std::nullopt, 0};
    res_->send_event(completion_chunk(meta_, d));
  }

  void send(std::string text, std::optional<std::vector<PositionLogprobs>> lps, std::optional<FinishReason> finish,
            std::vector<ToolCallDelta> calls = {}) {
    if (!res_) return;
    if (!calls.empty()) {
      if (!text.empty()) send(std::move(text), std::nullopt, std::nullopt);
      text.clear();
    }
    if (text.empty() && calls.empty() && (!lps || lps->empty()) && !finish) return;
    ChoiceDelta d{index_, std::move(text), std::move(lps), finish, offset_, std::move(calls)};
    if (d.logprobs) {
      for (const PositionLogprobs& l : *d.logprobs) offset_ += count_code_points(l.token);
    }
    res_->send_event(chat_ ? chat_chunk(meta_, d) : completion_chunk(meta_, d));
  }

 private:
  Responder* res_;
  const ResponseMeta& meta_;
  int index_;
  bool chat_;
  // Completions logprobs: text_offset of the next token, counted over the tokens' own text
  // as the non-stream response counts it — not over the text sent so far, which lags
  // behind while a stop string's prefix is held back.
  size_t offset_ = 0;
};

// One attempt's tokens as text: detokenized incrementally, with the stop strings applied
// (text that may begin a stop string is held back until that is decided), then split into
// content and tool calls (ToolCallParser; all content when the request parses none).
class ChoiceText {
 public:
  ChoiceText(const Tokenizer& tokenizer, const CompletionRequest& r)
      : detok_(tokenizer, r.skip_special_tokens), stops_(r.stop, r.include_stop_str_in_output), tools_(r.tool_parser) {}

  // What settled with `token`.
  ToolParseStep feed(int token) {
    const StopStringMatcher::Step step = stops_.feed(detok_.step(token));
    if (step.stopped) stopped_ = true;
    ToolParseStep out = tools_.feed(step.text);
    if (stopped_) append(out, tools_.finish());
    return out;
  }

  // The rest once generation has ended.
  ToolParseStep finish() {
    if (stopped_) return {};
    const StopStringMatcher::Step step = stops_.feed(detok_.finish());
    stopped_ = step.stopped;
    ToolParseStep out = tools_.feed(stopped_ ? step.text : step.text + stops_.flush());
    append(out, tools_.finish());
    return out;
  }

  // A stop string matched: the choice ends there.
  bool stopped() const { return stopped_; }
  const std::vector<ToolCall>& tool_calls() const { return tools_.calls(); }

 private:
  static void append(ToolParseStep& to, ToolParseStep from) {
    to.content += from.content;
    for (ToolCallDelta& d : from.calls) {
      if (!to.calls.empty() && to.calls.back().index == d.index && !d.id) {
        to.calls.back().arguments += d.arguments;
      } else {
        to.calls.push_back(std::move(d));
      }
    }
  }

  IncrementalDecoder detok_;
  StopStringMatcher stops_;
  ToolCallParser tools_;
  bool stopped_ = false;
};

// The prefill and decode node an attempt runs on, counted in their pools' load.
struct NodePair {
  NodePool::Lease prefill, decode;
  NodeAddress decode_node;   // decode.node() with its UCX address and KV format
  NodeAddress prefill_node;  // prefill.node() with its KV format
};

// One attempt of a choice on a node pair.
struct Attempt {
  NodePair nodes;
  ChoiceText text;
  std::string kept;  // a whole response's text so far
  Clock::time_point last_token = Clock::now();
};

// One choice of a request while it runs.
struct ChoiceRun {
  const AdmittedRequest& req;
  RequestGauge& gauge;
  SamplingParams params;
  ChoiceStream stream;
  ChoiceOutcome& out;
  std::vector<int> generated;  // every token relayed so far, over all attempts (a migration resends them)
};

// One attempt's stall clock. A watcher coroutine on the attempt's strand sleeps on `timer`
// until `stall` after the last node event; then it asks whether the stream is stuck (a
// health round trip) and, when it is, marks the attempt stalled and cancels its call. The
// timers of every attempt sit in the io_context's one timer queue: no thread per attempt.
struct StallClock {
  explicit StallClock(const asio::any_io_executor& ex) : timer(ex), done(ex) {}
  Clock::time_point last = Clock::now();  // the last node event
  bool stop = false;                      // the attempt has ended
  bool fired = false;                     // the watcher found it stalled
  asio::steady_timer timer;
  CoEvent done;                           // the watcher has returned
};

}  // namespace

struct RouterServer::Impl {
  RouterConfig config;
  Tokenizer tokenizer;
  std::optional<ChatTemplate> chat_template;
  bool template_renders_tools = false;  // else tools and tool messages are rendered in Hermes form first
  ToolParserKind tool_parser = ToolParserKind::none;
  std::string model_name;
  int max_model_len = 0;
  int64_t created_s = 0;
  SamplingParams defaults;
  std::vector<int> eos_ids;  // the model's, as the nodes merge them (a migrated stream that ended on one is done)
  ProtocolLimits limits;
  ApiKeys keys;
  NodePool prefill_pool, decode_pool;
  std::vector<NodeAddress> prefill_nodes, decode_nodes;
  Metrics metrics;
  std::atomic<int> running{0}, waiting{0};

  std::mutex node_info_mutex;
  struct DecodeUcx {
    std::string address, worker, host_id;  // NodeHealth's ucx_address, ucx_worker, host_id
  };
  std::map<std::string, DecodeUcx> ucx_of;  // decode node name → where its KV goes
  std::map<std::string, std::string> prefill_format_of, decode_format_of;  // node name → KV format (node_info_mutex)
  std::map<std::string, uint64_t> kv_bytes_seen;  // health thread only

  // Every client request runs as a coroutine on a strand of `io` (config.io_threads threads):
  // node calls, token relay and stall timers wait without holding a thread. Open requests
  // are listed here so that shutdown can cancel them, and waits until the last has returned
  // before any other member goes.
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> io_work;
  std::vector<std::thread> io_threads;
  std::unique_ptr<HttpConnectionPool> node_connections;  // keep-alive connections to the nodes
  std::mutex requests_mutex;
  std::condition_variable requests_cv;  // a request ended
  std::map<uint64_t, std::shared_ptr<RequestContext>> requests;  // open, by arrival number
  uint64_t next_request = 0;
  bool stopping = false;  // set once shutdown has begun: no new request starts

  std::mutex health_mutex;
  std::condition_variable health_cv;
  bool health_stop = false;
  bool health_starting = false;  // the first poll found a node not ready yet (set before health_thread starts)
  std::thread health_thread;

  std::unique_ptr<HttpServer> http;

  explicit Impl(const RouterConfig& c)
      : config(c),
        tokenizer(Tokenizer::load(c.model)),
        prefill_pool(HealthPolicy{}, AffinityPolicy{c.prefix_affinity_tokens}) {
    HACK_CHECK(config.prefix_block_tokens > 0, "--prefix-block-tokens must be positive");
    HACK_CHECK(!config.model.empty(), "--model DIR is required (tokenizer, chat template, config.json)");
    const std::filesystem::path dir(config.model);
    const ModelConfig mc = load_model_config(dir / "config.json");
    model_name = !config.served_name.empty() ? config.served_name : dir.lexically_normal().filename().string();
    if (model_name.empty()) model_name = dir.lexically_normal().parent_path().filename().string();
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
    limits.served_models = {model_name};
    limits.vocab_size = mc.vocab_size;
    keys = ApiKeys::from_flags(config.api_keys, config.api_key_file);
    prefill_nodes = parse_nodes(config.prefill, "prefill");
    decode_nodes = parse_nodes(config.decode, "decode");
    for (const NodeAddress& n : prefill_nodes) prefill_pool.add(n);
    for (const NodeAddress& n : decode_nodes) decode_pool.add(n);
    health_starting = poll_health();  // a cluster that is up is routable at once

    HttpServerOptions ho;
    ho.host = config.host;
    ho.port = config.port;
    ho.threads = config.http_threads;
    HACK_CHECK(config.max_body_kb > 0, "--max-body-kb must be positive");
    ho.max_body_bytes = static_cast<size_t>(config.max_body_kb) << 10;
    ho.header_timeout_s = config.header_timeout_s;
    HACK_CHECK(config.io_threads > 0, "--io-threads must be positive");
    node_connections = std::make_unique<HttpConnectionPool>(io.get_executor());
    io_work.emplace(io.get_executor());
    http = std::make_unique<HttpServer>(ho, [this](HttpRequest req, std::shared_ptr<Responder> res) {
      handle(std::move(req), std::move(res));
    });
    // After the listener (a constructor that throws must leave no thread joinable); requests
    // that came in between wait in `io`'s queue.
    for (int i = 0; i < config.io_threads; ++i) io_threads.emplace_back([this] { run_io(); });
    // Started last: a constructor that throws (port taken) must not leave it joinable.
    health_thread = std::thread([this] { health_loop(); });
    spdlog::info("hack-router: model {} (max length {}), {} prefill + {} decode nodes, API {}:{}{}", model_name,
                 max_model_len, prefill_nodes.size(), decode_nodes.size(), config.host, http->port(),
                 keys.enabled() ? ", API keys required" : "");
  }

  ~Impl() {
    http.reset();  // no new requests; open ones see their clients close and cancel
    stop_requests();
    node_connections->clear();
    io_work.reset();
    for (std::thread& t : io_threads) t.join();
    {
      std::lock_guard lock(health_mutex);
      health_stop = true;
    }
    health_cv.notify_all();
    health_thread.join();
  }

  // ---- health ---------------------------------------------------------------------------

  // Returns true for a node that answered but is not ready yet (not draining).
  bool poll_node(NodePool& pool, const NodeAddress& node, const char* role) {
    try {
      const double timeout = std::max(0.5, std::min(2.0, 2.0 * config.health_interval_s));
      const NodeHealth h = fetch_health(node, timeout);
      HACK_CHECK(h.role == role, "node {} is a {} node, configured as {}", node.name, h.role, role);
      {
        std::lock_guard lock(node_info_mutex);
        if (h.role == std::string("decode")) ucx_of[node.name] = {h.ucx_address, h.ucx_worker, h.host_id};
        (h.role == std::string("decode") ? decode_format_of : prefill_format_of)[node.name] = h.kv_format;
      }
      metrics.set_kv_cache_usage_ratio(node.name, h.kv_usage);
      uint64_t& seen = kv_bytes_seen[node.name];
      if (h.kv_bytes_transferred > seen) metrics.add_kv_bytes_transferred(node.name, h.kv_bytes_transferred - seen);
      seen = h.kv_bytes_transferred;
      if (h.draining || !h.ready) {  // not ready: a decode node whose UCX listener has not passed its self-probe
        pool.report_draining(node.name);
        return !h.draining;
      }
      pool.report_success(node.name, h.queue_tokens);
    } catch (const std::exception& e) {
      spdlog::debug("health of {} node {}: {}", role, node.name, e.what());
      pool.report_failure(node.name);
    }
    return false;
  }

  // Polls every node; true if one answered that it is not ready yet.
  bool poll_health() {
    bool starting = false;
    for (const NodeAddress& n : prefill_nodes) starting |= poll_node(prefill_pool, n, "prefill");
    for (const NodeAddress& n : decode_nodes) starting |= poll_node(decode_pool, n, "decode");
    return starting;
  }

  void health_loop() {
    std::unique_lock lock(health_mutex);
    bool starting = health_starting;
    while (!health_stop) {
      // A node still starting (its self-probe not passed) is asked again soon, whatever the
      // interval: it is about to serve, and a long --health-interval would keep it out.
      const double wait_s = starting ? std::min<double>(config.health_interval_s, kStartingRepollS) : config.health_interval_s;
      health_cv.wait_for(lock, std::chrono::duration<double>(wait_s));
      if (health_stop) break;
      lock.unlock();
      starting = poll_health();
      lock.lock();
    }
  }

  // ---- HTTP -----------------------------------------------------------------------------

  void handle(HttpRequest req, std::shared_ptr<Responder> res) {
    const std::string& path = req.path;
    if (path == "/health" || path == "/health/live") {
      const size_t p = prefill_pool.healthy_count(), d = decode_pool.healthy_count();
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
      res->send(200, "application/json", models_response(std::span<const std::string>(&model_name, 1), created_s,
                                                         max_model_len));
      return;
    }
    if (path.starts_with("/v1/models/")) {
      if (req.method != "GET") return send_error(*res, method_error(req.method, path));
      const std::string id = path.substr(std::string_view("/v1/models/").size());
      if (id != model_name) return send_error(*res, model_not_found_error(id));
      res->send(200, "application/json", model_response(model_name, created_s, max_model_len));
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
    if (j.contains("model") && !(j["model"].is_string() && j["model"] == model_name))
      throw model_not_found_error(j["model"].is_string() ? j["model"].get<std::string>() : j["model"].dump());
    std::vector<int> ids;
    if (j.contains("messages")) {
      nlohmann::json chat = {{"model", model_name}, {"messages", j["messages"]}};
      for (const char* key : {"add_generation_prompt", "tools", "chat_template_kwargs"})
        if (j.contains(key)) chat[key] = j[key];
      ParseResult parsed = parse_request(chat.dump(), Endpoint::kChatCompletions, limits);
      if (auto* e = std::get_if<ProtocolError>(&parsed)) throw *e;
      std::string text;
      auto tokens = prompt_tokens(std::get<CompletionRequest>(parsed), text);
      if (auto* e = std::get_if<ProtocolError>(&tokens)) throw *e;
      ids = std::get<std::vector<int>>(std::move(tokens));
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      bool special = true;
      if (j.contains("add_special_tokens")) {
        if (!j["add_special_tokens"].is_boolean()) throw bad_request("add_special_tokens must be a boolean", "add_special_tokens");
        special = j["add_special_tokens"].get<bool>();
      }
      ids = tokenizer.encode(j["prompt"].get<std::string>(), special);
    } else {
      throw bad_request("send \"prompt\" (a string) or \"messages\" (a chat)", "prompt");
    }
    return nlohmann::json{{"count", ids.size()}, {"max_model_len", max_model_len}, {"tokens", ids}}.dump();
  }

  // {"tokens": [ids]} → {"prompt": text}.
  std::string detokenize(const std::string& body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad_request("the body must be a JSON object", "");
    if (j.contains("model") && !(j["model"].is_string() && j["model"] == model_name))
      throw model_not_found_error(j["model"].is_string() ? j["model"].get<std::string>() : j["model"].dump());
    if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad_request("tokens must be a list of token ids", "tokens");
    std::vector<int> ids;
    for (const auto& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= limits.vocab_size)
        throw bad_request(fmt::format("tokens: {} is not a token id of this model (0..{})", t.dump(), limits.vocab_size - 1),
                          "tokens");
      ids.push_back(t.get<int>());
    }
    return nlohmann::json{{"prompt", tokenizer.decode(ids, /*skip_special_tokens=*/false)}}.dump();
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

  Task<bool> node_alive(const NodeAddress& node) { return async_node_alive(node, 1.0, node_connections.get()); }

  static ProtocolError method_error(const std::string& method, const std::string& path) {
    ProtocolError e;
    e.status = 405;
    e.message = fmt::format("method {} is not allowed on {}", method, path);
    return e;
  }

  // Prompt token ids of a request, or the 400 explaining why there are none.
  std::variant<std::vector<int>, ProtocolError> prompt_tokens(const CompletionRequest& r, std::string& prompt_text) {
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
      e.message = fmt::format("model {} has no chat template; start the router with --chat-template FILE", model_name);
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

  PositionLogprobs logprob_entry(const SampleResult& s) const {
    PositionLogprobs e{tokenizer.decode(std::span<const int>(&s.token, 1), false), s.logprob, {}};
    for (const hack::TokenLogprob& t : s.top_logprobs) {
      e.top.push_back(TopLogprob{tokenizer.decode(std::span<const int>(&t.token, 1), false), t.logprob});
    }
    return e;
  }

  // ---- one request ----------------------------------------------------------------------

  Task<void> complete(const HttpRequest& http_req, Responder& res, RequestContext& ctx, Endpoint endpoint) {
    auto admitted = admit(http_req.body, endpoint, Clock::now());
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
    answer(res, ctx, req, static_cast<int>(prompt_tokens), std::move(outcomes));
  }

  // Parses and validates a request, and checks that the nodes can take it. One part per
  // prompt (a /v1/completions list of prompts gives several, sharing one response id).
  std::variant<std::vector<AdmittedRequest>, Rejection> admit(const std::string& body, Endpoint endpoint,
                                                              Clock::time_point t_arrival) {
    ParseResult parsed = parse_request(body, endpoint, limits);
    if (auto* e = std::get_if<ProtocolError>(&parsed)) return Rejection{*e, "invalid_request"};
    CompletionRequest request = std::get<CompletionRequest>(std::move(parsed));
    std::vector<CompletionRequest> prompts;
    if (request.batch.empty()) {
      prompts.push_back(std::move(request));
    } else {
      for (auto& p : request.batch) {
        CompletionRequest one = request;
        one.batch.clear();
        if (auto* text = std::get_if<std::string>(&p)) {
          one.prompt_text = *text;
        } else {
          one.prompt_token_ids = std::get<std::vector<int>>(p);
        }
        prompts.push_back(std::move(one));
      }
    }
    std::vector<AdmittedRequest> parts;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto part = admit_prompt(std::move(prompts[i]), endpoint, t_arrival);
      if (auto* no = std::get_if<Rejection>(&part)) {
        if (prompts.size() > 1) no->error.message = fmt::format("prompt {}: {}", i, no->error.message);
        return *no;
      }
      parts.push_back(std::get<AdmittedRequest>(std::move(part)));
      parts.back().meta = parts.front().meta;
    }
    return parts;
  }

  std::variant<AdmittedRequest, Rejection> admit_prompt(CompletionRequest request, Endpoint endpoint,
                                                         Clock::time_point t_arrival) {
    AdmittedRequest req;
    req.request = std::move(request);
    if (req.request.endpoint == Endpoint::kChatCompletions && req.request.tools.is_array() &&
        !req.request.tools.empty() && !req.request.tool_choice_none) {
      req.request.tool_parser = tool_parser;
      // Mistral's [TOOL_CALLS] is a special token: keep it in the text (vLLM does the same).
      if (tool_parser == ToolParserKind::mistral) req.request.skip_special_tokens = false;
      if (req.request.tool_choice_required || !req.request.tool_choice_function.empty()) {
        try {  // the reply is forced to be calls, in the syntax the parser reads
          req.request.grammar = forced_tool_calls_gbnf(tool_parser, req.request.tools, req.request.tool_choice_function,
                                                       req.request.parallel_tool_calls);
        } catch (const Error& e) {
          return Rejection{bad_request(e.what(), "tool_choice"), "invalid_request"};
        }
      }
    }
    const CompletionRequest& r = req.request;
    auto tokens = prompt_tokens(r, req.prompt_text);
    if (auto* e = std::get_if<ProtocolError>(&tokens)) return Rejection{*e, "invalid_request"};
    req.prompt = std::get<std::vector<int>>(std::move(tokens));
    auto fitted = fit_max_tokens(r, static_cast<int>(req.prompt.size()), max_model_len);
    if (auto* e = std::get_if<ProtocolError>(&fitted)) return Rejection{*e, "invalid_request"};
    if (prefill_pool.healthy_count() == 0 || decode_pool.healthy_count() == 0) {
      const char* role = prefill_pool.healthy_count() == 0 ? "prefill" : "decode";
      return Rejection{unavailable_error(fmt::format("no healthy {} node", role)), "unavailable"};
    }
    if (config.max_queue_tokens > 0 &&
        (prefill_pool.saturated(config.max_queue_tokens) || decode_pool.saturated(config.max_queue_tokens))) {
      return Rejection{overloaded_error(), "overloaded"};
    }
    req.params = to_sampling_params(r, std::get<int>(fitted), defaults);
    req.meta = ResponseMeta{make_request_id(endpoint), r.model, unix_seconds_now(), r.stream && r.include_usage};
    req.t_arrival = t_arrival;
    return req;
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
      outcomes[0] = co_await run_choice(ctx, parts[0], 0, 0, gauge, stream);
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
              outcomes[static_cast<size_t>(index)] = co_await run_choice(ctx, parts[p], i, index, gauge, stream);
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

  // Answers from the choices' outcomes: the first error, else the response (when streaming,
  // the end of the stream). Nothing once the client has gone.
  void answer(Responder& res, const RequestContext& ctx, const AdmittedRequest& req, int prompt_tokens,
              std::vector<ChoiceOutcome> outcomes) {
    const CompletionRequest& r = req.request;
    Usage usage{prompt_tokens, 0};
    std::optional<ProtocolError> error;
    std::vector<Choice> choices;
    for (ChoiceOutcome& o : outcomes) {
      usage.completion_tokens += o.completion_tokens;
      if (o.error && !error) error = o.error;
      choices.push_back(std::move(o.choice));
    }
    if (ctx.cancelled()) {
      metrics.count_request_error("cancelled");
      spdlog::info("request {}: cancelled (client went away)", req.meta.id);
      return;
    }
    if (error) {
      metrics.count_request_error(error->status == 503 ? "unavailable" : "node_failure");
      spdlog::warn("request {}: failed: {}", req.meta.id, error->message);
      if (r.stream) {
        res.send_event(error_body(*error));
        res.send_event("[DONE]");
        res.end();
      } else {
        send_error(res, *error);
      }
      return;
    }
    for (const Choice& c : choices) metrics.count_request_success(finish_reason_name(c.finish_reason));
    spdlog::info("request {}: done, {} completion tokens in {:.3f} s", req.meta.id, usage.completion_tokens,
                 seconds_since(req.t_arrival));
    if (r.stream) {
      if (r.include_usage) res.send_event(usage_chunk(req.meta, r.endpoint, usage));
      res.send_event("[DONE]");
      res.end();
      return;
    }
    const std::string body =
        r.endpoint == Endpoint::kCompletions
            ? completion_response(req.meta, choices, usage,
                                  r.echo && req.params.prompt_logprobs < 0 ? count_code_points(req.prompt_text) : 0)
            : chat_completion_response(req.meta, choices, usage);
    res.send(200, "application/json", body);
  }

  // ---- one choice -----------------------------------------------------------------------

  // Runs one choice to its end. An attempt that fails before any token is retried once on
  // other nodes; one that fails after tokens (node lost, stream broken, stalled) is migrated:
  // prompt + the tokens so far go to another node pair, which continues the same stream
  // (same seed, sampler step = tokens so far), at most config.max_migrations times. The text
  // state (detokenizer, stop strings) spans every attempt, so the client sees one stream.
  // With `stream`, chunks are sent as text settles.
  // `index`: the choice's number within its prompt (its sampling seed); `reported`: its index
  // in the response.
  Task<ChoiceOutcome> run_choice(RequestContext& ctx, const AdmittedRequest& req, int index, int reported,
                                 RequestGauge& gauge, Responder* stream) {
    const CompletionRequest& r = req.request;
    const bool chat = r.endpoint == Endpoint::kChatCompletions;
    ChoiceOutcome out;
    ChoiceRun run{req, gauge, choice_params(req.params, index), ChoiceStream(stream, req.meta, reported, chat), out};
    // A migrated stream draws on its new nodes what it would have drawn on the first pair only
    // with the same seed: pick it here when the client gave none.
    if (!run.params.seed) run.params.seed = random_id();
    out.choice.index = reported;
    if (run.params.logprobs >= 0) out.choice.logprobs.emplace();
    const std::string echo = r.echo && !chat ? req.prompt_text : std::string();
    if (!stream) out.choice.text = echo;
    run.stream.open(echo);

    std::set<std::string> bad_prefill, bad_decode;
    Attempt a{NodePair{}, ChoiceText(tokenizer, r)};
    int retries = 0, migrations = 0;
    for (int attempt = 0;; ++attempt) {
      out.error.reset();  // an earlier attempt's failure is not this one's
      auto nodes = co_await acquire_live_nodes(ctx, req, run.params, bad_prefill, bad_decode,
                                      static_cast<int64_t>(run.generated.size()), attempt > 0);
      if (auto* e = std::get_if<ProtocolError>(&nodes)) {
        out.error = *e;
        if (!run.generated.empty())
          out.error->message = fmt::format("generation failed after {} tokens: {}", run.generated.size(), e->message);
        co_return out;
      }
      a.nodes = std::get<NodePair>(std::move(nodes));
      bool stalled = false;
      const GenerateOutcome g = co_await run_attempt(ctx, run, a, attempt, stalled);
      if (g.status.is_ok()) {
        finish_choice(run, a, g.finish_reason);
        co_return out;
      }
      if (ctx.cancelled()) {
        out.error = internal_error("cancelled");
        co_return out;
      }
      // The stream broke after its last token, before the node said it had finished.
      if (auto finish = ended_by_last_token(run)) {
        finish_choice(run, a, *finish);
        co_return out;
      }
      const std::string why = stalled ? fmt::format("no token for {} s (stalled)", config.stall_timeout_s)
                                      : g.status.message();
      const bool decode_lost = co_await exclude_failed_nodes(a.nodes, bad_prefill, bad_decode, !run.generated.empty());
      if (run.generated.empty()) {
        if (retries >= std::max(1, config.max_migrations)) {
          out.error = internal_error(why);
          co_return out;
        }
        ++retries;
        metrics.count_request_retry(stalled ? "stalled" : "node_failure");
        spdlog::warn("request {}: attempt {} on {} + {} failed before any token: {}", req.meta.id, attempt + 1,
                     a.nodes.prefill_node.name, a.nodes.decode_node.name, why);
      } else {
        if (migrations >= config.max_migrations) {
          out.error = internal_error(fmt::format("generation failed after {} tokens and {} migrations: {}",
                                                 run.generated.size(), migrations, why));
          co_return out;
        }
        ++migrations;
        const char* cause = stalled ? "stalled" : decode_lost ? "node_lost" : "stream_broken";
        metrics.count_request_migration(cause);
        spdlog::warn("request {}: choice {} migrates after {} tokens ({}: {} + {}: {})", req.meta.id, reported,
                     run.generated.size(), cause, a.nodes.prefill_node.name, a.nodes.decode_node.name, why);
      }
      a.nodes = NodePair{};  // out of the failed nodes' load before the next pick
    }
  }

  // acquire_nodes for a retry or migration: when the pick falls back to a node excluded as
  // failed (no other was free) and it still does not answer, wait for the pool to offer a
  // live one (a restarted node, or the health poll dropping the dead one) for up to
  // stall_timeout_s (at least 5 s) rather than spend an attempt on a dead node.
  Task<std::variant<NodePair, ProtocolError>> acquire_live_nodes(RequestContext& ctx, const AdmittedRequest& req,
                                                                 const SamplingParams& params,
                                                                 const std::set<std::string>& bad_prefill,
                                                                 const std::set<std::string>& bad_decode,
                                                                 int64_t generated, bool after_failure) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::max(5.0f, config.stall_timeout_s)));
    for (;;) {
      auto nodes = acquire_nodes(req, params, bad_prefill, bad_decode, generated);
      if (!after_failure || Clock::now() >= deadline || ctx.cancelled()) co_return nodes;
      if (auto* pair = std::get_if<NodePair>(&nodes)) {
        const bool prefill_ok =
            !bad_prefill.contains(pair->prefill_node.name) || co_await node_alive(pair->prefill_node);
        const bool decode_ok = !bad_decode.contains(pair->decode_node.name) || co_await node_alive(pair->decode_node);
        if (prefill_ok && decode_ok) co_return nodes;
      }
      co_await co_sleep(0.2);
    }
  }

  // A stream that broke after the token that ended it (max_tokens reached, a stop id or EOS
  // sampled) has nothing left to generate: how it finished, or nullopt when it has not.
  std::optional<FinishReason> ended_by_last_token(const ChoiceRun& run) const {
    if (run.generated.empty()) return std::nullopt;
    const int last = run.generated.back();
    const auto& stops = run.params.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), last) != stops.end()) return FinishReason::stop;
    if (!run.params.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), last) != eos_ids.end())
      return FinishReason::stop;
    if (static_cast<int>(run.generated.size()) >= run.params.max_tokens) return FinishReason::length;
    return std::nullopt;
  }

  // The prefill and decode node with the shortest queues, not one of `bad_*` unless there is
  // no other.
  // `generated`: tokens of a migrated stream, prefilled with the prompt.
  std::variant<NodePair, ProtocolError> acquire_nodes(const AdmittedRequest& req, const SamplingParams& params,
                                                      const std::set<std::string>& bad_prefill,
                                                      const std::set<std::string>& bad_decode, int64_t generated = 0) {
    const auto prompt_tokens = static_cast<int64_t>(req.prompt.size()) + generated;
    const std::vector<uint64_t> prefix = config.prefix_affinity_tokens > 0
                                             ? prefix_block_hashes(req.prompt, config.prefix_block_tokens)
                                             : std::vector<uint64_t>{};
    auto pl = prefill_pool.acquire(prompt_tokens, bad_prefill, prefix);
    if (!pl) pl = prefill_pool.acquire(prompt_tokens, {}, prefix);
    if (!pl) return unavailable_error("no healthy prefill node");
    // Only a decode node whose KV format equals the prefill node's can take its KV.
    std::string format;
    std::set<std::string> other_format;
    {
      std::lock_guard lock(node_info_mutex);
      format = prefill_format_of[pl->node().name];
      for (const auto& [name, f] : decode_format_of)
        if (f != format) other_format.insert(name);
    }
    std::set<std::string> exclude = other_format;
    exclude.insert(bad_decode.begin(), bad_decode.end());
    const int64_t decode_tokens = prompt_tokens + params.max_tokens - generated;
    auto dl = decode_pool.acquire(decode_tokens, exclude);
    if (!dl) dl = decode_pool.acquire(decode_tokens, other_format);
    if (!dl && !other_format.empty() && decode_pool.healthy_count() > 0)
      return unavailable_error(fmt::format("no healthy decode node has the KV format of prefill node {} ('{}'): "
                                           "start every node with the same --kv, --hack-* and --fdc",
                                           pl->node().name, format));
    if (!dl) return unavailable_error("no healthy decode node");
    NodePair nodes{std::move(*pl), std::move(*dl), {}, {}};
    nodes.decode_node = nodes.decode.node();
    nodes.prefill_node = nodes.prefill.node();
    {
      std::lock_guard lock(node_info_mutex);
      const DecodeUcx& ucx = ucx_of[nodes.decode_node.name];
      nodes.decode_node.ucx_address = ucx.address;
      nodes.decode_node.ucx_worker = ucx.worker;
      nodes.decode_node.host_id = ucx.host_id;
      nodes.decode_node.kv_format = decode_format_of[nodes.decode_node.name];
      nodes.prefill_node.kv_format = format;
    }
    return nodes;
  }

  // Generates on the attempt's nodes until the request ends, fails, or a stop string matches.
  // Generates on the attempt's nodes until the request ends, fails, stalls (`stalled` set:
  // no token for config.stall_timeout_s and stream_stalled says so) or a stop string matches.
  // A migrated stream (run.generated not empty) continues from its tokens so far.
  Task<GenerateOutcome> run_attempt(RequestContext& ctx, ChoiceRun& run, Attempt& a, int attempt, bool& stalled) {
    GenerateJob job{random_id(), run.req.prompt, run.params, true};
    job.generated = run.generated;
    if (!run.generated.empty()) job.params.prompt_logprobs = -1;  // the prompt's were relayed with the first token
    GenerateOptions go{config.secret, config.request_timeout_s, false};
    AsyncDisaggregatedCall call(a.nodes.prefill_node, a.nodes.decode_node, job, go, node_connections.get());
    ctx.add(&call);
    spdlog::debug("request {}: choice {} attempt {} on prefill {} + decode {} (node request {}, {} tokens so far)",
                  run.req.meta.id, run.out.choice.index, attempt + 1, a.nodes.prefill_node.name,
                  a.nodes.decode_node.name, job.request_id, run.generated.size());
    bool any_token = false;
    const auto ex = co_await asio::this_coro::executor;
    StallClock clock(ex);
    if (config.stall_timeout_s > 0) {
      asio::co_spawn(ex, watch_stall(clock, a.nodes, any_token, call), asio::detached);
    } else {
      clock.done.set();
    }
    GenerateOutcome g = co_await call.run([&](const NodeEvent& e) {
      clock.last = Clock::now();
      // The attempt's first token is sampled by prefill: that node's part is done.
      if (e.kind == NodeEventKind::token && !any_token) {
        any_token = true;
        a.nodes.prefill.release();
      }
      return on_node_event(run, a, e);
    });
    clock.stop = true;
    clock.timer.cancel();
    co_await clock.done.wait();
    stalled = clock.fired;
    ctx.remove(&call);
    co_return g;
  }

  // The stall watcher of one attempt (StallClock): when no node event has come for
  // stall_timeout_s, asks stream_stalled; a stuck stream is marked and its call cancelled.
  Task<void> watch_stall(StallClock& clock, const NodePair& nodes, const bool& any_token, AsyncDisaggregatedCall& call) {
    const auto stall = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config.stall_timeout_s));
    try {
      while (!clock.stop) {
        if (Clock::now() < clock.last + stall) {
          clock.timer.expires_at(clock.last + stall);
          boost::system::error_code ec;
          co_await clock.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          continue;
        }
        const Clock::time_point seen = clock.last;
        const bool stuck = co_await stream_stalled(nodes, any_token);
        if (clock.stop) break;
        if (clock.last != seen) continue;  // a token came while the nodes were asked
        if (stuck) {
          clock.fired = true;
          call.cancel();
          break;
        }
        clock.last = Clock::now();  // alive and not stuck: give it another stall_timeout_s
      }
    } catch (const std::exception& e) {
      spdlog::error("stall watcher: {}", e.what());
    }
    clock.done.set();
  }

  // Whether an attempt silent for stall_timeout_s is stuck: its decode node does not answer
  // its health check (hung, e.g. SIGSTOP, or dead), or after a token it is running requests
  // yet sent none of ours; before the first token, also when the prefill node does not answer
  // (a decode node waiting for KV, or a prefill queue, is not a stall).
  Task<bool> stream_stalled(const NodePair& nodes, const bool& any_token) {
    std::optional<NodeHealth> h;
    try {
      h = co_await async_fetch_health(nodes.decode_node, 1.0, node_connections.get());
    } catch (const std::exception&) {
    }
    if (!h) co_return true;
    if (any_token) co_return h->running > 0;
    co_return !co_await node_alive(nodes.prefill_node);
  }

  // One event of the decode stream; false stops generation (a stop string matched).
  bool on_node_event(ChoiceRun& run, Attempt& a, const NodeEvent& e) {
    if (e.kind == NodeEventKind::accepted) {
      metrics.observe_request_queue_time_s(seconds_since(run.req.t_arrival));
      return true;
    }
    if (e.kind != NodeEventKind::token) return true;
    if (e.index < static_cast<int>(run.generated.size())) return true;  // relayed before a migration
    run.generated.push_back(e.sample.token);
    count_token(run, a);
    if (!e.prompt_logprobs.empty()) relay_prompt_logprobs(run, e.prompt_logprobs);
    return relay_token(run, a, e.sample);
  }

  // A token in the metrics and the decode node's load (run_attempt ends the prefill node's
  // lease at each attempt's first token).
  void count_token(ChoiceRun& run, Attempt& a) {
    const auto now = Clock::now();
    if (run.out.completion_tokens == 0) {
      if (run.gauge.first_token()) metrics.observe_time_to_first_token_s(seconds_since(run.req.t_arrival));
    } else {
      metrics.observe_inter_token_latency_s(std::chrono::duration<double>(now - a.last_token).count());
    }
    a.last_token = now;
    ++run.out.completion_tokens;
    metrics.add_generation_tokens(1);
    a.nodes.decode.set_tokens(static_cast<int64_t>(run.req.prompt.size()) + run.params.max_tokens -
                              run.out.completion_tokens);
  }

  // echo's logprobs (the prompt's, first token null): a chunk after the echoed text, or the
  // head of the whole response's list.
  void relay_prompt_logprobs(ChoiceRun& run, const std::vector<SampleResult>& samples) {
    std::vector<PositionLogprobs> lps;
    lps.reserve(samples.size() + 1);
    lps.push_back(PositionLogprobs{tokenizer.decode(std::span<const int>(run.req.prompt).first(1), false), 0.0f, {}, true});
    for (const SampleResult& s : samples) lps.push_back(logprob_entry(s));
    if (run.stream.streaming()) {
      run.stream.send_prompt_logprobs(std::move(lps));
    } else if (run.out.choice.logprobs) {
      run.out.choice.logprobs->insert(run.out.choice.logprobs->begin(), lps.begin(), lps.end());
    }
  }

  // A token's text and logprobs: sent as a chunk, or kept for the whole response. False once
  // a stop string has matched.
  bool relay_token(ChoiceRun& run, Attempt& a, const SampleResult& sample) {
    std::optional<std::vector<PositionLogprobs>> lps;
    if (run.params.logprobs >= 0) lps = std::vector<PositionLogprobs>{logprob_entry(sample)};
    ToolParseStep step = a.text.feed(sample.token);
    if (run.stream.streaming()) {
      run.stream.send(std::move(step.content), std::move(lps), std::nullopt, std::move(step.calls));
    } else {
      a.kept += step.content;
      if (lps) run.out.choice.logprobs->push_back(std::move(lps->front()));
    }
    return !a.text.stopped();
  }

  // The end of a choice whose generation succeeded: the text held back, and why it finished.
  void finish_choice(ChoiceRun& run, Attempt& a, FinishReason node_finish) {
    ToolParseStep tail = a.text.finish();
    FinishReason finish =
        a.text.stopped() || node_finish == FinishReason::stop ? FinishReason::stop : FinishReason::length;
    // As vLLM: a choice that called tools and was not cut off finishes with "tool_calls".
    // A named tool_choice finishes with "stop", as OpenAI reports it.
    if (finish == FinishReason::stop && !a.text.tool_calls().empty() && run.req.request.tool_choice_function.empty())
      finish = FinishReason::tool_calls;
    run.out.choice.finish_reason = finish;
    if (run.stream.streaming()) {
      run.stream.send(std::move(tail.content), std::nullopt, finish, std::move(tail.calls));
    } else {
      run.out.choice.text += a.kept + tail.content;
      run.out.choice.tool_calls = a.text.tool_calls();
    }
  }

  // Retry away from the node at fault. Which one failed is not always clear from the error
  // (a dead decode node also fails the prefill job), so ask both: a node that does not
  // answer its health check is excluded and its pool told (failures in a row take it out
  // of rotation); when both answer, neither is trusted for the retry. After tokens
  // (`streaming`) the prefill node's part was done, so only a prefill node that is down is
  // excluded. Returns whether the decode node is down.
  Task<bool> exclude_failed_nodes(const NodePair& nodes, std::set<std::string>& bad_prefill,
                                  std::set<std::string>& bad_decode, bool streaming = false) {
    const NodeAddress& prefill = nodes.prefill_node;
    const NodeAddress& decode = nodes.decode_node;
    const bool prefill_down = !co_await node_alive(prefill);
    const bool decode_down = !co_await node_alive(decode);
    if (prefill_down) prefill_pool.report_failure(prefill.name);
    if (decode_down) decode_pool.report_failure(decode.name);
    if (prefill_down || (!decode_down && !streaming)) bad_prefill.insert(prefill.name);
    if (decode_down || !prefill_down || streaming) bad_decode.insert(decode.name);
    co_return decode_down;
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
