// The decode node's outbox: events run on its own thread, in order, bounded, and none is lost
// at shutdown.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "hack/decode/event_outbox.h"

namespace hack::server {
namespace {

DecodeEvent token_event(int index) {
  DecodeEvent e;
  e.kind = DecodeEventKind::token;
  e.index = index;
  e.sample.token = 100 + index;
  return e;
}

}  // namespace

TEST_CASE("event outbox: handlers run on the output thread, each request's events in order", "[decode][outbox]") {
  EventOutbox outbox(64);
  std::mutex mutex;
  std::vector<std::vector<int>> seen(3);
  std::atomic<bool> ran_on_poster{false};
  const std::thread::id poster = std::this_thread::get_id();
  std::vector<DecodeEventFn> fns;
  for (int r = 0; r < 3; ++r)
    fns.push_back(outbox.relay([&, r](const DecodeEvent& e) {
      if (std::this_thread::get_id() == poster) ran_on_poster = true;
      std::lock_guard lock(mutex);
      seen[static_cast<size_t>(r)].push_back(e.index);
      CHECK(e.sample.token == 100 + e.index);
    }));
  for (int i = 0; i < 500; ++i) fns[static_cast<size_t>(i % 3)](token_event(i));
  outbox.flush();
  CHECK_FALSE(ran_on_poster);
  size_t total = 0;
  for (int r = 0; r < 3; ++r) {
    const std::vector<int>& s = seen[static_cast<size_t>(r)];
    total += s.size();
    for (size_t i = 1; i < s.size(); ++i) REQUIRE(s[i] == s[i - 1] + 3);  // posted order, per request
  }
  CHECK(total == 500);
  CHECK(outbox.high_water() <= outbox.capacity());
}

TEST_CASE("event outbox: a full outbox makes the poster wait, and nothing is dropped", "[decode][outbox]") {
  EventOutbox outbox(4);
  std::atomic<bool> release{false};
  std::atomic<int> handled{0};
  const DecodeEventFn slow = outbox.relay([&](const DecodeEvent&) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++handled;
  });
  std::atomic<int> posted{0};
  std::thread poster([&] {
    for (int i = 0; i < 10; ++i) {
      slow(token_event(i));
      ++posted;
    }
  });
  // The event in the handler keeps its slot until it returns: with it, four fill the outbox
  // and the poster waits at the fifth.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (posted < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(posted == 4);
  CHECK(outbox.high_water() == 4);
  release = true;
  poster.join();
  outbox.flush();
  CHECK(handled == 10);
  CHECK(outbox.full_waits() >= 1);
}

TEST_CASE("event outbox: events still queued run before the outbox is destroyed", "[decode][outbox]") {
  std::atomic<int> handled{0};
  {
    EventOutbox outbox(128);
    const DecodeEventFn fn = outbox.relay([&](const DecodeEvent&) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      ++handled;
    });
    for (int i = 0; i < 100; ++i) fn(token_event(i));
  }
  CHECK(handled == 100);
}

}  // namespace hack::server
