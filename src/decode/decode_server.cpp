#include "hack/decode/decode_server.h"

#include <spdlog/spdlog.h>

#include <thread>

#include <atomic>
#include <map>
#include <mutex>

#include "hack/core/cpu_features.h"
#include "hack/core/logging.h"
#include "hack/net/kv_transfer.h"
#include "hack/net/listener_probe.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/vault_client.h"
#include "hack/decode/event_outbox.h"
#include "hack/decode/kv_recorder.h"
#include "hack/runtime/prefix_fingerprint.h"
#include "hack/node/node_address.h"
#include "hack/http/http_server.h"
#include "hack/node/node_http.h"
#include "hack/node/node_protocol.h"
#include "hack/node/metrics.h"

namespace hack::server {

void add_decode_flags(FlagSet& flags, DecodeServerConfig& c) {
  add_model_flags(flags, c.model);
  add_served_name_flag(flags, c.model);
  flags.add_string("host", &c.host, "address to bind HTTP and UCX to");
  flags.add_int("port", &c.port, "HTTP port of the internal API (0 = any free port)");
  flags.add_int("ucx-port", &c.ucx_port, "UCX listener port for KV from prefill nodes (0 = any free port)");
  flags.add_string("advertise-host", &c.advertise_host,
                   "host prefill nodes connect to for KV, reported by /health (empty = --host; set it when "
                   "--host is 0.0.0.0, e.g. to the container's name)");
  flags.add_secret("secret", &c.secret, "shared secret required on internal endpoints (X-Hack-Secret); empty = none");
  flags.add_int("http-threads", &c.http_threads, "HTTP I/O threads");
  flags.add_int("max-batch", &c.max_batch, "running requests per decode step at most");
  flags.add_int("reserve-ahead", &c.reserve_ahead_tokens, "KV reservation step in tokens beyond a request's length");
  flags.add_int("recompute-chunk-tokens", &c.recompute_chunk_tokens,
                "a preempted request's KV is recomputed this many tokens per decode step, in the same forward as "
                "the running streams (they keep their pace); 0 = all at once on readmission");
  flags.add_string("recompute-budget", &c.recompute_budget,
                   "fixed (every piece --recompute-chunk-tokens) or adaptive (smaller pieces when a step would "
                   "exceed 2x a plain decode step; slower recomputes, measured in bench/RESULTS.md)");
  flags.add_float("kv-timeout", &c.kv_timeout_s, "seconds an admitted request waits for its KV from prefill");
  flags.add_float("ready-probe-timeout", &c.ready_probe_timeout_s,
                  "seconds a self-probe of the UCX listener waits for its message (repeated until one passes; "
                  "/health reports ready=false until then)");
  flags.add_float("idle-trim-s", &c.idle_trim_s,
                  "seconds without a request after which free KV slabs and malloc's free pages go back to the "
                  "system, so RSS follows the load, not its busiest moment (0 = never)");
  flags.add_bool("enable-test-hooks", &c.enable_test_hooks, "honour --test-step-delay-ms; never in production");
  flags.add_int("test-step-delay-ms", &c.test_step_delay_ms,
                "with --enable-test-hooks: sleep this long after each decode step (long streams for routing tests)");
  flags.add_float("drain-timeout", &c.drain_timeout_s,
                  "on SIGTERM: seconds to finish running requests (taking no new ones) before exiting");
  add_vault_flags(flags, c.vault, /*restores=*/false);
  flags.add_bool("json-logs", &c.json_logs, "log one JSON object per line");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
}

struct DecodeServer::Impl {
  DecodeServerConfig config;
  std::unique_ptr<ModelRuntime> rt;
  std::unique_ptr<net::UcxWorker> worker;
  std::string host_id;  // net::ucx_host_id(), published with the worker's address
  uint16_t ucx_port = 0;
  std::unique_ptr<net::VaultClient> vault;  // --vault: finished conversations' blocks go there
  BlockCodec vault_codec = BlockCodec::int8_head;
  DType vault_dtype = DType::bf16;
  BlockKey vault_root{};
  std::atomic<bool> draining{false};
  // Set once a self-probe has gone through the UCX listener (/health "ready"); the probe
  // thread repeats failed probes until then or until stopping.
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::thread probe_thread;
  // Token events leave the engine thread here; JSON, SSE and metrics run on its output thread.
  // Declared before the scheduler: a scheduler shutting down still posts its requests' failures.
  std::unique_ptr<EventOutbox> outbox;
  std::unique_ptr<DecodeScheduler> scheduler;
  std::unique_ptr<net::KvReceiver> receiver;
  std::atomic<net::KvReceiver*> receiver_for_callbacks{nullptr};  // `receiver`, for its own callbacks
  Metrics metrics;
  std::atomic<uint64_t> kv_bytes_received{0};
  // Open /internal/generate streams, so /internal/cancel can end them.
  std::mutex streams_mutex;
  std::map<uint64_t, std::shared_ptr<Responder>> streams;
  NodeEndpoints endpoints;
  std::unique_ptr<HttpServer> http;

