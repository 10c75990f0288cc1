// Blocking client calls built from Beast async ops on a private io_context that the calling
// thread runs until each step completes or its deadline passes; HttpCancel posts a socket
// close into that io_context from another thread.
#include "hack/http/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <limits>
#include <optional>

#include "hack/core/error.h"
#include "hack/http/sse.h"
#include "src/http/cancel_access.h"
#include "src/http/client_message.h"

namespace hack::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

void HttpCancel::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  for (auto& [id, abort] : aborts_) abort();  // only posts; the call's thread closes its socket
  aborts_.clear();
}

bool HttpCancel::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

std::string HttpResponse::header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

namespace {

using detail::header_map;
using detail::kMaxResponseBodyBytes;

struct OpResult {
  bool done = false;
  error_code ec;
  size_t bytes = 0;
};

auto completion(OpResult& r) {
  return [&r](error_code ec, size_t n = 0) {
    r.done = true;
    r.ec = ec;
    r.bytes = n;
  };
}

/// One call: its own io_context, socket and deadline, run on the caller's thread.
class ClientCall {
 public:
  ClientCall(const HttpClientRequest& req, HttpCancel* cancel)
      : req_(req), where_(fmt::format("{}:{}", req.host, req.port)), cancel_(cancel) {
    if (cancel_ && !detail::CancelAccess::attach(*cancel_, [this] { post_abort(); }, cancel_id_)) fail("cancelled");
  }
  ~ClientCall() {
    if (cancel_) detail::CancelAccess::detach(*cancel_, cancel_id_);
  }
  ClientCall(const ClientCall&) = delete;
  ClientCall& operator=(const ClientCall&) = delete;

  const std::string& where() const { return where_; }

  void set_deadline(double seconds) {
    if (!(seconds > 0) || seconds > 1e8) seconds = 1e8;  // none: far away without overflowing the clock
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  }

  /// Runs the io_context until `r` completes; throws on the deadline or a cancel.
  void wait(const OpResult& r, std::string_view doing) { wait_for([&] { return r.done; }, doing); }

  template <class Done>
  void wait_for(const Done& done, std::string_view doing) {
    if (ioc_.stopped()) ioc_.restart();  // it stops whenever it runs out of work
    while (!done()) {
      if (aborted_) break;
      if (ioc_.run_one_until(deadline_) == 0) {
        if (std::chrono::steady_clock::now() >= deadline_) {
          close();
          fail("http {} {}{}: timed out after {} s {}", req_.method, where_, req_.target, req_.timeout_s, doing);
        }
        if (ioc_.stopped()) fail("http {} {}: internal error: no pending operation while {}", req_.method, where_, doing);
      }
    }
    if (aborted_) {
      close();
      fail("cancelled");
    }
  }

