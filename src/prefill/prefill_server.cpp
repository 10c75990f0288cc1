#include "hack/prefill/prefill_server.h"

#include <mutex>
#include <nlohmann/json.hpp>
#include <future>

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "hack/core/cpu_features.h"
#include "hack/net/ucx_worker.h"
#include "hack/http/http_server.h"
#include "hack/node/metrics.h"
#include "hack/node/node_http.h"
#include "hack/node/node_protocol.h"
#include "hack/prefill/prefill_worker.h"
#include "hack/node/node_address.h"

namespace hack::server {

void add_prefill_flags(FlagSet& flags, PrefillServerConfig& c) {
  add_model_flags(flags, c.model);
  add_served_name_flag(flags, c.model);
  flags.add_string("host", &c.host, "address to bind HTTP to");
  flags.add_int("port", &c.port, "HTTP port of the internal API (0 = any free port)");
  flags.add_secret("secret", &c.secret, "shared secret required on internal endpoints (X-Hack-Secret); empty = none");
  flags.add_int("http-threads", &c.http_threads, "HTTP I/O threads");
  flags.add_int64("window-mb", &c.window_mb, "KV bytes in flight per decode node before sends wait (MiB)");
  flags.add_int64("kv-message-kb", &c.kv_message_kb,
                  "KV pages of one layer are sent together in messages of about this many KiB (0 = one page per "
                  "message)");
  flags.add_string("kv-gather", &c.kv_gather,
                   "how a KV message's pages reach UCX: copy (into one buffer, sent contiguous: faster over tcp with "
                   "UCX 1.13), iov (in place, no copy: faster over shared memory) or auto (iov where UCX put the "
                   "decode node's endpoint on shared memory, copy elsewhere)");
  flags.add_string("kv-checksum", &c.kv_checksum,
                   "KV page checksums: always (hashed here and on arrival) or auto (none where UCX put the decode "
                   "node's endpoint on shared memory, whose bytes never leave this host's memory; always elsewhere)");
  flags.add_string("kv-connect", &c.kv_connect,
                   "how KV endpoints to decode nodes are opened: auto (by UCX worker address when the decode node runs "
                   "on this host, so UCX may use shared memory; by its host:port listener otherwise) or listener "
                   "(always host:port)");
  flags.add_float("send-timeout", &c.send_timeout_s, "seconds a job's KV may take to leave after its prefill");
  flags.add_int("send-retries", &c.send_retries,
                "times a job whose KV send failed on a broken decode endpoint (reset, timeout, a restarted node) "
                "runs again on a freshly connected endpoint before it fails");
  flags.add_float("send-retry-wait", &c.send_retry_wait_s,
                  "seconds such a retry waits for the failed attempt's messages to be dropped (no retry after)");
  flags.add_int("max-draining-jobs", &c.max_draining_jobs,
                "prefills whose KV may still be streaming to their decode nodes while the next prompt computes "
                "(each keeps its KV here until sent; a prompt also waits while the KV budget cannot hold it beside "
                "them); 0 = the next prompt starts only once the previous one's KV has left");
  flags.add_int("prefill-batch-jobs", &c.prefill_batch_jobs,
                "up to this many queued short prompts (each, and all together, within one --prefill-chunk) share one "
                "batched prefill forward; 1 = every prompt alone, bit-identical to hack-run (a batch rounds logits "
                "differently in the last bits)");
  flags.add_bool("enable-test-hooks", &c.enable_test_hooks,
                 "honour fault-injection fields (test_corrupt_page), --test-layer-delay-ms and POST "
                 "/internal/test/hold-ucx; never in production");
  flags.add_int("test-layer-delay-ms", &c.test_layer_delay_ms,
                "with --enable-test-hooks: sleep this long after each layer (makes transfers long for fault tests)");
  flags.add_string("prefix-cache-bytes", &c.prefix_cache_bytes,
                   "local LRU prefix cache of full KV blocks, e.g. 256M, 2G; 0 = none (with no --vault: no prefix caching)");
  flags.add_bool("prefix-whole-chunks", &c.prefix_whole_chunks,
                 "restore cached prefixes in whole --prefill-chunk units only, so the prefill's KV and logits are "
                 "bit-identical to no cache (default: any whole block — more reuse, the rest of the prompt may round "
                 "differently in its last bits)");
  flags.add_bool("prefix-cache-pages", &c.prefix_cache_pages,
                 "--kv hack: keep each cached block's HACK pages beside it in the local cache, so a hit sends them "
                 "as the computing prompt closed them instead of quantizing the restored tokens again (K4/V4: about "
                 "0.55x the int8-head block's bytes of --prefix-cache-bytes); --prefix-cache-pages=false: quantize again");
  flags.add_bool("prefix-cache-tail", &c.prefix_cache_tail,
                 "keep a prompt's last partial block (all but its last token) in the local cache too, so the same "
                 "prompt again computes only its last token (not with --prefix-whole-chunks; never sent to the vault)");
  add_vault_flags(flags, c.vault, /*restores=*/true);
  flags.add_float("drain-timeout", &c.drain_timeout_s,
                  "on SIGTERM: seconds to finish queued and running prefills (taking no new ones) before exiting");
  flags.add_bool("json-logs", &c.json_logs, "log one JSON object per line");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
}

namespace {

// The call's decode node → DecodePeer: by worker address when that node runs on this host
// (same boot and namespaces: UCX may move the KV over shared memory) and by_address allows,
// else by its "host:port" listener.
DecodePeer parse_peer(const PrefillCall& call, const std::string& host_id, bool by_address) {
  const NodeAddress node = parse_node_address(call.decode_ucx, "decode_ucx");
  DecodePeer peer;
  peer.host = node.host;
  peer.port = node.port;
  if (by_address && !host_id.empty() && call.decode_host_id == host_id) peer.worker_address = call.decode_ucx_worker;
  return peer;
}

}  // namespace

struct PrefillServer::Impl {
  PrefillServerConfig config;
  std::unique_ptr<ModelRuntime> rt;
  std::unique_ptr<net::UcxWorker> ucx;
  bool kv_connect_by_address = true;  // --kv-connect auto
  std::string host_id;                // net::ucx_host_id()
  std::unique_ptr<PrefillWorker> worker;
  bool worker_has_prefix_cache = false;
  std::atomic<bool> draining{false};
  std::atomic<int> replies_pending{0};  // accepted prefills whose HTTP reply is not yet sent
  int block_tokens = 64;
  Metrics metrics;
  std::thread ucx_hold;  // test hook: holds the UCX progress thread (POST /internal/test/hold-ucx)
  std::mutex retries_mutex;
  uint64_t retries_reported = 0;  // PrefillWorkerStats::send_retries already in metrics (retries_mutex)
  uint64_t connects_reported[2] = {0, 0};  // connects_by_address, _by_listener already in metrics (retries_mutex)
  uint64_t batched_reported = 0;  // PrefillWorkerStats::batched_jobs already in metrics (retries_mutex)
  NodeEndpoints endpoints;
  std::unique_ptr<HttpServer> http;

