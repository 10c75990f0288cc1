// hack-vault as a library object (include/hack/vault/vault_server.h).
#include "hack/vault/vault_server.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "hack/core/clock.h"
#include "hack/http/http_server.h"
#include "hack/kv/kv_block.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/vault_protocol.h"
#include "hack/net/wire.h"
#include "hack/node/metrics.h"
#include "hack/node/node_http.h"
#include "hack/node/node_protocol.h"

namespace hack::vault {

using net::WireType;

void add_vault_flags(FlagSet& flags, VaultServerConfig& c) {
  flags.add_string("host", &c.host, "address to bind HTTP and UCX to");
  flags.add_int("port", &c.port, "HTTP port of /health and /metrics (0 = any free port)");
  flags.add_int("ucx-port", &c.ucx_port, "UCX port the prefill and decode nodes connect to (0 = any free port)");
  flags.add_string("max-bytes", &c.max_bytes, "byte budget over all namespaces, e.g. 512M, 8G (LRU evicts chain tails past it)");
  flags.add_list("namespace-quota", &c.namespace_quotas, "NAME=SIZE: a namespace's own budget, e.g. tenant-a=1G (repeatable)");
  flags.add_string("data-dir", &c.data_dir, "persist blocks in append-only segment files here (empty = memory only)");
  flags.add_bool("fsync", &c.fsync, "fdatasync after every stored record (durable across power loss, slower)");
  flags.add_float("orphan-timeout", &c.orphan_timeout_s, "seconds a block waits for its parent before it is dropped");
  flags.add_secret("secret", &c.secret,
                   "cluster secret: required on internal HTTP endpoints (X-Hack-Secret) and the key of the vault "
                   "protocol's MAC (every call and reply); empty = none");
  flags.add_int("http-threads", &c.http_threads, "HTTP I/O threads");
  flags.add_bool("enable-test-hooks", &c.enable_test_hooks,
                 "serve POST /internal/test/corrupt and GET /internal/test/keys for fault tests; never in production");
  flags.add_bool("json-logs", &c.json_logs, "log one JSON object per line");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
}

BlockStoreOptions store_options(const VaultServerConfig& c) {
  BlockStoreOptions o;
  o.max_bytes = parse_byte_size(c.max_bytes, "max-bytes");
  HACK_CHECK(o.max_bytes > 0, "--max-bytes must be positive");
  for (const std::string& q : c.namespace_quotas) {
    const auto eq = q.find('=');
    HACK_CHECK(eq != std::string::npos, "--namespace-quota: '{}' is not NAME=SIZE", q);
    const std::string name = q.substr(0, eq);
    net::check_vault_namespace(name);
    o.namespace_quota_bytes[name] = parse_byte_size(q.substr(eq + 1), "namespace-quota");
  }
  o.data_dir = c.data_dir;
  o.fsync = c.fsync;
  HACK_CHECK(c.orphan_timeout_s > 0, "--orphan-timeout must be positive");
  o.orphan_timeout_s = c.orphan_timeout_s;
  return o;
}

namespace {

nlohmann::json stats_json(const BlockStoreStats& s) {
  return {{"blocks", s.blocks},
          {"bytes", s.bytes},
          {"staged_blocks", s.staged_blocks},
          {"staged_bytes", s.staged_bytes},
          {"memory_pinned_bytes", s.memory_pinned_bytes},
          {"puts", s.puts},
          {"stored", s.stored},
          {"duplicates", s.duplicates},
          {"rejected", s.rejected},
          {"lookups", s.lookups},
          {"hit_blocks", s.hit_blocks},
          {"miss_blocks", s.miss_blocks},
          {"evictions", s.evictions},
          {"evicted_bytes", s.evicted_bytes},
          {"orphans_expired", s.orphans_expired},
          {"corrupt_blocks", s.corrupt_blocks},
          {"deletes", s.deletes},
          {"namespace_bytes", s.namespace_bytes},
          {"recovery",
           {{"segments", s.recovery.segments},
            {"records", s.recovery.records},
            {"blocks_restored", s.recovery.blocks_restored},
            {"torn_records", s.recovery.torn_records},
            {"corrupt_records", s.recovery.corrupt_records},
            {"orphans_dropped", s.recovery.orphans_dropped}}},
          {"segment_files", s.segment_files},
          {"disk_bytes", s.disk_bytes},
          {"compactions", s.compactions}};
}

}  // namespace

struct VaultServer::Impl {
  VaultServerConfig config;
  BlockStore store;
  server::Metrics metrics;
  std::unique_ptr<net::UcxWorker> ucx;
  uint16_t ucx_port = 0;
  server::NodeEndpoints endpoints;
  std::unique_ptr<server::HttpServer> http;
  std::atomic<uint64_t> bad_messages{0};
  std::atomic<uint64_t> rejected_messages{0};  // refused for their MAC (never decoded)
  net::WireAuth auth;                           // the vault protocol's key (kVaultAuthLabel), off without a secret
  std::mutex evictions_mutex;
  uint64_t evictions_seen = 0;

