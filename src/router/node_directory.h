// The router's view of its nodes: the prefill and decode pools (routing.h) kept current by
// a health thread (load, readiness, KV format, a decode node's UCX address), and the pick
// of a prefill + decode pair for an attempt.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "hack/node/metrics.h"
#include "hack/router/openai_protocol.h"
#include "hack/router/router_server.h"
#include "hack/router/routing.h"

namespace hack::server::router {

// The prefill and decode node an attempt runs on, counted in their pools' load.
struct NodePair {
  NodePool::Lease prefill, decode;
  NodeAddress decode_node;   // decode.node() with its UCX address and KV format
  NodeAddress prefill_node;  // prefill.node() with its KV format
};

class NodeDirectory {
 public:
  /// Parses --prefill / --decode and polls every node once (a cluster that is up is
  /// routable at once). Throws hack::Error on bad addresses.
  NodeDirectory(const RouterConfig& config, Metrics& metrics);
  /// Stops the health thread.
  ~NodeDirectory();
  NodeDirectory(const NodeDirectory&) = delete;
  NodeDirectory& operator=(const NodeDirectory&) = delete;

  /// Polls every node each --health-interval (sooner while one is starting) on a thread.
  void start_polling();

  /// The prefill and decode node with the shortest queues, not one of `bad_*` unless there
  /// is no other, and of one KV format; `generated`: tokens of a migrated stream, prefilled
  /// with the prompt.
  std::variant<NodePair, ProtocolError> acquire(const std::vector<int>& prompt, int max_tokens,
                                                const std::set<std::string>& bad_prefill,
                                                const std::set<std::string>& bad_decode, int64_t generated = 0);

  NodePool& prefill_pool() { return prefill_pool_; }
  NodePool& decode_pool() { return decode_pool_; }

 private:
  bool poll_node(NodePool& pool, const NodeAddress& node, const char* role);
  bool poll_health();
  void health_loop();

  const RouterConfig& config_;
  Metrics& metrics_;
  NodePool prefill_pool_, decode_pool_;
  std::vector<NodeAddress> prefill_nodes_, decode_nodes_;

  std::mutex node_info_mutex_;
  struct DecodeUcx {
    std::string address, worker, host_id;  // NodeHealth's ucx_address, ucx_worker, host_id
  };
  std::map<std::string, DecodeUcx> ucx_of_;  // decode node name → where its KV goes
  std::map<std::string, std::string> prefill_format_of_, decode_format_of_;  // node name → KV format
  std::map<std::string, uint64_t> kv_bytes_seen_;  // health thread only

  std::mutex health_mutex_;
  std::condition_variable health_cv_;
  bool health_stop_ = false;
  bool health_starting_ = false;  // the last poll found a node not ready yet
  std::thread health_thread_;
};

}  // namespace hack::server::router
