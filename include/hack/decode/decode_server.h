/// @file decode_server.h
/// @brief hack-decode as a library object: the DecodeScheduler behind an internal HTTP/SSE
/// endpoint and a UCX listener whose KvReceiver feeds received KV into the scheduler.
/// See node_protocol.h for the endpoints. The daemon's main() only parses flags into
/// DecodeServerConfig, builds this and waits for a signal.
#pragma once

#include <memory>
#include <string>

#include "hack/core/flags.h"
#include "hack/decode/decode_scheduler.h"
#include "hack/node/vault_flags.h"
#include "hack/runtime/model_runtime.h"

namespace hack::server {

struct DecodeServerConfig {
  ModelRuntimeConfig model;
  std::string host = "127.0.0.1";  ///< HTTP and UCX bind address
  int port = 8300;                 ///< HTTP port (0 = any)
  int ucx_port = 0;                ///< UCX listener port (0 = any; reported by /health)
  std::string advertise_host;      ///< host prefill nodes dial for KV (empty = host)
  std::string secret;              ///< shared secret of the internal endpoints ("" = none)
  int http_threads = 2;
  int max_batch = 64;
  int reserve_ahead_tokens = 64;
  int recompute_chunk_tokens = 16;  ///< DecodeSchedulerOptions::recompute_chunk_tokens
  std::string recompute_budget = "fixed";  ///< fixed | adaptive (DecodeSchedulerOptions::recompute_adaptive)
  float kv_timeout_s = 120;
  /// Seconds one self-probe of the UCX listener (net/listener_probe.h) waits for its message;
  /// a failed probe is repeated (after as long again) until one passes. /health says
  /// "ready": false, and routers send nothing, until then.
  float ready_probe_timeout_s = 2;
  float idle_trim_s = 1;           ///< idle this long: free KV slabs and malloc's free pages back to the system (0 = never)
  bool enable_test_hooks = false;  ///< honour --test-step-delay-ms
  int test_step_delay_ms = 0;
  float drain_timeout_s = 20;      ///< SIGTERM: seconds to finish running requests before exiting
  VaultFlags vault;                ///< --vault*: store finished conversations' new blocks (node/vault_flags.h)
  bool json_logs = false;
  std::string log_level = "info";
};

/// Registers every DecodeServerConfig flag (env mirrors HACK_DECODE_*).
void add_decode_flags(FlagSet& flags, DecodeServerConfig& config);

class DecodeServer {
 public:
  /// Loads the model, binds HTTP and UCX, starts serving. Throws hack::Error.
  explicit DecodeServer(const DecodeServerConfig& config);
  /// Stops accepting, fails open requests, joins every thread.
  ~DecodeServer();
  DecodeServer(const DecodeServer&) = delete;
  DecodeServer& operator=(const DecodeServer&) = delete;

  int port() const;
  std::string ucx_address() const;
  /// Drains (what SIGTERM does before the destructor): refuses new requests with 503, tells
  /// /health it is draining (routers stop sending at once), and waits up to timeout_s for the
  /// running ones to finish. True when they all did.
  bool drain(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::server
