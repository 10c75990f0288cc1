// Client calls as coroutines: each call's socket, deadline timer and cancel hook live in a
// CallState that the coroutine and the timer share; everything touching them runs on the
// calling coroutine's executor (a strand), so a deadline or an HttpCancel closes the socket
// between two of the coroutine's steps and the pending operation ends with an error.
#include "hack/http/async_http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>

#include <array>
#include <limits>
#include <memory>
#include <optional>

#include "hack/core/error.h"
#include "hack/http/sse.h"
#include "src/http/cancel_access.h"
#include "src/http/client_message.h"

namespace hack::server {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// ---- the pool ---------------------------------------------------------------------------

tcp::socket HttpConnectionPool::take(const std::string& where, bool& reused) {
  std::lock_guard lock(mu_);
  reused = false;
  auto it = idle_.find(where);
  const auto now = Clock::now();
  if (it != idle_.end()) {
    auto& v = it->second;
    while (!v.empty()) {  // newest first: the oldest are the likeliest to have been closed
      Idle c = std::move(v.back());
      v.pop_back();
      if (now - c.since > max_idle_ || !c.socket.is_open()) {
        error_code ignored;
        c.socket.close(ignored);
        continue;
      }
      reused = true;
      ++reused_;
      return std::move(c.socket);
    }
  }
  ++dialled_;
  return tcp::socket(ex_);
}

tcp::socket HttpConnectionPool::dial() {
  std::lock_guard lock(mu_);
  ++dialled_;
  return tcp::socket(ex_);
}

void HttpConnectionPool::put(const std::string& where, tcp::socket socket) {
  std::lock_guard lock(mu_);
  auto& v = idle_[where];
  if (v.size() >= max_idle_per_host_ || !socket.is_open()) {
    error_code ignored;
    socket.close(ignored);
    return;
  }
  v.push_back(Idle{std::move(socket), Clock::now()});
}

size_t HttpConnectionPool::idle() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [where, v] : idle_) n += v.size();
  return n;
}

size_t HttpConnectionPool::dialled() const {
  std::lock_guard lock(mu_);
  return dialled_;
}

size_t HttpConnectionPool::reused() const {
  std::lock_guard lock(mu_);
  return reused_;
}

void HttpConnectionPool::clear() {
  std::lock_guard lock(mu_);
  for (auto& [where, v] : idle_) {
    for (Idle& c : v) {
      error_code ignored;
      c.socket.close(ignored);
    }
  }
  idle_.clear();
}

namespace {

using detail::kMaxResponseBodyBytes;

// One call's socket and deadline; shared with the deadline timer's and the cancel's handlers,
// which only close the socket (on the call's executor).
struct CallState : std::enable_shared_from_this<CallState> {
  CallState(const asio::any_io_executor& ex, tcp::socket s) : socket(std::move(s)), timer(ex), executor(ex) {}

  /// Closes the socket after `seconds` unless re-armed or disarmed first (<= 0: none).
  void arm(double seconds) {
    ++gen;
    timer.cancel();
    if (!(seconds > 0) || seconds > 1e8) return;
    timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(seconds)));
    timer.async_wait([weak = weak_from_this(), g = gen](error_code ec) {
      auto self = weak.lock();
      if (!self || ec || g != self->gen) return;
      self->timed_out = true;
      self->close();
    });
  }
  void disarm() {
    ++gen;
    timer.cancel();
  }
  void close() {
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }

  tcp::socket socket;
  asio::steady_timer timer;
  asio::any_io_executor executor;
  uint64_t gen = 0;
  bool timed_out = false;  // the deadline closed the socket
  bool aborted = false;    // an HttpCancel closed it
};

