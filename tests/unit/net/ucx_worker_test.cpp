// UcxWorker over real UCX on loopback, with TCP and with shared memory: listen on an
// ephemeral port, connect, active messages small (eager) and large (rendezvous) both ways,
// connecting by worker address (the peer's endpoint adopted on its first message), payloads
// sent from the caller's memory, a send to an unknown endpoint, a refused connection.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "hack/net/ucx_worker.h"
#include "net_test_util.h"

using namespace hack;
using namespace hack::net;

namespace {

constexpr uint16_t kTestAm = 3;

struct Inbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> messages;  // header, payload
  std::vector<EndpointId> from;
  std::vector<std::string> disconnects;

  void add(EndpointId ep, std::span<const std::byte> h, std::span<const std::byte> p) {
    std::lock_guard lock(mutex);
    messages.emplace_back(std::vector<std::byte>(h.begin(), h.end()), std::vector<std::byte>(p.begin(), p.end()));
    from.push_back(ep);
    changed.notify_all();
  }
  bool wait_count(size_t n) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return messages.size() >= n; });
  }
};

struct SendResult {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Status> results;
  UcxWorker::SendCallback callback() {
    return [this](const Status& s) {
      std::lock_guard lock(mutex);
      results.push_back(s);
      changed.notify_all();
    };
  }
  bool wait_count(size_t n) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return results.size() >= n; });
  }
};

}  // namespace

TEST_CASE("ucx worker: messages small and large arrive intact both ways", "[net][ucx]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  UcxWorker server(test::options_for(tls));
  UcxWorker client(test::options_for(tls));
  Inbox server_inbox, client_inbox;
  server.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) {
    server_inbox.add(ep, h, p);
    // Echo from the progress thread, on the endpoint the message came on.
    server.send(ep, kTestAm, {h.begin(), h.end()}, {p.begin(), p.end()});
  });
  client.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) { client_inbox.add(ep, h, p); });

  const uint16_t port = server.listen("127.0.0.1", 0);
  REQUIRE(port != 0);
  const EndpointId ep = client.connect("127.0.0.1", port);

  const std::vector<size_t> sizes = {0, 1, 4096, 65537, size_t{9} << 20};  // 9 MiB: rendezvous
  SendResult sent;
  for (size_t i = 0; i < sizes.size(); ++i)
    client.send(ep, kTestAm, test::random_bytes(24, i), test::random_bytes(sizes[i], 100 + i), sent.callback());

  REQUIRE(sent.wait_count(sizes.size()));
  for (const Status& s : sent.results) CHECK(s.is_ok());
  REQUIRE(server_inbox.wait_count(sizes.size()));
  REQUIRE(client_inbox.wait_count(sizes.size()));
  for (Inbox* inbox : {&server_inbox, &client_inbox}) {
    std::lock_guard lock(inbox->mutex);
    // One endpoint, so order is not promised across eager/rendezvous: match by header.
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto header = test::random_bytes(24, i);
      bool found = false;
      for (const auto& [h, p] : inbox->messages) {
        if (h != header) continue;
        found = true;
        CHECK(p == test::random_bytes(sizes[i], 100 + i));
      }
      CHECK(found);
    }
  }
  CHECK(server.stats().rndv_received >= 1);
  CHECK(client.stats().rndv_received >= 1);
  CHECK(server.stats().messages_received == sizes.size());
}

TEST_CASE("ucx worker: connected by worker address, borrowed payloads arrive intact and replies come back", "[net][ucx]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  UcxOptions server_options = test::options_for(tls);
  server_options.accept_address_peers = true;
  UcxWorker server(server_options);
  UcxWorker client(test::options_for(tls));
  REQUIRE(!server.address().empty());
  CHECK(server.address() != client.address());
  CHECK(server.address().find_first_not_of("0123456789abcdef") == std::string::npos);
  Inbox server_inbox, client_inbox;
  server.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) {
    server_inbox.add(ep, h, p);
    server.send(ep, kTestAm, {h.begin(), h.end()}, {p.begin(), p.end()});  // on the adopted endpoint
  });
  client.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) { client_inbox.add(ep, h, p); });
  const EndpointId ep = client.connect_address(server.address());

  // Kept alive (and unchanged) until every send has completed, as send_borrowed requires.
  const std::vector<size_t> sizes = {1, 4096, 65537, size_t{3} << 20};  // 3 MiB: rendezvous
  std::vector<std::vector<std::byte>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i) payloads.push_back(test::random_bytes(sizes[i], 300 + i));
  SendResult sent;
  for (size_t i = 0; i < sizes.size(); ++i)
    client.send_borrowed(ep, kTestAm, test::random_bytes(24, 200 + i), payloads[i], sent.callback());
  REQUIRE(sent.wait_count(sizes.size()));
  for (const Status& s : sent.results) CHECK(s.is_ok());
  REQUIRE(server_inbox.wait_count(sizes.size()));
  REQUIRE(client_inbox.wait_count(sizes.size()));
  {
    std::lock_guard lock(server_inbox.mutex);
    // Every message came on one endpoint the server had not created itself; it has an id.
    CHECK(server_inbox.from.front() != 0);
    for (EndpointId from : server_inbox.from) CHECK(from == server_inbox.from.front());
  }
  for (Inbox* inbox : {&server_inbox, &client_inbox}) {
    std::lock_guard lock(inbox->mutex);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto header = test::random_bytes(24, 200 + i);
      size_t found = 0;
      for (const auto& [h, p] : inbox->messages) {
        if (h != header) continue;
        ++found;
        CHECK(p == payloads[i]);
      }
      CHECK(found == 1);
    }
  }
  CHECK(server.stats().rndv_received >= 1);
}

