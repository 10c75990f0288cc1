// KV streaming over real UCX on loopback (TCP and shared memory): pages small and large
// arrive intact and in order per layer, several to a message (KvSenderOptions::message_bytes)
// or one each, a corrupted page or a bad page table fails only its request, a cancel and a
// lost peer on either side end in error callbacks, never a hang.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "hack/net/kv_transfer.h"
#include "net_test_util.h"

using namespace hack;
using namespace hack::net;

namespace {

// A receiver worker listening on an ephemeral port and a sender worker connected to it.
struct Link {
  test::Events rx, tx;
  std::unique_ptr<UcxWorker> receiver_worker, sender_worker;
  std::unique_ptr<KvReceiver> receiver;
  std::unique_ptr<KvSender> sender;
  EndpointId peer = 0;

  std::atomic<int> rejected{0};
  std::vector<std::string> rejections;  // under rx.mutex
  // Runs in on_page before it is recorded (set before anything is sent).
  std::function<void(uint64_t, uint32_t, std::span<const std::byte>)> page_hook;
  uint16_t port = 0;

  // by_address: the sender connects to the receiver's worker address (transfer_bench
  // --connect address; the receiver then accepts address peers); else to its host:port listener.
  explicit Link(const std::string& tls, const WireAuth& rx_auth = {}, const WireAuth& tx_auth = {},
                bool by_address = false, size_t message_bytes = KvSenderOptions{}.message_bytes,
                KvGather gather = KvSenderOptions{}.gather, KvChecksum checksum = KvSenderOptions{}.checksum) {
    UcxOptions rx_options = test::options_for(tls);
    rx_options.accept_address_peers = by_address;
    receiver_worker = std::make_unique<UcxWorker>(rx_options);
    sender_worker = std::make_unique<UcxWorker>(test::options_for(tls));
    KvReceiverCallbacks callbacks;
    callbacks.on_page = [this](uint64_t id, uint32_t layer, std::span<const std::byte> page) {
      if (page_hook) page_hook(id, layer, page);
      rx.page(id, layer, page);
    };
    callbacks.on_layer_done = [this](uint64_t id, uint32_t layer) { rx.layer_done(id, layer); };
    callbacks.on_exact = [this](uint64_t id, uint32_t layer, std::span<const std::byte> exact) {
      rx.exact(id, layer, exact);
    };
    callbacks.on_request_done = [this](uint64_t id, std::span<const std::byte> payload) { rx.done(id, payload); };
    callbacks.on_request_error = [this](uint64_t id, const Status& s) { rx.error(id, s); };
    callbacks.on_bad_message = [this](EndpointId, const Status& s) { rx.bad_message(s); };
    callbacks.on_rejected = [this](EndpointId, const Status& s) {
      {
        std::lock_guard lock(rx.mutex);
        ++rejected;
        rejections.push_back(s.message());
      }
      rx.changed.notify_all();
    };
    receiver = std::make_unique<KvReceiver>(*receiver_worker, callbacks, rx_auth);
    KvSenderOptions so;
    so.auth = tx_auth;
    so.message_bytes = message_bytes;
    so.gather = gather;
    so.checksum = checksum;
    sender = std::make_unique<KvSender>(
        *sender_worker, KvSenderCallbacks{[this](uint64_t id, const Status& s) { tx.error(id, s); }}, so);
    if (by_address) {
      peer = sender_worker->connect_address(receiver_worker->address());
    } else {
      port = receiver_worker->listen("127.0.0.1", 0);
      peer = sender_worker->connect("127.0.0.1", port);
    }
  }
  ~Link() {
    sender.reset();
    receiver.reset();
  }
};

// Deterministic page content for (request, layer, index).
std::vector<std::byte> page_bytes(uint64_t id, uint32_t layer, int index, size_t bytes) {
  return test::random_bytes(bytes, id * 1000003 + layer * 1009 + static_cast<uint64_t>(index));
}

// Checks that request `id`'s pages arrived in order, page i of a layer holding
// page_bytes(id, layer, i, size_of(id, layer, i)); returns how many arrived. Caller holds rx.mutex.
template <class SizeOf>
int check_pages_in_order(const test::Events& rx, uint64_t id, const SizeOf& size_of) {
  int index = 0, pages = 0;
  uint32_t layer = 0;
  for (const auto& page : rx.pages) {
    if (page.request_id != id) continue;
    if (page.layer != layer) {
      layer = page.layer;
      index = 0;
    }
    CHECK(page.bytes == page_bytes(id, layer, index, size_of(id, layer, index)));
    ++index;
    ++pages;
  }
  return pages;
}

}  // namespace

TEST_CASE("kv transfer: small and large pages arrive intact", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls);
  const std::vector<size_t> sizes = {1, 4096, (size_t{8} << 20) + 3, 100000, size_t{12} << 20};
  for (size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, static_cast<int>(i), sizes[i])).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 1, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  CHECK(link.sender->wait_idle(test::kWaitS).is_ok());

  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  REQUIRE(link.rx.pages.size() == sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("page " << i << ", " << sizes[i] << " bytes");
    CHECK(link.rx.pages[i].bytes == page_bytes(1, 0, static_cast<int>(i), sizes[i]));
  }
  CHECK(link.rx.log[1].back() == "done");
  CHECK(link.receiver_worker->stats().rndv_received >= 2);  // the two ≥ 8 MiB pages
  CHECK(link.tx.errors.empty());
}

