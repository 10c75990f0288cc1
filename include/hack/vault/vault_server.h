/// @file vault_server.h
/// @brief hack-vault as a library object: a BlockStore (vault/block_store.h) served over UCX
/// (net/vault_protocol.h) plus GET /health, GET /metrics and GET /stats over HTTP like the
/// nodes. Calls are answered on the UCX progress thread; each is a few index operations and
/// memory copies (a promote copies its blocks' slices into one message per layer, so no
/// block stays pinned once its messages are queued).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hack/core/flags.h"
#include "hack/vault/block_store.h"

namespace hack::vault {

struct VaultServerConfig {
  std::string host = "127.0.0.1";  ///< HTTP and UCX bind address
  int port = 8400;                 ///< HTTP port (0 = any)
  int ucx_port = 8401;             ///< UCX port the nodes connect to (0 = any; /health reports it)
  std::string max_bytes = "1G";    ///< byte budget: a number with an optional K/M/G/T suffix (powers of 1024)
  std::vector<std::string> namespace_quotas;  ///< "namespace=size", repeatable
  std::string data_dir;            ///< persistence; empty = memory only
  bool fsync = false;
  float orphan_timeout_s = 10;
  /// The cluster secret ("" = none): required on the internal HTTP endpoints, and the key
  /// (net/wire.h WireAuth, kVaultAuthLabel) every vault call and reply is sealed with.
  std::string secret;
  int http_threads = 1;
  bool enable_test_hooks = false;  ///< POST /internal/test/corrupt {"namespace", "key"}; never in production
  bool json_logs = false;
  std::string log_level = "info";
};

/// Registers every VaultServerConfig flag (env mirrors HACK_VAULT_*).
void add_vault_flags(FlagSet& flags, VaultServerConfig& config);
/// The BlockStore options a config asks for (validated).
BlockStoreOptions store_options(const VaultServerConfig& config);

class VaultServer {
 public:
  explicit VaultServer(const VaultServerConfig& config);
  ~VaultServer();
  VaultServer(const VaultServer&) = delete;
  VaultServer& operator=(const VaultServer&) = delete;

  int port() const;          ///< HTTP
  int ucx_port() const;
  BlockStoreStats stats() const;
  /// Calls refused for their MAC since start (also hack:vault_messages_rejected_total).
  uint64_t rejected_messages() const;
  /// What GET /metrics answers.
  std::string metrics_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::vault
