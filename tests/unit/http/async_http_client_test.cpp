// The coroutine client calls (http/async_http_client.h) against our HttpServer: keep-alive
// reuse through HttpConnectionPool (and a redial when the server closed an idle pooled
// connection), SSE streams, timeouts and cancels with host:port in the message, and many
// calls in flight on one thread.
#include "hack/http/async_http_client.h"  // first: Asio's coroutine support

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/http/http_server.h"
#include "unit/http/http_test_util.h"

using namespace hack::server;
using namespace std::chrono_literals;

namespace {

using test::make_request;
using test::seconds_since;

// Runs `body` as a coroutine on `ioc` (one thread: this one) until it returns; rethrows.
void run_coroutine(asio::io_context& ioc, std::function<Task<void>()> body) {
  std::exception_ptr error;
  asio::co_spawn(ioc, std::move(body), [&](std::exception_ptr e) { error = e; });
  ioc.restart();
  ioc.run();
  if (error) std::rethrow_exception(error);
}

std::string error_of(asio::io_context& ioc, std::function<Task<void>()> body) {
  try {
    run_coroutine(ioc, std::move(body));
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// /echo answers its target; /sse streams the events "a", "b", "c" and ends.
void echo_or_sse(HttpRequest req, std::shared_ptr<Responder> res) {
  if (req.path == "/sse") {
    res->start_sse();
    for (const char* e : {"a", "b", "c"}) res->send_event(e);
    res->end();
    return;
  }
  res->send(200, "text/plain", req.method + " " + req.target);
}

}  // namespace

TEST_CASE("async http: a pool keeps one connection alive across requests and streams", "[server][http_client]") {
  HttpServer server({}, echo_or_sse);
  asio::io_context ioc;
  HttpConnectionPool pool(ioc.get_executor());
  std::vector<std::string> bodies, events;
  run_coroutine(ioc, [&]() -> Task<void> {
    for (int i = 0; i < 5; ++i) {
      HttpResponse r = co_await async_http_request(make_request(server.port(), "/echo?" + std::to_string(i)), nullptr, &pool);
      bodies.push_back(r.body);
    }
    HttpResponse s = co_await async_http_stream(
        make_request(server.port(), "/sse"),
        [&](std::string_view e) -> Task<bool> {
          events.emplace_back(e);
          co_return true;
        },
        nullptr, &pool);
    CHECK(s.status == 200);
    HttpResponse last = co_await async_http_request(make_request(server.port(), "/echo?last"), nullptr, &pool);
    bodies.push_back(last.body);
  });
  REQUIRE(bodies.size() == 6);
  CHECK(bodies[0] == "GET /echo?0");
  CHECK(bodies[4] == "GET /echo?4");
  CHECK(bodies[5] == "GET /echo?last");
  CHECK(events == std::vector<std::string>{"a", "b", "c"});
  CHECK(pool.dialled() == 1);  // every call after the first reused the one connection
  CHECK(pool.reused() == 6);
  CHECK(pool.idle() == 1);
  CHECK(test::eventually([&] { return server.open_connections() == 1; }));
  pool.clear();
  CHECK(test::eventually([&] { return server.open_connections() == 0; }));
}

TEST_CASE("async http: without a pool every call closes its connection", "[server][http_client]") {
  HttpServer server({}, echo_or_sse);
  asio::io_context ioc;
  run_coroutine(ioc, [&]() -> Task<void> {
    for (int i = 0; i < 3; ++i) {
      HttpResponse r = co_await async_http_request(make_request(server.port(), "/x"));
      CHECK(r.body == "GET /x");
    }
  });
  CHECK(test::eventually([&] { return server.open_connections() == 0; }));
}

TEST_CASE("async http: a pooled connection the server closed while idle is redialled", "[server][http_client]") {
  HttpServerOptions o;
  o.idle_timeout_s = 0.2;  // the server drops idle keep-alive connections quickly
  HttpServer server(o, echo_or_sse);
  asio::io_context ioc;
  HttpConnectionPool pool(ioc.get_executor());
  std::vector<std::string> bodies;
  run_coroutine(ioc, [&]() -> Task<void> {
    bodies.push_back((co_await async_http_request(make_request(server.port(), "/one"), nullptr, &pool)).body);
    co_await co_sleep(0.6);  // the server has closed it by now; the pool does not know
    bodies.push_back((co_await async_http_request(make_request(server.port(), "/two"), nullptr, &pool)).body);
    std::vector<std::string> events;
    co_await co_sleep(0.6);
    co_await async_http_stream(
        make_request(server.port(), "/sse"),
        [&](std::string_view e) -> Task<bool> {
          events.emplace_back(e);
          co_return true;
        },
        nullptr, &pool);
    bodies.push_back(events.size() == 3 ? "3 events" : "events lost");
  });
  CHECK(bodies == std::vector<std::string>{"GET /one", "GET /two", "3 events"});
  CHECK(pool.dialled() == 3);  // the first call's, and a redial after each stale reuse
  CHECK(pool.reused() == 2);
}

TEST_CASE("async http: connect failure, timeout and cancel name what failed", "[server][http_client]") {
  asio::io_context ioc;
  // A port nothing listens on.
  int dead_port;
  {
    HttpServer gone({}, echo_or_sse);
    dead_port = gone.port();
  }
  std::string e = error_of(ioc, [&]() -> Task<void> { co_await async_http_request(make_request(dead_port, "/")); });
  CHECK(contains(e, "connect"));
  CHECK(contains(e, "127.0.0.1:" + std::to_string(dead_port)));

  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> never;  // held, never answered
  HttpServer server({}, [&](HttpRequest, std::shared_ptr<Responder> res) {
    std::lock_guard lock(mu);
    never.push_back(res);
  });
  auto t0 = test::Clock::now();
  e = error_of(ioc, [&]() -> Task<void> { co_await async_http_request(make_request(server.port(), "/hang", 0.3)); });
  CHECK(contains(e, "timed out"));
  CHECK(contains(e, "127.0.0.1:" + std::to_string(server.port())));
  CHECK(seconds_since(t0) < 2.0);

  HttpCancel cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    cancel.cancel();
  });
  t0 = test::Clock::now();
  e = error_of(ioc, [&]() -> Task<void> {
    co_await async_http_stream(
        make_request(server.port(), "/hang", 30), [](std::string_view) -> Task<bool> { co_return true; }, &cancel);
  });
  canceller.join();
  CHECK(e == "cancelled");
  CHECK(seconds_since(t0) < 2.0);
  // Sticky: a call that starts after the cancel fails at once.
  e = error_of(ioc, [&]() -> Task<void> { co_await async_http_request(make_request(server.port(), "/x"), &cancel); });
  CHECK(e == "cancelled");
}