TEST_CASE("kv transfer: borrowed pages arrive intact by worker address and a corrupted one leaves the caller's page alone", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  const bool sealed = GENERATE(false, true);
  INFO("UCX_TLS=" << tls << (sealed ? ", sealed" : ""));
  const WireAuth auth = sealed ? WireAuth("borrowed pages secret") : WireAuth();
  Link link(tls, auth, auth, /*by_address=*/true);
  // The caller's pages: alive and unchanged until the request has left the sender.
  const std::vector<size_t> sizes = {1, 4096, (size_t{2} << 20) + 3, 100000};
  std::vector<std::vector<std::byte>> pages;
  for (size_t i = 0; i < sizes.size(); ++i) pages.push_back(page_bytes(1, 0, static_cast<int>(i), sizes[i]));
  for (const auto& page : pages) REQUIRE(link.sender->send_page_borrowed(link.peer, 1, 0, page).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 1, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  REQUIRE(link.sender->wait_request_closed(1, test::kWaitS));

  // Request 2: its second page is corrupted in flight; the caller's copy must not be.
  const auto before = pages[1];
  REQUIRE(link.sender->send_page_borrowed(link.peer, 2, 0, pages[0]).is_ok());
  link.sender->corrupt_next_page_for_test(2);
  REQUIRE(link.sender->send_page_borrowed(link.peer, 2, 0, pages[1]).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 2, 0).is_ok());  // sends the two pages' message
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(2); }));
  link.sender->cancel(link.peer, 2, "test over");
  REQUIRE(link.sender->wait_request_closed(2, test::kWaitS));
  CHECK(pages[1] == before);

  std::lock_guard lock(link.rx.mutex);
  CHECK_FALSE(link.rx.errors.contains(1));
  CHECK_THAT(link.rx.errors[2], Catch::Contains("checksum"));
  CHECK(link.rejected == 0);
  REQUIRE(link.rx.log[1].size() == sizes.size() + 2);
  size_t request_1_pages = 0;
  for (const auto& page : link.rx.pages) {
    if (page.request_id != 1) continue;
    CHECK(page.bytes == pages[request_1_pages]);
    ++request_1_pages;
  }
  CHECK(request_1_pages == sizes.size());
}

TEST_CASE("kv transfer: many pages stay in order per layer across interleaved requests", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls);
  constexpr int kLayers = 4, kPages = 24;
  const std::vector<uint64_t> ids = {10, 11, 12};
  // Mixed sizes so that rendezvous pages (fetched later) sit between eager ones.
  auto size_of = [](uint64_t id, uint32_t layer, int index) -> size_t {
    const uint64_t k = id + layer * 7 + static_cast<uint64_t>(index);
    return k % 9 == 0 ? (size_t{1} << 20) + k : 512 + 37 * k;
  };
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (int index = 0; index < kPages; ++index)
      for (uint64_t id : ids)
        REQUIRE(link.sender->send_page(link.peer, id, layer, page_bytes(id, layer, index, size_of(id, layer, index))).is_ok());
    for (uint64_t id : ids) REQUIRE(link.sender->layer_done(link.peer, id, layer).is_ok());
  }
  for (uint64_t id : ids) REQUIRE(link.sender->request_done(link.peer, id).is_ok());
  REQUIRE(link.rx.wait([&] {
    for (uint64_t id : ids)
      if (!link.rx.is_done(id) && !link.rx.has_error(id)) return false;
    return true;
  }));

  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  std::vector<std::string> expected_log;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (int index = 0; index < kPages; ++index) expected_log.push_back("page " + std::to_string(layer));
    expected_log.push_back("layer " + std::to_string(layer));
  }
  expected_log.push_back("done");
  for (uint64_t id : ids) {
    INFO("request " << id);
    CHECK(link.rx.log[id] == expected_log);
    check_pages_in_order(link.rx, id, size_of);
  }
  CHECK(link.receiver->open_requests() == 0);
}

TEST_CASE("kv transfer: a corrupted page fails its request only", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls);
  // Request 1: the second page is corrupted after its checksum was taken.
  REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, 0, 3000)).is_ok());
  link.sender->corrupt_next_page_for_test(1);
  REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, 1, 3000)).is_ok());
  // The receiver's reply fails the request at the sender; until then sends still queue.
  (void)link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, 2, 3000));
  (void)link.sender->layer_done(link.peer, 1, 0);
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(1); }));
  REQUIRE(link.tx.wait([&] { return link.tx.has_error(1); }));
  // Ending a failed request returns its error (and tells the receiver to forget it).
  CHECK_FALSE(link.sender->request_done(link.peer, 1).is_ok());

  // Request 2 on the same endpoint still succeeds, with a large (rendezvous) page too.
  REQUIRE(link.sender->send_page(link.peer, 2, 0, page_bytes(2, 0, 0, 3000)).is_ok());
  REQUIRE(link.sender->send_page(link.peer, 2, 0, page_bytes(2, 0, 1, size_t{9} << 20)).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 2, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 2).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(2) || link.rx.has_error(2); }));
  CHECK(link.sender->wait_idle(test::kWaitS).is_ok());

  std::lock_guard lock(link.rx.mutex);
  CHECK_THAT(link.rx.errors[1], Catch::Contains("checksum"));
  CHECK_THAT(link.tx.errors[1], Catch::Contains("rejected by the receiver"));
  CHECK_FALSE(link.rx.errors.contains(2));
  CHECK_FALSE(link.tx.errors.contains(2));
  CHECK_FALSE(link.rx.is_done(1));
  // The three pages left as one message, refused whole: none of them was delivered.
  CHECK(link.rx.log[1].empty());
  CHECK(link.rx.log[2] == std::vector<std::string>{"page 0", "page 0", "layer 0", "done"});
  CHECK(link.rx.pages.back().bytes == page_bytes(2, 0, 1, size_t{9} << 20));
}

