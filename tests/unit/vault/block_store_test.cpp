// The vault's block store (DESIGN.md §3.3): chains become visible only prefix-closed (out of
// order arrivals wait, abandoned ones expire), eviction takes LRU tails and never the path
// being stored, namespaces never see each other, a corrupted block ends a read and takes its
// descendants with it; segment files bring the same blocks back after a restart, with torn
// and damaged records dropped. Record offsets in the file tests are computed from the layout
// documented in block_store.h (not from the implementation), so they check the document too.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/block_key.h"
#include "hack/vault/block_store.h"

using namespace hack;
using namespace hack::vault;

namespace {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("hack_block_store_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::vector<std::filesystem::path> segment_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".hkv") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Record size per the documented layout: 100-byte header, namespace, value, u32 CRC.
constexpr size_t record_size(size_t ns_bytes, size_t value_bytes) { return 100 + ns_bytes + value_bytes + 4; }

BlockKey key_of(const std::string& label) {
  return sha256(std::span(reinterpret_cast<const uint8_t*>(label.data()), label.size()));
}

std::vector<std::byte> value_of(const std::string& label, size_t bytes) {
  std::mt19937_64 rng(std::hash<std::string>{}(label));
  std::vector<std::byte> v(bytes);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

Block make_block(const std::string& ns, const BlockKey& key, const BlockKey& parent, bool first, size_t value_bytes) {
  Block b;
  b.name_space = ns;
  b.key = key;
  b.parent = parent;
  b.first = first;
  b.codec = 2;
  b.value = value_of(ns + to_hex(key), value_bytes);
  b.checksum = block_checksum(b.value);
  return b;
}

// A chain of n blocks named "<tag>/0", "<tag>/1", ...; block 0 is first (its parent the root).
struct Chain {
  std::vector<Block> blocks;
  std::vector<BlockKey> keys;
};
Chain make_chain(const std::string& ns, const std::string& tag, int n, size_t value_bytes) {
  Chain c;
  BlockKey parent = key_of(tag + "/root");
  for (int i = 0; i < n; ++i) {
    const BlockKey key = key_of(tag + "/" + std::to_string(i));
    c.blocks.push_back(make_block(ns, key, parent, i == 0, value_bytes));
    c.keys.push_back(key);
    parent = key;
  }
  return c;
}

void put_all(BlockStore& store, const Chain& c) {
  for (const Block& b : c.blocks) REQUIRE(store.put(b) == PutResult::stored);
}

// Room for exactly n blocks of `value_bytes`.
size_t budget_for(int n, size_t value_bytes) { return n * (value_bytes + kBlockOverheadBytes); }

bool visible(BlockStore& store, const std::string& ns, const BlockKey& key) {
  return store.lookup(ns, std::span(&key, 1)) == 1;
}

}  // namespace

TEST_CASE("put, lookup and promote a chain", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 5, 1000);
  put_all(store, c);
  CHECK(store.lookup("ns", c.keys) == 5);
  CHECK(store.lookup("ns", std::span(c.keys).first(3)) == 3);
  CHECK(store.lookup("ns", std::span(c.keys).subspan(2)) == 3);  // any visible block may start a query

  std::vector<BlockKey> holed = c.keys;
  holed[2] = key_of("absent");
  CHECK(store.lookup("ns", holed) == 2);
  std::vector<BlockKey> unchained = {c.keys[0], c.keys[2]};  // keys[2]'s parent is not keys[0]
  CHECK(store.lookup("ns", unchained) == 1);

  const auto blocks = store.promote("ns", c.keys);
  REQUIRE(blocks.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(blocks[i]->key == c.keys[i]);
    CHECK(blocks[i]->value == c.blocks[i].value);
    CHECK(blocks[i]->first == (i == 0));
    CHECK(blocks[i]->codec == 2);
  }
  CHECK(store.promote("ns", c.keys, 2).size() == 2);
  CHECK(store.promote("other", c.keys).empty());

  const BlockStoreStats s = store.stats();
  CHECK(s.blocks == 5);
  CHECK(s.bytes == 5 * (1000 + kBlockOverheadBytes));
  CHECK(s.namespace_bytes.at("ns") == s.bytes);
  CHECK(s.puts == 5);
  CHECK(s.stored == 5);
  CHECK(s.lookups == 8);
  // hits 5+3+3+2+1 (lookups) + 5+2+0 (promotes); misses 0+0+0+3+1 + 0+0+5
  CHECK(s.hit_blocks == 21);
  CHECK(s.miss_blocks == 9);
}

TEST_CASE("a duplicate put keeps the first copy", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 2, 100);
  put_all(store, c);
  Block again = c.blocks[1];
  again.value.assign(100, std::byte{7});
  again.checksum = block_checksum(again.value);
  CHECK(store.put(again) == PutResult::duplicate);
  CHECK(store.promote("ns", c.keys).at(1)->value == c.blocks[1].value);
  CHECK(store.stats().duplicates == 1);
  CHECK(store.stats().blocks == 2);
}