TEST_CASE("ucx worker: without accept_address_peers a peer connected by address stays anonymous", "[net][ucx]") {
  UcxWorker server(test::options_for("tcp"));
  UcxWorker client(test::options_for("tcp"));
  Inbox inbox;
  server.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) { inbox.add(ep, h, p); });
  const EndpointId ep = client.connect_address(server.address());
  SendResult sent;
  client.send(ep, kTestAm, test::random_bytes(24, 1), test::random_bytes(100, 2), sent.callback());
  REQUIRE(sent.wait_count(1));
  REQUIRE(inbox.wait_count(1));
  std::lock_guard lock(inbox.mutex);
  CHECK(inbox.from.front() == 0);
}

TEST_CASE("ucx worker: a handler takes a rendezvous payload's buffer instead of copying it", "[net][ucx]") {
  UcxWorker server(test::options_for("tcp"));
  UcxWorker client(test::options_for("tcp"));
  struct Taken {
    size_t bytes = 0;
    bool same_memory = false, subspan_refused = false;
    std::unique_ptr<std::byte[]> buffer;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Taken> taken;
  server.set_message_handler(kTestAm, [&](EndpointId, auto, std::span<const std::byte> p) {
    Taken t;
    t.bytes = p.size();
    // Only the whole payload can be taken (KvReceiver hands out whole payloads).
    t.subspan_refused = p.size() < 2 || server.take_received_payload(p.subspan(1)) == nullptr;
    t.buffer = server.take_received_payload(p);
    t.same_memory = t.buffer && t.buffer.get() == p.data();
    std::lock_guard lock(mutex);
    taken.push_back(std::move(t));
    changed.notify_all();
  });
  const EndpointId ep = client.connect("127.0.0.1", server.listen("127.0.0.1", 0));
  const auto big = test::random_bytes(size_t{3} << 20, 1), small = test::random_bytes(100, 2);
  SendResult sent;
  client.send(ep, kTestAm, test::random_bytes(24, 3), big, sent.callback());  // ≥ 1 MiB: rendezvous
  REQUIRE(sent.wait_count(1));
  client.send(ep, kTestAm, test::random_bytes(24, 4), small, sent.callback());  // eager
  REQUIRE(sent.wait_count(2));
  std::unique_lock lock(mutex);
  REQUIRE(changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return taken.size() == 2; }));
  if (taken[0].bytes != big.size()) std::swap(taken[0], taken[1]);  // handlers may run in either order
  CHECK(taken[0].bytes == big.size());
  CHECK(taken[0].subspan_refused);
  REQUIRE(taken[0].same_memory);
  CHECK(std::memcmp(taken[0].buffer.get(), big.data(), big.size()) == 0);  // still the message, after the handler
  CHECK(taken[1].bytes == small.size());
  CHECK(taken[1].buffer == nullptr);  // UCX's own memory: the handler copies
  CHECK(server.take_received_payload(big) == nullptr);  // outside a handler
}

TEST_CASE("ucx worker: a malformed worker address is an error", "[net][ucx]") {
  UcxWorker worker(test::options_for("tcp"));
  CHECK_THROWS_WITH(worker.connect_address(""), Catch::Contains("hex digits"));
  CHECK_THROWS_WITH(worker.connect_address("abc"), Catch::Contains("hex digits"));
  CHECK_THROWS_WITH(worker.connect_address("zz"), Catch::Contains("not a hex digit"));
  // Well-formed hex that is no UCX address: refused by UCX, not a crash.
  CHECK_THROWS(worker.connect_address("00"));
}

TEST_CASE("ucx worker: sending on an unknown endpoint completes with an error", "[net][ucx]") {
  UcxWorker worker(test::options_for("tcp"));
  SendResult sent;
  worker.send(12345, kTestAm, {}, test::random_bytes(10, 1), sent.callback());
  REQUIRE(sent.wait_count(1));
  CHECK_FALSE(sent.results[0].is_ok());
  CHECK_THAT(sent.results[0].message(), Catch::Contains("12345"));
}

TEST_CASE("ucx worker: a refused connection is reported as a disconnect", "[net][ucx]") {
  // A port that was just bound and released: nothing listens there now.
  uint16_t port = 0;
  {
    UcxWorker probe(test::options_for("tcp"));
    port = probe.listen("127.0.0.1", 0);
  }
  UcxWorker client(test::options_for("tcp"));
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<EndpointId> lost;
  client.add_disconnect_handler([&](EndpointId ep, const Status&) {
    std::lock_guard lock(mutex);
    lost.push_back(ep);
    changed.notify_all();
  });
  const EndpointId ep = client.connect("127.0.0.1", port);
  SendResult sent;
  client.send(ep, kTestAm, {}, test::random_bytes(100, 2), sent.callback());
  std::unique_lock lock(mutex);
  REQUIRE(changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return !lost.empty(); }));
  CHECK(lost == std::vector<EndpointId>{ep});
  lock.unlock();
  REQUIRE(sent.wait_count(1));
  CHECK_FALSE(sent.results[0].is_ok());
}

TEST_CASE("ucx worker: a bad UCX option is an error naming it", "[net][ucx]") {
  UcxOptions options;
  options.config = {{"RNDV_THRESH", "not-a-size"}};
  CHECK_THROWS_WITH(UcxWorker(options), Catch::Contains("RNDV_THRESH=not-a-size"));
}