TEST_CASE("kv transfer: a message with a bad header is dropped alone", "[net][kv]") {
  Link link("tcp");
  // Raw messages on the KV id: a wrong magic, then a header cut short.
  auto header = encode_wire_header(make_wire_header(WireType::kv_page, 3, 0, 0, test::random_bytes(100, 1)));
  header[0] = std::byte{'X'};
  link.sender_worker->send(link.peer, kKvDataAmId, header, test::random_bytes(100, 1));
  link.sender_worker->send(link.peer, kKvDataAmId, std::vector<std::byte>(header.begin(), header.begin() + 7), {});
  REQUIRE(link.rx.wait([&] { return link.rx.bad_messages.size() == 2; }));
  // The same endpoint then carries a request normally.
  REQUIRE(link.sender->send_page(link.peer, 3, 0, page_bytes(3, 0, 0, 500)).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 3).is_ok());  // sends the pending page first
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(3) || link.rx.has_error(3); }));
  std::lock_guard lock(link.rx.mutex);
  // Arrival order of the two is not promised (AM lanes may differ).
  const std::string both = link.rx.bad_messages[0] + " | " + link.rx.bad_messages[1];
  CHECK_THAT(both, Catch::Contains("magic"));
  CHECK_THAT(both, Catch::Contains("7 bytes"));
  CHECK(link.rx.errors.empty());
  CHECK(link.rx.log[3] == std::vector<std::string>{"page 0", "done"});
}

TEST_CASE("kv transfer: a cancel ends the request at the receiver with an error", "[net][kv]") {
  Link link("tcp");
  REQUIRE(link.sender->send_page(link.peer, 5, 0, page_bytes(5, 0, 0, 100)).is_ok());
  link.sender->cancel(link.peer, 5, "client went away");
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(5); }));
  std::lock_guard lock(link.rx.mutex);
  CHECK_THAT(link.rx.errors[5], Catch::Contains("client went away"));
  CHECK(link.tx.errors.empty());
}

TEST_CASE("kv transfer: losing the sender mid-transfer fails its requests at the receiver", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls);
  for (int index = 0; index < 16; ++index) {
    REQUIRE(link.sender->send_page(link.peer, 7, 0, page_bytes(7, 0, index, size_t{2} << 20)).is_ok());
    REQUIRE(link.sender->send_page(link.peer, 8, 0, page_bytes(8, 0, index, 1000)).is_ok());
    REQUIRE(link.sender->flush(link.peer, 8).is_ok());  // a message each, as prefill's per-chunk flush
  }
  REQUIRE(link.rx.wait([&] { return link.rx.pages.size() >= 2; }));
  // Destroy the sending side with requests open and pages in flight.
  link.sender.reset();
  link.sender_worker.reset();
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(7) && link.rx.has_error(8); }));
  std::lock_guard lock(link.rx.mutex);
  // Either the endpoint's failure or the failed fetch of a page in flight names it.
  CHECK_THAT(link.rx.errors[7], Catch::Contains("request 7: lost"));
  CHECK_THAT(link.rx.errors[8], Catch::Contains("request 8: lost"));
  CHECK_FALSE(link.rx.is_done(7));
}

TEST_CASE("kv transfer: losing the receiver mid-transfer fails the sender's requests", "[net][kv]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls);
  for (int index = 0; index < 8; ++index)
    REQUIRE(link.sender->send_page(link.peer, 9, 0, page_bytes(9, 0, index, size_t{2} << 20)).is_ok());
  REQUIRE(link.rx.wait([&] { return !link.rx.pages.empty(); }));
  link.receiver.reset();
  link.receiver_worker.reset();
  REQUIRE(link.tx.wait([&] { return link.tx.has_error(9); }));
  // Everything queued has completed (with errors); later calls fail fast.
  CHECK(link.sender->wait_idle(test::kWaitS).is_ok());
  CHECK_FALSE(link.sender->wait_request(9, test::kWaitS).is_ok());
  CHECK_FALSE(link.sender->send_page(link.peer, 9, 0, page_bytes(9, 0, 99, 10)).is_ok());
  std::lock_guard lock(link.tx.mutex);
  CHECK_FALSE(link.tx.errors[9].empty());
}

TEST_CASE("kv transfer: exact messages and the request_done payload arrive in order", "[net][kv]") {
  Link link("tcp");
  const std::string json = R"({"token":17,"seed":42})";
  const auto* b = reinterpret_cast<const std::byte*>(json.data());
  REQUIRE(link.sender->send_exact(link.peer, 4, 0, page_bytes(4, 0, 0, 300)).is_ok());
  REQUIRE(link.sender->send_page(link.peer, 4, 0, page_bytes(4, 0, 1, 5000)).is_ok());
  REQUIRE(link.sender->send_exact(link.peer, 4, 0, page_bytes(4, 0, 2, (size_t{3} << 20) + 1)).is_ok());  // rendezvous
  REQUIRE(link.sender->layer_done(link.peer, 4, 0).is_ok());
  // Too large a done payload is refused before anything is queued.
  CHECK_THAT(link.sender->request_done(link.peer, 4, std::vector<std::byte>(kWireMaxDoneBytes + 1)).message(),
             Catch::Contains("exceeds the limit"));
  REQUIRE(link.sender->request_done(link.peer, 4, std::vector<std::byte>(b, b + json.size())).is_ok());
  CHECK(link.sender->wait_request(4, test::kWaitS).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(4) || link.rx.has_error(4); }));
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  CHECK(link.rx.log[4] == std::vector<std::string>{"exact 0", "page 0", "exact 0", "layer 0", "done"});
  REQUIRE(link.rx.exacts.size() == 2);
  CHECK(link.rx.exacts[0].bytes == page_bytes(4, 0, 0, 300));
  CHECK(link.rx.exacts[1].bytes == page_bytes(4, 0, 2, (size_t{3} << 20) + 1));
  const auto& got = link.rx.done_payloads[4];
  CHECK(std::string(reinterpret_cast<const char*>(got.data()), got.size()) == json);
}