TEST_CASE("async http: 200 streams in flight at once on one thread", "[server][http_client]") {
  // The server answers each stream only once all 200 have arrived, so every call must be in
  // flight at the same time on the client's single thread.
  constexpr int kStreams = 200;
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> waiting;
  HttpServerOptions o;
  o.threads = 2;
  HttpServer server(o, [&](HttpRequest, std::shared_ptr<Responder> res) {
    std::vector<std::shared_ptr<Responder>> go;
    {
      std::lock_guard lock(mu);
      waiting.push_back(std::move(res));
      if (static_cast<int>(waiting.size()) == kStreams) go.swap(waiting);
    }
    for (auto& r : go) {
      r->start_sse();
      r->send_event("x");
      r->send_event("y");
      r->end();
    }
  });
  asio::io_context ioc;
  std::atomic<int> events{0}, done{0};
  std::exception_ptr error;
  for (int i = 0; i < kStreams; ++i) {
    asio::co_spawn(
        ioc,
        [&]() -> Task<void> {
          co_await async_http_stream(make_request(server.port(), "/s", 10), [&](std::string_view) -> Task<bool> {
            ++events;
            co_return true;
          });
          ++done;
        },
        [&](std::exception_ptr e) {
          if (e) error = e;
        });
  }
  ioc.run();
  if (error) std::rethrow_exception(error);
  CHECK(done == kStreams);
  CHECK(events == 2 * kStreams);
}
