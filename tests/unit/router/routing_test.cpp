#include <catch2/catch.hpp>

#include <map>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/router/routing.h"

using namespace hack::server;

namespace {

// A pool of `n` nodes "n0".."n{n-1}", all healthy after one poll reporting `queue[i]` tokens.
void add_nodes(NodePool& pool, const std::vector<int64_t>& queue) {
  for (size_t i = 0; i < queue.size(); ++i) {
    const std::string name = "n" + std::to_string(i);
    pool.add(NodeAddress{name, "127.0.0.1", static_cast<uint16_t>(9000 + i), "ucx-" + name});
    pool.report_success(name, queue[i]);
  }
}

std::string pick_name(NodePool& pool, const std::set<std::string>& exclude = {}) {
  auto n = pool.pick(exclude);
  return n ? n->name : "<none>";
}

}  // namespace

TEST_CASE("routing: the shortest reported queue wins") {
  NodePool pool;
  add_nodes(pool, {500, 20, 300});
  CHECK(pick_name(pool) == "n1");
  auto node = pool.pick();
  REQUIRE(node);
  CHECK(node->port == 9001);
  CHECK(node->ucx_address == "ucx-n1");
  pool.report_success("n1", 1000);
  CHECK(pick_name(pool) == "n2");
}

TEST_CASE("routing: in-flight tokens spread a burst before the next poll") {
  NodePool pool;
  add_nodes(pool, {0, 0, 1000});
  std::vector<NodePool::Lease> leases;
  std::map<std::string, int> count;
  // 11 requests of 200 tokens: n0 and n1 alternate up to 1000 each (n2's reported load);
  // then all three tie on tokens and n2, with no request in flight, takes the 11th.
  for (int i = 0; i < 11; ++i) {
    auto lease = pool.acquire(200);
    REQUIRE(lease);
    ++count[lease->node().name];
    leases.push_back(std::move(*lease));
  }
  CHECK(count["n0"] == 5);
  CHECK(count["n1"] == 5);
  CHECK(count["n2"] == 1);
  auto snap = pool.snapshot();
  CHECK(snap[0].inflight_tokens == 1000);
  CHECK(snap[0].inflight_requests == 5);
  CHECK(snap[2].load_tokens() == 1200);
  leases.clear();  // requests done: only reported queues remain
  for (const NodeStatus& s : pool.snapshot()) {
    CHECK(s.inflight_tokens == 0);
    CHECK(s.inflight_requests == 0);
  }
}

TEST_CASE("routing: ties go to fewer in-flight requests, then round robin") {
  NodePool pool;
  add_nodes(pool, {100, 0, 100});
  auto big = pool.acquire(100);  // n1 reaches 100 with one request in flight
  REQUIRE(big);
  CHECK(big->node().name == "n1");
  // n0 and n2 tie on tokens and requests; round robin alternates between them.
  const std::string first = pick_name(pool);
  const std::string second = pick_name(pool);
  CHECK(first != "n1");
  CHECK(second != "n1");
  CHECK(first != second);
  // Equal everything: every node gets its turn.
  NodePool rr;
  add_nodes(rr, {5, 5, 5, 5});
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) seen.insert(pick_name(rr));
  CHECK(seen.size() == 4);
}

TEST_CASE("routing: lease set_tokens, release and move") {
  NodePool pool;
  add_nodes(pool, {0});
  auto lease = pool.acquire(10);
  REQUIRE(lease);
  lease->set_tokens(25);
  CHECK(pool.snapshot()[0].inflight_tokens == 25);
  NodePool::Lease moved = std::move(*lease);
  CHECK_FALSE(*lease);
  lease.reset();  // the moved-from lease releases nothing
  CHECK(pool.snapshot()[0].inflight_tokens == 25);
  moved.release();
  CHECK(pool.snapshot()[0].inflight_tokens == 0);
  moved.release();  // idempotent
  CHECK(pool.snapshot()[0].inflight_requests == 0);
}

