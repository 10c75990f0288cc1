/// @file async_http_client.h
/// @brief HTTP/1.1 client calls as coroutines (http/coro.h) for the router → node path: a
/// one-shot request and an SSE stream, with the same contract as http_client.h's blocking
/// calls (timeouts, HttpCancel, error messages naming host:port) but no thread of their own:
/// thousands of calls share a router's few I/O threads. With an HttpConnectionPool, calls
/// reuse keep-alive connections to the same node instead of dialling one per call.
#pragma once

#include "hack/http/coro.h"  // first: Asio's coroutine support

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "hack/http/http_client.h"

namespace hack::server {

/// Idle keep-alive connections by host:port, shared by every call of one io_context. A
/// connection is handed to one call at a time (take), and given back after a response that
/// was read whole and allows keep-alive (put). Idle connections older than `max_idle_s` are
/// dropped (the nodes close theirs after 60 s idle: HttpServerOptions::idle_timeout_s).
/// Thread-safe.
class HttpConnectionPool {
 public:
  explicit HttpConnectionPool(asio::any_io_executor ex, double max_idle_s = 20, size_t max_idle_per_host = 64)
      : ex_(std::move(ex)), max_idle_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(max_idle_s))),
        max_idle_per_host_(max_idle_per_host) {}
  HttpConnectionPool(const HttpConnectionPool&) = delete;
  HttpConnectionPool& operator=(const HttpConnectionPool&) = delete;

  /// An idle open connection to `where` ("host:port"), or a closed socket to dial.
  asio::ip::tcp::socket take(const std::string& where, bool& reused);
  /// A new socket to dial (counted in dialled()).
  asio::ip::tcp::socket dial();
  /// Gives a connection back for reuse (closed when the host already keeps enough).
  void put(const std::string& where, asio::ip::tcp::socket socket);
  /// Idle connections now held, over all hosts.
  size_t idle() const;
  /// Connections dialled and reuses served since construction.
  size_t dialled() const;
  size_t reused() const;
  /// Closes every idle connection (shutdown).
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  struct Idle {
    asio::ip::tcp::socket socket;
    Clock::time_point since;
  };
  asio::any_io_executor ex_;
  Clock::duration max_idle_;
  size_t max_idle_per_host_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<Idle>> idle_;
  size_t dialled_ = 0, reused_ = 0;
};

/// One-shot request (http_request's contract). With a pool, the connection is kept alive
/// and reused; a reused connection that the node had closed (no response byte) is redialled
/// once. Throws hack::Error on connect/IO failure, timeout, or "cancelled".
Task<HttpResponse> async_http_request(const HttpClientRequest& req, HttpCancel* cancel = nullptr,
                                      HttpConnectionPool* pool = nullptr);

/// Streaming call (http_stream's contract): on_event(data) for each SSE event as it
/// arrives, awaited before the next is read; false stops reading (the connection closes).
/// timeout_s is the idle time between bytes.
Task<HttpResponse> async_http_stream(const HttpClientRequest& req,
                                     const std::function<Task<bool>(std::string_view data)>& on_event,
                                     HttpCancel* cancel = nullptr, HttpConnectionPool* pool = nullptr);

}  // namespace hack::server
