// hack-vault in process (vault/vault_server.h) and a node's client (net/vault_client.h) over
// UCX on loopback: stores become visible whole, lookups and promotes find the longest chain,
// promoted layers equal what was stored, and every failure is an error the caller can act on.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "hack/kv/kv_block.h"
#include "hack/net/vault_client.h"
#include "hack/vault/vault_server.h"

using namespace hack;
using namespace hack::net;
using namespace hack::vault;

namespace {

const KvShape kShape{3, 2, 32, 2};  // layers, kv heads, head_dim, group
constexpr int kTokens = 16;

// Block i of a chain: random K/V per layer, int8-head slices.
std::vector<std::vector<std::byte>> block_slices(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  std::vector<std::vector<std::byte>> slices(kShape.num_layers);
  std::vector<float> k(static_cast<size_t>(kTokens * kShape.num_kv_heads * kShape.head_dim)), v(k.size());
  for (auto& s : slices) {
    for (auto& x : k) x = n(rng);
    for (auto& x : v) x = n(rng);
    encode_kv_block_layer(k.data(), v.data(), kTokens, kShape.num_kv_heads, kShape.head_dim, BlockCodec::int8_head,
                          DType::f32, s);
  }
  return slices;
}

struct Chain {
  BlockKey root;
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::vector<std::byte>>> slices;
  std::vector<std::vector<std::byte>> values;
};

Chain make_chain(const std::string& label, int blocks) {
  KvFingerprint f;
  f.add("test", label);
  Chain c;
  c.root = chain_root(f, "default");
  std::vector<int> tokens(static_cast<size_t>(blocks * kTokens));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i % 97);
  c.keys = chain_keys(c.root, tokens, kTokens);
  for (int b = 0; b < blocks; ++b) {
    c.slices.push_back(block_slices(std::hash<std::string>{}(label) + static_cast<uint64_t>(b)));
    c.values.push_back(assemble_kv_block(BlockCodec::int8_head, DType::i8, kShape, int64_t{b} * kTokens, kTokens,
                                         c.slices.back()));
  }
  return c;
}

// A port a UCX listener had a moment ago: nothing listens there now.
uint16_t unused_port() {
  UcxWorker probe;
  return probe.listen("127.0.0.1", 0);
}

struct Fixture {
  std::unique_ptr<VaultServer> server;
  std::unique_ptr<UcxWorker> worker = std::make_unique<UcxWorker>();
  std::unique_ptr<VaultClient> client;

  explicit Fixture(const std::string& max_bytes = "64M") {
    VaultServerConfig c;
    c.port = 0;
    c.ucx_port = 0;
    c.max_bytes = max_bytes;
    server = std::make_unique<VaultServer>(c);
    client = std::make_unique<VaultClient>(*worker,
                                           VaultClientOptions{"127.0.0.1", static_cast<uint16_t>(server->ucx_port())});
  }
  ~Fixture() {
    client.reset();
    worker.reset();
    server.reset();
  }

  void store(const std::string& ns, const Chain& c, int b) {
    const auto i = static_cast<size_t>(b);
    client->store(ns, c.keys[i], b == 0 ? c.root : c.keys[i - 1], b == 0, static_cast<uint8_t>(BlockCodec::int8_head),
                  c.values[i]);
  }

  size_t found(const std::string& ns, std::span<const BlockKey> keys) {
    size_t n = 0;
    const Status s = client->lookup(ns, keys, 5.0, n);
    INFO(s.message());
    REQUIRE(s);
    return n;
  }

  // Waits until the vault holds `blocks` blocks (stores are fire-and-forget).
  void wait_blocks(uint64_t blocks) {
    REQUIRE(client->flush(5.0));
    for (int i = 0; i < 500 && server->stats().blocks < blocks; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(server->stats().blocks == blocks);
  }
};

}  // namespace

TEST_CASE("vault: stored chains are found and promoted layer by layer, byte for byte", "[vault_server]") {
  Fixture f;
  const Chain c = make_chain("a", 4);
  // Out of order: block 2 before its parent is staged, then published with it.
  f.store("default", c, 0);
  f.store("default", c, 2);
  f.store("default", c, 1);
  f.store("default", c, 3);
  f.wait_blocks(4);
  CHECK(f.found("default", c.keys) == 4);
  CHECK(f.found("default", std::span<const BlockKey>(c.keys).subspan(1)) == 3);

  auto p = f.client->promote("default", c.keys);
  REQUIRE(p->wait_head(5.0));
  REQUIRE(p->head().headers.size() == 4);
  for (int l = kShape.num_layers - 1; l >= 0; --l) {  // any order
    std::vector<std::span<const std::byte>> slices;
    REQUIRE(p->wait_layer(l, 5.0, slices));
    REQUIRE(slices.size() == 4);
    for (size_t b = 0; b < 4; ++b) {
      const auto& want = c.slices[b][static_cast<size_t>(l)];
      CHECK(std::equal(slices[b].begin(), slices[b].end(), want.begin(), want.end()));
    }
  }
  auto limited = f.client->promote("default", c.keys, 2);
  REQUIRE(limited->wait_head(5.0));
  CHECK(limited->head().headers.size() == 2);
  CHECK(f.server->stats().hit_blocks >= 4);
}

