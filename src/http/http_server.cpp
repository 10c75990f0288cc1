// HTTP/1.1 server on Boost.Asio; Beast parses requests, responses are formatted here.
//
// Every connection runs on its own strand. Its state machine:
//   kHead     waiting for (the rest of) a request head; header_timeout_s armed (408)
//   kBody     head done, reading the body;            body_timeout_s armed (408)
//   kHandling handler has the request; one read stays pending to notice a disconnect (and
//             buffers pipelined bytes, up to a cap); the response is written as Responder
//             calls arrive (posted to the strand)
//   kIdle     keep-alive, no byte of the next request yet; idle_timeout_s armed (silent close)
//   kClosing  last response queued/written, send side shut, draining input until EOF or
//             kLingerS, so the client reads the response instead of a reset
//   kClosed   socket closed; the Connection lives on only while a Responder holds it
// Writes are queued and sent in gathers; each write must progress within write_timeout_s.
#include "hack/http/http_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "hack/core/error.h"
#include "hack/http/sse.h"

namespace hack::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

constexpr double kLingerS = 2.0;                 // drain after the last response before closing
constexpr size_t kReadChunkBytes = 8 << 10;
constexpr size_t kPipelineBufferBytes = 64 << 10;  // buffered while a request is handled

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string error_json(std::string_view message, std::string_view type) {
  nlohmann::json j = {{"error",
                       {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

void check_headers(const std::vector<std::pair<std::string, std::string>>& headers) {
  for (const auto& [name, value] : headers) {
    HACK_CHECK(!name.empty() && std::all_of(name.begin(), name.end(), is_token_char),
               "http response: invalid header name '{}'", name);
    HACK_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
               "http response: header '{}' has a CR, LF or NUL in its value", name);
  }
}

/// Status line and headers, through the blank line.
std::string format_head(int status, bool keep_alive, bool http10, std::string_view content_type,
                        std::optional<size_t> content_length, bool chunked,
                        const std::vector<std::pair<std::string, std::string>>& extra) {
  beast::string_view reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  if (http::int_to_status(static_cast<unsigned>(status)) == http::status::unknown) reason = "";
  std::string head = fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
  if (!content_type.empty()) head += fmt::format("Content-Type: {}\r\n", content_type);
  if (content_length) head += fmt::format("Content-Length: {}\r\n", *content_length);
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive) {
    head += "Connection: close\r\n";
  } else if (http10) {
    head += "Connection: keep-alive\r\n";
  }
  for (const auto& [name, value] : extra) head += fmt::format("{}: {}\r\n", name, value);
  head += "\r\n";
  return head;
}

std::string format_error(int status, std::string_view message, bool keep_alive) {
  std::string body = error_json(message, status >= 500 ? "server_error" : "invalid_request_error");
  return format_head(status, keep_alive, false, "application/json", body.size(), false, {}) + body;
}

std::chrono::steady_clock::duration to_duration(double seconds) {
  seconds = std::min(seconds, 1e8);  // "forever" without overflowing the clock
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

class Connection;

}  // namespace

struct HttpServerCore : std::enable_shared_from_this<HttpServerCore> {
  HttpServerCore(HttpServerOptions opts, HttpHandler h)
      : options(std::move(opts)), handler(std::move(h)), acceptor(asio::make_strand(ioc)), accept_retry(acceptor.get_executor()) {}

  void do_accept();
  void on_accept(error_code ec, tcp::socket socket);
  void unregister(Connection* c);

  /// Posts fn to ex unless stop() has begun; posts after that would outlive the io threads.
  template <class Fn>
  bool post_unless_stopped(const asio::any_io_executor& ex, Fn&& fn) {
    std::shared_lock lock(stop_mu);
    if (stopped) return false;
    asio::post(ex, std::forward<Fn>(fn));
    return true;
  }

  asio::io_context ioc;  // first member: the io objects below are destroyed before it
  HttpServerOptions options;
  HttpHandler handler;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  std::string listen_name;  // "host:port" for messages
  int bound_port = 0;
  std::vector<std::thread> threads;

  std::mutex stop_call_mu;
  std::shared_mutex stop_mu;  // exclusive in stop(); shared while posting from outside
  bool stopped = false;
  std::mutex conn_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
  std::atomic<size_t> open{0};
};

namespace {

enum class Delivery { kPart, kLast, kLastThenClose };

class ResponderImpl;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<HttpServerCore> server, tcp::socket socket, std::string remote)
      : server_(std::move(server)),
        ex_(socket.get_executor()),
        socket_(std::move(socket)),
        read_timer_(ex_),
        write_timer_(ex_),
        remote_(std::move(remote)) {}

  const asio::any_io_executor& executor() const { return ex_; }

  /// On the strand, right after accept.
  void start(bool refuse) {
    if (phase_ == Phase::kClosed) return;  // stop() came first
    if (refuse) {
      spdlog::debug("http {}: refused, {} connections open", remote_, server_->open.load());
      respond_error_and_close(503, fmt::format("server busy: more than {} connections open",
                                               server_->options.max_connections));
      return;
    }
    begin_request(/*fresh=*/true);
  }

  /// From any thread (Responder): queues response bytes on the strand. False once stopped.
  bool deliver(std::string head, std::string body, Delivery kind) {
    return server_->post_unless_stopped(
        ex_, [self = shared_from_this(), head = std::move(head), body = std::move(body), kind]() mutable {
          self->on_deliver(std::move(head), std::move(body), kind);
        });
  }

  /// Runs fn on the strand unless the server is stopping.
  bool post(std::function<void()> fn) { return server_->post_unless_stopped(ex_, std::move(fn)); }

  /// On the strand: stop() or a fatal error.
  void close_socket();

 private:
  enum class Phase { kHead, kBody, kHandling, kIdle, kClosing, kClosed };

  void begin_request(bool fresh) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(server_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->eager(true);
    if (fresh || buffer_.size() > 0) {
      phase_ = Phase::kHead;
      arm_read_timer(server_->options.header_timeout_s);
      parse_buffer();
    } else {
      phase_ = Phase::kIdle;
      arm_read_timer(server_->options.idle_timeout_s);
      do_read();
    }
  }

  void arm_read_timer(double seconds) {
    ++read_gen_;
    read_timer_.cancel();
    if (!(seconds > 0)) return;
    read_timer_.expires_after(to_duration(seconds));
    read_timer_.async_wait([self = shared_from_this(), gen = read_gen_](error_code ec) {
      if (!ec && gen == self->read_gen_) self->on_read_timeout();
    });
  }

  void disarm_read_timer() {
    ++read_gen_;
    read_timer_.cancel();
  }

  void on_read_timeout() {
    switch (phase_) {
      case Phase::kHead:
        spdlog::debug("http {}: request head not complete within {} s", remote_, server_->options.header_timeout_s);
        respond_error_and_close(408, fmt::format("request head not received within {} s", server_->options.header_timeout_s));
        break;
      case Phase::kBody:
        spdlog::debug("http {}: request body not complete within {} s", remote_, server_->options.body_timeout_s);
        respond_error_and_close(408, fmt::format("request body not received within {} s", server_->options.body_timeout_s));
        break;
      case Phase::kIdle:
        spdlog::debug("http {}: idle keep-alive connection closed", remote_);
        close_socket();
        break;
      case Phase::kClosing:
        close_socket();
        break;
      case Phase::kHandling:
      case Phase::kClosed:
        break;
    }
  }

  void do_read() {
    if (read_pending_ || phase_ == Phase::kClosed) return;
    if (phase_ == Phase::kHandling && buffer_.size() >= kPipelineBufferBytes) return;  // resumes after the response
    read_pending_ = true;
    // Into a fixed chunk, not buffer_: the parser consumes buffer_ while this read is pending.
    socket_.async_read_some(asio::buffer(read_chunk_),
                            [self = shared_from_this()](error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(error_code ec, size_t n) {
    read_pending_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec || n == 0) {
      if (phase_ == Phase::kHandling) spdlog::debug("http {}: client closed before the response completed ({})", remote_, ec.message());
      close_socket();
      return;
    }
    if (phase_ == Phase::kClosing) {  // draining
      do_read();
      return;
    }
    buffer_.commit(asio::buffer_copy(buffer_.prepare(n), asio::buffer(read_chunk_.data(), n)));
    if (phase_ == Phase::kHandling) {  // pipelined bytes wait for the response to finish
      do_read();
      return;
    }
    if (phase_ == Phase::kIdle) {
      phase_ = Phase::kHead;
      arm_read_timer(server_->options.header_timeout_s);
    }
    parse_buffer();
  }

  void parse_buffer() {
    while (true) {
      error_code ec;
      size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec && ec != http::error::need_more) {
        fail_request(ec);
        return;
      }
      if (phase_ == Phase::kHead && parser_->is_header_done()) {
        phase_ = Phase::kBody;
        arm_read_timer(server_->options.body_timeout_s);
        auto expect = parser_->get()[http::field::expect];
        if (!parser_->is_done() && beast::iequals(expect, "100-continue")) {
          out_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
          start_write();
        }
      }
      if (parser_->is_done()) {
        dispatch();
        return;
      }
      if (ec == http::error::need_more || used == 0 || buffer_.size() == 0) break;
    }
    do_read();
  }

  void fail_request(error_code ec) {
    const auto& o = server_->options;
    spdlog::debug("http {}: bad request: {}", remote_, ec.message());
    if (ec == http::error::body_limit) {
      respond_error_and_close(413, fmt::format("request body exceeds the limit of {} bytes", o.max_body_bytes));
    } else if (ec == http::error::header_limit) {
      respond_error_and_close(431, fmt::format("request header exceeds the limit of {} bytes", o.max_header_bytes));
    } else {
      respond_error_and_close(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
  }

  /// A response the server makes itself; the connection then closes.
  void respond_error_and_close(int status, const std::string& message) {
    disarm_read_timer();
    phase_ = Phase::kClosing;
    out_.push_back(format_error(status, message, /*keep_alive=*/false));
    start_write();
  }

  void dispatch();

  void on_deliver(std::string head, std::string body, Delivery kind) {
    if (phase_ != Phase::kHandling) return;  // socket already closed (client gone, stop)
    if (!head.empty()) out_.push_back(std::move(head));
    if (!body.empty()) out_.push_back(std::move(body));
    if (kind != Delivery::kPart) {
      response_done_ = true;
      if (kind == Delivery::kLastThenClose) keep_alive_ = false;
    }
    start_write();
    if (out_.empty() && !write_pending_ && response_done_) finish_response();
  }

  void start_write() {
    if (write_pending_ || out_.empty() || phase_ == Phase::kClosed) return;
    writing_.clear();
    write_bufs_.clear();
    while (!out_.empty()) {
      writing_.push_back(std::move(out_.front()));
      out_.pop_front();
    }
    for (const auto& s : writing_) write_bufs_.emplace_back(s.data(), s.size());
    write_pending_ = true;
    ++write_gen_;
    if (server_->options.write_timeout_s > 0) {
      write_timer_.expires_after(to_duration(server_->options.write_timeout_s));
      write_timer_.async_wait([self = shared_from_this(), gen = write_gen_](error_code ec) {
        if (!ec && gen == self->write_gen_ && self->write_pending_) {
          spdlog::debug("http {}: write made no progress in {} s; closing", self->remote_,
                        self->server_->options.write_timeout_s);
          self->close_socket();
        }
      });
    }
    asio::async_write(socket_, write_bufs_,
                      [self = shared_from_this()](error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(error_code ec) {
    write_pending_ = false;
    ++write_gen_;
    write_timer_.cancel();
    writing_.clear();
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      spdlog::debug("http {}: write failed: {}", remote_, ec.message());
      close_socket();
      return;
    }
    if (!out_.empty()) {
      start_write();
      return;
    }
    if (phase_ == Phase::kClosing) {
      linger();
      return;
    }
    if (phase_ == Phase::kHandling && response_done_) finish_response();
  }

  void finish_response() {
    response_done_ = false;
    responder_.reset();
    if (!keep_alive_) {
      phase_ = Phase::kClosing;
      linger();
      return;
    }
    begin_request(/*fresh=*/false);
  }

  /// Response fully written and the connection ends: shut our side, read until the peer
  /// closes (bounded), then close, so the peer is not reset while reading our response.
  void linger() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    arm_read_timer(kLingerS);
    do_read();
  }

  std::shared_ptr<HttpServerCore> server_;
  asio::any_io_executor ex_;  // the connection's strand
  tcp::socket socket_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  uint64_t read_gen_ = 0;   // a read-timer expiry counts only for the arming that made it
  uint64_t write_gen_ = 0;
  std::string remote_;
  Phase phase_ = Phase::kHead;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, kReadChunkBytes> read_chunk_{};
  bool read_pending_ = false;
  bool write_pending_ = false;
  std::deque<std::string> out_;
  std::vector<std::string> writing_;
  std::vector<asio::const_buffer> write_bufs_;
  bool keep_alive_ = true;     // of the current request
  bool response_done_ = false; // the Responder completed; finish once out_ drains
  std::weak_ptr<ResponderImpl> responder_;
};

class ResponderImpl final : public Responder {
 public:
  ResponderImpl(std::shared_ptr<Connection> conn, bool keep_alive, bool http10)
      : conn_(std::move(conn)), keep_alive_(keep_alive), http10_(http10) {}

  ~ResponderImpl() override {
    // The last holder let go without completing: do not leave the client hanging.
    if (gone_ || state_ == State::kDone) return;
    if (state_ == State::kFresh) {
      spdlog::debug("http: handler dropped a request without responding");
      std::string body = error_json("the server dropped the request without a response", "server_error");
      conn_->deliver(format_head(500, keep_alive_, http10_, "application/json", body.size(), false, {}),
                     std::move(body), Delivery::kLast);
    } else {
      conn_->deliver("", final_chunk(), http10_ ? Delivery::kLastThenClose : Delivery::kLast);
    }
  }

  bool send(int status, std::string_view content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> extra_headers) override {
    HACK_CHECK(status >= 100 && status <= 999, "http response: invalid status {}", status);
    check_headers(extra_headers);
    std::string head = format_head(status, keep_alive_, http10_, content_type, body.size(), false, extra_headers);
    std::lock_guard lock(mu_);
    if (state_ != State::kFresh || gone_) return false;
    state_ = State::kDone;
    return conn_->deliver(std::move(head), std::move(body), Delivery::kLast);
  }

  bool start_sse(std::vector<std::pair<std::string, std::string>> extra_headers) override {
    check_headers(extra_headers);
    extra_headers.insert(extra_headers.begin(), {"Cache-Control", "no-cache"});
    // HTTP/1.0 has no chunked encoding: the stream ends when the connection closes.
    std::string head = format_head(200, keep_alive_ && !http10_, http10_, "text/event-stream", std::nullopt,
                                   !http10_, extra_headers);
    std::lock_guard lock(mu_);
    if (state_ != State::kFresh || gone_) return false;
    state_ = State::kStreaming;
    return conn_->deliver(std::move(head), "", Delivery::kPart);
  }

  bool send_event(std::string_view data, std::string_view name) override {
    std::string event = sse_event(data, name);
    std::lock_guard lock(mu_);
    if (state_ != State::kStreaming || gone_) return false;
    return conn_->deliver("", std::move(event), Delivery::kPart);
  }

  bool end() override {
    std::lock_guard lock(mu_);
    if (state_ != State::kStreaming || gone_) return false;
    state_ = State::kDone;
    return conn_->deliver("", final_chunk(), http10_ ? Delivery::kLastThenClose : Delivery::kLast);
  }

  bool closed() const override {
    std::lock_guard lock(mu_);
    return gone_ || state_ == State::kDone;
  }

  void on_client_closed(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      if (!gone_ || state_ == State::kDone) {
        on_closed_ = std::move(fn);
        return;
      }
      if (!fn) return;
    }
    // Already gone: call it now, on an io thread while the server runs.
    if (!conn_->post(fn)) fn();
  }

  /// On the strand, when the socket closes before the response was fully written.
  void mark_gone() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mu_);
      if (gone_) return;
      gone_ = true;
      if (state_ == State::kDone) return;
      fn = std::move(on_closed_);
    }
    if (!fn) return;
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::warn("http: on_client_closed callback threw: {}", e.what());
    }
  }

 private:
  enum class State { kFresh, kStreaming, kDone };

  std::string sse_event(std::string_view data, std::string_view name = {}) const {
    std::string event = sse_format_event(data, name);
    if (http10_) return event;
    return fmt::format("{:x}\r\n", event.size()) + event + "\r\n";
  }
  std::string final_chunk() const { return http10_ ? "" : "0\r\n\r\n"; }

  std::shared_ptr<Connection> conn_;
  const bool keep_alive_;
  const bool http10_;
  mutable std::mutex mu_;
  State state_ = State::kFresh;
  bool gone_ = false;      // client or server closed the connection
  std::function<void()> on_closed_;
};

