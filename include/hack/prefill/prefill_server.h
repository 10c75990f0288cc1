/// @file prefill_server.h
/// @brief hack-prefill as a library object: a PrefillWorker behind the internal HTTP
/// endpoint POST /internal/prefill (see node_protocol.h). Each call names the decode node's
/// UCX address; the worker streams the KV there layer by layer and the reply carries the
/// first token once every message has left. The daemon's main() only parses flags.
#pragma once

#include <memory>
#include <string>

#include "hack/core/flags.h"
#include "hack/node/vault_flags.h"
#include "hack/runtime/model_runtime.h"

namespace hack::server {

struct PrefillServerConfig {
  ModelRuntimeConfig model;
  std::string host = "127.0.0.1";  ///< HTTP bind address
  int port = 8200;                 ///< HTTP port (0 = any)
  std::string secret;              ///< shared secret of the internal endpoints ("" = none)
  int http_threads = 2;
  int64_t window_mb = 64;          ///< unacknowledged KV bytes in flight per decode node
  int64_t kv_message_kb = 1024;    ///< KvSenderOptions::message_bytes, in KiB
  std::string kv_gather = "auto";   ///< KvSenderOptions::gather: copy, iov or auto
  std::string kv_checksum = "auto"; ///< KvSenderOptions::checksum: always or auto
  std::string kv_connect = "auto";  ///< auto: by worker address to decode nodes on this host; listener: host:port
  float send_timeout_s = 60;
  int send_retries = 1;       ///< PrefillWorkerOptions::send_retries
  float send_retry_wait_s = 5; ///< PrefillWorkerOptions::retry_wait_s
  int max_draining_jobs = 4;   ///< PrefillWorkerOptions::max_draining_jobs (0: no pipelining)
  int prefill_batch_jobs = 1;  ///< PrefillWorkerOptions::batch_jobs (1: no batched prefill)
  bool enable_test_hooks = false;  ///< honour test_corrupt_page, --test-layer-delay-ms, POST /internal/test/hold-ucx
  int test_layer_delay_ms = 0;
  std::string prefix_cache_bytes = "256M";  ///< local prefix cache budget (K/M/G suffix); "0" = none
  bool prefix_whole_chunks = false;
  bool prefix_cache_pages = true;
  bool prefix_cache_tail = true;
  float drain_timeout_s = 20;      ///< SIGTERM: seconds to finish queued and running jobs before exiting  ///< restore whole prefill chunks only (bit-identical to no cache)
  VaultFlags vault;                ///< --vault* (node/vault_flags.h)
  bool json_logs = false;
  std::string log_level = "info";
};

/// Registers every PrefillServerConfig flag (env mirrors HACK_PREFILL_*).
void add_prefill_flags(FlagSet& flags, PrefillServerConfig& config);

class PrefillServer {
 public:
  explicit PrefillServer(const PrefillServerConfig& config);
  ~PrefillServer();
  PrefillServer(const PrefillServer&) = delete;
  PrefillServer& operator=(const PrefillServer&) = delete;

  int port() const;
  /// Drains (what SIGTERM does before the destructor): refuses new prefills with 503, tells
  /// /health it is draining, and waits up to timeout_s for queued and running jobs. True when
  /// they all finished.
  bool drain(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::server