TEST_CASE("routing: a dead node is avoided and rejoins after enough successes") {
  NodePool pool(HealthPolicy{3, 2});
  add_nodes(pool, {0, 500});
  CHECK(pick_name(pool) == "n0");
  pool.report_failure("n0");
  pool.report_failure("n0");
  CHECK(pick_name(pool) == "n0");  // two failures: still in
  pool.report_failure("n0");
  CHECK(pick_name(pool) == "n1");  // third: out
  CHECK(pool.healthy_count() == 1);
  pool.report_success("n0", 0);
  CHECK(pick_name(pool) == "n1");  // one success is not enough to rejoin
  pool.report_failure("n0");        // and a failure resets the count
  pool.report_success("n0", 0);
  CHECK(pick_name(pool) == "n1");
  pool.report_success("n0", 0);
  CHECK(pick_name(pool) == "n0");  // back
  // A success between failures resets the failure count.
  pool.report_failure("n0");
  pool.report_failure("n0");
  pool.report_success("n0", 0);
  pool.report_failure("n0");
  CHECK(pool.snapshot()[0].healthy);
}

TEST_CASE("routing: new nodes join on the first success, none healthy gives nothing") {
  NodePool pool;
  pool.add(NodeAddress{"a", "h", 1, ""});
  CHECK_FALSE(pool.pick());
  CHECK_FALSE(pool.acquire(5));
  CHECK_FALSE(pool.saturated(0));  // no healthy node is a 503, not a 429
  pool.report_success("a", 7);
  CHECK(pick_name(pool) == "a");
  pool.report_success("unknown", 1);  // ignored
  CHECK_THROWS_AS(pool.add(NodeAddress{"a", "h", 2, ""}), hack::Error);
  pool.remove("a");
  CHECK_FALSE(pool.pick());
}

TEST_CASE("routing: exclude set for retries") {
  NodePool pool;
  add_nodes(pool, {0, 10, 20});
  CHECK(pick_name(pool, {"n0"}) == "n1");
  CHECK(pick_name(pool, {"n0", "n1"}) == "n2");
  CHECK(pick_name(pool, {"n0", "n1", "n2"}) == "<none>");
  auto lease = pool.acquire(5, {"n0"});
  REQUIRE(lease);
  CHECK(lease->node().name == "n1");
}

TEST_CASE("routing: saturation when every healthy node is past the bound") {
  NodePool pool;
  add_nodes(pool, {900, 1200});
  CHECK_FALSE(pool.saturated(1000));
  auto lease = pool.acquire(200);  // n0 -> 1100
  REQUIRE(lease);
  CHECK(pool.saturated(1000));
  lease->release();
  CHECK_FALSE(pool.saturated(1000));
  pool.report_failure("n0");
  pool.report_failure("n0");
  pool.report_failure("n0");
  CHECK(pool.saturated(1000));  // only n1 is healthy, and it is past the bound
}

TEST_CASE("routing: a lease on a removed node ends harmlessly, even after the pool") {
  auto pool = std::make_unique<NodePool>();
  add_nodes(*pool, {0});
  auto lease = pool->acquire(50);
  REQUIRE(lease);
  pool->remove("n0");
  add_nodes(*pool, {0});  // same name, new node: the old lease must not touch it
  lease->release();
  CHECK(pool->snapshot()[0].inflight_requests == 0);
  CHECK(pool->snapshot()[0].inflight_tokens == 0);
  auto late = pool->acquire(5);
  pool.reset();
  late.reset();  // pool gone: releasing is still safe
}

TEST_CASE("routing: concurrent acquire and release keep the accounting exact") {
  NodePool pool;
  add_nodes(pool, {0, 0, 0, 0});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        auto lease = pool.acquire(1 + (i + t) % 7);
        if (lease && i % 3 == 0) lease->set_tokens(3);
        if (i % 5 == 0) pool.report_success("n" + std::to_string(i % 4), i);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const NodeStatus& s : pool.snapshot()) {
    CHECK(s.inflight_tokens == 0);
    CHECK(s.inflight_requests == 0);
  }
}