  explicit Impl(const VaultServerConfig& c)
      : config(c), store(store_options(c)), auth(c.secret, net::kVaultAuthLabel) {
    if (config.secret.empty())
      spdlog::warn("no --secret-file: the vault accepts calls from anyone who reaches its UCX port");
    const BlockStoreStats s = store.stats();
    if (!config.data_dir.empty())
      spdlog::info("hack-vault: recovered {} blocks ({} bytes) from {} segments in {} ({} torn, {} corrupt records dropped)",
                   s.recovery.blocks_restored, s.bytes, s.recovery.segments, config.data_dir, s.recovery.torn_records,
                   s.recovery.corrupt_records);
    evictions_seen = s.evictions;
    metrics.set_vault_usage(static_cast<double>(s.blocks), static_cast<double>(s.bytes));
    // A restarted vault must get its port back while the old connections linger in TIME_WAIT.
    // The TCP connection manager reads this from the environment only (not ucp_config), and
    // an operator's own setting wins.
    ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
    ucx = std::make_unique<net::UcxWorker>();
    ucx->set_message_handler(net::kVaultRequestAmId,
                             [this](net::EndpointId from, std::span<const std::byte> header,
                                    std::span<const std::byte> payload) { on_message(from, header, payload); });
    ucx_port = ucx->listen(config.host, static_cast<uint16_t>(config.ucx_port));
    endpoints = server::NodeEndpoints{config.secret, [this] { return health_json(); },
                                      [this] { return metrics.serialize(); }};
    server::HttpServerOptions ho;
    ho.host = config.host;
    ho.port = config.port;
    ho.threads = config.http_threads;
    http = std::make_unique<server::HttpServer>(
        ho, [this](server::HttpRequest req, std::shared_ptr<server::Responder> res) { handle(req, *res); });
    promote_thread = std::thread([this] { run_promotes(); });
    spdlog::info("hack-vault: budget {} bytes, {}, HTTP {}:{}, UCX {}:{}", store.options().max_bytes,
                 config.data_dir.empty() ? std::string("memory only") : "persisted in " + config.data_dir, config.host,
                 http->port(), config.host, ucx_port);
  }

  ~Impl() {
    // No call is delivered past this (it returns once the progress thread has dropped the
    // handler, so none is running either): a handler replies through `ucx`, which goes below.
    ucx->set_message_handler(net::kVaultRequestAmId, {});
    http.reset();
    {
      std::lock_guard lock(promote_mutex);
      promote_stop = true;
    }
    promote_wake.notify_all();
    if (promote_thread.joinable()) promote_thread.join();
    ucx.reset();
  }

  std::string health_json() const {
    const BlockStoreStats s = store.stats();
    nlohmann::json j = {{"role", "vault"},
                        {"ucx_address", config.host + ":" + std::to_string(ucx_port)},
                        {"budget_bytes", store.options().max_bytes},
                        {"bad_messages", bad_messages.load()},
                        {"rejected_messages", rejected_messages.load()},
                        {"store", stats_json(s)}};
    return j.dump();
  }

  void handle(const server::HttpRequest& req, server::Responder& res) {
    if (server::answer_common_node_request(req, res, endpoints)) return;
    if (config.enable_test_hooks && req.method == "POST" && req.path == "/internal/test/corrupt") {
      try {
        const auto body = nlohmann::json::parse(req.body);
        const bool done = store.corrupt_for_test(body.at("namespace").get<std::string>(),
                                                 parse_block_key(body.at("key").get<std::string>()));
        res.send(done ? 200 : 404, "application/json", nlohmann::json{{"corrupted", done}}.dump());
      } catch (const std::exception& e) {
        res.send(400, "application/json", server::node_error_body(e.what(), "invalid_request_error"));
      }
      return;
    }
    if (config.enable_test_hooks && req.method == "GET" && req.path == "/internal/test/keys") {
      nlohmann::json keys = nlohmann::json::object();
      for (const auto& [ns, list] : store.keys_for_test()) {
        auto& out = keys[ns] = nlohmann::json::array();
        for (const BlockKey& k : list) out.push_back(to_hex(k));
      }
      res.send(200, "application/json", keys.dump());
      return;
    }
    server::answer_unknown_endpoint(req, res);
  }