TEST_CASE("kv transfer: a request queued in one go stays within the receiver's reorder bound", "[net][kv]") {
  // 6000 small pages (more than the receiver holds ahead of a slow one, kKvMaxEarlyMessages)
  // with a 1.5 MiB rendezvous page every 150, ~70 MiB in all (more than the default byte
  // window), queued without waiting: the sender's window holds the rest back locally.
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  const int window = GENERATE(0, 8);  // 0: default options; 8: a tiny window (8 messages, 4 MiB)
  // 0: one page per message (so more messages than the receiver's early bound); else coalesced.
  const size_t message_bytes = GENERATE(size_t{0}, KvSenderOptions{}.message_bytes);
  INFO("UCX_TLS=" << tls << " window " << window << " message_bytes " << message_bytes);
  test::Events rx;
  UcxWorker receiver_worker(test::options_for(tls)), sender_worker(test::options_for(tls));
  KvReceiverCallbacks callbacks;
  callbacks.on_page = [&](uint64_t id, uint32_t layer, std::span<const std::byte> page) { rx.page(id, layer, page); };
  callbacks.on_request_done = [&](uint64_t id, std::span<const std::byte> payload) { rx.done(id, payload); };
  callbacks.on_request_error = [&](uint64_t id, const Status& s) { rx.error(id, s); };
  KvReceiver receiver(receiver_worker, callbacks);
  KvSenderOptions options;
  options.message_bytes = message_bytes;
  if (window > 0) {
    options.max_in_flight_messages = static_cast<size_t>(window);
    options.max_in_flight_bytes = size_t{4} << 20;
  }
  KvSender sender(sender_worker, {}, options);
  const EndpointId peer = sender_worker.connect("127.0.0.1", receiver_worker.listen("127.0.0.1", 0));
  constexpr int kPages = 6000;
  auto size_of = [](int index) -> size_t { return index % 150 == 75 ? (size_t{3} << 19) + index : 1500 + index % 700; };
  size_t total = 0;
  for (int index = 0; index < kPages; ++index) {
    total += size_of(index);
    REQUIRE(sender.send_page(peer, 21, static_cast<uint32_t>(index / 1000), page_bytes(21, 0, index, size_of(index))).is_ok());
  }
  REQUIRE(sender.request_done(peer, 21).is_ok());
  INFO(total << " bytes queued");
  REQUIRE(sender.wait_request(21, 120.0).is_ok());
  REQUIRE(rx.wait([&] { return rx.is_done(21) || rx.has_error(21); }, 120.0));
  const KvSenderStats stats = sender.stats();
  // The window held: never more messages between the oldest incomplete one and the newest
  // than allowed (so never more early messages at the receiver than its bound), never
  // more bytes than allowed (a single larger message aside); the rest waited locally.
  const size_t max_messages = window > 0 ? static_cast<size_t>(window) : KvSenderOptions{}.max_in_flight_messages;
  const size_t max_bytes = window > 0 ? size_t{4} << 20 : KvSenderOptions{}.max_in_flight_bytes;
  CHECK(stats.max_window_messages <= max_messages);
  CHECK(stats.max_window_messages >= 2);
  CHECK(stats.max_window_bytes <= max_bytes);
  if (message_bytes == 0 || window > 0) CHECK(stats.max_waiting > 0);
  CHECK(stats.messages_waiting == 0);
  CHECK(stats.pages_sent == kPages);
  if (message_bytes == 0) CHECK(stats.messages_sent == kPages + 1);
  else CHECK(stats.messages_sent < kPages / 10);
  CHECK(stats.bytes_sent == total);
  std::lock_guard lock(rx.mutex);
  CHECK(rx.errors.empty());
  REQUIRE(rx.pages.size() == kPages);
  for (int index = 0; index < kPages; ++index) {
    const auto& page = rx.pages[static_cast<size_t>(index)];
    if (page.bytes != page_bytes(21, 0, index, size_of(index)) || page.layer != static_cast<uint32_t>(index / 1000))
      FAIL("page " << index << " differs");
  }
  CHECK(receiver.open_requests() == 0);
}

TEST_CASE("kv transfer: sender options are validated", "[net][kv]") {
  UcxWorker worker(test::options_for("tcp"));
  KvSenderOptions o;
  o.max_in_flight_messages = kKvMaxEarlyMessages + 1;
  REQUIRE_THROWS_WITH(KvSender(worker, {}, o), Catch::Contains("max_in_flight_messages"));
  o.max_in_flight_messages = 0;
  REQUIRE_THROWS_AS(KvSender(worker, {}, o), Error);
  o = {};
  o.message_bytes = kWireMaxPayloadBytes + 1;
  REQUIRE_THROWS_WITH(KvSender(worker, {}, o), Catch::Contains("message_bytes"));
}