TEST_CASE("a chain arriving out of order is staged until its parent arrives", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 5, 100);
  for (int i = 4; i >= 1; --i) {
    CHECK(store.put(c.blocks[i]) == PutResult::staged);
    CHECK(store.lookup("ns", std::span(c.keys).subspan(i)) == 0);  // staged blocks are invisible
  }
  CHECK(store.put(c.blocks[3]) == PutResult::staged);  // staged twice: still one
  CHECK(store.stats().staged_blocks == 4);
  CHECK(store.stats().staged_bytes == 4 * (100 + kBlockOverheadBytes));
  CHECK(store.put(c.blocks[0]) == PutResult::stored);
  CHECK(store.lookup("ns", c.keys) == 5);
  const BlockStoreStats s = store.stats();
  CHECK(s.staged_blocks == 0);
  CHECK(s.staged_bytes == 0);
  CHECK(s.blocks == 5);
}

TEST_CASE("staged blocks whose parent never comes expire", "[vault][block_store]") {
  BlockStoreOptions o;
  o.orphan_timeout_s = 0.02;
  BlockStore store(o);
  const Chain c = make_chain("ns", "a", 3, 100);
  CHECK(store.put(c.blocks[2]) == PutResult::staged);
  CHECK(store.put(c.blocks[1]) == PutResult::staged);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  store.expire_orphans();
  CHECK(store.stats().staged_blocks == 0);
  CHECK(store.stats().orphans_expired == 2);
  CHECK(store.put(c.blocks[0]) == PutResult::stored);
  CHECK(store.lookup("ns", c.keys) == 1);  // an abandoned store leaves nothing
  CHECK(store.stats().blocks == 1);
}

TEST_CASE("the staging budget drops the oldest staged block", "[vault][block_store]") {
  BlockStoreOptions o;
  o.max_orphan_bytes = 2 * (100 + kBlockOverheadBytes);
  BlockStore store(o);
  const Chain a = make_chain("ns", "a", 2, 100), b = make_chain("ns", "b", 2, 100), c = make_chain("ns", "c", 2, 100);
  CHECK(store.put(a.blocks[1]) == PutResult::staged);
  CHECK(store.put(b.blocks[1]) == PutResult::staged);
  CHECK(store.put(c.blocks[1]) == PutResult::staged);  // drops a's
  CHECK(store.stats().staged_blocks == 2);
  CHECK(store.stats().orphans_expired == 1);
  for (const Chain* chain : {&a, &b, &c}) CHECK(store.put(chain->blocks[0]) == PutResult::stored);
  CHECK(store.lookup("ns", a.keys) == 1);
  CHECK(store.lookup("ns", b.keys) == 2);
  CHECK(store.lookup("ns", c.keys) == 2);
  Block big = make_block("ns", key_of("big"), key_of("nowhere"), false, 1000);
  CHECK(store.put(big) == PutResult::too_large);  // cannot wait within the staging budget
}

TEST_CASE("a block whose value does not match its checksum is rejected", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 3, 100);
  Block bad = c.blocks[0];
  bad.value[10] ^= std::byte{1};
  CHECK(store.put(bad) == PutResult::bad_checksum);
  CHECK(store.lookup("ns", c.keys) == 0);
  Block bad_staged = c.blocks[2];
  bad_staged.checksum ^= 1;
  CHECK(store.put(bad_staged) == PutResult::bad_checksum);  // not staged either
  CHECK(store.put(c.blocks[0]) == PutResult::stored);
  CHECK(store.put(c.blocks[1]) == PutResult::stored);
  CHECK(store.lookup("ns", c.keys) == 2);
  CHECK(store.stats().rejected == 2);
  CHECK(store.stats().staged_blocks == 0);
}

