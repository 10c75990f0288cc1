#include "hack/router/routing.h"

#include <xxhash.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <unordered_map>
#include <tuple>
#include <utility>

#include "hack/core/error.h"

namespace hack::server {

namespace {

struct Node {
  NodeAddress address;
  uint64_t id = 0;
  bool healthy = false;
  bool ever_healthy = false;
  int64_t reported_queue_tokens = 0;
  int64_t inflight_tokens = 0;
  int inflight_requests = 0;
  int consecutive_failures = 0;
  int consecutive_successes = 0;
  // Prefix hashes routed here, most recent first (AffinityPolicy).
  std::list<uint64_t> prefixes;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> prefix_index;

  size_t matched(std::span<const uint64_t> prefix) const {
    size_t n = 0;
    while (n < prefix.size() && prefix_index.contains(prefix[n])) ++n;
    return n;
  }
  void remember(std::span<const uint64_t> prefix, size_t limit) {
    for (uint64_t h : prefix) {
      if (auto it = prefix_index.find(h); it != prefix_index.end()) prefixes.erase(it->second);
      prefixes.push_front(h);
      prefix_index[h] = prefixes.begin();
    }
    while (prefixes.size() > limit) {
      prefix_index.erase(prefixes.back());
      prefixes.pop_back();
    }
  }
};

}  // namespace

std::vector<uint64_t> prefix_block_hashes(std::span<const int> tokens, int block_tokens) {
  HACK_CHECK(block_tokens > 0, "prefix_block_hashes: block_tokens must be positive");
  std::vector<uint64_t> out;
  uint64_t h = 0;
  for (size_t b = 0; (b + 1) * static_cast<size_t>(block_tokens) <= tokens.size(); ++b) {
    h = XXH3_64bits_withSeed(tokens.data() + b * static_cast<size_t>(block_tokens),
                             static_cast<size_t>(block_tokens) * sizeof(int), h);
    out.push_back(h);
  }
  return out;
}

struct NodePool::State {
  HealthPolicy policy;
  AffinityPolicy affinity;
  mutable std::mutex mutex;
  std::vector<Node> nodes;  // in the order added; the round-robin cursor walks this order
  size_t round_robin = 0;
  uint64_t next_id = 1;

  Node* find(std::string_view name) {
    for (Node& n : nodes) {
      if (n.address.name == name) return &n;
    }
    return nullptr;
  }
  Node* find_id(uint64_t id) {
    for (Node& n : nodes) {
      if (n.id == id) return &n;
    }
    return nullptr;
  }

  // Index of the node to route to, or nodes.size(). Caller holds the mutex.
  size_t choose(const std::set<std::string>& exclude, std::span<const uint64_t> prefix = {}) {
    size_t best = nodes.size();
    auto key = [&](size_t i) {
      const Node& n = nodes[i];
      // Round robin among equals: distance from the cursor, cyclically.
      const size_t rr = (i + nodes.size() - round_robin % nodes.size()) % nodes.size();
      return std::make_tuple(n.reported_queue_tokens + n.inflight_tokens, n.inflight_requests, rr);
    };
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!nodes[i].healthy || exclude.count(nodes[i].address.name)) continue;
      if (best == nodes.size() || key(i) < key(best)) best = i;
    }
    if (best != nodes.size() && affinity.slack_tokens > 0 && !prefix.empty()) {
      // Near-equal queues: the longest remembered prefix wins (ties keep the shortest queue).
      const int64_t limit = std::get<0>(key(best)) + affinity.slack_tokens;
      size_t best_match = nodes[best].matched(prefix);
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (!nodes[i].healthy || exclude.count(nodes[i].address.name) || std::get<0>(key(i)) > limit) continue;
        const size_t m = nodes[i].matched(prefix);
        if (m > best_match) {
          best = i;
          best_match = m;
        }
      }
    }
    if (best != nodes.size()) round_robin = best + 1;
    return best;
  }

  void end_lease(uint64_t node_id, int64_t tokens) {
    std::lock_guard lock(mutex);
    if (Node* n = find_id(node_id)) {
      n->inflight_tokens -= tokens;
      n->inflight_requests -= 1;
    }
  }
};

NodePool::NodePool(HealthPolicy policy, AffinityPolicy affinity) : state_(std::make_shared<State>()) {
  HACK_CHECK(affinity.slack_tokens >= 0 && affinity.remember_blocks > 0,
             "affinity policy: slack_tokens must be >= 0 and remember_blocks positive");
  state_->affinity = affinity;
  HACK_CHECK(policy.failures_to_leave >= 1 && policy.successes_to_rejoin >= 1,
             "health policy thresholds must be >= 1, got failures_to_leave={} successes_to_rejoin={}",
             policy.failures_to_leave, policy.successes_to_rejoin);
  state_->policy = policy;
}