  void reply(net::EndpointId to, WireType type, uint64_t id, uint32_t layer, std::vector<std::byte> payload,
             net::UcxWorker::SendCallback done = {}) {
    std::vector<std::byte> header = auth.seal(net::encode_wire_header(net::make_wire_header(type, id, layer, 0, payload)),
                                              payload, net::WireChannel::reply);  // before payload is moved from
    ucx->send(to, net::kVaultReplyAmId, std::move(header), std::move(payload), std::move(done));
  }

  void update_usage() {
    const BlockStoreStats s = store.stats();
    metrics.set_vault_usage(static_cast<double>(s.blocks), static_cast<double>(s.bytes));
    std::lock_guard lock(evictions_mutex);
    if (s.evictions > evictions_seen) metrics.add_vault_evictions(s.evictions - evictions_seen);
    evictions_seen = s.evictions;
  }

  // Progress thread.
  void on_message(net::EndpointId from, std::span<const std::byte> sealed, std::span<const std::byte> payload) {
    // Authenticated first: a call without this cluster's vault MAC is dropped unread and
    // unanswered (an answer would tell a stranger what the vault holds).
    std::span<const std::byte> header_bytes;
    if (const Status s = auth.open(sealed, payload, net::WireChannel::data, header_bytes); !s) {
      ++rejected_messages;
      metrics.count_vault_message_rejected(net::WireAuth::rejection_reason(s));
      spdlog::error("vault: refused a message from endpoint {}: {}", from, s.message());
      return;
    }
    net::WireHeader h;
    if (const Status s = net::decode_wire_header(header_bytes, h); !s) {
      ++bad_messages;
      spdlog::warn("vault: dropped a message from endpoint {}: {}", from, s.message());
      return;
    }
    try {
      if (const Status s = net::verify_wire_payload(h, payload); !s) fail("{}", s.message());
      switch (h.type) {
        case WireType::vault_store: on_store(payload); break;
        case WireType::vault_lookup: on_lookup(from, h.request_id, payload); break;
        case WireType::vault_promote: on_promote(from, h.request_id, payload); break;
        case WireType::vault_delete: {
          const net::VaultKeysMessage m = net::decode_vault_keys(payload);
          HACK_CHECK(m.keys.size() == 1, "vault_delete: {} keys, expected one", m.keys.size());
          const size_t removed = store.remove(m.name_space, m.keys[0]);
          reply(from, WireType::vault_count, h.request_id, 0, net::encode_vault_count(removed));
          update_usage();
          break;
        }
        case WireType::vault_stats: {
          const std::string text = health_json();
          const auto* b = reinterpret_cast<const std::byte*>(text.data());
          reply(from, WireType::vault_stats_reply, h.request_id, 0, {b, b + text.size()});
          break;
        }
        default: fail("{} is not a vault call", net::wire_type_name(h.type));
      }
    } catch (const std::exception& e) {
      ++bad_messages;
      spdlog::warn("vault: call {} ({}) from endpoint {} failed: {}", h.request_id, net::wire_type_name(h.type), from,
                   e.what());
      if (h.type != WireType::vault_store) reply(from, WireType::vault_error, h.request_id, 0, net::wire_text(e.what()));
    }
  }

  void on_store(std::span<const std::byte> payload) {
    const net::VaultStoreMessage m = net::decode_vault_store(payload);
    // The value must be a kv_block the vault can stream layer by layer.
    const KvBlockHeader kh = decode_kv_block_header(m.value);
    HACK_CHECK(static_cast<uint8_t>(kh.codec) == m.codec, "vault_store: declared codec {} but the block is {}", m.codec,
               block_codec_name(kh.codec));
    Block b;
    b.name_space = m.name_space;
    b.key = m.key;
    b.parent = m.parent;
    b.first = m.first;
    b.codec = m.codec;
    b.checksum = m.checksum;
    b.value.assign(m.value.begin(), m.value.end());
    const size_t bytes = b.value.size();
    const PutResult r = store.put(std::move(b));
    if (r == PutResult::stored || r == PutResult::staged) metrics.add_vault_bytes_stored(bytes);
    if (r != PutResult::stored && r != PutResult::staged && r != PutResult::duplicate)
      spdlog::warn("vault: store of {} in {} rejected: {}", to_hex(m.key).substr(0, 16), m.name_space,
                   put_result_name(r));
    update_usage();
  }

  void on_lookup(net::EndpointId from, uint64_t id, std::span<const std::byte> payload) {
    const net::VaultKeysMessage m = net::decode_vault_keys(payload);
    const size_t found = store.lookup(m.name_space, m.keys);
    reply(from, WireType::vault_count, id, 0, net::encode_vault_count(found));
  }