TEST_CASE("invalid and oversized blocks are rejected", "[vault][block_store]") {
  BlockStoreOptions o;
  o.max_block_bytes = 1000;
  o.max_bytes = 4000;
  o.namespace_quota_bytes["tight"] = 500;
  BlockStore store(o);
  const Chain c = make_chain("ns", "a", 1, 100);
  Block b = c.blocks[0];
  b.name_space = "";
  CHECK(store.put(b) == PutResult::invalid);
  b = c.blocks[0];
  b.parent = b.key;
  CHECK(store.put(b) == PutResult::invalid);
  b = c.blocks[0];
  b.name_space = std::string(70000, 'n');
  CHECK(store.put(b) == PutResult::invalid);
  CHECK(store.put(make_block("ns", key_of("x"), key_of("r"), true, 1001)) == PutResult::too_large);
  CHECK(store.put(make_block("tight", key_of("x"), key_of("r"), true, 300)) == PutResult::too_large);
  CHECK(store.put(make_block("tight", key_of("x"), key_of("r"), true, 200)) == PutResult::stored);
  CHECK(store.stats().rejected == 5);
  CHECK_THROWS_AS(BlockStore(BlockStoreOptions{.max_bytes = 0}), Error);
}

TEST_CASE("eviction takes the least recently used chain's tail first", "[vault][block_store]") {
  constexpr size_t kValue = 500;
  BlockStoreOptions o;
  o.max_bytes = budget_for(10, kValue);
  BlockStore store(o);
  const Chain a = make_chain("ns", "a", 5, kValue), b = make_chain("ns", "b", 5, kValue);
  put_all(store, a);
  put_all(store, b);
  CHECK(store.lookup("ns", a.keys) == 5);  // a is now more recent than b
  const Chain c = make_chain("ns", "c", 3, kValue);
  put_all(store, c);
  // (Checked only now: a lookup touches what it finds.)
  CHECK(store.lookup("ns", a.keys) == 5);
  CHECK(store.lookup("ns", b.keys) == 2);  // b lost its last three blocks
  CHECK(store.lookup("ns", c.keys) == 3);
  const BlockStoreStats s = store.stats();
  CHECK(s.evictions == 3);
  CHECK(s.evicted_bytes == 3 * (kValue + kBlockOverheadBytes));
  CHECK(s.bytes <= o.max_bytes);
}

TEST_CASE("eviction never takes the ancestors of the block being stored", "[vault][block_store]") {
  constexpr size_t kValue = 500;
  BlockStoreOptions o;
  o.max_bytes = budget_for(6, kValue);
  BlockStore store(o);
  const Chain y = make_chain("ns", "y", 7, kValue), x = make_chain("ns", "x", 3, kValue);
  for (int i = 0; i < 3; ++i) REQUIRE(store.put(y.blocks[i]) == PutResult::stored);
  put_all(store, x);  // x is more recent: y's prefix is the least recently used
  for (int i = 3; i < 6; ++i) REQUIRE(store.put(y.blocks[i]) == PutResult::stored);
  CHECK(store.lookup("ns", y.keys) == 6);
  CHECK(store.lookup("ns", x.keys) == 0);
  // The 7th block cannot fit without evicting its own ancestors: refused, the prefix stays.
  CHECK(store.put(y.blocks[6]) == PutResult::too_large);
  CHECK(store.lookup("ns", y.keys) == 6);
}