  explicit Impl(const PrefillServerConfig& c) : config(c) {
    HACK_CHECK(config.prefill_batch_jobs >= 1 && config.prefill_batch_jobs <= 256,
               "--prefill-batch-jobs must be in [1, 256], got {}", config.prefill_batch_jobs);
    // One job computes at a time, or a batched step's jobs: the sequences of one forward.
    rt = load_model_runtime(config.model, RuntimeParts{.device_max_sequences = config.prefill_batch_jobs});
    ucx = std::make_unique<net::UcxWorker>();
    HACK_CHECK(config.kv_connect == "auto" || config.kv_connect == "listener",
               "--kv-connect must be auto or listener, got '{}'", config.kv_connect);
    kv_connect_by_address = config.kv_connect == "auto";
    host_id = net::ucx_host_id();
    PrefillWorkerOptions wo;
    wo.kv = rt->kv_options;
    wo.engine = engine_options_from(config.model);
    HACK_CHECK(config.window_mb > 0, "--window-mb must be positive, got {}", config.window_mb);
    wo.sender.max_in_flight_bytes = static_cast<size_t>(config.window_mb) << 20;
    HACK_CHECK(config.kv_message_kb >= 0 && config.kv_message_kb <= (int64_t{1} << 20),
               "--kv-message-kb must be in [0, 1048576], got {}", config.kv_message_kb);
    wo.sender.message_bytes = static_cast<size_t>(config.kv_message_kb) << 10;
    wo.sender.gather = net::parse_kv_gather(config.kv_gather);
    wo.sender.checksum = net::parse_kv_checksum(config.kv_checksum);
    wo.sender.auth = net::WireAuth(config.secret);  // KV messages carry the cluster's MAC (none without a secret)
    wo.send_timeout_s = config.send_timeout_s;
    wo.send_retries = config.send_retries;
    wo.retry_wait_s = config.send_retry_wait_s;
    HACK_CHECK(config.max_draining_jobs >= 0 && config.max_draining_jobs <= 1024,
               "--max-draining-jobs must be in [0, 1024], got {}", config.max_draining_jobs);
    wo.max_draining_jobs = config.max_draining_jobs;
    wo.batch_jobs = config.prefill_batch_jobs;
    HACK_CHECK(config.test_layer_delay_ms == 0 || config.enable_test_hooks,
               "--test-layer-delay-ms needs --enable-test-hooks");
    wo.test_layer_delay_ms = config.test_layer_delay_ms;
    const size_t local_bytes = parse_byte_size(config.prefix_cache_bytes, "prefix-cache-bytes");
    const VaultFlags& vf = config.vault;
    if (local_bytes > 0 || !vf.address.empty()) {
      PrefixCacheOptions po;
      po.codec = parse_block_codec(vf.codec);
      po.name_space = vf.name_space;
      po.local_bytes = local_bytes;
      if (!vf.address.empty()) {
        const NodeAddress a = parse_node_address(vf.address, "vault");
        po.vault = net::VaultClientOptions{a.host, a.port};
        po.vault->auth = net::WireAuth(config.secret, net::kVaultAuthLabel);  // the vault admits only the cluster
      }
      HACK_CHECK(vf.min_blocks >= 1, "--vault-min-blocks must be at least 1");
      HACK_CHECK(vf.timeout_s > 0, "--vault-timeout must be positive");
      po.vault_min_blocks = vf.min_blocks;
      po.vault_timeout_s = vf.timeout_s;
      po.whole_chunks = config.prefix_whole_chunks;
      po.keep_pages = config.prefix_cache_pages;
      po.keep_tail = config.prefix_cache_tail;
      const DType exact = cache_exact_dtype(rt->kv_options);
      wo.prefix_fingerprint = prefix_fingerprint(rt->model, config.model.device, rt->kv_options, exact, po.codec);
      wo.prefix_cache = po;
      // A decode node that stores conversations needs the prompt's partial last block exactly.
      wo.send_exact_tail = po.vault.has_value() && rt->kv_options.mode == KvMode::hack;
      spdlog::info("hack-prefill: prefix cache {} local, vault {}, codec {}, namespace {}, fingerprint {}",
                   config.prefix_cache_bytes, vf.address.empty() ? "none" : vf.address, vf.codec, vf.name_space,
                   wo.prefix_fingerprint.digest().substr(0, 16));
    }
    worker_has_prefix_cache = wo.prefix_cache.has_value();
    block_tokens = wo.kv.block_tokens;
    wo.constraints = rt->constraints.get();
    worker = std::make_unique<PrefillWorker>(take_engine(*rt), *ucx, wo);
    endpoints = NodeEndpoints{config.secret, [this] { return to_json(health()); }, [this] { return metrics_text(); }};
    HttpServerOptions ho;
    ho.host = config.host;
    ho.port = config.port;
    ho.threads = config.http_threads;
    http = std::make_unique<HttpServer>(ho, [this](HttpRequest req, std::shared_ptr<Responder> res) {
      handle(std::move(req), std::move(res));
    });
    spdlog::info("hack-prefill: model {} ({}, cpu isa {}), kv {}, HTTP {}:{}", rt->name, config.model.device,
                 cpu_isa_name(cpu_isa()), describe(rt->kv_options), config.host, http->port());
    if (rt->device == DeviceKind::cuda) spdlog::info("hack-prefill: {}", net::device_kv_path(*ucx));
  }

