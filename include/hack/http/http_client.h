/// @file http_client.h
/// @brief Blocking HTTP/1.1 client calls (one connection each) for the router→node path and
/// tests: a one-shot request, and a streaming call that delivers SSE events as they arrive.
/// Either can be aborted from another thread with an HttpCancel. Boost.Beast stays inside.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hack::server {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names; repeats joined with ", "
  std::string body;
  /// Value of header `name` (lower-case), "" if absent.
  std::string header(std::string_view name) const;
};

struct HttpClientRequest {
  std::string host;
  int port = 0;
  std::string method = "GET";
  std::string target = "/";
  std::string body;
  std::string content_type = "application/json";  // sent when body is non-empty
  std::vector<std::pair<std::string, std::string>> headers;  // override same-named defaults
  double timeout_s = 30;  // http_request: whole call; http_stream: idle time between bytes; <= 0: none
};

namespace detail {
struct CancelAccess;
}

/// Lets another thread abort http_request / http_stream calls that were given it: their
/// socket is closed and the call throws hack::Error("cancelled"). Sticky: a call started
/// after cancel() throws at once. Thread-safe; several calls may share one.
class HttpCancel {
 public:
  HttpCancel() = default;
  HttpCancel(const HttpCancel&) = delete;
  HttpCancel& operator=(const HttpCancel&) = delete;

  void cancel();
  bool cancelled() const;

 private:
  friend struct detail::CancelAccess;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::function<void()>> aborts_;  // calls in progress
};

/// Blocking one-shot request on its own connection (Connection: close). Any status is
/// returned. Throws hack::Error on connect/IO failure or timeout (the message says which,
/// with host:port), or "cancelled".
HttpResponse http_request(const HttpClientRequest& req, HttpCancel* cancel = nullptr);

/// Streaming: sends the request, then calls on_event(data) for each SSE event's data as it
/// arrives (multi-line data joined with '\n'; comments and other fields ignored). A response
/// that is not 200 text/event-stream is read whole into the returned body, with no events.
/// Blocks the caller's thread; returns when the stream ends (final chunk, or EOF for a body
/// without framing). on_event returning false stops reading and closes the connection.
/// timeout_s is an idle timeout between bytes. Throws hack::Error on failure, timeout, a
/// stream cut before its final chunk, or "cancelled"; exceptions from on_event propagate.
HttpResponse http_stream(const HttpClientRequest& req, const std::function<bool(std::string_view data)>& on_event,
                         HttpCancel* cancel = nullptr);

}  // namespace hack::server