TEST_CASE("random chains with shared prefixes stay prefix-closed under eviction", "[vault][block_store]") {
  const uint64_t seed = 20260523;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int kBlockTokens = 4;
  constexpr size_t kValue = 64;
  BlockStoreOptions o;
  o.max_bytes = budget_for(40, kValue);
  o.namespace_quota_bytes["b"] = budget_for(15, kValue);
  BlockStore store(o);

  struct Known {
    BlockKey parent;
    bool first;
  };
  std::map<std::pair<std::string, BlockKey>, Known> known;  // every block ever put
  std::vector<std::pair<std::string, std::vector<BlockKey>>> prompts;
  KvFingerprint fingerprint;
  fingerprint.add("model", "test");
  size_t stored = 0, lookups = 0;
  for (int round = 0; round < 400; ++round) {
    const std::string ns = rng() % 3 == 0 ? "b" : "a";
    // A prompt from a 3-token vocabulary, so prompts share prefixes often.
    std::vector<int> tokens(kBlockTokens * (1 + rng() % 8));
    for (int& t : tokens) t = static_cast<int>(rng() % 3);
    const BlockKey root = chain_root(fingerprint, ns);
    const std::vector<BlockKey> keys = chain_keys(root, tokens, kBlockTokens);
    // Put in order, or occasionally in a random order (staged until the parent arrives).
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (rng() % 4 == 0) std::shuffle(order.begin(), order.end(), rng);
    for (const size_t i : order) {
      Block b = make_block(ns, keys[i], i == 0 ? root : keys[i - 1], i == 0, kValue);
      known[{ns, keys[i]}] = {b.parent, b.first};
      const PutResult r = store.put(std::move(b));
      REQUIRE((r == PutResult::stored || r == PutResult::duplicate || r == PutResult::staged));
      stored += r == PutResult::stored;
    }
    prompts.emplace_back(ns, keys);
    for (int q = 0; q < 3; ++q) {
      const auto& [qns, qkeys] = prompts[rng() % prompts.size()];
      const size_t hit = store.lookup(qns, qkeys);
      REQUIRE(hit <= qkeys.size());
      ++lookups;
      // The hit prefix is really there: a promote of it returns it whole.
      REQUIRE(store.promote(qns, std::span(qkeys).first(hit)).size() == hit);
    }
    const BlockStoreStats s = store.stats();
    REQUIRE(s.bytes <= o.max_bytes);
    const auto b_bytes = s.namespace_bytes.find("b");
    REQUIRE((b_bytes == s.namespace_bytes.end() || b_bytes->second <= o.namespace_quota_bytes.at("b")));
  }
  CHECK(store.stats().evictions > 100);  // the budget really was exercised
  size_t visible_blocks = 0;
  for (const auto& [id, k] : known) {
    if (!visible(store, id.first, id.second)) continue;
    ++visible_blocks;
    INFO("block " << to_hex(id.second) << " in " << id.first);
    CHECK((k.first || visible(store, id.first, k.parent)));
    if (!k.first) {  // and the chain relation holds
      const BlockKey pair[2] = {k.parent, id.second};
      CHECK(store.lookup(id.first, pair) == 2);
    }
  }
  CHECK(visible_blocks == store.stats().blocks);
  CHECK(visible_blocks > 10);
}

TEST_CASE("namespaces are isolated", "[vault][block_store]") {
  BlockStore store({});
  const Chain a = make_chain("tenant-a", "shared", 3, 100);
  Chain b = make_chain("tenant-b", "shared", 3, 100);  // the same keys
  for (Block& blk : b.blocks) {
    blk.value.assign(100, std::byte{0xB});
    blk.checksum = block_checksum(blk.value);
  }
  put_all(store, a);
  CHECK(store.lookup("tenant-b", a.keys) == 0);
  put_all(store, b);  // the same keys in another namespace are other blocks, not duplicates
  CHECK(store.promote("tenant-a", a.keys).at(2)->value == a.blocks[2].value);
  CHECK(store.promote("tenant-b", b.keys).at(2)->value == b.blocks[2].value);
  CHECK(store.promote("tenant-b", b.keys).at(2)->name_space == "tenant-b");
  CHECK(store.remove("tenant-a", a.keys[0]) == 3);
  CHECK(store.lookup("tenant-a", a.keys) == 0);
  CHECK(store.lookup("tenant-b", b.keys) == 3);
  CHECK(store.lookup("tenant-c", b.keys) == 0);
  // A staged block waits for its parent in its own namespace only.
  const Chain c = make_chain("tenant-c", "c", 2, 100);
  CHECK(store.put(c.blocks[1]) == PutResult::staged);
  CHECK(store.put(make_block("tenant-d", c.keys[0], key_of("c/root"), true, 100)) == PutResult::stored);
  CHECK(store.stats().staged_blocks == 1);
}

