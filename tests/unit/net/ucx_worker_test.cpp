// UcxWorker over real UCX on loopback, with TCP and with shared memory: listen on an
// ephemeral port, connect, active messages small (eager) and large (rendezvous) both ways,
// connecting by worker address (the peer's endpoint adopted on its first message), payloads
// sent from the caller's memory, a send to an unknown endpoint, a refused connection, and
// one-sided puts into a peer's registered memory.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

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
  CHECK(client.transports(ep).empty());  // reported for worker-address endpoints only

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
  // Peer-failure detection is on (the default, as on the nodes): with shared memory enabled on
  // both sides, the lanes are on it all the same (MM_ERROR_HANDLING, which UcxWorker sets).
  const std::string lanes = client.transports(ep);
  INFO(lanes);
  if (tls == "tcp") {
    CHECK(lanes.find("tcp/") != std::string::npos);
  } else if (tls.find("sysv") != std::string::npos) {
    CHECK((lanes.find("sysv/") != std::string::npos || lanes.find("posix/") != std::string::npos));
  }
  CHECK(client.transports(ep + 1000).empty());
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

TEST_CASE("ucx worker: a handler retains a rendezvous payload's buffer instead of copying it", "[net][ucx]") {
  UcxWorker server(test::options_for("tcp"));
  UcxWorker client(test::options_for("tcp"));
  struct Retained {
    size_t bytes = 0;
    bool same_memory = false, outside_refused = false;
    const std::byte* data = nullptr;
    std::shared_ptr<const void> first_half, second_half;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Retained> retained;
  server.set_message_handler(kTestAm, [&](EndpointId, auto, std::span<const std::byte> p) {
    Retained r;
    r.bytes = p.size();
    r.data = p.data();
    // Parts of the payload (the pages of one KV message) share the buffer; nothing outside it.
    r.first_half = server.retain_received_payload(p.first(p.size() / 2));
    r.second_half = server.retain_received_payload(p.subspan(p.size() / 2));
    r.same_memory = r.first_half && r.first_half.get() == p.data() && r.second_half &&
                    r.second_half.get() == p.data() + p.size() / 2;
    std::byte outside{};
    r.outside_refused = server.retain_received_payload(std::span(&outside, 1)) == nullptr &&
                        server.retain_received_payload(std::span(p.data(), p.size() + 1)) == nullptr;
    std::lock_guard lock(mutex);
    retained.push_back(std::move(r));
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
  REQUIRE(changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return retained.size() == 2; }));
  if (retained[0].bytes != big.size()) std::swap(retained[0], retained[1]);  // handlers may run in either order
  CHECK(retained[0].bytes == big.size());
  CHECK(retained[0].outside_refused);
  REQUIRE(retained[0].same_memory);
  // Still the message after the handler, and after one of its owners let go.
  retained[0].first_half.reset();
  CHECK(std::memcmp(retained[0].data, big.data(), big.size()) == 0);
  CHECK(retained[1].bytes == small.size());
  CHECK(retained[1].first_half == nullptr);  // eager, and this handler is not retainable: the handler copies
  CHECK(server.retain_received_payload(big) == nullptr);  // outside a handler
  CHECK(server.stats().eager_retained == 0);
}

TEST_CASE("ucx worker: a retainable handler keeps eager payloads in UCX's memory until released", "[net][ucx]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  UcxOptions options = test::options_for(tls);
  options.max_retained_eager_bytes = 64 * 1024;
  UcxWorker server(options);
  UcxWorker client(test::options_for(tls));
  struct Kept {
    std::shared_ptr<const void> owner;
    std::span<const std::byte> bytes;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Kept> kept;
  server.set_message_handler(
      kTestAm,
      [&](EndpointId, auto, std::span<const std::byte> p) {
        Kept k{server.retain_received_payload(p), p};
        std::lock_guard lock(mutex);
        kept.push_back(std::move(k));
        changed.notify_all();
      },
      {}, /*retainable=*/true);
  const EndpointId ep = client.connect("127.0.0.1", server.listen("127.0.0.1", 0));
  // 20 eager payloads of 5000 bytes (multi-fragment on tcp), more than the 64 KiB the worker
  // may hold: the first 13 are retained, the rest refused (their handler would copy).
  constexpr int kMessages = 20;
  constexpr size_t kBytes = 5000;
  std::vector<std::vector<std::byte>> payloads;
  SendResult sent;
  for (int i = 0; i < kMessages; ++i) {
    payloads.push_back(test::random_bytes(kBytes, 100 + i));
    client.send(ep, kTestAm, test::random_bytes(24, i), payloads.back(), sent.callback());
  }
  REQUIRE(sent.wait_count(kMessages));
  std::unique_lock lock(mutex);
  REQUIRE(changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return kept.size() == kMessages; }));
  const size_t limit = options.max_retained_eager_bytes / kBytes;
  size_t held = 0;
  for (const Kept& k : kept) {
    if (!k.owner) continue;
    ++held;
    CHECK(k.owner.get() == k.bytes.data());  // UCX's own buffer, not a copy
    bool match = false;  // still a message that was sent, long after its handler returned
    for (const auto& p : payloads) match = match || (p.size() == k.bytes.size() && std::memcmp(p.data(), k.bytes.data(), p.size()) == 0);
    CHECK(match);
  }
  CHECK(held == limit);
  CHECK(server.stats().eager_retained == limit);
  CHECK(server.stats().eager_held_bytes == limit * kBytes);
  // Dropping the owners (on this thread) hands the buffers back on the progress thread.
  kept.clear();
  lock.unlock();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(test::kWaitS);
  while (server.stats().eager_held_bytes != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(server.stats().eager_held_bytes == 0);
  // And the worker keeps receiving (its buffers were really returned).
  client.send(ep, kTestAm, test::random_bytes(24, 999), payloads[0], sent.callback());
  REQUIRE(sent.wait_count(kMessages + 1));  // `sent` outlives every completion
  lock.lock();
  REQUIRE(changed.wait_for(lock, std::chrono::duration<double>(test::kWaitS), [&] { return kept.size() == 1; }));
  CHECK(kept[0].owner != nullptr);
  kept.clear();
}

TEST_CASE("ucx worker: a malformed worker address is an error", "[net][ucx]") {
  UcxWorker worker(test::options_for("tcp"));
  CHECK_THROWS_WITH(worker.connect_address(""), Catch::Contains("hex digits"));
  CHECK_THROWS_WITH(worker.connect_address("abc"), Catch::Contains("hex digits"));
  CHECK_THROWS_WITH(worker.connect_address("zz"), Catch::Contains("not a hex digit"));
  // Well-formed hex that is no UCX address: refused by UCX, not a crash.
  CHECK_THROWS(worker.connect_address("00"));
}

TEST_CASE("ucx worker: an error raised on the progress thread reaches the caller whole on every call",
          "[net][ucx]") {
  // ucp_ep_create refuses the address on the progress thread; the caller reads the message.
  // Under ThreadSanitizer this raced when the progress thread kept a reference to the
  // exception and dropped the last one after the caller had read it (seen as a prefill node
  // retried a dead decode node's worker address).
  UcxWorker worker(test::options_for("tcp"));
  for (int i = 0; i < 300; ++i) {
    std::string message;
    try {
      (void)worker.connect_address("00");
    } catch (const std::exception& e) {
      message = e.what();
    }
    REQUIRE_THAT(message, Catch::Contains("ucp_ep_create"));
  }
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

TEST_CASE("ucx worker: CUDA memory support is reported as the loaded UCX modules give it", "[net][ucx]") {
  // UCX moves device memory only through its cuda transports (libuct_cuda*: cuda_copy,
  // cuda_ipc, gdr_copy), loaded from its module directory. Debian's build has none, and a
  // node on --device cuda then says that its pages go through host copies.
  namespace fs = std::filesystem;
  const char* env = std::getenv("UCX_MODULE_DIR");
  const fs::path dir = env != nullptr && *env != '\0' ? fs::path(env) : fs::path("/usr/lib/x86_64-linux-gnu/ucx");
  REQUIRE(fs::is_directory(dir));
  bool cuda_module = false;
  for (const auto& e : fs::directory_iterator(dir))
    cuda_module = cuda_module || e.path().filename().string().starts_with("libuct_cuda");
  UcxWorker worker(test::options_for("tcp"));
  CHECK(worker.cuda_memory() == cuda_module);
  CHECK_THAT(device_kv_path(worker), Catch::Contains("through host copies"));
  CHECK_THAT(device_kv_path(worker), Catch::Contains(cuda_module ? "could send CUDA memory" : "no CUDA memory transport"));
}

TEST_CASE("ucx worker: puts land in a peer's registered memory, complete once flushed, then a message finds them", "[net][ucx]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  UcxOptions options = test::options_for(tls);
  options.rma = true;
  UcxWorker receiver(options), sender(options);
  std::vector<std::byte> region(size_t{3} << 20, std::byte{0});
  const RemoteMemory remote = receiver.register_memory(region);
  REQUIRE(remote.address == reinterpret_cast<uint64_t>(region.data()));
  REQUIRE(!remote.rkey.empty());
  // After the flush, a message on the same endpoint: its handler sees every byte in place.
  std::atomic<bool> in_place{false};
  const std::vector<std::byte> a = test::random_bytes(4096, 11), b = test::random_bytes(size_t{2} << 20, 12);
  Inbox inbox;
  receiver.set_message_handler(kTestAm, [&](EndpointId ep, auto h, auto p) {
    in_place = std::memcmp(region.data() + 100, a.data(), a.size()) == 0 &&
               std::memcmp(region.data() + (size_t{1} << 20), b.data(), b.size()) == 0;
    inbox.add(ep, h, p);
  });
  const EndpointId ep = sender.connect_address(receiver.address());
  SendResult done;
  sender.put(ep, {{a, remote.address + 100}}, remote.rkey, done.callback());
  sender.put(ep, {{std::span(b).first(4096), remote.address + (size_t{1} << 20)},
                  {std::span(b).subspan(4096), remote.address + (size_t{1} << 20) + 4096}},
             remote.rkey, done.callback());  // one call, two writes
  SendResult flushed;
  sender.flush(ep, flushed.callback());
  REQUIRE(flushed.wait_count(1));
  REQUIRE(done.wait_count(2));
  for (const Status& s : done.results) CHECK(s.is_ok());
  CHECK(flushed.results.front().is_ok());
  sender.send(ep, kTestAm, test::random_bytes(8, 1), {}, {});
  REQUIRE(inbox.wait_count(1));
  CHECK(in_place.load());
  CHECK(std::all_of(region.begin(), region.begin() + 100, [](std::byte x) { return x == std::byte{0}; }));
  // A put or a flush on an endpoint that does not exist fails, naming it.
  SendResult failed;
  sender.put(ep + 1000, {{a, remote.address}}, remote.rkey, failed.callback());
  sender.flush(ep + 1000, failed.callback());
  REQUIRE(failed.wait_count(2));
  for (const Status& s : failed.results) CHECK(s.message().find("closed, unknown") != std::string::npos);
  receiver.unregister_memory(remote.id);
  UcxWorker plain(test::options_for(tls));  // without UcxOptions::rma
  REQUIRE_THROWS_AS(plain.register_memory(region), Error);
}