  explicit Impl(const DecodeServerConfig& c) : config(c) {
    HACK_CHECK(config.test_step_delay_ms == 0 || config.enable_test_hooks,
               "--test-step-delay-ms needs --enable-test-hooks");
    rt = load_model_runtime(config.model, RuntimeParts{.device_max_sequences = config.max_batch});
    // A prefill node on this host connects by worker address (PrefillCall::decode_ucx_worker),
    // so its endpoint appears here with its first message and must get an id for our replies.
    worker = std::make_unique<net::UcxWorker>(net::UcxOptions{.accept_address_peers = true});
    host_id = net::ucx_host_id();
    ucx_port = worker->listen(config.host, static_cast<uint16_t>(config.ucx_port));
    DecodeSchedulerOptions so{.max_batch = config.max_batch,
                              .reserve_ahead_tokens = config.reserve_ahead_tokens,
                              .kv_wait_timeout_s = config.kv_timeout_s,
                              .test_step_delay_ms = config.test_step_delay_ms,
                              .recompute_chunk_tokens = config.recompute_chunk_tokens,
                              .recompute_adaptive = config.recompute_budget == "adaptive",
                              .idle_trim_s = config.idle_trim_s};
    HACK_CHECK(config.recompute_chunk_tokens >= 0, "--recompute-chunk-tokens must not be negative, got {}",
               config.recompute_chunk_tokens);
    HACK_CHECK(config.recompute_budget == "fixed" || config.recompute_budget == "adaptive",
               "--recompute-budget must be fixed or adaptive, got '{}'", config.recompute_budget);
    so.constraints = rt->constraints.get();
    if (!config.vault.address.empty()) {
      // A finished request's blocks past its prompt's last full block go to the vault, keyed
      // like the prefill nodes' (same fingerprint), so the conversation's next turn restores them.
      const NodeAddress a = parse_node_address(config.vault.address, "vault");
      net::VaultClientOptions vo{a.host, a.port};
      vo.auth = net::WireAuth(config.secret, net::kVaultAuthLabel);  // the vault admits only the cluster
      vault = std::make_unique<net::VaultClient>(*worker, vo);
      net::check_vault_namespace(config.vault.name_space);
      vault_codec = parse_block_codec(config.vault.codec);
      vault_dtype = cache_exact_dtype(rt->kv_options);
      vault_root = chain_root(prefix_fingerprint(rt->model, config.model.device, rt->kv_options, vault_dtype, vault_codec),
                              config.vault.name_space);
      so.record_block_tokens = rt->kv_options.block_tokens;
      so.on_finished_kv = [this](const FinishedKv& f) { store_finished(f); };
    }
    outbox = std::make_unique<EventOutbox>();
    scheduler = std::make_unique<DecodeScheduler>(*rt->engine, *rt->kv, so);
    // With a secret, KV is accepted only sealed with it (net/wire.h WireAuth); without one, from anyone who
    // reaches the UCX port, as before.
    receiver = std::make_unique<net::KvReceiver>(*worker, receiver_callbacks(), net::WireAuth(config.secret));
    receiver_for_callbacks.store(receiver.get(), std::memory_order_release);
    if (config.secret.empty()) spdlog::warn("no --secret-file: the KV data plane accepts messages from anyone who reaches its port");
    endpoints = NodeEndpoints{config.secret, [this] { return to_json(health()); }, [this] { return metrics_text(); }};
    HttpServerOptions ho;
    ho.host = config.host;
    ho.port = config.port;
    ho.threads = config.http_threads;
    http = std::make_unique<HttpServer>(ho, [this](HttpRequest req, std::shared_ptr<Responder> res) {
      handle(std::move(req), std::move(res));
    });
    HACK_CHECK(config.ready_probe_timeout_s > 0, "--ready-probe-timeout must be positive");
    probe_thread = std::thread([this] { probe_until_ready(); });
    spdlog::info("hack-decode: model {} ({}, cpu isa {}), kv {}, HTTP {}:{}, UCX {}", rt->name, rt->backend->name(),
                 cpu_isa_name(cpu_isa()), describe(rt->kv_options), config.host, http->port(), ucx_address());
    if (rt->device == DeviceKind::cuda) spdlog::info("hack-decode: {}", net::device_kv_path(*worker));
  }