TEST_CASE("a namespace quota evicts that namespace's blocks first", "[vault][block_store]") {
  constexpr size_t kValue = 200;
  BlockStoreOptions o;
  o.max_bytes = budget_for(20, kValue);
  o.namespace_quota_bytes["small"] = budget_for(3, kValue);
  BlockStore store(o);
  const Chain big = make_chain("big", "big", 5, kValue);
  put_all(store, big);  // older than anything in "small"
  std::vector<Chain> small;
  for (int i = 0; i < 5; ++i) {
    small.push_back(make_chain("small", "s" + std::to_string(i), 1, kValue));
    put_all(store, small.back());
  }
  CHECK(store.lookup("big", big.keys) == 5);
  for (int i = 0; i < 5; ++i) CHECK(store.lookup("small", small[i].keys) == (i >= 2 ? 1u : 0u));
  const BlockStoreStats s = store.stats();
  CHECK(s.namespace_bytes.at("small") == budget_for(3, kValue));
  CHECK(s.evictions == 2);
  // A chain longer than its quota: the block that would need its own ancestors evicted is refused.
  const Chain longer = make_chain("small", "long", 4, kValue);
  for (int i = 0; i < 3; ++i) CHECK(store.put(longer.blocks[i]) == PutResult::stored);
  CHECK(store.put(longer.blocks[3]) == PutResult::too_large);
  CHECK(store.lookup("small", longer.keys) == 3);
}

TEST_CASE("a corrupted block ends a promote and goes with its descendants", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 5, 100);
  put_all(store, c);
  const Block branch = make_block("ns", key_of("branch"), c.keys[2], false, 100);  // a sibling of block 3
  REQUIRE(store.put(branch) == PutResult::stored);
  const std::vector<BlockPtr> held = store.promote("ns", c.keys);  // a reader still sending these
  REQUIRE(held.size() == 5);

  REQUIRE(store.corrupt_for_test("ns", c.keys[2]));
  CHECK_FALSE(store.corrupt_for_test("ns", key_of("absent")));
  CHECK(store.lookup("ns", c.keys) == 5);  // lookup does not hash
  const auto blocks = store.promote("ns", c.keys);
  REQUIRE(blocks.size() == 2);
  CHECK(blocks[1]->key == c.keys[1]);
  CHECK(store.lookup("ns", c.keys) == 2);
  CHECK_FALSE(visible(store, "ns", branch.key));
  BlockStoreStats s = store.stats();
  CHECK(s.corrupt_blocks == 4);  // blocks 2, 3, 4 and the branch
  CHECK(s.blocks == 2);
  CHECK(s.memory_pinned_bytes == 3 * (100 + kBlockOverheadBytes));  // held's blocks 2, 3, 4
  // Stored again intact, the chain is whole again.
  for (int i = 2; i < 5; ++i) CHECK(store.put(c.blocks[i]) == PutResult::stored);
  CHECK(store.promote("ns", c.keys).size() == 5);
}

TEST_CASE("remove takes a block and its descendants, readers keep theirs", "[vault][block_store]") {
  BlockStore store({});
  const Chain c = make_chain("ns", "a", 4, 100);
  put_all(store, c);
  const Chain d = make_chain("ns", "d", 2, 100);
  put_all(store, d);
  std::vector<BlockPtr> held = store.promote("ns", c.keys);
  CHECK(store.remove("ns", c.keys[1]) == 3);
  CHECK(store.remove("ns", c.keys[1]) == 0);
  CHECK(store.remove("other", c.keys[0]) == 0);
  CHECK(store.lookup("ns", c.keys) == 1);
  CHECK(store.lookup("ns", d.keys) == 2);
  BlockStoreStats s = store.stats();
  CHECK(s.deletes == 3);
  CHECK(s.blocks == 3);
  CHECK(s.bytes == 3 * (100 + kBlockOverheadBytes));
  CHECK(s.memory_pinned_bytes == 3 * (100 + kBlockOverheadBytes));
  CHECK(held[3]->value == c.blocks[3].value);  // still readable
  held.clear();
  CHECK(store.stats().memory_pinned_bytes == 0);
}

