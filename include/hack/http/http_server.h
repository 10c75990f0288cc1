/// @file http_server.h
/// @brief The asynchronous HTTP/1.1 server every daemon serves its API with (Boost.Beast
/// inside; nothing of it in this header). Keep-alive, SSE streaming from any thread,
/// client-disconnect notification, and limits/timeouts against slow or hostile clients.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hack::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // "/v1/completions?x=1"
  std::string path;                            // "/v1/completions" (target without query)
  std::map<std::string, std::string> headers;  // lower-case names; repeats joined with ", "
  std::string body;
  std::string remote;                          // "127.0.0.1:54321"
  /// Value of header `name` (lower-case), "" if absent.
  std::string header(std::string_view name) const;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0 = any free port (see HttpServer::port())
  int threads = 2;                    // io threads
  size_t max_body_bytes = 8 << 20;    // larger: 413
  size_t max_header_bytes = 16 << 10; // larger request head: 431
  double header_timeout_s = 10;       // whole request head must arrive within this (slowloris): 408
  double body_timeout_s = 30;         // whole body must arrive within this after the head: 408
  double idle_timeout_s = 60;         // keep-alive connection with no new request: closed
                                      // (a timeout <= 0 is disabled)
  double write_timeout_s = 60;        // queued response bytes not all written within this: closed
  size_t max_connections = 4096;      // beyond: accept, answer 503 and close
};

/// One in-progress response. Thread-safe: any thread may call any method, any time after the
/// handler got it (handlers usually hand it to another thread). Exactly one of send() or
/// start_sse()…end() completes it; calls after completion or after the client has gone are
/// ignored and return false. A Responder dropped before completion answers 500 (nothing
/// sent yet) or ends the stream (SSE started). Holding it keeps the connection alive.
class Responder {
 public:
  virtual ~Responder() = default;
  /// Whole response. An empty content_type sends no Content-Type. Header names/values must
  /// not contain CR or LF (hack::Error).
  virtual bool send(int status, std::string_view content_type, std::string body,
                    std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  /// 200, text/event-stream, chunked, Cache-Control: no-cache.
  virtual bool start_sse(std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  /// Writes "data: <data>\n\n"; a multi-line `data` becomes several data: lines. A named
  /// event (`event`, no CR or LF) gets its "event: <event>" line first, as OpenAI's
  /// Responses stream sends them.
  virtual bool send_event(std::string_view data, std::string_view event = {}) = 0;
  /// Ends the stream (final chunk).
  virtual bool end() = 0;
  /// Client gone, server stopped, or response complete.
  virtual bool closed() const = 0;
  /// Called once, on an io thread, if the client disconnects (or the server stops) before
  /// the response is complete — while streaming and while the handler is still working on a
  /// non-streamed reply. Set it right away in the handler; set after the disconnect, it is
  /// called at once (on an io thread).
  virtual void on_client_closed(std::function<void()> fn) = 0;
};

/// Called on an io thread for every complete request; must not block for long. A throw
/// answers 500 with the exception text (when nothing was sent yet).
using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<Responder>)>;

struct HttpServerCore;  // defined in http_server.cpp

class HttpServer {
 public:
  /// Binds and starts serving. Throws hack::Error naming host:port on failure.
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The bound port (the chosen one when options.port was 0).
  int port() const;
  /// Closes the listener and all connections, joins the io threads; in-flight Responders
  /// become closed (their on_client_closed runs). Idempotent. Not from a handler or an
  /// on_client_closed callback: it joins the io threads they run on.
  void stop();
  /// Sockets currently open (including ones being refused with 503).
  size_t open_connections() const;

 private:
  std::shared_ptr<HttpServerCore> impl_;  // shared with connections that Responders keep alive
};

}  // namespace hack::server
