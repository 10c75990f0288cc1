/// @file routing.h
/// @brief The router's view of its prefill or decode nodes: each node's queue length in
/// tokens (what the node last reported, corrected by the router's own in-flight accounting),
/// its health, and the shortest-queue choice of the node for the next request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hack/node/node_address.h"

namespace hack::server {

/// When a node changes state, counted in consecutive health polls (or request failures).
struct HealthPolicy {
  int failures_to_leave = 3;  ///< a healthy node leaves the pool after this many failures in a row
  int successes_to_rejoin = 2;  ///< a node that left comes back after this many successes in a row
  /// A node never yet seen healthy joins on its first success (so a starting cluster is
  /// usable after one poll).
};

/// Prefix affinity (prefill pools): among nodes whose load is within slack_tokens of the
/// least loaded, prefer the one that was last sent the longest prefix of this prompt, since
/// its local prefix cache most likely still holds it. The router knows this from its own
/// routing history only — per node, an LRU set of the chained 64-bit hashes of the Π-token
/// prefixes it routed there (prefix_block_hashes) — so it needs no cache reports from the
/// nodes; a node that evicted a prefix just costs a vault restore or a recompute.
struct AffinityPolicy {
  int64_t slack_tokens = 0;           ///< 0 = no affinity (pure shortest queue)
  size_t remember_blocks = 1 << 16;   ///< prefix hashes remembered per node (LRU)
};

/// Chained hashes of the full `block_tokens`-token blocks of a prompt: hash i names tokens
/// [0, (i + 1)·block_tokens) (xxh3; routing hints, not cache keys).
std::vector<uint64_t> prefix_block_hashes(std::span<const int> tokens, int block_tokens);

/// A node as the pool sees it now (for /health, metrics and logs).
struct NodeStatus {
  NodeAddress address;
  bool healthy = false;
  int64_t reported_queue_tokens = 0;
  int64_t inflight_tokens = 0;
  int inflight_requests = 0;
  int consecutive_failures = 0;
  int consecutive_successes = 0;
  int64_t load_tokens() const { return reported_queue_tokens + inflight_tokens; }
};

/// Nodes of one kind (all prefill or all decode). Thread-safe; leases may outlive the pool.
class NodePool {
  struct State;

 public:
  explicit NodePool(HealthPolicy policy = {}, AffinityPolicy affinity = {});
  ~NodePool();
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  /// Adds a node (not routable until its first successful poll). Throws hack::Error when
  /// the name is already there.
  void add(NodeAddress address);
  /// Removes a node; its open leases end harmlessly.
  void remove(std::string_view name);

  /// A health / stats poll answered: `queue_tokens` is the node's own count of tokens
  /// waiting or running. Unknown names are ignored.
  void report_success(std::string_view name, int64_t queue_tokens);
  /// A poll failed or a request could not reach the node.
  void report_failure(std::string_view name);
  /// The node says it is draining (SIGTERM): out of the pool at once, back like a failed
  /// node once it answers healthy again (a restarted process).
  void report_draining(std::string_view name);

  /// Router-side accounting of one request on a node: `tokens` count in the node's load
  /// from acquire until the lease ends (destroyed or released).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    const NodeAddress& node() const { return node_; }
    /// Changes the tokens this request counts for (e.g. prompt + generated so far on decode).
    void set_tokens(int64_t tokens);
    /// Ends the lease now.
    void release();
    explicit operator bool() const { return state_ != nullptr; }

   private:
    friend class NodePool;
    std::shared_ptr<State> state_;
    NodeAddress node_;
    uint64_t node_id_ = 0;  // guards against a node removed and re-added under the same name
    int64_t tokens_ = 0;
  };

  /// The healthy node, not in `exclude`, with the fewest reported + in-flight tokens; ties
  /// go to fewer in-flight requests, then round robin. nullopt when there is none.
  std::optional<NodeAddress> pick(const std::set<std::string>& exclude = {});
  /// pick() and, atomically with it, count `tokens` in flight on the chosen node. With
  /// `prefix` (prefix_block_hashes of the prompt) and an AffinityPolicy, prefers the node
  /// holding the longest prefix among near-equal queues, and remembers the prompt's prefixes
  /// on the node chosen.
  std::optional<Lease> acquire(int64_t tokens, const std::set<std::string>& exclude = {},
                               std::span<const uint64_t> prefix = {});
  /// How many leading blocks of `prefix` the pool remembers sending to node `name`.
  size_t remembered_prefix_blocks(std::string_view name, std::span<const uint64_t> prefix) const;

  /// True when there is a healthy node and every healthy node's load exceeds
  /// `max_queue_tokens` (the router answers 429 with Retry-After). No healthy node at all is
  /// not saturation (that is a 503).
  bool saturated(int64_t max_queue_tokens) const;

  size_t healthy_count() const;
  std::vector<NodeStatus> snapshot() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace hack::server