TEST_CASE("concurrent writers and readers keep the store consistent", "[vault][block_store]") {
  constexpr size_t kValue = 256;
  BlockStoreOptions o;
  o.max_bytes = budget_for(60, kValue);
  BlockStore store(o);
  constexpr int kThreads = 4, kChains = 40, kLength = 6;
  std::vector<std::vector<Chain>> chains(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int c = 0; c < kChains; ++c)  // threads share half their chains, so puts race on the same keys
      chains[t].push_back(make_chain("ns", "t" + std::to_string(c % 2 == 0 ? 0 : t) + "c" + std::to_string(c), kLength,
                                     kValue));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const Chain& c : chains[t]) {
        for (int i = kLength - 1; i >= 0; --i) store.put(c.blocks[i]);  // reversed: staging too
        const auto blocks = store.promote("ns", c.keys);
        for (size_t i = 0; i < blocks.size(); ++i)
          if (blocks[i]->key != c.keys[i] || blocks[i]->value != c.blocks[i].value) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  const BlockStoreStats s = store.stats();
  CHECK(s.bytes <= o.max_bytes);
  CHECK(s.staged_blocks == 0);
  CHECK(s.evictions > 0);
  size_t visible_blocks = 0;
  std::set<BlockKey> seen;
  for (const auto& per_thread : chains)
    for (const Chain& c : per_thread) {
      if (!seen.insert(c.keys[0]).second) continue;
      const size_t hit = store.lookup("ns", c.keys);
      for (size_t i = hit; i < c.keys.size(); ++i) CHECK_FALSE(visible(store, "ns", c.keys[i]));
      visible_blocks += hit;
    }
  CHECK(visible_blocks == s.blocks);
}

// ---- persistence ----