// Registers a call with its HttpCancel (a cancel posts a close onto the call's executor).
class CancelHook {
 public:
  CancelHook(HttpCancel* cancel, const std::shared_ptr<CallState>& st) : cancel_(cancel) {
    if (!cancel_) return;
    std::weak_ptr<CallState> weak = st;
    auto abort = [weak, ex = st->executor] {
      asio::post(ex, [weak] {
        if (auto s = weak.lock()) {
          s->aborted = true;
          s->close();
        }
      });
    };
    if (!detail::CancelAccess::attach(*cancel_, std::move(abort), id_)) fail("cancelled");
  }
  ~CancelHook() {
    if (cancel_) detail::CancelAccess::detach(*cancel_, id_);
  }
  CancelHook(const CancelHook&) = delete;
  CancelHook& operator=(const CancelHook&) = delete;

 private:
  HttpCancel* cancel_;
  uint64_t id_ = 0;
};

struct Target {
  const HttpClientRequest& req;
  std::string where;
  explicit Target(const HttpClientRequest& r) : req(r), where(fmt::format("{}:{}", r.host, r.port)) {}

  /// Throws the error of a step that failed: the deadline's, the cancel's, or `ec`'s.
  [[noreturn]] void fail_step(const CallState& st, error_code ec, std::string_view doing, double timeout_s) const {
    if (st.aborted) fail("cancelled");
    if (st.timed_out) fail("http {} {}{}: timed out after {} s {}", req.method, where, req.target, timeout_s, doing);
    fail("http {} {}{}: {} failed: {}", req.method, where, req.target, doing, ec.message());
  }
};

Task<void> connect(const Target& t, CallState& st) {
  error_code ec;
  auto addr = asio::ip::make_address(t.req.host, ec);
  if (!ec) {
    co_await st.socket.async_connect(tcp::endpoint(addr, static_cast<unsigned short>(t.req.port)),
                                     asio::redirect_error(asio::use_awaitable, ec));
  } else {
    tcp::resolver resolver(st.executor);
    auto results = co_await resolver.async_resolve(t.req.host, std::to_string(t.req.port),
                                                   asio::redirect_error(asio::use_awaitable, ec));
    if (st.aborted) fail("cancelled");
    if (ec) fail("http: cannot resolve {}: {}", t.where, ec.message());
    co_await asio::async_connect(st.socket, results, asio::redirect_error(asio::use_awaitable, ec));
  }
  if (st.aborted) fail("cancelled");
  if (st.timed_out) fail("http {} {}{}: timed out after {} s connecting", t.req.method, t.where, t.req.target, t.req.timeout_s);
  if (ec) fail("http: connect to {} failed: {}", t.where, ec.message());
  st.socket.set_option(tcp::no_delay(true), ec);
}

// An idle connection from the pool when `may_reuse` (`reused` says whether there was one), or
// a socket to dial.
Task<std::shared_ptr<CallState>> open_call(const Target& t, HttpConnectionPool* pool, bool may_reuse, bool& reused) {
  auto ex = co_await asio::this_coro::executor;
  reused = false;
  tcp::socket socket = !pool ? tcp::socket(ex) : may_reuse ? pool->take(t.where, reused) : pool->dial();
  co_return std::make_shared<CallState>(ex, std::move(socket));
}

// Whether a failed first exchange on a reused connection is the node having closed it while
// idle (nothing of a response came): then the request is sent again on a new connection.
bool stale_connection(bool reused, const CallState& st, bool got_response_bytes) {
  return reused && !st.aborted && !st.timed_out && !got_response_bytes;
}

using Message = http::request<http::string_body>;

// Connects when the socket is not a reused open one, and writes the request. False when a
// reused connection proved stale (the node had closed it): the caller dials a new one.
Task<bool> send_request(const Target& t, CallState& st, const Message& message, bool reused) {
  if (!st.socket.is_open()) co_await connect(t, st);
  error_code ec;
  co_await http::async_write(st.socket, message, asio::redirect_error(asio::use_awaitable, ec));
  if (!ec) co_return true;
  if (stale_connection(reused, st, false)) co_return false;
  if (st.aborted) fail("cancelled");
  if (st.timed_out) t.fail_step(st, ec, "sending the request", t.req.timeout_s);
  fail("http {} {}{}: sending the request failed: {}", t.req.method, t.where, t.req.target, ec.message());
}

}  // namespace