TEST_CASE("vault: namespaces never see each other's blocks", "[vault_server]") {
  Fixture f;
  const Chain c = make_chain("a", 2);
  f.store("tenant-a", c, 0);
  f.store("tenant-a", c, 1);
  f.wait_blocks(2);
  CHECK(f.found("tenant-a", c.keys) == 2);
  CHECK(f.found("tenant-b", c.keys) == 0);
  auto p = f.client->promote("tenant-b", c.keys);
  REQUIRE(p->wait_head(5.0));
  CHECK(p->head().headers.empty());
}

TEST_CASE("vault: delete removes a block and its descendants", "[vault_server]") {
  Fixture f;
  const Chain c = make_chain("a", 5);
  for (int b = 0; b < 5; ++b) f.store("default", c, b);
  f.wait_blocks(5);
  size_t removed = 0;
  REQUIRE(f.client->remove("default", c.keys[3], 5.0, removed));
  CHECK(removed == 2);
  CHECK(f.found("default", c.keys) == 3);
}

TEST_CASE("vault: bad stores are refused and the vault keeps serving", "[vault_server]") {
  Fixture f;
  const Chain c = make_chain("a", 2);
  std::vector<std::byte> garbage(200, std::byte{7});
  f.client->store("default", c.keys[0], c.root, true, 2, garbage);  // not a kv block
  auto bad_codec = c.values[0];
  f.client->store("default", c.keys[0], c.root, true, 1, bad_codec);  // declared codec != the block's
  f.store("default", c, 0);
  f.store("default", c, 1);
  f.wait_blocks(2);
  CHECK(f.found("default", c.keys) == 2);
}

TEST_CASE("vault: an unreachable vault is an error within the timeout, and redials are rate-limited",
          "[vault_server]") {
  UcxWorker worker;
  VaultClient client(worker, VaultClientOptions{"127.0.0.1", unused_port(), 60.0});
  const Chain c = make_chain("a", 1);
  size_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(client.lookup("default", c.keys, 2.0, n));
  CHECK_FALSE(client.lookup("default", c.keys, 2.0, n));  // no redial within the interval: at once
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 4.5);
  auto p = client.promote("default", c.keys);
  CHECK_FALSE(p->wait_head(1.0));
  CHECK(client.stats().call_errors >= 2);
}

