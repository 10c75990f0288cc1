#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/http/http_client.h"
#include "hack/http/http_server.h"
#include "unit/http/http_test_util.h"

using namespace hack::server;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using test::eventually;
using test::seconds_since;
using test::Workers;
using test::make_request;

/// A port nothing listens on: bound, never listened, so connects are refused.
struct DeadPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  DeadPort() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
  }
  ~DeadPort() { ::close(fd); }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("http client: request headers, body and response fields", "[server][http_client]") {
  HttpServer server({}, [](HttpRequest req, std::shared_ptr<Responder> res) {
    res->send(201, "application/json", req.method + "|" + req.header("content-type") + "|" + req.header("x-key") + "|" + req.body,
              {{"X-One", "1"}, {"Set-Thing", "a"}, {"Set-Thing", "b"}});
  });
  auto req = make_request(server.port(), "/x");
  req.method = "PUT";
  req.body = "{\"k\":2}";
  req.headers = {{"X-Key", "secret"}};
  HttpResponse r = http_request(req);
  CHECK(r.status == 201);
  CHECK(r.body == "PUT|application/json|secret|{\"k\":2}");
  CHECK(r.header("x-one") == "1");
  CHECK(r.header("set-thing") == "a, b");
  CHECK(r.header("content-length") == std::to_string(r.body.size()));
  CHECK(r.header("absent").empty());

  req.content_type = "text/plain";  // and a user header overrides a default
  req.headers = {{"X-Key", "k2"}, {"Content-Type", "application/x-custom"}};
  CHECK(http_request(req).body == "PUT|application/x-custom|k2|{\"k\":2}");
}

TEST_CASE("http client: connect failure and timeout name host:port", "[server][http_client]") {
  DeadPort dead;
  std::string e = error_of([&] { http_request(make_request(dead.port, "/")); });
  CHECK(contains(e, "connect"));
  CHECK(contains(e, "127.0.0.1:" + std::to_string(dead.port)));
  e = error_of([&] { http_stream(make_request(dead.port, "/"), [](std::string_view) { return true; }); });
  CHECK(contains(e, "127.0.0.1:" + std::to_string(dead.port)));

  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> never;  // held, never answered
  HttpServer server({}, [&](HttpRequest, std::shared_ptr<Responder> res) {
    std::lock_guard lock(mu);
    never.push_back(res);
  });
  auto t0 = Clock::now();
  e = error_of([&] { http_request(make_request(server.port(), "/hang", 0.3)); });
  CHECK(contains(e, "timed out"));
  CHECK(contains(e, "127.0.0.1:" + std::to_string(server.port())));
  CHECK(seconds_since(t0) < 2.0);
}

TEST_CASE("http client: stream falls back to a plain body when not SSE", "[server][http_client]") {
  HttpServer server({}, [](HttpRequest req, std::shared_ptr<Responder> res) {
    if (req.path == "/missing") {
      res->send(404, "application/json", "{\"error\":{\"message\":\"no such route\"}}");
    } else {
      res->send(200, "application/json", std::string(100000, 'j'));
    }
  });
  int events = 0;
  auto on_event = [&](std::string_view) {
    ++events;
    return true;
  };
  HttpResponse r = http_stream(make_request(server.port(), "/missing"), on_event);
  CHECK(r.status == 404);
  CHECK(r.body == "{\"error\":{\"message\":\"no such route\"}}");
  r = http_stream(make_request(server.port(), "/json"), on_event);
  CHECK(r.status == 200);
  CHECK(r.body == std::string(100000, 'j'));
  CHECK(events == 0);
}

TEST_CASE("http client: early 413 is returned while the body is still being sent", "[server][http_client]") {
  HttpServerOptions o;
  o.max_body_bytes = 1024;
  HttpServer server(o, [](HttpRequest, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "ok"); });
  auto req = make_request(server.port(), "/");
  req.method = "POST";
  req.body = std::string(16 << 20, 'x');
  CHECK(http_request(req).status == 413);
}

TEST_CASE("http client: stream idle timeout and a stream cut short", "[server][http_client]") {
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> held;
  auto server = std::make_unique<HttpServer>(HttpServerOptions{}, [&](HttpRequest, std::shared_ptr<Responder> res) {
    res->start_sse();
    res->send_event("first");  // then silence
    std::lock_guard lock(mu);
    held.push_back(res);
  });
  std::vector<std::string> got;
  auto on_event = [&](std::string_view d) {
    got.emplace_back(d);
    return true;
  };
  auto t0 = Clock::now();
  std::string e = error_of([&] { http_stream(make_request(server->port(), "/s", 0.3), on_event); });
  CHECK(contains(e, "timed out"));
  CHECK(seconds_since(t0) < 2.0);
  CHECK(got == std::vector<std::string>{"first"});

  // The server goes away before the final chunk: an error, not a normal end.
  got.clear();
  std::thread stopper([&] {
    eventually([&] {
      std::lock_guard lock(mu);
      return held.size() == 2;
    });
    server->stop();
  });
  e = error_of([&] { http_stream(make_request(server->port(), "/s", 5), on_event); });
  stopper.join();
  CHECK(contains(e, "closed before the stream ended"));
  CHECK(got == std::vector<std::string>{"first"});
}

TEST_CASE("http client: HttpCancel aborts a stream and a request", "[server][http_client]") {
  Workers workers;
  std::atomic<int> server_saw_close{0};
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> held;
  HttpServer server({}, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    res->on_client_closed([&] { server_saw_close++; });
    if (req.path == "/stream") {
      res->start_sse();
      workers.start([res] {
        for (int i = 0; i < 1000 && res->send_event(std::to_string(i)); ++i) std::this_thread::sleep_for(20ms);
      });
    } else {
      std::lock_guard lock(mu);
      held.push_back(res);
    }
  });

  SECTION("stream") {
    HttpCancel cancel;
    std::atomic<int> events{0};
    Clock::time_point cancelled_at;
    std::thread canceller([&] {
      eventually([&] { return events.load() >= 3; });
      cancelled_at = Clock::now();
      cancel.cancel();
    });
    std::string e = error_of([&] {
      http_stream(make_request(server.port(), "/stream", 30), [&](std::string_view) {
        events++;
        return true;
      }, &cancel);
    });
    double after_cancel = seconds_since(cancelled_at);
    canceller.join();
    CHECK(e == "cancelled");
    CHECK(events.load() >= 3);
    CHECK(after_cancel < 0.5);
    CHECK(cancel.cancelled());
    CHECK(eventually([&] { return server_saw_close.load() == 1; }));
  }
  SECTION("request waiting for its response") {
    HttpCancel cancel;
    std::thread canceller([&] {
      eventually([&] {
        std::lock_guard lock(mu);
        return held.size() == 1;
      });
      cancel.cancel();
    });
    auto t0 = Clock::now();
    std::string e = error_of([&] { http_request(make_request(server.port(), "/wait", 30), &cancel); });
    canceller.join();
    CHECK(e == "cancelled");
    CHECK(seconds_since(t0) < 3);
    CHECK(eventually([&] { return server_saw_close.load() == 1; }));
  }
  SECTION("cancelled before the call starts") {
    HttpCancel cancel;
    cancel.cancel();
    CHECK(error_of([&] { http_request(make_request(server.port(), "/wait"), &cancel); }) == "cancelled");
    CHECK(error_of([&] { http_stream(make_request(server.port(), "/stream"), [](std::string_view) { return true; }, &cancel); }) ==
          "cancelled");
    std::lock_guard lock(mu);
    CHECK(held.empty());
  }
}