void Connection::dispatch() {
  disarm_read_timer();
  auto& msg = parser_->get();
  HttpRequest req;
  req.method = std::string(sv(msg.method_string()));
  req.target = std::string(sv(msg.target()));
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& field : msg) {
    auto [it, inserted] = req.headers.try_emplace(lower(sv(field.name_string())), sv(field.value()));
    if (!inserted) {
      it->second += ", ";
      it->second.append(field.value().data(), field.value().size());
    }
  }
  req.body = std::move(msg.body());
  req.remote = remote_;
  keep_alive_ = msg.keep_alive();
  bool http10 = msg.version() < 11;
  parser_.reset();
  phase_ = Phase::kHandling;
  response_done_ = false;
  spdlog::debug("http {}: {} {} ({} body bytes)", remote_, req.method, req.target, req.body.size());

  auto responder = std::make_shared<ResponderImpl>(shared_from_this(), keep_alive_, http10);
  responder_ = responder;
  do_read();  // notices a disconnect while the handler works
  try {
    server_->handler(std::move(req), responder);
  } catch (const std::exception& e) {
    spdlog::debug("http {}: handler threw: {}", remote_, e.what());
    responder->send(500, "application/json", error_json(e.what(), "server_error"), {});
  } catch (...) {
    responder->send(500, "application/json", error_json("unknown error", "server_error"), {});
  }
}