TEST_CASE("kv transfer: with a cluster secret, a rogue sender's messages are refused and counted", "[net][kv][auth]") {
  Link link("tcp", WireAuth("cluster secret"), WireAuth("cluster secret"));
  // Two rogues that reach the port: one without the secret, one with another secret.
  for (const WireAuth& rogue_auth : {WireAuth(), WireAuth("guessed secret")}) {
    UcxWorker rogue_worker(test::options_for("tcp"));
    KvSenderOptions so;
    so.auth = rogue_auth;
    test::Events rogue_events;
    KvSender rogue(rogue_worker, KvSenderCallbacks{[&](uint64_t id, const Status& s) { rogue_events.error(id, s); }}, so);
    const EndpointId ep = rogue_worker.connect("127.0.0.1", link.port);
    const int before = link.rejected.load();
    REQUIRE(rogue.send_page(ep, 77, 0, page_bytes(77, 0, 0, 4096)).is_ok());
    REQUIRE(rogue.layer_done(ep, 77, 0).is_ok());
    REQUIRE(rogue.request_done(ep, 77).is_ok());
    REQUIRE(link.rx.wait([&] { return link.rejected.load() >= before + 3; }));
  }
  // The cluster's own sender still streams: the node kept serving.
  REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, 0, 100000)).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 1, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  REQUIRE(link.rx.pages.size() == 1);  // nothing of request 77 got through
  CHECK(link.rx.pages[0].request_id == 1);
  CHECK(link.rx.pages[0].bytes == page_bytes(1, 0, 0, 100000));
}

TEST_CASE("kv transfer: a receiver without a secret refuses sealed messages (nodes must agree)", "[net][kv][auth]") {
  Link link("tcp", WireAuth(), WireAuth("cluster secret"));
  REQUIRE(link.sender->send_page(link.peer, 5, 0, page_bytes(5, 0, 0, 512)).is_ok());
  REQUIRE(link.sender->flush(link.peer, 5).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rejected.load() >= 1; }));
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.pages.empty());
}

// The sender computes each message's MAC outside its lock (an unsealed message holds its
// place in the endpoint's queue until its tag is in): threads streaming to one endpoint at
// once must still deliver every request's messages in order, each tag accepted.
TEST_CASE("kv transfer: sealed messages from concurrent senders arrive in order and are accepted", "[net][kv][auth]") {
  Link link("tcp", WireAuth("cluster secret"), WireAuth("cluster secret"));
  constexpr int kThreads = 4, kLayers = 3, kPages = 40;
  auto size_of = [](uint64_t id, uint32_t layer, int index) -> size_t {
    const uint64_t k = id * 13 + layer * 7 + static_cast<uint64_t>(index);
    return k % 11 == 0 ? (size_t{1} << 20) + k : 300 + 53 * k;  // a few rendezvous pages among eager ones
  };
  std::vector<std::thread> threads;
  std::atomic<int> send_errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, id = static_cast<uint64_t>(100 + t)] {
      for (uint32_t layer = 0; layer < kLayers; ++layer) {
        for (int index = 0; index < kPages; ++index)
          if (!link.sender->send_page(link.peer, id, layer, page_bytes(id, layer, index, size_of(id, layer, index))))
            ++send_errors;
        if (!link.sender->layer_done(link.peer, id, layer)) ++send_errors;
      }
      if (!link.sender->request_done(link.peer, id)) ++send_errors;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(send_errors == 0);
  REQUIRE(link.rx.wait([&] {
    for (int t = 0; t < kThreads; ++t)
      if (!link.rx.is_done(100 + t) && !link.rx.has_error(100 + t)) return false;
    return true;
  }));
  CHECK(link.rejected == 0);
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  for (int t = 0; t < kThreads; ++t) {
    const uint64_t id = 100 + t;
    INFO("request " << id);
    CHECK(check_pages_in_order(link.rx, id, size_of) == kLayers * kPages);
    CHECK(link.rx.log[id].back() == "done");
  }
  CHECK(link.receiver->open_requests() == 0);
}

// ---- several pages per message (wire v3, v4) ----------------------------------------------