Task<HttpResponse> async_http_request(const HttpClientRequest& req, HttpCancel* cancel, HttpConnectionPool* pool) {
  const Target t(req);
  auto message = detail::client_message(req, t.where, /*keep_alive=*/pool != nullptr);
  for (int round = 0;; ++round) {
    bool reused = false;
    auto st = co_await open_call(t, pool, /*may_reuse=*/round == 0, reused);
    CancelHook hook(cancel, st);
    st->arm(req.timeout_s);  // the whole call
    if (!co_await send_request(t, *st, message, reused)) continue;
    error_code ec;
    http::response_parser<http::string_body> parser;
    parser.header_limit(detail::kMaxResponseHeaderBytes);
    parser.body_limit(kMaxResponseBodyBytes);
    beast::flat_buffer buffer;
    co_await http::async_read(st->socket, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (stale_connection(reused, *st, parser.got_some())) continue;
      t.fail_step(*st, ec, "waiting for the response", req.timeout_s);
    }
    st->disarm();
    HttpResponse out;
    auto& msg = parser.get();
    out.status = static_cast<int>(msg.result_int());
    out.headers = detail::header_map(msg);
    out.body = std::move(msg.body());
    if (pool && msg.keep_alive() && buffer.size() == 0) {
      pool->put(t.where, std::move(st->socket));
    } else {
      st->close();
    }
    co_return out;
  }
}

Task<HttpResponse> async_http_stream(const HttpClientRequest& req,
                                     const std::function<Task<bool>(std::string_view data)>& on_event,
                                     HttpCancel* cancel, HttpConnectionPool* pool) {
  const Target t(req);
  auto message = detail::client_message(req, t.where, /*keep_alive=*/pool != nullptr);
  for (int round = 0;; ++round) {
    bool reused = false;
    auto st = co_await open_call(t, pool, /*may_reuse=*/round == 0, reused);
    CancelHook hook(cancel, st);
    st->arm(req.timeout_s);
    if (!co_await send_request(t, *st, message, reused)) continue;
    st->arm(req.timeout_s);  // idle time from here
    error_code ec;
    http::response_parser<http::buffer_body> parser;
    parser.header_limit(detail::kMaxResponseHeaderBytes);
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // not boost::none: Beast 1.74 then rejects any Content-Length
    beast::flat_buffer buffer;
    co_await http::async_read_header(st->socket, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (stale_connection(reused, *st, parser.got_some())) continue;
      t.fail_step(*st, ec, "waiting for the response head", req.timeout_s);
    }
    HttpResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    out.headers = detail::header_map(parser.get());
    const bool sse = detail::is_event_stream(out);

    SseParser sse_parser;
    std::vector<std::string> events;
    std::array<char, 16 << 10> chunk;
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      st->arm(req.timeout_s);  // idle timeout: re-armed for every read
      co_await http::async_read_some(st->socket, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec == http::error::partial_message && !st->aborted && !st->timed_out)
        fail("http {} {}{}: connection closed before the stream ended", req.method, t.where, req.target);
      if (ec) t.fail_step(*st, ec, sse ? "waiting for the next event" : "reading the response body", req.timeout_s);
      const size_t n = chunk.size() - parser.get().body().size;
      detail::take_stream_bytes(sse, std::string_view(chunk.data(), n), out, sse_parser, events, t.where);
      for (const auto& e : events) {
        st->disarm();  // the caller's handling of an event is not the node's idle time
        if (!co_await on_event(e)) {
          st->close();
          co_return out;
        }
        if (st->aborted) fail("cancelled");
      }
    }
    st->disarm();
    if (pool && parser.get().keep_alive() && buffer.size() == 0) {
      pool->put(t.where, std::move(st->socket));
    } else {
      st->close();
    }
    co_return out;
  }
}

}  // namespace hack::server