  // Readiness covers the data plane: a prefill node can stream KV here only once a
  // connection to the listener has been accepted and has carried a message.
  void probe_until_ready() {
    // The address prefill nodes dial (--advertise-host): in a container only its interface may
    // be enabled for UCX (UCX_NET_DEVICES=eth0), where loopback is "Destination is unreachable".
    const std::string host = config.advertise_host.empty() ? net::probe_host(config.host) : config.advertise_host;
    for (int attempt = 1; !stopping; ++attempt) {
      const Status s = net::listener_probe(*worker, host, ucx_port, config.ready_probe_timeout_s);
      if (s) {
        ready = true;
        spdlog::info("hack-decode: ready: UCX listener {}:{} accepted the self-probe (attempt {})", host, ucx_port,
                     attempt);
        return;
      }
      spdlog::warn("hack-decode: not ready yet: {}", s.message());
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(config.ready_probe_timeout_s);
      while (!stopping && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  ~Impl() {
    stopping = true;
    if (probe_thread.joinable()) probe_thread.join();
    http.reset();      // no new requests
    receiver_for_callbacks.store(nullptr);
    receiver.reset();  // no more KV callbacks
    scheduler.reset(); // fails what is still open
    outbox.reset();    // ...and those failures reach their streams
    vault.reset();
    worker.reset();
  }

  // What the router hands prefill nodes: the bind address is no address to dial when it is 0.0.0.0.
  std::string ucx_address() const {
    return (config.advertise_host.empty() ? config.host : config.advertise_host) + ":" + std::to_string(ucx_port);
  }

  // Engine thread (DecodeSchedulerOptions::on_finished_kv).
  void store_finished(const FinishedKv& f) {
    const int n = encode_finished_blocks(f, vault_root, rt->kv_options.block_tokens, vault_codec, vault_dtype,
                                         rt->kv->shape(),
                                         [this](const BlockKey& key, const BlockKey& parent, bool first,
                                                std::vector<std::byte> value) {
                                           vault->store(config.vault.name_space, key, parent, first,
                                                        static_cast<uint8_t>(vault_codec), value);
                                         });
    if (n > 0) spdlog::debug("request {}: {} blocks of the conversation sent to the vault", f.id, n);
  }

  // A received payload kept in UCX's memory for the engine thread to copy once (null: the
  // scheduler copies it). Callbacks may run before `receiver` is assigned, hence the atomic.
  std::shared_ptr<const void> retain(std::span<const std::byte> payload) {
    net::KvReceiver* r = receiver_for_callbacks.load(std::memory_order_acquire);
    return r != nullptr ? r->retain_payload(payload) : nullptr;
  }

  net::KvReceiverCallbacks receiver_callbacks() {
    net::KvReceiverCallbacks cb;
    cb.on_page = [this](uint64_t id, uint32_t layer, std::span<const std::byte> page) {
      kv_bytes_received += page.size();
      metrics.add_kv_bytes_transferred("decode", page.size());
      scheduler->import_kv(id, layer, KvMessageKind::hack_page, page, retain(page));
    };
    cb.on_exact = [this](uint64_t id, uint32_t layer, std::span<const std::byte> payload) {
      kv_bytes_received += payload.size();
      metrics.add_kv_bytes_transferred("decode", payload.size());
      scheduler->import_kv(id, layer, KvMessageKind::exact, payload, retain(payload));
    };
    cb.on_exact_copy = [this](uint64_t id, uint32_t layer, std::span<const std::byte> payload) {
      kv_bytes_received += payload.size();
      scheduler->import_kv(id, layer, KvMessageKind::exact_copy, payload, retain(payload));
    };
    cb.on_request_done = [this](uint64_t id, std::span<const std::byte> payload) {
      try {
        const FirstToken first =
            parse_first_token(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
        scheduler->kv_complete(id, first.sample, first.seed);
      } catch (const Error& e) {
        scheduler->kv_failed(id, Status::error(fmt::format("bad request_done from the prefill node: {}", e.what())));
      }
    };
    cb.on_request_error = [this](uint64_t id, const Status& error) { scheduler->kv_failed(id, error); };
    cb.on_bad_message = [](net::EndpointId from, const Status& error) {
      spdlog::warn("UCX endpoint {}: unreadable message: {}", from, error.message());
    };
    cb.on_rejected = [this](net::EndpointId, const Status& error) {
      metrics.count_kv_message_rejected(net::WireAuth::rejection_reason(error));
    };
    return cb;
  }

  NodeHealth health() const {
    const DecodeSchedulerStats st = scheduler->stats();
    NodeHealth h;
    h.role = "decode";
    h.model = rt->name;
    h.ucx_address = ucx_address();
    h.ucx_worker = worker->address();
    h.host_id = host_id;
    h.draining = draining;
    h.ready = ready;
    h.kv_format = kv_format(*rt);
    h.queue_tokens = st.queue_tokens;
    h.running = st.running;
    h.waiting = st.waiting;
    h.kv_usage = st.kv_usage;
    h.kv_bytes_transferred = kv_bytes_received.load();
    h.kv_sequences = st.sequences;
    h.kv_bytes_used = st.kv_bytes_used;
    return h;
  }

  void handle(HttpRequest req, std::shared_ptr<Responder> res) {
    if (answer_common_node_request(req, *res, endpoints)) return;
    if (req.method == "POST" && req.path == "/internal/generate") {
      if (draining) {
        res->send(503, "application/json", node_error_body("this decode node is draining (shutting down)", "unavailable"));
        return;
      }
      generate(req, res);
    } else if (req.method == "POST" && req.path == "/internal/cancel") {
      if (const auto id = cancel_request_id(req, *res)) {
        cancel(*id, "cancelled by the caller");
        res->send(200, "application/json", "{}");
      }
    } else {
      answer_unknown_endpoint(req, *res);
    }
  }

  std::string metrics_text() {
    const DecodeSchedulerStats st = scheduler->stats();
    metrics.set_num_requests_running(st.running);
    metrics.set_num_requests_waiting(st.waiting);
    metrics.set_kv_cache_usage_ratio("decode", st.kv_usage);
    return metrics.serialize();
  }

  void cancel(uint64_t id, const std::string& why) {
    scheduler->cancel(id);
    std::shared_ptr<Responder> stream;
    {
      std::lock_guard lock(streams_mutex);
      auto it = streams.find(id);
      if (it == streams.end()) return;
      stream = std::move(it->second);
      streams.erase(it);
    }
    spdlog::info("request {}: {}", id, why);
    stream->send_event(to_json(NodeEvent{.kind = NodeEventKind::error, .message = why}));
    stream->end();
  }

  void generate(const HttpRequest& req, const std::shared_ptr<Responder>& res) {
    GenerateJob job;
    try {
      job = parse_generate_job(req.body);
      const int64_t total = static_cast<int64_t>(job.prompt.size()) + job.params.max_tokens;
      HACK_CHECK(total <= rt->max_model_len,
                 "prompt ({} tokens) + max_tokens ({}) exceeds this node's max model length of {} tokens",
                 job.prompt.size(), job.params.max_tokens, rt->max_model_len);
      HACK_CHECK(!job.remote_kv || job.kv_format.empty() || job.kv_format == kv_format(*rt),
                 "the prefill node's KV format '{}' differs from this decode node's '{}' (same --kv, --hack-* and "
                 "--fdc on every node)", job.kv_format, kv_format(*rt));
    } catch (const Error& e) {
      res->send(400, "application/json", node_error_body(e.what(), "invalid_request_error"));
      return;
    }
    const uint64_t id = job.request_id;
    {
      std::lock_guard lock(streams_mutex);
      if (streams.contains(id)) {
        res->send(409, "application/json", node_error_body(fmt::format("request {} is already open", id)));
        return;
      }
      streams.emplace(id, res);
    }
    res->start_sse();
    res->on_client_closed([this, id] {
      spdlog::info("request {}: caller went away, generation cancelled", id);
      scheduler->cancel(id);
      std::lock_guard lock(streams_mutex);
      streams.erase(id);
    });
    DecodeRequest dr{.id = id, .prompt = std::move(job.prompt), .params = job.params, .eos_ids = rt->eos_ids,
                     .remote_kv = job.remote_kv, .generated = std::move(job.generated)};
    const auto t0 = std::chrono::steady_clock::now();
    auto last = std::make_shared<std::chrono::steady_clock::time_point>(t0);
    // Runs on the outbox's output thread, never on the engine thread.
    DecodeEventFn on_event = [this, id, res, t0, last](const DecodeEvent& e) {
      NodeEvent ne;
      switch (e.kind) {
        case DecodeEventKind::accepted:
          ne.kind = NodeEventKind::accepted;
          ne.ucx_address = ucx_address();
          ne.ucx_worker = worker->address();
          ne.host_id = host_id;
          break;
        case DecodeEventKind::token: {
          ne.kind = NodeEventKind::token;
          ne.sample = e.sample;
          ne.index = e.index;
          const auto now = std::chrono::steady_clock::now();
          if (e.index > 0) metrics.observe_inter_token_latency_s(std::chrono::duration<double>(now - *last).count());
          *last = now;
          metrics.add_generation_tokens(1);
          break;
        }
        case DecodeEventKind::finished:
          ne.kind = NodeEventKind::finished;
          ne.finish_reason = e.finish_reason;
          ne.prompt_tokens = e.prompt_tokens;
          ne.completion_tokens = e.completion_tokens;
          metrics.observe_e2e_request_latency_s(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          metrics.count_request_success(finish_reason_name(e.finish_reason));
          break;
        case DecodeEventKind::failed:
          ne.kind = NodeEventKind::error;
          ne.message = e.message;
          metrics.count_request_error("decode");
          break;
      }
      res->send_event(to_json(ne));
      if (e.kind == DecodeEventKind::finished || e.kind == DecodeEventKind::failed) {
        res->end();
        std::lock_guard lock(streams_mutex);
        streams.erase(id);
      }
    };
    const Status st = scheduler->submit(std::move(dr), outbox->relay(std::move(on_event)));
    if (!st) {
      res->send_event(to_json(NodeEvent{.kind = NodeEventKind::error, .message = st.message()}));
      res->end();
      std::lock_guard lock(streams_mutex);
      streams.erase(id);
    }
  }
};

DecodeServer::DecodeServer(const DecodeServerConfig& config) : impl_(std::make_unique<Impl>(config)) {}
DecodeServer::~DecodeServer() = default;
int DecodeServer::port() const { return impl_->http->port(); }
std::string DecodeServer::ucx_address() const { return impl_->ucx_address(); }

bool DecodeServer::drain(double timeout_s) {
  impl_->draining = true;
  const DecodeSchedulerStats st = impl_->scheduler->stats();
  spdlog::info("hack-decode: draining: {} running, {} waiting; up to {} s", st.running, st.waiting, timeout_s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool idle = impl_->scheduler->wait_idle(timeout_s);
  // Then every stream's last event handed to its connection...
  while (idle) {
    {
      std::lock_guard lock(impl_->streams_mutex);
      if (impl_->streams.empty()) break;
    }
    if (std::chrono::steady_clock::now() > deadline) idle = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (idle) {
    // ...and a moment for those bytes to leave before the server closes its sockets.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    spdlog::info("hack-decode: drained");
  } else {
    spdlog::warn("hack-decode: requests still open after {} s; they end with an error", timeout_s);
  }
  return idle;
}

}  // namespace hack::server