NodePool::~NodePool() = default;

void NodePool::add(NodeAddress address) {
  std::lock_guard lock(state_->mutex);
  HACK_CHECK(!state_->find(address.name), "node '{}' is already in the pool", address.name);
  Node n;
  n.address = std::move(address);
  n.id = state_->next_id++;
  state_->nodes.push_back(std::move(n));
}

void NodePool::remove(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  auto& nodes = state_->nodes;
  nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](const Node& n) { return n.address.name == name; }),
              nodes.end());
}

void NodePool::report_success(std::string_view name, int64_t queue_tokens) {
  std::lock_guard lock(state_->mutex);
  Node* n = state_->find(name);
  if (!n) return;
  n->reported_queue_tokens = std::max<int64_t>(queue_tokens, 0);
  n->consecutive_failures = 0;
  n->consecutive_successes += 1;
  if (!n->healthy && (!n->ever_healthy || n->consecutive_successes >= state_->policy.successes_to_rejoin)) {
    n->healthy = true;
    n->ever_healthy = true;
  }
}

void NodePool::report_failure(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  Node* n = state_->find(name);
  if (!n) return;
  n->consecutive_successes = 0;
  n->consecutive_failures += 1;
  if (n->healthy && n->consecutive_failures >= state_->policy.failures_to_leave) n->healthy = false;
}

void NodePool::report_draining(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  Node* n = state_->find(name);
  if (!n) return;
  n->consecutive_successes = 0;
  n->consecutive_failures = std::max(n->consecutive_failures, state_->policy.failures_to_leave);
  n->healthy = false;
}

std::optional<NodeAddress> NodePool::pick(const std::set<std::string>& exclude) {
  std::lock_guard lock(state_->mutex);
  const size_t i = state_->choose(exclude);
  if (i == state_->nodes.size()) return std::nullopt;
  return state_->nodes[i].address;
}

std::optional<NodePool::Lease> NodePool::acquire(int64_t tokens, const std::set<std::string>& exclude,
                                                 std::span<const uint64_t> prefix) {
  std::lock_guard lock(state_->mutex);
  const size_t i = state_->choose(exclude, prefix);
  if (i == state_->nodes.size()) return std::nullopt;
  Node& n = state_->nodes[i];
  if (state_->affinity.slack_tokens > 0) n.remember(prefix, state_->affinity.remember_blocks);
  n.inflight_tokens += tokens;
  n.inflight_requests += 1;
  Lease lease;
  lease.state_ = state_;
  lease.node_ = n.address;
  lease.node_id_ = n.id;
  lease.tokens_ = tokens;
  return lease;
}

size_t NodePool::remembered_prefix_blocks(std::string_view name, std::span<const uint64_t> prefix) const {
  std::lock_guard lock(state_->mutex);
  for (const Node& n : state_->nodes)
    if (n.address.name == name) return n.matched(prefix);
  return 0;
}

bool NodePool::saturated(int64_t max_queue_tokens) const {
  std::lock_guard lock(state_->mutex);
  bool any = false;
  for (const Node& n : state_->nodes) {
    if (!n.healthy) continue;
    any = true;
    if (n.reported_queue_tokens + n.inflight_tokens <= max_queue_tokens) return false;
  }
  return any;
}

size_t NodePool::healthy_count() const {
  std::lock_guard lock(state_->mutex);
  return static_cast<size_t>(
      std::count_if(state_->nodes.begin(), state_->nodes.end(), [](const Node& n) { return n.healthy; }));
}

std::vector<NodeStatus> NodePool::snapshot() const {
  std::lock_guard lock(state_->mutex);
  std::vector<NodeStatus> out;
  out.reserve(state_->nodes.size());
  for (const Node& n : state_->nodes) {
    out.push_back(NodeStatus{n.address, n.healthy, n.reported_queue_tokens, n.inflight_tokens, n.inflight_requests,
                             n.consecutive_failures, n.consecutive_successes});
  }
  return out;
}

NodePool::Lease::Lease(Lease&& other) noexcept
    : state_(std::move(other.state_)), node_(std::move(other.node_)), node_id_(other.node_id_), tokens_(other.tokens_) {
  other.state_.reset();
}

NodePool::Lease& NodePool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    other.state_.reset();
    node_ = std::move(other.node_);
    node_id_ = other.node_id_;
    tokens_ = other.tokens_;
  }
  return *this;
}

NodePool::Lease::~Lease() { release(); }

void NodePool::Lease::set_tokens(int64_t tokens) {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  if (Node* n = state_->find_id(node_id_)) n->inflight_tokens += tokens - tokens_;
  tokens_ = tokens;
}

void NodePool::Lease::release() {
  if (!state_) return;
  state_->end_lease(node_id_, tokens_);
  state_.reset();
}

}  // namespace hack::server
