#include "src/router/node_directory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "hack/core/error.h"
#include "hack/router/node_client.h"

namespace hack::server::router {

namespace {

// Seconds between health polls while a node answers that it is not ready yet.
constexpr double kStartingRepollS = 0.25;

std::vector<NodeAddress> parse_nodes(const std::vector<std::string>& specs, const char* flag) {
  std::vector<NodeAddress> nodes;
  for (const std::string& spec : specs) {
    for (const std::string& one : split_list(spec)) nodes.push_back(parse_node_address(one, fmt::format("--{}", flag)));
  }
  HACK_CHECK(!nodes.empty(), "give at least one --{} node (host:port)", flag);
  return nodes;
}

}  // namespace

NodeDirectory::NodeDirectory(const RouterConfig& config, Metrics& metrics)
    : config_(config), metrics_(metrics), prefill_pool_(HealthPolicy{}, AffinityPolicy{config.prefix_affinity_tokens}) {
  HACK_CHECK(config_.prefix_block_tokens > 0, "--prefix-block-tokens must be positive");
  prefill_nodes_ = parse_nodes(config_.prefill, "prefill");
  decode_nodes_ = parse_nodes(config_.decode, "decode");
  for (const NodeAddress& n : prefill_nodes_) prefill_pool_.add(n);
  for (const NodeAddress& n : decode_nodes_) decode_pool_.add(n);
  health_starting_ = poll_health();
}

NodeDirectory::~NodeDirectory() {
  {
    std::lock_guard lock(health_mutex_);
    health_stop_ = true;
  }
  health_cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

void NodeDirectory::start_polling() { health_thread_ = std::thread([this] { health_loop(); }); }

// Returns true for a node that answered but is not ready yet (not draining).
bool NodeDirectory::poll_node(NodePool& pool, const NodeAddress& node, const char* role) {
  try {
    const double timeout = std::max(0.5, std::min(2.0, 2.0 * config_.health_interval_s));
    const NodeHealth h = fetch_health(node, timeout);
    HACK_CHECK(h.role == role, "node {} is a {} node, configured as {}", node.name, h.role, role);
    {
      std::lock_guard lock(node_info_mutex_);
      if (h.role == std::string("decode")) ucx_of_[node.name] = {h.ucx_address, h.ucx_worker, h.host_id};
      (h.role == std::string("decode") ? decode_format_of_ : prefill_format_of_)[node.name] = h.kv_format;
    }
    metrics_.set_kv_cache_usage_ratio(node.name, h.kv_usage);
    uint64_t& seen = kv_bytes_seen_[node.name];
    if (h.kv_bytes_transferred > seen) metrics_.add_kv_bytes_transferred(node.name, h.kv_bytes_transferred - seen);
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
bool NodeDirectory::poll_health() {
  bool starting = false;
  for (const NodeAddress& n : prefill_nodes_) starting |= poll_node(prefill_pool_, n, "prefill");
  for (const NodeAddress& n : decode_nodes_) starting |= poll_node(decode_pool_, n, "decode");
  return starting;
}

void NodeDirectory::health_loop() {
  std::unique_lock lock(health_mutex_);
  bool starting = health_starting_;
  while (!health_stop_) {
    // A node still starting (its self-probe not passed) is asked again soon, whatever the
    // interval: it is about to serve, and a long --health-interval would keep it out.
    const double wait_s = starting ? std::min<double>(config_.health_interval_s, kStartingRepollS) : config_.health_interval_s;
    health_cv_.wait_for(lock, std::chrono::duration<double>(wait_s));
    if (health_stop_) break;
    lock.unlock();
    starting = poll_health();
    lock.lock();
  }
}

// The prefill and decode node with the shortest queues, not one of `bad_*` unless there is
// no other.
// `generated`: tokens of a migrated stream, prefilled with the prompt.
std::variant<NodePair, ProtocolError> NodeDirectory::acquire(const std::vector<int>& prompt, int max_tokens,
                                                             const std::set<std::string>& bad_prefill,
                                                             const std::set<std::string>& bad_decode, int64_t generated) {
  const auto prompt_tokens = static_cast<int64_t>(prompt.size()) + generated;
  const std::vector<uint64_t> prefix = config_.prefix_affinity_tokens > 0
                                           ? prefix_block_hashes(prompt, config_.prefix_block_tokens)
                                           : std::vector<uint64_t>{};
  auto pl = prefill_pool_.acquire(prompt_tokens, bad_prefill, prefix);
  if (!pl) pl = prefill_pool_.acquire(prompt_tokens, {}, prefix);
  if (!pl) return unavailable_error("no healthy prefill node");
  // Only a decode node whose KV format equals the prefill node's can take its KV.
  std::string format;
  std::set<std::string> other_format;
  {
    std::lock_guard lock(node_info_mutex_);
    format = prefill_format_of_[pl->node().name];
    for (const auto& [name, f] : decode_format_of_)
      if (f != format) other_format.insert(name);
  }
  std::set<std::string> exclude = other_format;
  exclude.insert(bad_decode.begin(), bad_decode.end());
  const int64_t decode_tokens = prompt_tokens + max_tokens - generated;
  auto dl = decode_pool_.acquire(decode_tokens, exclude);
  if (!dl) dl = decode_pool_.acquire(decode_tokens, other_format);
  if (!dl && !other_format.empty() && decode_pool_.healthy_count() > 0)
    return unavailable_error(fmt::format("no healthy decode node has the KV format of prefill node {} ('{}'): "
                                         "start every node with the same --kv, --hack-* and --fdc",
                                         pl->node().name, format));
  if (!dl) return unavailable_error("no healthy decode node");
  NodePair nodes{std::move(*pl), std::move(*dl), {}, {}};
  nodes.decode_node = nodes.decode.node();
  nodes.prefill_node = nodes.prefill.node();
  {
    std::lock_guard lock(node_info_mutex_);
    const DecodeUcx& ucx = ucx_of_[nodes.decode_node.name];
    nodes.decode_node.ucx_address = ucx.address;
    nodes.decode_node.ucx_worker = ucx.worker;
    nodes.decode_node.host_id = ucx.host_id;
    nodes.decode_node.kv_format = decode_format_of_[nodes.decode_node.name];
    nodes.prefill_node.kv_format = format;
  }
  return nodes;
}

}  // namespace hack::server::router
