/// @file vault_client.h
/// @brief A node's handle on hack-vault (net/vault_protocol.h) over the node's UcxWorker:
/// fire-and-forget stores, lookups and layer-streamed promotes with deadlines. The vault is
/// an optimisation, so every failure here (vault down, slow, restarted, a bad reply) is an
/// error the caller answers by recomputing; nothing blocks past its timeout.
///
/// Authentication: with VaultClientOptions::auth every request carries the vault MAC
/// (net/wire.h) and a reply without the right one is dropped.
///
/// Connection: dialled on first use; a lost connection fails the calls in flight on it and is
/// redialled by the next call, at most once per reconnect_interval_s (a dead vault costs a
/// request at most one failed dial, not one per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/block_key.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/vault_protocol.h"
#include "hack/net/wire.h"

namespace hack::net {

struct VaultClientOptions {
  std::string host;
  uint16_t port = 0;
  double reconnect_interval_s = 1.0;
  /// Store payload bytes queued and not yet handed to the transport beyond which new stores
  /// are dropped (counted): a slow vault never makes a node buffer without bound.
  size_t max_store_bytes_in_flight = size_t{256} << 20;
  /// Seals every call and checks every reply with the cluster secret (WireAuth keyed with
  /// kVaultAuthLabel); off without a secret. Must agree with the vault's.
  WireAuth auth;
};

struct VaultClientStats {
  uint64_t stores = 0;           ///< handed to UCX
  uint64_t store_bytes = 0;
  uint64_t stores_dropped = 0;   ///< over max_store_bytes_in_flight, or no connection
  uint64_t store_errors = 0;     ///< sends that failed
  uint64_t calls = 0;            ///< lookups, promotes, deletes, stats
  uint64_t call_errors = 0;      ///< of those: timeouts, lost connections, vault errors
  uint64_t disconnects = 0;
  uint64_t replies_rejected = 0; ///< replies refused for their MAC (dropped; their call times out)
};

/// One promote in flight: the head (how many blocks come, their headers), then each layer's
/// slices, as they arrive. Destroying it abandons the call (late replies are dropped).
class VaultPromotion {
 public:
  virtual ~VaultPromotion() = default;
  /// Waits for the head. An error: timeout, connection lost, vault error, bad reply.
  virtual Status wait_head(double timeout_s) = 0;
  /// After wait_head succeeded.
  virtual const VaultPromoteHead& head() const = 0;
  /// Waits for layer `layer` and gives its slices (one per block, checksums verified),
  /// valid while this object lives.
  virtual Status wait_layer(int layer, double timeout_s, std::vector<std::span<const std::byte>>& slices) = 0;
};

class VaultClient {
 public:
  /// `worker` must outlive the client. Does not connect yet.
  VaultClient(UcxWorker& worker, VaultClientOptions options);
  ~VaultClient();
  VaultClient(const VaultClient&) = delete;
  VaultClient& operator=(const VaultClient&) = delete;

  /// Queues one block (its checksum computed here). Never waits; a store that cannot be
  /// queued is dropped and counted.
  void store(const std::string& name_space, const BlockKey& key, const BlockKey& parent, bool first, uint8_t codec,
             std::span<const std::byte> value);
  /// How many of keys[0..] the vault holds, in one round trip.
  Status lookup(const std::string& name_space, std::span<const BlockKey> keys, double timeout_s, size_t& found);
  /// Starts promoting the longest held prefix of keys (at most max_blocks, 0 = all).
  std::unique_ptr<VaultPromotion> promote(const std::string& name_space, std::span<const BlockKey> keys,
                                          uint32_t max_blocks = 0);
  /// Removes a block and its descendants; `removed` gets how many.
  Status remove(const std::string& name_space, const BlockKey& key, double timeout_s, size_t& removed);
  /// The vault's stats as JSON.
  Status stats_json(double timeout_s, std::string& json);
  /// Waits until queued stores have left (tests, shutdown).
  Status flush(double timeout_s);

  VaultClientStats stats() const;
  const VaultClientOptions& options() const { return options_; }

  struct Shared;  ///< (implementation: calls in flight, the connection)

 private:
  UcxWorker& worker_;
  VaultClientOptions options_;
  std::shared_ptr<Shared> shared_;
  int disconnect_token_ = 0;
};

}  // namespace hack::net