TEST_CASE("kv transfer: pages coalesced into multi-page messages arrive as the same pages, in order", "[net][kv][pages]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  const bool sealed = GENERATE(false, true);
  // How a message's scattered pages reach UCX: gathered by copy, in place (iov), or chosen by
  // the endpoint's lanes (auto: iov over shared memory, which a worker-address endpoint uses).
  // With auto, checksums are chosen by the lanes too (none over shared memory), as hack-prefill.
  const KvGather gather = GENERATE(KvGather::copy, KvGather::iov, KvGather::automatic);
  const KvChecksum checksum = gather == KvGather::automatic ? KvChecksum::automatic : KvChecksum::always;
  const bool by_address = GENERATE(false, true);
  INFO("UCX_TLS=" << tls << (sealed ? ", sealed" : "") << ", gather " << kv_gather_name(gather)
                  << (by_address ? ", by worker address" : ""));
  const WireAuth auth = sealed ? WireAuth("multi-page secret") : WireAuth();
  constexpr size_t kMessageBytes = 64 * 1024;
  Link link(tls, auth, auth, by_address, kMessageBytes, gather, checksum);
  // Awkward sizes: 1 byte, odd lengths, pages just under, at and over the message size, one
  // large enough for rendezvous; borrowed and copied pages mixed within one message.
  auto size_of = [](uint64_t, uint32_t layer, int index) -> size_t {
    static const size_t sizes[] = {1, 4095, 20001, kMessageBytes - 1, kMessageBytes, kMessageBytes + 1, 7, 33333,
                                   (size_t{3} << 20) + 5, 12345, 2, 40000};
    return sizes[(static_cast<size_t>(index) + layer * 5) % std::size(sizes)];
  };
  constexpr int kLayers = 3, kPages = 30;
  std::vector<std::vector<std::byte>> kept;  // borrowed pages stay alive until the request has left
  size_t expected_messages = 0;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    size_t pending = 0;  // the sender's rule: a message leaves once it holds kMessageBytes
    for (int index = 0; index < kPages; ++index) {
      auto page = page_bytes(1, layer, index, size_of(1, layer, index));
      pending += page.size();
      if (pending >= kMessageBytes) {
        ++expected_messages;
        pending = 0;
      }
      if (index % 2 == 0) {
        kept.push_back(std::move(page));
        REQUIRE(link.sender->send_page_borrowed(link.peer, 1, layer, kept.back()).is_ok());
      } else {
        REQUIRE(link.sender->send_page(link.peer, 1, layer, std::move(page)).is_ok());
      }
    }
    if (pending > 0) ++expected_messages;  // the partial message layer_done sends
    REQUIRE(link.sender->layer_done(link.peer, 1, layer).is_ok());
  }
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  REQUIRE(link.sender->wait_request_closed(1, test::kWaitS));
  const KvSenderStats stats = link.sender->stats();
  CHECK(stats.pages_sent == kLayers * kPages);
  CHECK(stats.messages_sent == expected_messages + kLayers + 1);  // + layer_done each, request_done
  CHECK(expected_messages < kLayers * kPages / 2);                // most messages carried several pages
  const bool shared_memory = by_address && tls.find("sysv") != std::string::npos;
  if (gather == KvGather::copy || (gather == KvGather::automatic && tls == "tcp")) CHECK(stats.messages_gathered > 0);
  if (gather == KvGather::iov || (gather == KvGather::automatic && shared_memory)) CHECK(stats.messages_gathered == 0);
  // Unchecked (wire v4) exactly where auto saw shared memory: then every kv_page message.
  if (checksum == KvChecksum::automatic && shared_memory) CHECK(stats.messages_unchecked == expected_messages);
  else CHECK(stats.messages_unchecked == 0);
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  CHECK(link.rejected == 0);
  CHECK(check_pages_in_order(link.rx, 1, size_of) == kLayers * kPages);
  std::vector<std::string> expected_log;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (int index = 0; index < kPages; ++index) expected_log.push_back("page " + std::to_string(layer));
    expected_log.push_back("layer " + std::to_string(layer));
  }
  expected_log.push_back("done");
  CHECK(link.rx.log[1] == expected_log);
}

TEST_CASE("kv transfer: a partial message leaves at layer_done and flush, so layer l arrives while l+1 is queued", "[net][kv][pages]") {
  Link link("tcp");  // default message_bytes (1 MiB): these small pages would all fit one message
  for (int index = 0; index < 5; ++index)
    REQUIRE(link.sender->send_page(link.peer, 3, 0, page_bytes(3, 0, index, 1000 + index)).is_ok());
  // Nothing ends the message yet: it waits in the sender.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard lock(link.rx.mutex);
    CHECK(link.rx.pages.empty());
  }
  REQUIRE(link.sender->layer_done(link.peer, 3, 0).is_ok());
  // Layer 0 arrives whole while the request is still open (streaming per layer).
  REQUIRE(link.rx.wait([&] { return link.rx.layers_done.size() == 1; }));
  {
    std::lock_guard lock(link.rx.mutex);
    CHECK(link.rx.log[3] == std::vector<std::string>{"page 0", "page 0", "page 0", "page 0", "page 0", "layer 0"});
  }
  // flush: a prefill chunk's pages of layer 1 go without a layer_done.
  for (int index = 0; index < 3; ++index)
    REQUIRE(link.sender->send_page(link.peer, 3, 1, page_bytes(3, 1, index, 700)).is_ok());
  REQUIRE(link.sender->flush(link.peer, 3).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.pages.size() == 8; }));
  // A page of another layer ends the pending message too.
  REQUIRE(link.sender->send_page(link.peer, 3, 1, page_bytes(3, 1, 3, 700)).is_ok());
  REQUIRE(link.sender->send_page(link.peer, 3, 2, page_bytes(3, 2, 0, 900)).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.pages.size() == 9; }));
  REQUIRE(link.sender->layer_done(link.peer, 3, 1).is_ok());  // after the layer-2 page: still ordered
  REQUIRE(link.sender->request_done(link.peer, 3).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(3) || link.rx.has_error(3); }));
  CHECK(link.sender->flush(link.peer, 3).is_ok());  // a finished request: nothing to do
  // The receiver can see request_done before the sender has counted its send completions.
  REQUIRE(link.sender->wait_request_closed(3, test::kWaitS));
  const KvSenderStats stats = link.sender->stats();
  CHECK(stats.pages_sent == 10);
  // Messages: 5 pages + layer_done, 3 pages (flush), 1 page (layer change), 1 page + layer_done, request_done.
  CHECK(stats.messages_sent == 7);
  std::lock_guard lock(link.rx.mutex);
  CHECK(link.rx.errors.empty());
  CHECK(link.rx.log[3].back() == "done");
  REQUIRE(link.rx.pages.size() == 10);
  CHECK(link.rx.pages[8].bytes == page_bytes(3, 1, 3, 700));
  CHECK(link.rx.pages[9].bytes == page_bytes(3, 2, 0, 900));
}