void Connection::close_socket() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  if (auto r = responder_.lock()) r->mark_gone();
  responder_.reset();
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  read_timer_.cancel();
  write_timer_.cancel();
  out_.clear();
  parser_.reset();
  server_->open.fetch_sub(1);
  server_->unregister(this);
}

std::string endpoint_name(const tcp::endpoint& ep) {
  auto addr = ep.address();
  return addr.is_v6() ? fmt::format("[{}]:{}", addr.to_string(), ep.port())
                      : fmt::format("{}:{}", addr.to_string(), ep.port());
}

}  // namespace

void HttpServerCore::do_accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](error_code ec, tcp::socket socket) {
    self->on_accept(ec, std::move(socket));
  });
}

void HttpServerCore::on_accept(error_code ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors and the like: back off instead of spinning on the error.
    spdlog::warn("http {}: accept failed: {}", listen_name, ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([self = shared_from_this()](error_code wait_ec) {
      if (!wait_ec && self->acceptor.is_open()) self->do_accept();
    });
    return;
  }
  error_code ep_ec;
  auto ep = socket.remote_endpoint(ep_ec);
  std::string remote = ep_ec ? std::string("?") : endpoint_name(ep);
  socket.set_option(tcp::no_delay(true), ep_ec);
  auto conn = std::make_shared<Connection>(shared_from_this(), std::move(socket), std::move(remote));
  {
    std::lock_guard lock(conn_mu);
    if (stopped) return;  // conn's socket closes with it
    connections.emplace(conn.get(), conn);
  }
  size_t n = open.fetch_add(1) + 1;
  bool refuse = n > options.max_connections;
  asio::post(conn->executor(), [conn, refuse] { conn->start(refuse); });
  do_accept();
}