namespace {

BlockStoreOptions disk_options(const TempDir& dir) {
  BlockStoreOptions o;
  o.data_dir = dir.str();
  return o;
}

void check_chain(BlockStore& store, const Chain& c, size_t expect) {
  const auto blocks = store.promote(c.blocks.at(0).name_space, c.keys);
  REQUIRE(blocks.size() == expect);
  for (size_t i = 0; i < expect; ++i) {
    CHECK(blocks[i]->key == c.keys[i]);
    CHECK(blocks[i]->parent == c.blocks[i].parent);
    CHECK(blocks[i]->first == c.blocks[i].first);
    CHECK(blocks[i]->codec == c.blocks[i].codec);
    CHECK(blocks[i]->checksum == c.blocks[i].checksum);
    CHECK(blocks[i]->value == c.blocks[i].value);
  }
}

void flip_byte(const std::filesystem::path& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("persisted blocks come back after a restart", "[vault][block_store][persist]") {
  TempDir dir;
  const Chain a = make_chain("ns", "a", 4, 300), b = make_chain("other", "b", 3, 0);
  Chain out_of_order = make_chain("ns", "o", 3, 300);
  {
    BlockStore store(disk_options(dir));
    put_all(store, a);
    put_all(store, b);
    CHECK(store.put(out_of_order.blocks[2]) == PutResult::staged);  // not on disk until visible
    CHECK(store.put(out_of_order.blocks[1]) == PutResult::staged);
    CHECK(store.put(out_of_order.blocks[0]) == PutResult::stored);
    const BlockStoreStats s = store.stats();
    CHECK(s.segment_files == 1);
    CHECK(s.disk_bytes == 7 * record_size(2, 300) + 3 * record_size(5, 0));
  }
  BlockStore store(disk_options(dir));
  check_chain(store, a, 4);
  check_chain(store, b, 3);
  check_chain(store, out_of_order, 3);
  const BlockStoreStats s = store.stats();
  CHECK(s.recovery.segments == 1);
  CHECK(s.recovery.records == 10);
  CHECK(s.recovery.blocks_restored == 10);
  CHECK(s.recovery.torn_records == 0);
  CHECK(s.recovery.corrupt_records == 0);
  CHECK(s.recovery.orphans_dropped == 0);
}

TEST_CASE("a data dir is used by one store at a time", "[vault][block_store][persist]") {
  TempDir dir;
  BlockStore store(disk_options(dir));
  CHECK_THROWS_WITH(BlockStore(disk_options(dir)), Catch::Contains("in use") && Catch::Contains(dir.str()));
}

TEST_CASE("evicted and removed blocks stay gone after a restart", "[vault][block_store][persist]") {
  TempDir dir;
  constexpr size_t kValue = 300;
  BlockStoreOptions o = disk_options(dir);
  o.max_bytes = budget_for(6, kValue);
  const Chain a = make_chain("ns", "a", 4, kValue), b = make_chain("ns", "b", 4, kValue);
  const Chain c = make_chain("ns", "c", 3, kValue);
  {
    BlockStore store(o);
    put_all(store, a);
    put_all(store, b);  // evicts a's blocks 3 and 2
    CHECK(store.lookup("ns", a.keys) == 2);
    CHECK(store.remove("ns", b.keys[2]) == 2);
    put_all(store, c);  // evicts b's block 1 (a's blocks were touched by the lookup)
  }
  BlockStore store(o);
  const size_t a_hits = store.lookup("ns", a.keys), b_hits = store.lookup("ns", b.keys);
  CHECK(store.lookup("ns", c.keys) == 3);
  CHECK(a_hits + b_hits + 3 == store.stats().blocks);
  CHECK(a_hits == 2);
  CHECK(b_hits == 1);
  CHECK(store.stats().evictions == 0);  // nothing needed evicting at the restart
}

TEST_CASE("a torn last record is cut off and the file stays usable", "[vault][block_store][persist]") {
  TempDir dir;
  const Chain a = make_chain("ns", "a", 4, 500);
  {
    BlockStore store(disk_options(dir));
    for (int i = 0; i < 3; ++i) REQUIRE(store.put(a.blocks[i]) == PutResult::stored);
  }
  const auto files = segment_files(dir.path());
  REQUIRE(files.size() == 1);
  const uint64_t whole = 3 * record_size(2, 500);
  REQUIRE(std::filesystem::file_size(files[0]) == whole);
  std::filesystem::resize_file(files[0], whole - 7);
  {
    BlockStore store(disk_options(dir));
    const BlockStoreStats s = store.stats();
    CHECK(s.recovery.torn_records == 1);
    CHECK(s.recovery.records == 2);
    CHECK(std::filesystem::file_size(files[0]) == 2 * record_size(2, 500));
    check_chain(store, a, 2);
    CHECK(store.put(a.blocks[2]) == PutResult::stored);
    CHECK(store.put(a.blocks[3]) == PutResult::stored);
  }
  BlockStore store(disk_options(dir));
  check_chain(store, a, 4);
  CHECK(store.stats().recovery.torn_records == 0);
}

TEST_CASE("a torn header at a file's end is cut off too", "[vault][block_store][persist]") {
  TempDir dir;
  const Chain a = make_chain("ns", "a", 3, 500);
  {
    BlockStore store(disk_options(dir));
    put_all(store, a);
  }
  const auto file = segment_files(dir.path()).at(0);
  std::filesystem::resize_file(file, 2 * record_size(2, 500) + 40);  // inside the third header
  BlockStore store(disk_options(dir));
  CHECK(store.stats().recovery.torn_records == 1);
  check_chain(store, a, 2);
}

TEST_CASE("a damaged record is skipped and its descendants dropped", "[vault][block_store][persist]") {
  TempDir dir;
  constexpr size_t kValue = 400;
  const Chain a = make_chain("ns", "a", 4, kValue), b = make_chain("ns", "b", 2, kValue);
  {
    BlockStore store(disk_options(dir));
    put_all(store, a);
    put_all(store, b);
  }
  const auto file = segment_files(dir.path()).at(0);
  const uint64_t rec = record_size(2, kValue);
  SECTION("a flipped value byte") { flip_byte(file, 1 * rec + 100 + 2 + 17); }  // a's block 1
  SECTION("a flipped header byte") { flip_byte(file, 1 * rec + 40); }         // a's block 1, in its key
  {
    BlockStore store(disk_options(dir));
    const BlockStoreStats s = store.stats();
    CHECK(s.recovery.corrupt_records == 1);
    CHECK(s.recovery.orphans_dropped == 2);  // a's blocks 2 and 3
    CHECK(s.recovery.blocks_restored == 3);
    check_chain(store, a, 1);
    check_chain(store, b, 2);
    CHECK(store.put(a.blocks[1]) == PutResult::stored);  // stored again, whole
  }
  BlockStore store(disk_options(dir));
  CHECK(store.stats().recovery.corrupt_records == 1);
  CHECK(store.stats().recovery.orphans_dropped == 0);  // tombstoned last time: they stay gone
  check_chain(store, a, 2);
  check_chain(store, b, 2);
}

TEST_CASE("segments roll and compaction shrinks the log without losing blocks", "[vault][block_store][persist]") {
  TempDir dir;
  constexpr size_t kValue = 1000;
  BlockStoreOptions o = disk_options(dir);
  o.segment_bytes = 4096;
  o.compact_ratio = 1.0;
  std::vector<Chain> chains;
  for (int i = 0; i < 6; ++i) chains.push_back(make_chain("ns", "c" + std::to_string(i), 4, kValue));
  uint64_t disk_before = 0;
  {
    BlockStore store(o);
    for (const Chain& c : chains) put_all(store, c);
    BlockStoreStats s = store.stats();
    CHECK(s.segment_files > 1);
    CHECK(s.disk_bytes == 24 * record_size(2, kValue));
    disk_before = s.disk_bytes;
    CHECK(store.remove("ns", chains[0].keys[0]) == 4);
    CHECK(store.remove("ns", chains[1].keys[0]) == 4);
    CHECK(store.stats().compactions == 0);  // dead 8 records + 2 tombstones < live 16 records
    CHECK(store.remove("ns", chains[2].keys[0]) == 4);  // dead 12 records + 3 tombstones > live 12
    s = store.stats();
    CHECK(s.compactions == 1);
    CHECK(s.segment_files == 1);
    CHECK(s.disk_bytes == 12 * record_size(2, kValue));
    CHECK(s.disk_bytes < disk_before);
    CHECK(store.remove("ns", chains[3].keys[1]) == 3);  // its tombstone opens a second segment
    s = store.stats();
    CHECK(s.segment_files == 2);
    CHECK(s.disk_bytes == 12 * record_size(2, kValue) + record_size(2, 0));
    check_chain(store, chains[3], 1);
    check_chain(store, chains[4], 4);
    check_chain(store, chains[5], 4);
    put_all(store, chains[0]);  // appends after compaction
  }
  BlockStore store(o);
  CHECK(store.stats().recovery.blocks_restored == 13);
  check_chain(store, chains[0], 4);
  CHECK(store.lookup("ns", chains[1].keys) == 0);
  CHECK(store.lookup("ns", chains[2].keys) == 0);
  check_chain(store, chains[3], 1);
  check_chain(store, chains[4], 4);
  check_chain(store, chains[5], 4);
}

TEST_CASE("a smaller budget at restart evicts and the eviction persists", "[vault][block_store][persist]") {
  TempDir dir;
  constexpr size_t kValue = 300;
  std::vector<Chain> chains;
  for (int i = 0; i < 4; ++i) chains.push_back(make_chain("ns", "c" + std::to_string(i), 3, kValue));
  {
    BlockStore store(disk_options(dir));
    for (const Chain& c : chains) put_all(store, c);
  }
  auto check_prefix_closed = [&](BlockStore& store) {
    size_t total = 0;
    for (const Chain& c : chains) {
      const size_t hit = store.lookup("ns", c.keys);
      for (size_t i = hit; i < c.keys.size(); ++i) CHECK_FALSE(visible(store, "ns", c.keys[i]));
      total += hit;
    }
    return total;
  };
  BlockStoreOptions small = disk_options(dir);
  small.max_bytes = budget_for(5, kValue);
  {
    BlockStore store(small);
    const BlockStoreStats s = store.stats();
    CHECK(s.bytes <= small.max_bytes);
    CHECK(s.blocks == 5);
    CHECK(s.evictions == 7);
    CHECK(check_prefix_closed(store) == 5);
    CHECK(store.lookup("ns", chains[3].keys) == 3);  // the most recently written survive
  }
  BlockStore store(disk_options(dir));  // a big budget again: the evictions were persisted
  CHECK(store.stats().blocks == 5);
  CHECK(check_prefix_closed(store) == 5);
}