TEST_CASE("vault: a vault that starts where none listened is found by a later call, never behind a dead endpoint",
          "[vault_server]") {
  // Each dial to the dead port fails fast, and its failure may reach the client before the
  // dial's own result (seen under load): the client must not keep that endpoint either way.
  UcxWorker worker;
  const uint16_t port = unused_port();
  VaultClient client(worker, VaultClientOptions{"127.0.0.1", port, 0.05});
  const Chain c = make_chain("late", 2);
  size_t n = 0;
  for (int i = 0; i < 20; ++i) {
    CHECK_FALSE(client.lookup("default", c.keys, 1.0, n));
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past the redial interval
  }
  VaultServerConfig config;
  config.port = 0;
  config.ucx_port = port;
  config.max_bytes = "64M";
  VaultServer server(config);
  bool found = false;
  for (int i = 0; i < 40 && !found; ++i) {
    found = client.lookup("default", c.keys, 1.0, n).is_ok();
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  CHECK(found);
  CHECK(n == 0);  // an empty vault answers: nothing stored yet
}

TEST_CASE("vault: stores racing promotes never serve a partial block", "[vault_server]") {
  Fixture f;
  const Chain c = make_chain("race", 8);
  std::thread writer([&] {
    for (int b = 0; b < 8; ++b) {
      f.store("default", c, b);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (int round = 0; round < 40; ++round) {
    auto p = f.client->promote("default", c.keys);
    REQUIRE(p->wait_head(5.0));
    const size_t n = p->head().headers.size();
    for (int l = 0; l < kShape.num_layers && n > 0; ++l) {
      std::vector<std::span<const std::byte>> slices;
      REQUIRE(p->wait_layer(l, 5.0, slices));  // checksums verified inside
      for (size_t b = 0; b < n; ++b) {
        const auto& want = c.slices[b][static_cast<size_t>(l)];
        REQUIRE(std::equal(slices[b].begin(), slices[b].end(), want.begin(), want.end()));
      }
    }
  }
  writer.join();
  f.wait_blocks(8);
}

// The vault admits only the cluster (net/wire.h WireAuth with kVaultAuthLabel): a client
// without the secret, with another one, or with the KV-transfer key of the same secret is
// refused, counted and logged, and the vault goes on serving the right client.
TEST_CASE("vault: calls without the cluster's vault MAC are refused and counted, the right key is served",
          "[vault_server]") {
  VaultServerConfig c;
  c.port = 0;
  c.ucx_port = 0;
  c.max_bytes = "64M";
  c.secret = "cluster-secret";
  VaultServer server(c);
  const auto port = static_cast<uint16_t>(server.ucx_port());
  // One worker per client: a client owns its worker's reply handler.
  struct Node {
    UcxWorker worker;
    std::unique_ptr<VaultClient> client;
    Node(uint16_t vault_port, WireAuth auth) {
      VaultClientOptions o{"127.0.0.1", vault_port};
      o.auth = std::move(auth);
      client = std::make_unique<VaultClient>(worker, o);
    }
    ~Node() { client.reset(); }
    VaultClient* operator->() { return client.get(); }
  };
  Node good(port, WireAuth("cluster-secret", kVaultAuthLabel));
  const Chain chain = make_chain("a", 2);
  for (int b = 0; b < 2; ++b) {
    const auto i = static_cast<size_t>(b);
    good->store("default", chain.keys[i], b == 0 ? chain.root : chain.keys[i - 1], b == 0,
                static_cast<uint8_t>(BlockCodec::int8_head), chain.values[i]);
  }
  REQUIRE(good->flush(5.0));
  for (int i = 0; i < 500 && server.stats().blocks < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(server.stats().blocks == 2);

  struct Stranger {
    const char* what;
    WireAuth auth;
    const char* reason;  // the metrics label its calls are refused with
  };
  const std::vector<Stranger> strangers = {
      {"no secret", WireAuth(), "unauthenticated"},
      {"another secret", WireAuth("not-the-cluster", kVaultAuthLabel), "bad_mac"},
      {"the KV-transfer key of the same secret", WireAuth("cluster-secret", kWireAuthLabel), "bad_mac"},
  };
  uint64_t refused = 0;
  for (const Stranger& s : strangers) {
    INFO(s.what);
    Node client(port, s.auth);
    size_t n = 99;
    const Status st = client->lookup("default", chain.keys, 1.0, n);
    CHECK_FALSE(st);  // never answered: the call times out
    CHECK(n == 0);
    // A store is refused too: the vault still holds 2 blocks after a stranger's 3rd.
    const Chain other = make_chain("b", 1);
    client->store("default", other.keys[0], other.root, true, static_cast<uint8_t>(BlockCodec::int8_head),
                  other.values[0]);
    REQUIRE(client->flush(5.0));
    refused += 2;
    for (int i = 0; i < 500 && server.rejected_messages() < refused; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(server.rejected_messages() == refused);
    CHECK(server.stats().blocks == 2);
    CHECK_THAT(server.metrics_text(),
               Catch::Contains(fmt::format("hack:vault_messages_rejected_total{{reason=\"{}\"}}", s.reason)));
  }
  // The cluster's client is still served, and its replies pass its own MAC check.
  size_t n = 0;
  REQUIRE(good->lookup("default", chain.keys, 5.0, n));
  CHECK(n == 2);
  CHECK(good->stats().replies_rejected == 0);

  // A vault without a secret refuses sealed calls (the nodes must agree) rather than
  // answering them unsealed.
  VaultServerConfig open_config = c;
  open_config.secret.clear();
  VaultServer open_vault(open_config);
  Node sealed_client(static_cast<uint16_t>(open_vault.ucx_port()), WireAuth("cluster-secret", kVaultAuthLabel));
  CHECK_FALSE(sealed_client->lookup("default", chain.keys, 1.0, n));
  CHECK(open_vault.rejected_messages() == 1);
  CHECK_THAT(open_vault.metrics_text(), Catch::Contains("hack:vault_messages_rejected_total{reason=\"unexpected_mac\"}"));
}