  ~Impl() {
    http.reset();
    if (ucx_hold.joinable()) ucx_hold.join();
    worker.reset();
    ucx.reset();
  }

  std::string metrics_text() {
    {
      std::lock_guard lock(retries_mutex);
      const PrefillWorkerStats st = worker->stats();
      metrics.add_kv_send_retries(st.send_retries - retries_reported);
      retries_reported = st.send_retries;
      metrics.add_kv_connects("address", st.connects_by_address - connects_reported[0]);
      metrics.add_kv_connects("listener", st.connects_by_listener - connects_reported[1]);
      connects_reported[0] = st.connects_by_address;
      connects_reported[1] = st.connects_by_listener;
      metrics.add_prefill_batched_jobs(st.batched_jobs - batched_reported);
      batched_reported = st.batched_jobs;
    }
    return metrics.serialize();
  }

  NodeHealth health() const {
    NodeHealth h;
    h.role = "prefill";
    h.draining = draining;
    h.kv_format = kv_format(*rt);
    h.model = rt->name;
    h.queue_tokens = worker->queue_tokens();
    h.running = h.queue_tokens > 0 ? 1 : 0;
    const PrefillWorkerStats ws = worker->stats();
    h.kv_bytes_transferred = ws.kv_bytes_sent;
    h.kv_sequences = ws.kv_sequences;
    h.kv_bytes_used = ws.kv_bytes_used;
    return h;
  }

