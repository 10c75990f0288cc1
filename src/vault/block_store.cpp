// The vault's block store (include/hack/vault/block_store.h): the in-memory index, its LRU
// and staging policy, and recovery from the segment log (segment_log.h).
#include "hack/vault/block_store.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <cassert>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "segment_log.h"

namespace hack::vault {

uint64_t block_checksum(std::span<const std::byte> value) { return XXH64(value.data(), value.size(), 0); }

const char* put_result_name(PutResult result) {
  switch (result) {
    case PutResult::stored: return "stored";
    case PutResult::duplicate: return "duplicate";
    case PutResult::staged: return "staged";
    case PutResult::bad_checksum: return "bad_checksum";
    case PutResult::too_large: return "too_large";
    case PutResult::invalid: return "invalid";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

// Keys are SHA-256 outputs, so their first 8 bytes are already a uniform hash.
struct KeyHash {
  size_t operator()(const BlockKey& key) const noexcept {
    size_t h;
    std::memcpy(&h, key.data(), sizeof h);
    return h;
  }
};

void validate(const BlockStoreOptions& o) {
  HACK_CHECK(o.max_bytes > 0, "block store: max_bytes must be positive");
  HACK_CHECK(o.max_block_bytes > 0, "block store: max_block_bytes must be positive");
  HACK_CHECK(o.orphan_timeout_s >= 0, "block store: orphan_timeout_s must be >= 0 (got {})", o.orphan_timeout_s);
  HACK_CHECK(o.segment_bytes > 0, "block store: segment_bytes must be positive");
  HACK_CHECK(o.compact_ratio > 0, "block store: compact_ratio must be positive (got {})", o.compact_ratio);
  for (const auto& [name, quota] : o.namespace_quota_bytes)
    HACK_CHECK(!name.empty() && quota > 0, "block store: namespace quota '{}' = {} must name a namespace and be positive",
               name, quota);
}

}  // namespace

// The index. Every visible block is a Node in its namespace's map; nodes link to their
// visible parent and children (an intrusive sibling list, so unlinking is O(1)). Leaves
// (no visible child) sit in two LRU maps keyed by their last-use tick, the store's and their
// namespace's; eviction takes the front one. Ticks are unique, so the maps need no tie-break.
struct BlockStore::Impl {
  struct Namespace;
  struct Node {
    std::shared_ptr<Block> block;
    Namespace* ns = nullptr;
    Node* parent = nullptr;
    Node* first_child = nullptr;
    Node* prev_sibling = nullptr;
    Node* next_sibling = nullptr;
    uint64_t last_use = 0;
    size_t charged_bytes = 0;
    size_t path_bytes = 0;    // charged bytes of this block and all its ancestors
    uint64_t record_bytes = 0;  // its record on disk (0 in memory-only stores)
    bool leaf() const { return first_child == nullptr; }
  };
  struct Staged {
    std::shared_ptr<Block> block;
    Namespace* ns = nullptr;
    size_t charged_bytes = 0;
    uint64_t record_bytes = 0;  // already on disk (replay), else 0
    Clock::time_point arrived;
  };
  struct Namespace {
    std::string name;
    size_t quota_bytes = SIZE_MAX;
    size_t bytes = 0;
    std::unordered_map<BlockKey, Node, KeyHash> nodes;
    std::map<uint64_t, Node*> leaves;                                 // by last_use
    std::unordered_map<BlockKey, uint64_t, KeyHash> staged;           // key -> staging seq
    std::unordered_multimap<BlockKey, uint64_t, KeyHash> waiting;     // parent key -> staging seq
  };

  explicit Impl(const BlockStoreOptions& o) : options(o) {}

  const BlockStoreOptions& options;
  mutable std::mutex mutex;
  std::unordered_map<std::string, Namespace> namespaces;
  std::map<uint64_t, Node*> leaves;  // every namespace's, by last_use
  std::map<uint64_t, Staged> staged;  // by staging seq = arrival order
  uint64_t tick = 0;
  uint64_t staging_seq = 0;
  size_t bytes = 0;
  size_t staged_bytes = 0;
  uint64_t live_disk_bytes = 0;  // records of visible blocks
  // Blocks gone from the index that a reader may still hold (pruned in stats() and as it grows).
  mutable std::vector<std::pair<std::weak_ptr<Block>, size_t>> pinned;
  mutable size_t pinned_after_prune = 0;
  void prune_pinned() const {
    std::erase_if(pinned, [](const auto& p) { return p.first.expired(); });
    pinned_after_prune = pinned.size();
  }
  BlockStoreStats counters;  // the monotonic counters and recovery; gauges are computed in stats()

  std::optional<SegmentLog> log;
  bool replaying = false;
  // During replay: keys evicted or refused, to tombstone once replay is over (if still gone).
  std::set<std::pair<Namespace*, BlockKey>> replay_dropped;
  uint64_t compact_retry_disk_bytes = 0;  // after a failed compaction, wait until disk grows past this

  Namespace& namespace_for(const std::string& name) {
    auto [it, inserted] = namespaces.try_emplace(name);
    if (inserted) {
      it->second.name = name;
      if (const auto q = options.namespace_quota_bytes.find(name); q != options.namespace_quota_bytes.end())
        it->second.quota_bytes = q->second;
    }
    return it->second;
  }
  Node* find(Namespace& ns, const BlockKey& key) {
    const auto it = ns.nodes.find(key);
    return it == ns.nodes.end() ? nullptr : &it->second;
  }
  // The visible block (name_space, key), or nullptr.
  Node* find(const std::string& name_space, const BlockKey& key) {
    const auto ns = namespaces.find(name_space);
    return ns == namespaces.end() ? nullptr : find(ns->second, key);
  }

  void add_leaf(Node* node) {
    leaves.emplace(node->last_use, node);
    node->ns->leaves.emplace(node->last_use, node);
  }
  void drop_leaf(Node* node) {
    leaves.erase(node->last_use);
    node->ns->leaves.erase(node->last_use);
  }
  void touch(Node* node) {
    if (node->leaf()) drop_leaf(node);
    node->last_use = ++tick;
    if (node->leaf()) add_leaf(node);
  }

  void write_tombstone(Namespace& ns, const BlockKey& key) {
    if (!log) return;
    if (replaying)
      replay_dropped.emplace(&ns, key);
    else
      log->append_tombstone(ns.name, key);
  }

  // Unlinks a leaf from the index (no tombstone: callers write one per removal).
  void remove_leaf(Node* node) {
    assert(node->leaf());
    Namespace& ns = *node->ns;
    drop_leaf(node);
    if (Node* parent = node->parent) {
      if (node->prev_sibling != nullptr)
        node->prev_sibling->next_sibling = node->next_sibling;
      else
        parent->first_child = node->next_sibling;
      if (node->next_sibling != nullptr) node->next_sibling->prev_sibling = node->prev_sibling;
      if (parent->leaf()) add_leaf(parent);
    }
    ns.bytes -= node->charged_bytes;
    bytes -= node->charged_bytes;
    live_disk_bytes -= node->record_bytes;
    if (node->block.use_count() > 1) {
      if (pinned.size() >= 2 * pinned_after_prune + 64) prune_pinned();
      pinned.emplace_back(node->block, node->charged_bytes);
    }
    const BlockKey key = node->block->key;
    ns.nodes.erase(key);
  }

  // Removes `root` and every descendant; `tombstone`: log it (one tombstone, for the root:
  // replay removes the subtree too). Returns how many blocks went.
  size_t remove_subtree(Node* root, bool tombstone) {
    if (tombstone) write_tombstone(*root->ns, root->block->key);
    std::vector<Node*> order{root};  // pre-order; removed in reverse, so children first
    for (size_t i = 0; i < order.size(); ++i)
      for (Node* child = order[i]->first_child; child != nullptr; child = child->next_sibling) order.push_back(child);
    for (auto it = order.rbegin(); it != order.rend(); ++it) remove_leaf(*it);
    return order.size();
  }

  void evict(Node* node) {
    ++counters.evictions;
    counters.evicted_bytes += node->charged_bytes;
    write_tombstone(*node->ns, node->block->key);
    remove_leaf(node);
  }

  // The least recently used leaf other than `pin`.
  static Node* lru_leaf(const std::map<uint64_t, Node*>& lru, const Node* pin) {
    auto it = lru.begin();
    if (it != lru.end() && it->second == pin) ++it;
    return it == lru.end() ? nullptr : it->second;
  }

  // Makes room for `charged` more bytes in `ns` below `parent`. Only `parent` needs pinning:
  // every other ancestor has a visible child on the path, so it is never a leaf. Feasible
  // whenever parent's path_bytes + charged fits (everything off the path can be evicted).
  void make_room(Namespace& ns, const Node* parent, size_t charged) {
    while (ns.bytes + charged > ns.quota_bytes) {
      Node* victim = lru_leaf(ns.leaves, parent);
      HACK_CHECK(victim != nullptr, "block store: nothing to evict in namespace '{}' (a bug)", ns.name);
      evict(victim);
    }
    while (bytes + charged > options.max_bytes) {
      Node* victim = lru_leaf(leaves, parent);
      HACK_CHECK(victim != nullptr, "block store: nothing to evict (a bug)");
      evict(victim);
    }
  }

  // Makes `block` visible under `parent` (nullptr: first block). False when it cannot fit
  // even with everything but its ancestors evicted.
  bool insert_visible(Namespace& ns, std::shared_ptr<Block> block, Node* parent, size_t charged, uint64_t on_disk) {
    const size_t path_bytes = (parent != nullptr ? parent->path_bytes : 0) + charged;
    if (path_bytes > options.max_bytes || path_bytes > ns.quota_bytes) return false;
    make_room(ns, parent, charged);
    uint64_t record = on_disk;
    if (log && !replaying) record = log->append_block(*block);
    const BlockKey key = block->key;
    Node& node = ns.nodes.try_emplace(key).first->second;
    node.block = std::move(block);
    node.ns = &ns;
    node.parent = parent;
    node.charged_bytes = charged;
    node.path_bytes = path_bytes;
    node.record_bytes = record;
    node.last_use = ++tick;
    if (parent != nullptr) {
      if (parent->leaf()) drop_leaf(parent);
      node.next_sibling = parent->first_child;
      if (parent->first_child != nullptr) parent->first_child->prev_sibling = &node;
      parent->first_child = &node;
    }
    add_leaf(&node);
    ns.bytes += charged;
    bytes += charged;
    live_disk_bytes += record;
    return true;
  }

  void drop_staged(std::map<uint64_t, Staged>::iterator it) {
    Staged& s = it->second;
    Namespace& ns = *s.ns;
    ns.staged.erase(s.block->key);
    auto [first, last] = ns.waiting.equal_range(s.block->parent);
    for (auto w = first; w != last; ++w) {
      if (w->second == it->first) {
        ns.waiting.erase(w);
        break;
      }
    }
    staged_bytes -= s.charged_bytes;
    staged.erase(it);
  }

  PutResult stage(Namespace& ns, Block&& block, size_t charged, uint64_t on_disk) {
    if (ns.staged.contains(block.key)) return PutResult::staged;  // the first copy waits
    if (!replaying) {
      if (charged > options.max_orphan_bytes) return PutResult::too_large;
      while (staged_bytes + charged > options.max_orphan_bytes) {
        ++counters.orphans_expired;
        drop_staged(staged.begin());
      }
    }
    const uint64_t seq = ++staging_seq;
    ns.staged.emplace(block.key, seq);
    ns.waiting.emplace(block.parent, seq);
    staged_bytes += charged;
    staged.emplace(seq, Staged{std::make_shared<Block>(std::move(block)), &ns, charged, on_disk, Clock::now()});
    return PutResult::staged;
  }

  // Publishes the staged blocks waiting for `key` (now visible), and theirs, depth first.
  // Keys, not Node pointers, are kept across insertions: an insertion may evict a sibling.
  void publish_waiting(Namespace& ns, const BlockKey& key) {
    std::vector<BlockKey> work{key};
    std::vector<uint64_t> seqs;
    while (!work.empty()) {
      const BlockKey parent_key = work.back();
      work.pop_back();
      seqs.clear();
      auto [first, last] = ns.waiting.equal_range(parent_key);
      for (auto w = first; w != last; ++w) seqs.push_back(w->second);
      for (const uint64_t seq : seqs) {
        const auto it = staged.find(seq);
        std::shared_ptr<Block> block = it->second.block;
        const size_t charged = it->second.charged_bytes;
        const uint64_t on_disk = it->second.record_bytes;
        drop_staged(it);
        Node* parent = find(ns, parent_key);
        const BlockKey child_key = block->key;
        if (parent == nullptr || find(ns, child_key) != nullptr) continue;
        if (insert_visible(ns, std::move(block), parent, charged, on_disk))
          work.push_back(child_key);
        else
          ++counters.orphans_expired;
      }
    }
  }

  // put() and replay: checks the block and makes it visible or stages it. `checksum_ok`:
  // whether the value matches block.checksum (hashed by the caller, outside the lock).
  PutResult admit(Block&& block, bool checksum_ok, uint64_t on_disk) {
    if (block.name_space.empty() || block.name_space.size() > kMaxNamespaceBytes || block.key == block.parent)
      return PutResult::invalid;
    Namespace& ns = namespace_for(block.name_space);
    const size_t charged = block.value.size() + kBlockOverheadBytes;
    if (block.value.size() > options.max_block_bytes || charged > options.max_bytes || charged > ns.quota_bytes)
      return PutResult::too_large;
    if (!checksum_ok) return PutResult::bad_checksum;
    if (ns.nodes.contains(block.key)) return PutResult::duplicate;
    Node* parent = nullptr;
    if (!block.first) {
      parent = find(ns, block.parent);
      if (parent == nullptr) return stage(ns, std::move(block), charged, on_disk);
    }
    const BlockKey key = block.key;
    if (!insert_visible(ns, std::make_shared<Block>(std::move(block)), parent, charged, on_disk))
      return PutResult::too_large;
    publish_waiting(ns, key);
    return PutResult::stored;
  }

  void expire(Clock::time_point now) {
    const auto timeout = std::chrono::duration<double>(options.orphan_timeout_s);
    while (!staged.empty() && now - staged.begin()->second.arrived > timeout) {
      ++counters.orphans_expired;
      drop_staged(staged.begin());
    }
  }

  // Longest prefix of `keys` (at most `limit`) visible as a chain in `name_space`; touches it.
  template <class Visit>
  size_t walk(const std::string& name_space, std::span<const BlockKey> keys, size_t limit, Visit&& visit) {
    const auto ns_it = namespaces.find(name_space);
    if (ns_it == namespaces.end()) return 0;
    Namespace& ns = ns_it->second;
    const size_t n = std::min(limit, keys.size());
    const Node* previous = nullptr;
    size_t i = 0;
    for (; i < n; ++i) {
      Node* node = find(ns, keys[i]);
      if (node == nullptr || (i > 0 && node->parent != previous)) break;
      touch(node);
      visit(*node);
      previous = node;
    }
    return i;
  }

  void maybe_compact() {
    if (!log || replaying) return;
    const uint64_t disk = log->disk_bytes();
    const uint64_t dead = disk > live_disk_bytes ? disk - live_disk_bytes : 0;
    if (dead <= options.segment_bytes || static_cast<double>(dead) <= options.compact_ratio * live_disk_bytes) return;
    if (disk < compact_retry_disk_bytes) return;
    std::vector<const Block*> live;  // parents before children: pre-order from each chain's first block
    size_t visible = 0;
    for (const auto& [name, ns] : namespaces) visible += ns.nodes.size();
    live.reserve(visible);
    std::vector<const Node*> stack;
    for (const auto& [name, ns] : namespaces) {
      for (const auto& [key, node] : ns.nodes) {
        if (node.parent != nullptr) continue;
        stack.push_back(&node);
        while (!stack.empty()) {
          const Node* n = stack.back();
          stack.pop_back();
          live.push_back(n->block.get());
          for (const Node* c = n->first_child; c != nullptr; c = c->next_sibling) stack.push_back(c);
        }
      }
    }
    try {
      log->compact(live);
      ++counters.compactions;
      compact_retry_disk_bytes = 0;
    } catch (const Error& error) {
      spdlog::warn("vault: compaction failed, keeping the old segments: {}", error.what());
      compact_retry_disk_bytes = disk + options.segment_bytes;
    }
  }

  void recover(const std::string& data_dir) {
    log.emplace(data_dir, options.segment_bytes, options.fsync);
    RecoveryStats& stats = counters.recovery;
    replaying = true;
    log->replay(
        [&](LogRecord&& record) {
          if (record.kind == RecordKind::tombstone) {
            Namespace& ns = namespace_for(record.block.name_space);
            replay_dropped.erase({&ns, record.block.key});  // the log already says it is gone
            if (Node* node = find(ns, record.block.key)) remove_subtree(node, false);
            if (const auto s = ns.staged.find(record.block.key); s != ns.staged.end()) drop_staged(staged.find(s->second));
            return;
          }
          Namespace* ns = record.block.name_space.empty() ? nullptr : &namespace_for(record.block.name_space);
          const BlockKey key = record.block.key;
          const bool checksum_ok = block_checksum(record.block.value) == record.block.checksum;
          switch (admit(std::move(record.block), checksum_ok, record.bytes)) {
            case PutResult::stored:
            case PutResult::staged:
            case PutResult::duplicate: break;
            case PutResult::too_large:  // under this run's smaller limits
              ++counters.evictions;
              if (ns != nullptr) replay_dropped.emplace(ns, key);
              break;
            case PutResult::bad_checksum:
            case PutResult::invalid: ++stats.corrupt_records; break;
          }
        },
        stats);
    // Blocks whose parent never came, and blocks dropped for the budget, get tombstones, so
    // the next start sees what this one does.
    for (const auto& [seq, s] : staged) replay_dropped.emplace(s.ns, s.block->key);
    stats.orphans_dropped = staged.size();
    while (!staged.empty()) drop_staged(staged.begin());
    replaying = false;
    for (const auto& [ns, key] : replay_dropped)
      if (find(*ns, key) == nullptr) log->append_tombstone(ns->name, key);
    replay_dropped.clear();
    for (const auto& [name, ns] : namespaces) stats.blocks_restored += ns.nodes.size();
    maybe_compact();
  }
};

BlockStore::BlockStore(BlockStoreOptions options) : options_(std::move(options)) {
  validate(options_);
  impl_ = std::make_unique<Impl>(options_);
  if (!options_.data_dir.empty()) impl_->recover(options_.data_dir);
}

BlockStore::~BlockStore() = default;

PutResult BlockStore::put(Block block) {
  // Hashed before taking the lock, so writers verify their blocks in parallel.
  const bool checksum_ok =
      block.value.size() <= options_.max_block_bytes && block_checksum(block.value) == block.checksum;
  std::lock_guard lock(impl_->mutex);
  Impl& s = *impl_;
  ++s.counters.puts;
  s.expire(Clock::now());
  const PutResult result = s.admit(std::move(block), checksum_ok, 0);
  switch (result) {
    case PutResult::stored: ++s.counters.stored; break;
    case PutResult::duplicate: ++s.counters.duplicates; break;
    case PutResult::staged: break;
    case PutResult::bad_checksum:
    case PutResult::too_large:
    case PutResult::invalid: ++s.counters.rejected; break;
  }
  s.maybe_compact();
  return result;
}

size_t BlockStore::lookup(const std::string& name_space, std::span<const BlockKey> keys) {
  std::lock_guard lock(impl_->mutex);
  Impl& s = *impl_;
  ++s.counters.lookups;
  const size_t hits = s.walk(name_space, keys, keys.size(), [](const Impl::Node&) {});
  s.counters.hit_blocks += hits;
  s.counters.miss_blocks += keys.size() - hits;
  return hits;
}

std::vector<BlockPtr> BlockStore::promote(const std::string& name_space, std::span<const BlockKey> keys,
                                          size_t max_blocks) {
  const size_t asked = std::min(max_blocks, keys.size());
  std::vector<BlockPtr> blocks;
  {
    std::lock_guard lock(impl_->mutex);
    ++impl_->counters.lookups;
    impl_->walk(name_space, keys, asked, [&](const Impl::Node& node) { blocks.push_back(node.block); });
  }
  // Blocks are immutable, so the (long) hashing runs without the lock.
  size_t good = 0;
  while (good < blocks.size() && block_checksum(blocks[good]->value) == blocks[good]->checksum) ++good;

  std::lock_guard lock(impl_->mutex);
  Impl& s = *impl_;
  if (good < blocks.size()) {
    const BlockPtr bad = blocks[good];
    blocks.resize(good);  // before removal, so the store does not count our copies as pinned
    Impl::Node* node = s.find(name_space, bad->key);
    if (node != nullptr && node->block == bad) {
      spdlog::warn("vault: block {} of namespace '{}' fails its checksum; removed with its descendants",
                   to_hex(bad->key), name_space);
      s.counters.corrupt_blocks += s.remove_subtree(node, true);
      s.maybe_compact();
    }
  }
  s.counters.hit_blocks += blocks.size();
  s.counters.miss_blocks += asked - blocks.size();
  return blocks;
}

size_t BlockStore::remove(const std::string& name_space, const BlockKey& key) {
  std::lock_guard lock(impl_->mutex);
  Impl& s = *impl_;
  Impl::Node* node = s.find(name_space, key);
  if (node == nullptr) return 0;
  const size_t removed = s.remove_subtree(node, true);
  s.counters.deletes += removed;
  s.maybe_compact();
  return removed;
}

void BlockStore::expire_orphans() {
  std::lock_guard lock(impl_->mutex);
  impl_->expire(Clock::now());
}

BlockStoreStats BlockStore::stats() const {
  std::lock_guard lock(impl_->mutex);
  const Impl& s = *impl_;
  BlockStoreStats out = s.counters;
  for (const auto& [name, ns] : s.namespaces) {
    out.blocks += ns.nodes.size();
    if (!ns.nodes.empty()) out.namespace_bytes[name] = ns.bytes;
  }
  out.bytes = s.bytes;
  out.staged_blocks = s.staged.size();
  out.staged_bytes = s.staged_bytes;
  s.prune_pinned();
  for (const auto& [block, charged] : s.pinned) out.memory_pinned_bytes += charged;
  if (s.log) {
    out.segment_files = s.log->segment_files();
    out.disk_bytes = s.log->disk_bytes();
  }
  return out;
}

bool BlockStore::corrupt_for_test(const std::string& name_space, const BlockKey& key) {
  std::lock_guard lock(impl_->mutex);
  Impl& s = *impl_;
  Impl::Node* node = s.find(name_space, key);
  if (node == nullptr) return false;
  Block& block = *node->block;
  if (block.value.empty())
    block.checksum ^= 1;  // nothing to flip: make the checksum disagree instead
  else
    block.value[block.value.size() / 2] ^= std::byte{0xFF};
  return true;
}

std::map<std::string, std::vector<BlockKey>> BlockStore::keys_for_test() const {
  std::lock_guard lock(impl_->mutex);
  std::map<std::string, std::vector<BlockKey>> out;
  for (const auto& [name, ns] : impl_->namespaces) {
    auto& keys = out[name];
    for (const auto& [key, node] : ns.nodes) keys.push_back(key);
  }
  return out;
}

}  // namespace hack::vault
