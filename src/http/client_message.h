// What the blocking (http_client.cpp) and the coroutine (async_http_client.cpp) client calls
// share: the request message they send, the response headers they return, their limits.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/error.h"
#include "hack/http/http_client.h"
#include "hack/http/sse.h"

namespace hack::server::detail {

namespace beast_http = boost::beast::http;

constexpr uint64_t kMaxResponseBodyBytes = uint64_t{1} << 30;
constexpr size_t kMaxPendingEventBytes = size_t{64} << 20;  // one SSE event may not grow past this
constexpr uint32_t kMaxResponseHeaderBytes = 1 << 20;

inline std::string_view sv(boost::beast::string_view s) { return {s.data(), s.size()}; }

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// The request `req` as sent to `where` ("host:port"); keep_alive false asks the server to
/// close after its response.
inline beast_http::request<beast_http::string_body> client_message(const HttpClientRequest& req, const std::string& where,
                                                                   bool keep_alive) {
  beast_http::request<beast_http::string_body> m;
  auto verb = beast_http::string_to_verb(req.method);
  if (verb == beast_http::verb::unknown) {
    m.method_string(req.method);
  } else {
    m.method(verb);
  }
  m.target(req.target);
  m.version(11);
  m.set(beast_http::field::host, where);
  m.set(beast_http::field::user_agent, "hackserve");
  if (!keep_alive) m.set(beast_http::field::connection, "close");
  if (!req.body.empty() && !req.content_type.empty()) m.set(beast_http::field::content_type, req.content_type);
  for (const auto& [name, value] : req.headers) {
    HACK_CHECK(name.find_first_of("\r\n:") == std::string::npos && value.find_first_of("\r\n") == std::string::npos,
               "http {}: header '{}' has a CR, LF or ':'", where, name);
    m.set(name, value);
  }
  m.body() = req.body;
  m.prepare_payload();
  return m;
}

/// Header fields by lower-case name; repeats joined with ", ".
template <class Fields>
std::map<std::string, std::string> header_map(const Fields& fields) {
  std::map<std::string, std::string> out;
  for (const auto& f : fields) {
    auto [it, inserted] = out.try_emplace(lower(sv(f.name_string())), sv(f.value()));
    if (!inserted) {
      it->second += ", ";
      it->second.append(f.value().data(), f.value().size());
    }
  }
  return out;
}

/// Bytes of a streamed response body: appended to out.body (within kMaxResponseBodyBytes), or,
/// for an event stream, fed to `parser` with the events they complete put in `events`.
inline void take_stream_bytes(bool sse, std::string_view bytes, HttpResponse& out, SseParser& parser,
                              std::vector<std::string>& events, const std::string& where) {
  events.clear();
  if (!sse) {
    HACK_CHECK(out.body.size() + bytes.size() <= kMaxResponseBodyBytes, "http {}: response body over {} bytes", where,
               kMaxResponseBodyBytes);
    out.body.append(bytes);
    return;
  }
  parser.feed(bytes, events);
  HACK_CHECK(parser.pending_bytes() <= kMaxPendingEventBytes, "http {}: an SSE event grew past {} bytes", where,
             kMaxPendingEventBytes);
}

inline bool is_event_stream(const HttpResponse& r) {
  return r.status == 200 && lower(r.header("content-type")).rfind("text/event-stream", 0) == 0;
}

}  // namespace hack::server::detail