  void handle(HttpRequest req, std::shared_ptr<Responder> res) {
    if (answer_common_node_request(req, *res, endpoints)) return;
    if (req.method == "POST" && req.path == "/internal/prefill") {
      if (draining) {
        res->send(503, "application/json", node_error_body("this prefill node is draining (shutting down)", "unavailable"));
        return;
      }
      prefill(req, res);
    } else if (req.method == "POST" && req.path == "/internal/cancel") {
      if (const auto id = cancel_request_id(req, *res)) {
        if (worker->cancel(*id)) spdlog::info("request {}: prefill cancelled by the caller", *id);
        res->send(200, "application/json", "{}");
      }
    } else if (config.enable_test_hooks && req.method == "POST" && req.path == "/internal/test/hold-ucx") {
      hold_ucx(req, *res);
    } else {
      answer_unknown_endpoint(req, *res);
    }
  }

  // Fault tests: the UCX progress thread sleeps for {"seconds": s}, as a node does that is
  // descheduled, so events on its endpoints (a peer gone) wait unread. Answers once the
  // thread is held.
  void hold_ucx(const HttpRequest& req, Responder& res) {
    double seconds = 0;
    try {
      const auto j = nlohmann::json::parse(req.body);
      seconds = j.at("seconds").get<double>();
      HACK_CHECK(seconds > 0 && seconds <= 30, "seconds must be in (0, 30]");
    } catch (const std::exception& e) {
      res.send(400, "application/json", node_error_body(fmt::format("hold-ucx: {}", e.what()), "invalid_request_error"));
      return;
    }
    if (ucx_hold.joinable()) ucx_hold.join();  // the previous hold has ended or ends soon
    auto held = std::make_shared<std::promise<void>>();
    auto started = held->get_future();
    ucx_hold = std::thread([this, seconds, held] {
      ucx->run_on_worker([&] {
        held->set_value();
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      });
    });
    started.wait();
    spdlog::warn("test hook: UCX progress thread held for {} s", seconds);
    res.send(200, "application/json", "{}");
  }