TEST_CASE("kv transfer: a checksum mismatch in a multi-page message fails only its request", "[net][kv][pages]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  Link link(tls, {}, {}, false, 16 * 1024);
  // Request 1: its first message is good (4 pages), its second has a flipped byte in page 3 of 4.
  for (int index = 0; index < 4; ++index)
    REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, index, 4096)).is_ok());
  for (int index = 4; index < 8; ++index) {
    if (index == 6) link.sender->corrupt_next_page_for_test(1);
    REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, index, 4096)).is_ok());
    // Request 2 interleaves its own multi-page messages on the same endpoint.
    REQUIRE(link.sender->send_page(link.peer, 2, 0, page_bytes(2, 0, index - 4, 5000)).is_ok());
  }
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(1); }));
  REQUIRE(link.tx.wait([&] { return link.tx.has_error(1); }));
  CHECK_FALSE(link.sender->layer_done(link.peer, 1, 0).is_ok());  // the sender knows it failed
  CHECK_FALSE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 2, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 2).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(2) || link.rx.has_error(2); }));
  std::lock_guard lock(link.rx.mutex);
  CHECK_THAT(link.rx.errors[1], Catch::Contains("checksum"));
  CHECK_THAT(link.rx.errors[1], Catch::Contains("4 pages"));
  CHECK_FALSE(link.rx.errors.contains(2));
  // The good first message was delivered, nothing of the bad one.
  CHECK(link.rx.log[1] == std::vector<std::string>(4, "page 0"));
  CHECK(check_pages_in_order(link.rx, 1, [](uint64_t, uint32_t, int) { return size_t{4096}; }) == 4);
  CHECK(check_pages_in_order(link.rx, 2, [](uint64_t, uint32_t, int) { return size_t{5000}; }) == 4);
  CHECK(link.rx.log[2].back() == "done");
}

TEST_CASE("kv transfer: over shared memory auto sends pages unchecked but a page the corruption hook flips is caught",
          "[net][kv][pages]") {
  // By worker address with sysv listed, UCX puts the endpoint on shared memory: KvChecksum::
  // automatic then sends kv_page messages unchecked (wire v4), except the one holding a page
  // the test hook corrupts, which is checksummed and so refused.
  const std::string tls = "posix,sysv,cma,self,tcp";
  Link link(tls, {}, {}, true, 16 * 1024, KvGather::automatic, KvChecksum::automatic);
  for (int index = 0; index < 8; ++index)
    REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, index, 4096)).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 1, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  REQUIRE(link.sender->wait_request_closed(1, test::kWaitS));
  CHECK(link.sender->stats().messages_unchecked == 2);  // 8 pages of 4 KiB in 16 KiB messages
  link.sender->corrupt_next_page_for_test(2);
  REQUIRE(link.sender->send_page(link.peer, 2, 0, page_bytes(2, 0, 0, 4096)).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 2, 0).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.has_error(2); }));
  CHECK(link.sender->stats().messages_unchecked == 2);
  std::lock_guard lock(link.rx.mutex);
  CHECK(check_pages_in_order(link.rx, 1, [](uint64_t, uint32_t, int) { return size_t{4096}; }) == 8);
  CHECK_THAT(link.rx.errors[2], Catch::Contains("checksum"));
}

TEST_CASE("kv transfer: a truncated or lying page table fails its request with a clear error", "[net][kv][pages]") {
  const bool sealed = GENERATE(false, true);
  INFO((sealed ? "sealed" : "plain"));
  const WireAuth auth = sealed ? WireAuth("page table secret") : WireAuth();
  Link link("tcp", auth, auth);
  const auto pages = std::vector<std::vector<std::byte>>{page_bytes(40, 0, 0, 3000), page_bytes(40, 0, 1, 5000)};
  std::vector<std::byte> payload = pages[0];
  payload.insert(payload.end(), pages[1].begin(), pages[1].end());
  const uint64_t sums[] = {wire_checksum(pages[0]), wire_checksum(pages[1])};
  // Sends a hand-made kv_page header (sealed like the sender would) with `payload` as seq 0 of `id`.
  auto send_raw = [&](uint64_t /*id: the header names it*/, std::vector<std::byte> header, std::span<const std::byte> body) {
    if (auth.enabled()) {
      const auto tag = auth.tag(header, body, WireChannel::data);
      header.insert(header.end(), tag.begin(), tag.end());
    }
    link.sender_worker->send(link.peer, kKvDataAmId, std::move(header), {body.begin(), body.end()});
  };
  auto header_for = [&](uint64_t id) { return encode_wire_header(make_pages_header(id, 0, 0, {3000, 5000}, sums)); };
  // 41: a page table cut short (the header claims 2 pages, carries 1 entry).
  auto truncated = header_for(41);
  truncated.resize(truncated.size() - 4);
  send_raw(41, truncated, payload);
  // 42: page lengths that do not add up to the payload the header declares.
  auto lying = header_for(42);
  lying[kWireHeaderBytes] = std::byte{0xB9};  // page 0: 3000 → 3001 bytes
  send_raw(42, lying, payload);
  // 43: a consistent header, but the payload is shorter than it says.
  send_raw(43, header_for(43), std::span<const std::byte>(payload).first(7000));
  // 44: a page count past the limit.
  auto too_many = header_for(44);
  too_many[40] = std::byte{0xFF};
  too_many[41] = std::byte{0xFF};
  send_raw(44, too_many, payload);
  // 40: the same pages, correctly framed: accepted, split back into the two pages.
  send_raw(40, header_for(40), payload);
  // Sealed, a header whose length its page count does not explain cannot be split from its
  // tag: refused as unauthenticated (41, 44), blaming no request; plain, its request fails.
  REQUIRE(link.rx.wait([&] {
    const bool framing = sealed ? link.rejected.load() == 2 : link.rx.has_error(41) && link.rx.has_error(44);
    return framing && link.rx.has_error(42) && link.rx.has_error(43) && link.rx.pages.size() == 2;
  }));
  // The endpoint still carries a request normally.
  REQUIRE(link.sender->send_page(link.peer, 45, 0, page_bytes(45, 0, 0, 100)).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 45).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(45) || link.rx.has_error(45); }));
  std::lock_guard lock(link.rx.mutex);
  for (const auto& [id, error] : link.rx.errors) UNSCOPED_INFO(id << ": " << error);
  if (sealed) {
    CHECK_FALSE(link.rx.has_error(41));
    CHECK_FALSE(link.rx.has_error(44));
    REQUIRE(link.rejections.size() == 2);
    CHECK_THAT(link.rejections[0], Catch::Contains("unauthenticated"));
  } else {
    CHECK_THAT(link.rx.errors[41], Catch::Contains("truncated or overlong page table"));
    CHECK_THAT(link.rx.errors[44], Catch::Contains("pages (1 to 256 allowed)"));
    CHECK(link.rejected == 0);
  }
  CHECK_THAT(link.rx.errors[42], Catch::Contains("page table sums to 8001 bytes"));
  CHECK_THAT(link.rx.errors[43], Catch::Contains("payload is 7000 bytes, header says 8000"));
  CHECK(link.rx.bad_messages.empty());
  REQUIRE(link.rx.pages.size() == 3);
  CHECK(link.rx.pages[0].request_id == 40);
  CHECK(link.rx.pages[0].bytes == pages[0]);
  CHECK(link.rx.pages[1].bytes == pages[1]);
  CHECK(link.rx.log[45] == std::vector<std::string>{"page 0", "done"});
}