  void connect() {
    OpResult r;
    error_code ec;
    auto addr = asio::ip::make_address(req_.host, ec);
    if (!ec) {
      socket_.async_connect(tcp::endpoint(addr, static_cast<unsigned short>(req_.port)), completion(r));
    } else {
      OpResult resolved;
      tcp::resolver::results_type results;
      resolver_.async_resolve(req_.host, std::to_string(req_.port),
                              [&](error_code e, tcp::resolver::results_type res) {
                                resolved.done = true;
                                resolved.ec = e;
                                results = std::move(res);
                              });
      wait(resolved, "resolving the host");
      if (resolved.ec) fail("http: cannot resolve {}: {}", where_, resolved.ec.message());
      asio::async_connect(socket_, results, [&](error_code e, const tcp::endpoint&) { completion(r)(e); });
    }
    wait(r, "connecting");
    if (r.ec) fail("http: connect to {} failed: {}", where_, r.ec.message());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  /// Starts writing the request; the response is read concurrently so that an early answer
  /// (413 while the body is still going out) is seen instead of a write error.
  void start_write() {
    request_ = detail::client_message(req_, where_, /*keep_alive=*/false);
    http::async_write(socket_, request_, completion(write_));
  }

  /// Throws the write error if the response could not be read because the write failed.
  [[noreturn]] void fail_io(const OpResult& read, std::string_view doing) {
    if (write_.done && write_.ec)
      fail("http {} {}{}: sending the request failed: {}", req_.method, where_, req_.target, write_.ec.message());
    fail("http {} {}{}: {} failed: {}", req_.method, where_, req_.target, doing, read.ec.message());
  }

  void close() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  tcp::socket& socket() { return socket_; }
  beast::flat_buffer& buffer() { return buffer_; }
  const HttpClientRequest& request() const { return req_; }

 private:
  void post_abort() {
    asio::post(ioc_, [this] {
      aborted_ = true;
      close();
    });
  }

  asio::io_context ioc_;  // first: outlives everything a pending operation refers to
  http::request<http::string_body> request_;
  OpResult write_;
  beast::flat_buffer buffer_;
  tcp::socket socket_{ioc_};
  tcp::resolver resolver_{ioc_};
  const HttpClientRequest& req_;
  std::string where_;
  HttpCancel* cancel_;
  uint64_t cancel_id_ = 0;
  bool aborted_ = false;  // set on the caller's thread by the posted abort
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace

HttpResponse http_request(const HttpClientRequest& req, HttpCancel* cancel) {
  ClientCall call(req, cancel);
  call.set_deadline(req.timeout_s);  // the whole call
  call.connect();
  call.start_write();
  http::response_parser<http::string_body> parser;
  parser.header_limit(detail::kMaxResponseHeaderBytes);
  parser.body_limit(kMaxResponseBodyBytes);
  OpResult read;
  http::async_read(call.socket(), call.buffer(), parser, completion(read));
  call.wait(read, "waiting for the response");
  if (read.ec) call.fail_io(read, "reading the response");
  HttpResponse out;
  auto& msg = parser.get();
  out.status = static_cast<int>(msg.result_int());
  out.headers = header_map(msg);
  out.body = std::move(msg.body());
  call.close();
  return out;
}

HttpResponse http_stream(const HttpClientRequest& req, const std::function<bool(std::string_view data)>& on_event,
                         HttpCancel* cancel) {
  ClientCall call(req, cancel);
  call.set_deadline(req.timeout_s);
  call.connect();
  call.set_deadline(req.timeout_s);
  call.start_write();
  http::response_parser<http::buffer_body> parser;
  parser.header_limit(detail::kMaxResponseHeaderBytes);
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // not boost::none: Beast 1.74 then rejects any Content-Length
  OpResult head;
  http::async_read_header(call.socket(), call.buffer(), parser, completion(head));
  call.wait(head, "waiting for the response head");
  if (head.ec) call.fail_io(head, "reading the response head");

  HttpResponse out;
  out.status = static_cast<int>(parser.get().result_int());
  out.headers = header_map(parser.get());
  bool sse = detail::is_event_stream(out);

  SseParser sse_parser;
  std::vector<std::string> events;
  std::array<char, 16 << 10> chunk;
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    OpResult r;
    call.set_deadline(req.timeout_s);  // idle timeout: re-armed for every read
    http::async_read_some(call.socket(), call.buffer(), parser, completion(r));
    call.wait(r, sse ? "waiting for the next event" : "reading the response body");
    if (r.ec == http::error::need_buffer) r.ec = {};
    if (r.ec == http::error::partial_message)
      fail("http {} {}{}: connection closed before the stream ended", req.method, call.where(), req.target);
    if (r.ec) call.fail_io(r, "reading the response body");
    size_t n = chunk.size() - parser.get().body().size;
    detail::take_stream_bytes(sse, std::string_view(chunk.data(), n), out, sse_parser, events, call.where());
    for (const auto& e : events) {
      if (!on_event(e)) {
        call.close();
        return out;
      }
    }
  }
  call.close();
  return out;
}

}  // namespace hack::server