  void prefill(const HttpRequest& req, const std::shared_ptr<Responder>& res) {
    PrefillJob job;
    try {
      PrefillCall call = parse_prefill_call(req.body);
      const int64_t total = static_cast<int64_t>(call.prompt.size()) + call.params.max_tokens;
      HACK_CHECK(total <= rt->max_model_len,
                 "prompt ({} tokens) + max_tokens ({}) exceeds this node's max model length of {} tokens",
                 call.prompt.size(), call.params.max_tokens, rt->max_model_len);
      HACK_CHECK(call.kv_format.empty() || call.kv_format == kv_format(*rt),
                 "the decode node's KV format '{}' differs from this prefill node's '{}' (same --kv, --hack-* and "
                 "--fdc on every node)", call.kv_format, kv_format(*rt));
      HACK_CHECK(!call.corrupt_page || config.enable_test_hooks,
                 "test_corrupt_page needs a node started with --enable-test-hooks");
      job.request_id = call.request_id;
      HACK_CHECK(call.generated.size() < static_cast<size_t>(call.params.max_tokens),
                 "{} generated tokens leave nothing to generate under max_tokens {}", call.generated.size(),
                 call.params.max_tokens);
      job.tokens = std::move(call.prompt);
      job.generated_tokens = static_cast<int>(call.generated.size());
      job.tokens.insert(job.tokens.end(), call.generated.begin(), call.generated.end());
      job.sampling = call.params;
      job.eos_ids = rt->eos_ids;
      job.peer = parse_peer(call, host_id, kv_connect_by_address);
      job.corrupt_page_for_test = call.corrupt_page;
    } catch (const Error& e) {
      res->send(400, "application/json", node_error_body(e.what(), "invalid_request_error"));
      return;
    }
    const uint64_t id = job.request_id;
    job.on_done = [this, res](uint64_t request_id, PrefillOutcome outcome) {
      struct Sent {  // the reply is handed to the connection when this goes out of scope
        std::atomic<int>& pending;
        ~Sent() { --pending; }
      } sent{replies_pending};
      if (auto* r = std::get_if<PrefillResult>(&outcome)) {
        metrics.add_kv_bytes_transferred("prefill", r->kv_bytes);
        metrics.add_prompt_tokens(r->prompt_tokens);
        metrics.observe_request_queue_time_s(r->timings.queue_s);
        const PrefillTimings& tm = r->timings;
        for (const auto& [stage, s] : {std::pair{"setup", tm.setup_s}, {"compute", tm.compute_s}, {"export", tm.export_s}, {"quantize", tm.quantize_s}, {"send", tm.send_s},
                                       {"capture", tm.capture_s}, {"sample", tm.sample_s}, {"store", tm.store_s},
                                       {"drain", tm.drain_s}})
          metrics.observe_prefill_stage_s(stage, s);
        if (r->prefix.tokens > 0) {
          metrics.observe_prefill_stage_s("restore_lookup", r->prefix.lookup_s);
          metrics.observe_prefill_stage_s("restore_decode", r->prefix.decode_s);
          metrics.observe_prefill_stage_s("restore_import", r->prefix.import_s);
        }
        if (worker_has_prefix_cache) {
          metrics.add_prefix_cache_hits("local", static_cast<uint64_t>(r->prefix.local_blocks));
          metrics.add_prefix_cache_hits("vault", static_cast<uint64_t>(r->prefix.vault_blocks));
          metrics.add_vault_hits(static_cast<uint64_t>(r->prefix.vault_blocks));
          if (r->prefix.tokens > 0) metrics.observe_vault_restore_s(r->prefix.restore_s);
          const int full = r->prompt_tokens > 0 ? (r->prompt_tokens - 1) / block_tokens : 0;
          metrics.add_prefix_cache_misses(static_cast<uint64_t>(std::max(0, full - r->prefix.local_blocks - r->prefix.vault_blocks)));
        }
        PrefillReply reply{FirstToken{r->first, r->seed}, r->kv_bytes, r->timings.prefill_s, r->timings.total_s};
        reply.prompt_logprobs = std::move(r->prompt_logprobs);
        res->send(200, "application/json", to_json(reply));
      } else {
        const Status& error = std::get<Status>(outcome);
        spdlog::warn("request {}: prefill failed: {}", request_id, error.message());
        metrics.count_request_error("prefill");
        res->send(502, "application/json", node_error_body(error.message(), "prefill_failed"));
      }
    };
    res->on_client_closed([this, id] {
      if (worker->cancel(id)) spdlog::info("request {}: caller went away, prefill cancelled", id);
    });
    ++replies_pending;
    const Status st = worker->submit(std::move(job));
    if (!st) {
      --replies_pending;  // on_done never runs for a refused job
      res->send(400, "application/json", node_error_body(st.message(), "invalid_request_error"));
    }
  }
};

PrefillServer::PrefillServer(const PrefillServerConfig& config) : impl_(std::make_unique<Impl>(config)) {}
PrefillServer::~PrefillServer() = default;
int PrefillServer::port() const { return impl_->http->port(); }

bool PrefillServer::drain(double timeout_s) {
  impl_->draining = true;
  spdlog::info("hack-prefill: draining: {} tokens queued or running; up to {} s", impl_->worker->queue_tokens(),
               timeout_s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (impl_->worker->queue_tokens() > 0 || impl_->replies_pending > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      spdlog::warn("hack-prefill: jobs still open after {} s; they end with an error", timeout_s);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last replies leave their sockets
  spdlog::info("hack-prefill: drained");
  return true;
}

}  // namespace hack::server
