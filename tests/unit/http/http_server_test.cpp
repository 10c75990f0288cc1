#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
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

/// A plain TCP client for what the HTTP client would never send (raw bytes, stalls, pipelining).
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  /// False if the peer is gone.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  struct Response {
    int status = 0;
    std::string head;
    std::string body;
  };

  /// One response with a Content-Length (or none) body; status 0 if none came in time.
  Response read_response(double timeout_s = 5) {
    Response r;
    auto t0 = Clock::now();
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!read_some(timeout_s - seconds_since(t0))) return r;
    }
    r.head = buf_.substr(0, end + 4);
    buf_.erase(0, end + 4);
    r.status = std::stoi(r.head.substr(9, 3));
    size_t length = 0;
    std::string lower_head = r.head;
    for (char& c : lower_head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (auto p = lower_head.find("content-length: "); p != std::string::npos) length = std::stoul(r.head.substr(p + 16));
    while (buf_.size() < length) {
      if (!read_some(timeout_s - seconds_since(t0))) return Response{};
    }
    r.body = buf_.substr(0, length);
    buf_.erase(0, length);
    return r;
  }

  /// True once the server closed the connection (EOF or reset) within timeout_s.
  bool wait_closed(double timeout_s = 3) {
    auto t0 = Clock::now();
    while (seconds_since(t0) < timeout_s) {
      if (!read_some(timeout_s - seconds_since(t0))) return eof_;
    }
    return false;
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  /// Appends what arrives within timeout_s; false on timeout, EOF or error.
  bool read_some(double timeout_s) {
    pollfd p{fd_, POLLIN, 0};
    int ms = std::max(0, static_cast<int>(timeout_s * 1000));
    if (::poll(&p, 1, ms) <= 0) return false;
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

HttpClientRequest make_request(int port, std::string method, std::string target, std::string body = "") {
  HttpClientRequest r;
  r.host = "127.0.0.1";
  r.port = port;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.timeout_s = 5;
  return r;
}

/// Echoes the request as "METHOD path target x-test body" (text/plain).
void echo(HttpRequest req, std::shared_ptr<Responder> res) {
  res->send(200, "text/plain", req.method + " " + req.path + " " + req.target + " " + req.header("x-test") + " " + req.body,
            {{"X-Remote", req.remote}});
}

/// The server's own errors are OpenAI-shaped JSON.
void check_error_body(const std::string& body, const std::string& message_part) {
  auto j = nlohmann::json::parse(body);
  INFO(body);
  CHECK(j["error"]["message"].get<std::string>().find(message_part) != std::string::npos);
  CHECK(j["error"].contains("type"));
  CHECK(j["error"]["param"].is_null());
  CHECK(j["error"]["code"].is_null());
}

}  // namespace

TEST_CASE("http server: GET and POST round trip", "[server][http]") {
  HttpServer server({}, echo);
  REQUIRE(server.port() > 0);
  auto get = make_request(server.port(), "GET", "/v1/models?x=1");
  get.headers = {{"X-Test", "hdr"}};
  HttpResponse r = http_request(get);
  CHECK(r.status == 200);
  CHECK(r.body == "GET /v1/models /v1/models?x=1 hdr ");
  CHECK(r.header("content-type") == "text/plain");
  CHECK(r.header("x-remote").rfind("127.0.0.1:", 0) == 0);

  std::string big(300000, 'b');
  r = http_request(make_request(server.port(), "POST", "/v1/completions", "{\"a\":1}" + big));
  CHECK(r.status == 200);
  CHECK(r.body == "POST /v1/completions /v1/completions  {\"a\":1}" + big);
}

TEST_CASE("http server: keep-alive, pipelining and Connection: close", "[server][http]") {
  HttpServer server({}, echo);
  RawClient c(server.port());
  REQUIRE(c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto a = c.read_response();
  REQUIRE(a.status == 200);
  CHECK(a.body.rfind("GET /a", 0) == 0);
  REQUIRE(c.send("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz"));
  auto b = c.read_response();
  REQUIRE(b.status == 200);
  CHECK(b.body == "POST /b /b  xyz");
  // Same connection: the server saw the same client port both times.
  auto remote = [](const std::string& head) { return head.substr(head.find("X-Remote: ")); };
  CHECK(remote(a.head).substr(0, remote(a.head).find("\r\n")) == remote(b.head).substr(0, remote(b.head).find("\r\n")));

  // Two requests in one write come back in order.
  REQUIRE(c.send("GET /p1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"));
  CHECK(c.read_response().body.rfind("GET /p1", 0) == 0);
  CHECK(c.read_response().body == "POST /p2 /p2  hi");

  REQUIRE(c.send("GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  auto last = c.read_response();
  CHECK(last.status == 200);
  CHECK(last.head.find("Connection: close") != std::string::npos);
  CHECK(c.wait_closed());

  RawClient old(server.port());  // HTTP/1.0 without keep-alive closes after the response
  REQUIRE(old.send("GET /old HTTP/1.0\r\n\r\n"));
  CHECK(old.read_response().status == 200);
  CHECK(old.wait_closed());
}

TEST_CASE("http server: oversized body is 413, server keeps serving", "[server][http]") {
  HttpServerOptions o;
  o.max_body_bytes = 1024;
  HttpServer server(o, echo);
  // Content-Length over the limit: refused from the head, while the client is still sending.
  HttpResponse r = http_request(make_request(server.port(), "POST", "/", std::string(4 << 20, 'x')));
  CHECK(r.status == 413);
  check_error_body(r.body, "1024");
  CHECK(http_request(make_request(server.port(), "POST", "/", std::string(1024, 'y'))).status == 200);

  RawClient c(server.port());  // chunked body that grows past the limit
  REQUIRE(c.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + std::string(1024, 'z') +
                 "\r\n10\r\n" + std::string(16, 'z') + "\r\n0\r\n\r\n"));
  auto cr = c.read_response();
  CHECK(cr.status == 413);
  CHECK(c.wait_closed());
  CHECK(http_request(make_request(server.port(), "GET", "/")).status == 200);
}

TEST_CASE("http server: oversized header is 431, malformed request is 400", "[server][http]") {
  HttpServer server({}, echo);
  auto big = make_request(server.port(), "GET", "/");
  big.headers = {{"X-Big", std::string(20000, 'a')}};
  HttpResponse r = http_request(big);
  CHECK(r.status == 431);
  check_error_body(r.body, "16384");

  for (std::string bad : {"GARBAGE\r\n\r\n", "GET / HTTP/1.1\r\nBad Header Line\r\n\r\n",
                          "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "GET / HTTP/9.x\r\n\r\n"}) {
    INFO(bad);
    RawClient c(server.port());
    REQUIRE(c.send(bad));
    auto resp = c.read_response();
    CHECK(resp.status == 400);
    check_error_body(resp.body, "malformed");
    CHECK(c.wait_closed());
  }
  CHECK(http_request(make_request(server.port(), "GET", "/")).status == 200);
}

TEST_CASE("http server: slowloris head and stalled body get 408", "[server][http]") {
  HttpServerOptions o;
  o.header_timeout_s = 0.5;
  o.body_timeout_s = 0.5;
  HttpServer server(o, echo);

  // A head trickled one byte per 100 ms never completes in time, even though bytes keep coming.
  RawClient slow(server.port());
  std::atomic<bool> stop_trickle{false};
  std::thread trickle([&] {
    std::string head = "GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(100, 'a');
    for (char ch : head) {
      if (stop_trickle || !slow.send(std::string(1, ch))) return;
      std::this_thread::sleep_for(100ms);
    }
  });
  auto t0 = Clock::now();
  // Others are served meanwhile.
  CHECK(http_request(make_request(server.port(), "GET", "/other")).status == 200);
  auto r = slow.read_response(3);
  double waited = seconds_since(t0);
  stop_trickle = true;
  trickle.join();
  CHECK(r.status == 408);
  CHECK(waited > 0.4);
  CHECK(waited < 2.0);
  check_error_body(r.body, "0.5 s");
  CHECK(slow.wait_closed());

  RawClient body(server.port());
  REQUIRE(body.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-some"));
  CHECK(body.read_response(3).status == 408);

  RawClient silent(server.port());  // a connection that never sends is timed out too
  CHECK(silent.read_response(3).status == 408);
  CHECK(http_request(make_request(server.port(), "GET", "/")).status == 200);
}

TEST_CASE("http server: idle keep-alive connection is closed", "[server][http]") {
  HttpServerOptions o;
  o.idle_timeout_s = 0.3;
  HttpServer server(o, echo);
  RawClient c(server.port());
  REQUIRE(c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(c.read_response().status == 200);
  auto t0 = Clock::now();
  CHECK(c.wait_closed(3));
  CHECK(seconds_since(t0) > 0.2);
  CHECK(eventually([&] { return server.open_connections() == 0; }));
}

TEST_CASE("http server: handler that throws gives 500 and the server keeps serving", "[server][http]") {
  HttpServer server({}, [](HttpRequest req, std::shared_ptr<Responder> res) {
    if (req.path == "/throw") throw std::runtime_error("boom on /throw");
    if (req.path == "/drop") return;  // drops the Responder without answering
    res->send(200, "text/plain", "ok");
  });
  RawClient c(server.port());
  REQUIRE(c.send("GET /throw HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto r = c.read_response();
  CHECK(r.status == 500);
  check_error_body(r.body, "boom on /throw");
  REQUIRE(c.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"));  // same connection still usable
  CHECK(c.read_response().body == "ok");
  REQUIRE(c.send("GET /drop HTTP/1.1\r\nHost: x\r\n\r\n"));
  CHECK(c.read_response().status == 500);
  CHECK(http_request(make_request(server.port(), "GET", "/ok")).status == 200);
}

TEST_CASE("http server: Expect 100-continue", "[server][http]") {
  HttpServer server({}, echo);
  RawClient c(server.port());
  REQUIRE(c.send("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  CHECK(c.read_response().status == 100);
  REQUIRE(c.send("hello"));
  auto r = c.read_response();
  CHECK(r.status == 200);
  CHECK(r.body == "POST /e /e  hello");
}

TEST_CASE("http server: SSE stream of 100 events from another thread arrives in order", "[server][http][sse]") {
  Workers workers;
  // What the handler and its thread saw, checked on the test's thread (Catch is not thread-safe:
  // an assertion there raced with the test's own under ThreadSanitizer).
  std::atomic<int> sse_refused{0}, open_after_end{0}, late_sent{0};
  HttpServer server({}, [&](HttpRequest, std::shared_ptr<Responder> res) {
    if (!res->start_sse({{"X-Stream", "1"}})) {
      ++sse_refused;
      return;
    }
    workers.start([res, &open_after_end, &late_sent] {
      for (int i = 0; i < 100; ++i) {
        res->send_event(i == 50 ? "line one\nline two" : "event " + std::to_string(i));
        if (i % 10 == 0) std::this_thread::sleep_for(1ms);
      }
      res->end();
      if (!res->closed()) ++open_after_end;
      if (res->send_event("late")) ++late_sent;
    });
  });
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> got;
    HttpResponse r = http_stream(make_request(server.port(), "POST", "/stream", "{}"), [&](std::string_view d) {
      got.emplace_back(d);
      return true;
    });
    CHECK(r.status == 200);
    CHECK(r.header("content-type") == "text/event-stream");
    CHECK(r.header("cache-control") == "no-cache");
    CHECK(r.header("x-stream") == "1");
    REQUIRE(got.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(got[static_cast<size_t>(i)] == (i == 50 ? "line one\nline two" : "event " + std::to_string(i)));
  }
  workers.join();
  CHECK(sse_refused == 0);
  CHECK(open_after_end == 0);  // closed() once end() was called
  CHECK(late_sent == 0);       // and nothing is sent after it
}

TEST_CASE("http server: client disconnect fires on_client_closed", "[server][http]") {
  Workers workers;
  std::atomic<int> closed_calls{0};
  std::mutex mu;
  std::shared_ptr<Responder> held;
  HttpServer server({}, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    res->on_client_closed([&] { closed_calls++; });
    if (req.path == "/sse") {
      res->start_sse();
      workers.start([res] {
        for (int i = 0; i < 2000 && res->send_event("tick " + std::to_string(i)); ++i) std::this_thread::sleep_for(5ms);
      });
    } else {  // a slow non-streamed reply: the handler's work outlives the client
      std::lock_guard lock(mu);
      held = res;
    }
  });

  SECTION("while streaming") {
    int seen = 0;
    http_stream(make_request(server.port(), "GET", "/sse"), [&](std::string_view) { return ++seen < 3; });
    CHECK(seen == 3);
    CHECK(eventually([&] { return closed_calls.load() == 1; }, 2));
  }
  SECTION("while the handler works on a plain reply") {
    RawClient c(server.port());
    REQUIRE(c.send("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"));
    REQUIRE(eventually([&] {
      std::lock_guard lock(mu);
      return held != nullptr;
    }));
    CHECK_FALSE(held->closed());
    std::this_thread::sleep_for(50ms);
    CHECK(closed_calls.load() == 0);
    c.close();
    CHECK(eventually([&] { return closed_calls.load() == 1; }, 2));
    CHECK(held->closed());
    CHECK_FALSE(held->send(200, "text/plain", "too late"));
    std::atomic<int> late_calls{0};  // set after the disconnect: still called, once
    held->on_client_closed([&] { late_calls++; });
    CHECK(eventually([&] { return late_calls == 1; }, 2));
    held.reset();
  }
  CHECK(eventually([&] { return server.open_connections() == 0; }));
  CHECK(closed_calls.load() == 1);
}

TEST_CASE("http server: a client that stops reading is cut off by the write timeout", "[server][http]") {
  Workers workers;
  HttpServerOptions o;
  o.write_timeout_s = 0.5;
  std::atomic<bool> closed{false};
  std::atomic<size_t> sent_bytes{0};
  HttpServer server(o, [&](HttpRequest, std::shared_ptr<Responder> res) {
    res->on_client_closed([&] { closed = true; });
    res->start_sse();
    workers.start([res, &sent_bytes] {
      std::string blob(64 << 10, 'x');
      // ~64 MB/s until the server gives up on the client (bounded at 1 GB if it never does).
      for (int i = 0; i < 16384 && res->send_event(blob); ++i) {
        sent_bytes += blob.size();
        std::this_thread::sleep_for(1ms);
      }
    });
  });
  RawClient c(server.port());
  REQUIRE(c.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n"));  // and never reads
  CHECK(eventually([&] { return closed.load(); }, 10));
  INFO("bytes queued before the cut: " << sent_bytes.load());
  CHECK(sent_bytes.load() < (size_t{1} << 30));
}

TEST_CASE("http server: 100 concurrent clients", "[server][http]") {
  Workers workers;
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> pending;
  std::vector<std::string> bodies;
  std::atomic<HttpServer*> self{nullptr};
  size_t open_at_100 = 0;
  // Answers only once all 100 requests are in flight at the same time.
  HttpServer server({}, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    std::lock_guard lock(mu);
    pending.push_back(std::move(res));
    bodies.push_back(req.body);
    if (pending.size() == 100) {
      open_at_100 = self.load()->open_connections();
      workers.start([p = std::move(pending), b = std::move(bodies)] {
        for (size_t i = 0; i < p.size(); ++i) p[i]->send(200, "text/plain", "echo " + b[i]);
      });
    }
  });
  self = &server;
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 100; ++i) {
    clients.emplace_back([&, i] {
      auto r = http_request(make_request(server.port(), "POST", "/", std::to_string(i)));
      if (r.status == 200 && r.body == "echo " + std::to_string(i)) ok++;
    });
  }
  for (auto& t : clients) t.join();
  CHECK(ok.load() == 100);
  std::lock_guard lock(mu);
  CHECK(open_at_100 == 100);
}

TEST_CASE("http server: too many connections get 503", "[server][http]") {
  HttpServerOptions o;
  o.max_connections = 2;
  HttpServer server(o, echo);
  auto a = std::make_unique<RawClient>(server.port());
  RawClient b(server.port());
  REQUIRE(eventually([&] { return server.open_connections() == 2; }));
  RawClient c(server.port());
  auto r = c.read_response();
  CHECK(r.status == 503);
  check_error_body(r.body, "2 connections");
  CHECK(c.wait_closed());
  c.close();
  a.reset();
  REQUIRE(eventually([&] { return server.open_connections() == 1; }));
  CHECK(http_request(make_request(server.port(), "GET", "/")).status == 200);
}

TEST_CASE("http server: stop() with open connections returns promptly", "[server][http]") {
  Workers workers;
  std::atomic<int> closed_calls{0};
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> held;
  auto server = std::make_unique<HttpServer>(HttpServerOptions{}, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    res->on_client_closed([&] { closed_calls++; });
    if (req.path == "/sse") {
      res->start_sse();
      workers.start([res] {
        while (res->send_event("x")) std::this_thread::sleep_for(5ms);
      });
    }
    std::lock_guard lock(mu);
    held.push_back(res);
  });
  int port = server->port();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(std::make_unique<RawClient>(port));
  RawClient plain(port), sse(port);
  REQUIRE(plain.send("GET /plain HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(sse.send("GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return held.size() == 2 && server->open_connections() == 7;
  }));

  auto t0 = Clock::now();
  server->stop();
  CHECK(seconds_since(t0) < 1.0);
  CHECK(server->open_connections() == 0);
  CHECK(closed_calls.load() == 2);
  for (auto& r : held) {
    CHECK(r->closed());
    CHECK_FALSE(r->send(200, "text/plain", "after stop"));
  }
  CHECK(plain.wait_closed());
  for (auto& c : idle) CHECK(c->wait_closed());
  server->stop();  // idempotent
  server.reset();  // Responders may outlive the server
  held.clear();
}

TEST_CASE("http server: bind failure names host:port", "[server][http]") {
  HttpServer first({}, echo);
  HttpServerOptions o;
  o.port = first.port();
  try {
    HttpServer second(o, echo);
    FAIL("second bind to the same port succeeded");
  } catch (const hack::Error& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())) != std::string::npos);
  }
}