  void on_promote(net::EndpointId from, uint64_t id, std::span<const std::byte> payload) {
    const double t0 = monotonic_s();
    const net::VaultKeysMessage m = net::decode_vault_keys(payload);
    const std::vector<BlockPtr> blocks =
        store.promote(m.name_space, m.keys, m.max_blocks == 0 ? SIZE_MAX : static_cast<size_t>(m.max_blocks));
    metrics.add_vault_hits(blocks.size());
    metrics.add_vault_misses(m.keys.size() - blocks.size());
    std::vector<KvBlockHeader> headers;
    std::vector<uint64_t> checksums;
    std::vector<std::span<const std::byte>> prefixes;
    int layers = 0;
    for (const BlockPtr& b : blocks) {
      headers.push_back(decode_kv_block_header(b->value));
      if (layers == 0) layers = headers.back().num_layers;
      HACK_CHECK(headers.back().num_layers == layers, "vault: blocks of one chain with {} and {} layers", layers,
                 headers.back().num_layers);
      checksums.push_back(b->checksum);
      prefixes.push_back(std::span<const std::byte>(b->value).first(net::kv_block_prefix_bytes(headers.back())));
    }
    if (blocks.empty()) layers = 1;  // an empty head still names a layer count (nothing follows)
    reply(from, WireType::vault_promote_head, id, 0, net::encode_vault_promote_head(layers, checksums, prefixes));
    if (blocks.empty()) return;
    // The layers are gathered off the progress thread, so layer 0 is on the wire while
    // layer 1 is being copied (the client restores layer by layer as they arrive).
    {
      std::lock_guard lock(promote_mutex);
      promote_jobs.push_back(PromoteJob{from, id, t0, blocks, std::move(headers)});
    }
    promote_wake.notify_one();
  }

  struct PromoteJob {
    net::EndpointId to = 0;
    uint64_t id = 0;
    double t0 = 0;
    std::vector<BlockPtr> blocks;  // held until every layer is copied out
    std::vector<KvBlockHeader> headers;
  };
  std::mutex promote_mutex;
  std::condition_variable promote_wake;
  std::deque<PromoteJob> promote_jobs;
  bool promote_stop = false;
  std::thread promote_thread;  // started last in the constructor (a throw before it leaves nothing to join)

  void run_promotes() {
    for (;;) {
      PromoteJob job;
      {
        std::unique_lock lock(promote_mutex);
        promote_wake.wait(lock, [&] { return promote_stop || !promote_jobs.empty(); });
        if (promote_stop) return;
        job = std::move(promote_jobs.front());
        promote_jobs.pop_front();
      }
      const int layers = job.headers.front().num_layers;
      size_t served = 0;
      for (int l = 0; l < layers; ++l) {
        size_t bytes = 0;
        for (const KvBlockHeader& kh : job.headers) bytes += kh.layers[static_cast<size_t>(l)].bytes;
        std::vector<std::byte> out;
        out.reserve(bytes);
        for (size_t i = 0; i < job.blocks.size(); ++i) {
          const KvBlockLayer& e = job.headers[i].layers[static_cast<size_t>(l)];
          const std::byte* p = job.blocks[i]->value.data() + e.offset;
          out.insert(out.end(), p, p + e.bytes);
        }
        served += bytes;
        net::UcxWorker::SendCallback done;
        if (l + 1 == layers) {
          done = [this, t0 = job.t0](const Status& s) {
            if (s) metrics.observe_vault_restore_s(monotonic_s() - t0);
          };
        }
        try {
          reply(job.to, WireType::vault_promote_layer, job.id, static_cast<uint32_t>(l), std::move(out), std::move(done));
        } catch (const std::exception& e) {
          spdlog::warn("vault: promote {} layer {} not sent: {}", job.id, l, e.what());
          break;
        }
      }
      metrics.add_vault_bytes_served(served);
    }
  }
};

VaultServer::VaultServer(const VaultServerConfig& config) : impl_(std::make_unique<Impl>(config)) {}
VaultServer::~VaultServer() = default;
int VaultServer::port() const { return impl_->http->port(); }
int VaultServer::ucx_port() const { return impl_->ucx_port; }
BlockStoreStats VaultServer::stats() const { return impl_->store.stats(); }
uint64_t VaultServer::rejected_messages() const { return impl_->rejected_messages.load(); }
std::string VaultServer::metrics_text() const { return impl_->metrics.serialize(); }

}  // namespace hack::vault