void HttpServerCore::unregister(Connection* c) {
  std::lock_guard lock(conn_mu);
  connections.erase(c);
}

std::string HttpRequest::header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_shared<HttpServerCore>(std::move(options), std::move(handler))) {
  HttpServerCore& s = *impl_;
  s.listen_name = fmt::format("{}:{}", s.options.host, s.options.port);
  HACK_CHECK(s.handler, "http server {}: no handler", s.listen_name);
  HACK_CHECK(s.options.port >= 0 && s.options.port <= 65535, "http server {}: port out of range", s.listen_name);
  error_code ec;
  tcp::endpoint endpoint;
  auto addr = asio::ip::make_address(s.options.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(addr, static_cast<unsigned short>(s.options.port));
  } else {
    tcp::resolver resolver(s.ioc);
    auto results = resolver.resolve(s.options.host, std::to_string(s.options.port), ec);
    if (ec || results.empty()) fail("http server: cannot resolve {}: {}", s.listen_name, ec.message());
    endpoint = results.begin()->endpoint();
  }
  auto check = [&](const char* what) {
    if (ec) fail("http server: cannot listen on {}: {} failed: {}", s.listen_name, what, ec.message());
  };
  s.acceptor.open(endpoint.protocol(), ec);
  check("open");
  s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  check("SO_REUSEADDR");
  s.acceptor.bind(endpoint, ec);
  check("bind");
  s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  check("listen");
  s.bound_port = s.acceptor.local_endpoint().port();
  s.listen_name = fmt::format("{}:{}", s.options.host, s.bound_port);
  s.do_accept();
  int n_threads = std::max(1, s.options.threads);
  for (int i = 0; i < n_threads; ++i) {
    s.threads.emplace_back([impl = impl_.get()] {
      while (true) {
        try {
          impl->ioc.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("http server {}: io thread: {}", impl->listen_name, e.what());
        }
      }
    });
  }
  spdlog::debug("http server listening on {}", s.listen_name);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const { return impl_->bound_port; }

size_t HttpServer::open_connections() const { return impl_->open.load(); }

void HttpServer::stop() {
  HttpServerCore& s = *impl_;
  std::lock_guard stopping(s.stop_call_mu);  // a concurrent second stop() waits for the first
  {
    std::unique_lock lock(s.stop_mu);
    if (s.stopped) return;
    std::lock_guard conn_lock(s.conn_mu);
    s.stopped = true;
  }
  asio::post(s.acceptor.get_executor(), [impl = impl_] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
  });
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard lock(s.conn_mu);
    for (auto& [ptr, weak] : s.connections) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) asio::post(c->executor(), [c] { c->close_socket(); });
  live.clear();
  // Without new work (no posts after `stopped`, every socket and timer closing) run() returns.
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // The io threads can have returned before the closes above were queued (the scheduler stops
  // for good once its work count reaches zero). A handler left in the queue owns its
  // Connection, which owns this core, which owns the queue: nothing would ever free them
  // (LeakSanitizer saw that cycle in hack-router, twice in one CI run). So run what is left
  // here; with every socket closed and every timer cancelled that ends at once, and the bound
  // only guards against a bug.
  s.ioc.restart();
  s.ioc.run_for(std::chrono::seconds(10));
  if (!s.ioc.stopped()) spdlog::warn("http server {}: handlers still pending 10 s after stop", s.listen_name);
  spdlog::debug("http server {} stopped", s.listen_name);
}

}  // namespace hack::server