TEST_CASE("routing: node addresses are host:port") {
  const NodeAddress a = parse_node_address("10.0.0.7:8300", "--decode");
  CHECK(a.name == "10.0.0.7:8300");
  CHECK(a.host == "10.0.0.7");
  CHECK(a.port == 8300);
  CHECK(parse_node_address("::1:80", "x").host == "::1");
  CHECK_THROWS_WITH(parse_node_address("10.0.0.7", "--decode"), Catch::Contains("--decode '10.0.0.7': expected host:port"));
  CHECK_THROWS_WITH(parse_node_address(":80", "x"), Catch::Contains("expected host:port"));
  CHECK_THROWS_WITH(parse_node_address("h:8x", "x"), Catch::Contains("expected host:port"));
  CHECK_THROWS_WITH(parse_node_address("h:", "x"), Catch::Contains("expected host:port"));
  CHECK_THROWS_WITH(parse_node_address("h:0", "x"), Catch::Contains("port out of range"));
  CHECK_THROWS_WITH(parse_node_address("h:65536", "x"), Catch::Contains("port out of range"));
  CHECK_THROWS_WITH(parse_node_address("h:1234567", "x"), Catch::Contains("expected host:port"));
}

TEST_CASE("prefix affinity: near-equal queues go to the node that got the prefix", "[routing]") {
  NodePool pool(HealthPolicy{}, AffinityPolicy{100});
  for (const char* name : {"a", "b", "c"}) {
    pool.add(NodeAddress{name, "127.0.0.1", 1, ""});
    pool.report_success(name, 0);
  }
  std::vector<int> prompt(64 * 5 + 3);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>(i * 7 % 1000);
  const auto hashes = prefix_block_hashes(prompt, 64);
  REQUIRE(hashes.size() == 5);
  // A prompt sharing only the first 3 blocks has the same first 3 hashes, then differs.
  auto other = prompt;
  other[64 * 3 + 1] += 1;
  const auto other_hashes = prefix_block_hashes(other, 64);
  CHECK(std::equal(hashes.begin(), hashes.begin() + 3, other_hashes.begin()));
  CHECK(hashes[3] != other_hashes[3]);

  auto first = pool.acquire(330, {}, hashes);
  REQUIRE(first);
  const std::string home = first->node().name;
  first->release();
  CHECK(pool.remembered_prefix_blocks(home, other_hashes) == 3);
  // Loads: home 50 tokens busier than the others — within the slack, so the prefix wins.
  pool.report_success(home, 50);
  auto second = pool.acquire(330, {}, other_hashes);
  REQUIRE(second);
  CHECK(second->node().name == home);
  second->release();
  // Past the slack: the shortest queue wins again.
  pool.report_success(home, 500);
  auto third = pool.acquire(330, {}, other_hashes);
  REQUIRE(third);
  CHECK(third->node().name != home);
}

TEST_CASE("prefix affinity off: shortest queue only, nothing remembered", "[routing]") {
  NodePool pool;
  pool.add(NodeAddress{"a", "127.0.0.1", 1, ""});
  pool.add(NodeAddress{"b", "127.0.0.1", 2, ""});
  pool.report_success("a", 0);
  pool.report_success("b", 10);
  std::vector<int> prompt(200, 5);
  const auto hashes = prefix_block_hashes(prompt, 64);
  auto l = pool.acquire(200, {}, hashes);
  REQUIRE(l);
  CHECK(l->node().name == "a");
  CHECK(pool.remembered_prefix_blocks("a", hashes) == 0);
  CHECK_THROWS_AS(prefix_block_hashes(prompt, 0), hack::Error);
}