TEST_CASE("kv transfer: a peer of wire version 2 gets a clear error", "[net][kv][pages]") {
  Link link("tcp");
  // A v2 kv_page header (40 bytes: no page count, no table) as an older node sends it.
  auto header = encode_wire_header(make_wire_header(WireType::kv_page, 50, 0, 0, page_bytes(50, 0, 0, 100)));
  header[4] = std::byte{2};
  header.resize(40);
  link.sender_worker->send(link.peer, kKvDataAmId, header, page_bytes(50, 0, 0, 100));
  REQUIRE(link.rx.wait([&] { return link.rejected.load() == 1; }));
  std::lock_guard lock(link.rx.mutex);
  REQUIRE(link.rejections.size() == 1);
  CHECK_THAT(link.rejections[0], Catch::Contains("wire version 2 is not supported (this build speaks 4)"));
  CHECK(WireAuth::rejection_reason(Status::error(link.rejections[0])) == std::string("wire_version"));
  CHECK(link.rx.pages.empty());
  CHECK_FALSE(link.rx.has_error(50));
}

// What hack-decode relies on for one copy per page: every page handed to on_page can be kept
// in the memory UCX received it into (KvReceiver::retain_payload), whether it came eager or
// by rendezvous, in its turn or ahead of it; the engine thread then copies it into the pool.
TEST_CASE("kv transfer: every received page can be kept where UCX put it, eager, rendezvous or early", "[net][kv][pages]") {
  const std::string tls = GENERATE(from_range(test::loopback_transports()));
  INFO("UCX_TLS=" << tls);
  // Messages of at most 8 KiB stay well under UCX's automatic rendezvous threshold (which
  // moved messages of 43–64 KiB either way between runs), so the small pages surely go eager.
  Link link(tls, {}, {}, false, 8 * 1024);
  struct Kept {
    std::shared_ptr<const void> owner;
    std::span<const std::byte> bytes;
  };
  std::vector<Kept> kept;  // progress thread only, until the request is done
  link.page_hook = [&](uint64_t, uint32_t, std::span<const std::byte> page) {
    kept.push_back({link.receiver->retain_payload(page), page});
  };
  // Rendezvous messages (a 2 MiB page) followed by small eager ones, which then arrive ahead
  // of their turn and wait in the receiver.
  auto size_of = [](uint64_t, uint32_t, int index) -> size_t { return index % 10 == 0 ? (size_t{2} << 20) + index : 1500 + index; };
  constexpr int kPages = 60;
  for (int index = 0; index < kPages; ++index)
    REQUIRE(link.sender->send_page(link.peer, 1, 0, page_bytes(1, 0, index, size_of(1, 0, index))).is_ok());
  REQUIRE(link.sender->layer_done(link.peer, 1, 0).is_ok());
  REQUIRE(link.sender->request_done(link.peer, 1).is_ok());
  REQUIRE(link.rx.wait([&] { return link.rx.is_done(1) || link.rx.has_error(1); }));
  link.receiver_worker->run_on_worker([] {});  // the callbacks have returned
  REQUIRE(kept.size() == kPages);
  for (int index = 0; index < kPages; ++index) {
    INFO("page " << index);
    const Kept& k = kept[static_cast<size_t>(index)];
    REQUIRE(k.owner != nullptr);
    CHECK(k.owner.get() == k.bytes.data());
    const auto want = page_bytes(1, 0, index, size_of(1, 0, index));
    CHECK((k.bytes.size() == want.size() && std::memcmp(k.bytes.data(), want.data(), want.size()) == 0));
  }
  const UcxStats stats = link.receiver_worker->stats();
  CHECK(stats.rndv_received >= 6);
  CHECK(stats.eager_retained >= 1);
  kept.clear();  // eager buffers go back to UCX on the progress thread
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(test::kWaitS);
  while (link.receiver_worker->stats().eager_held_bytes != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(link.receiver_worker->stats().eager_held_bytes == 0);
  // Outside a callback nothing can be kept.
  std::byte b{};
  CHECK(link.receiver->retain_payload(std::span(&b, 1)) == nullptr);
}
