/// @file node_http.h
/// @brief What the prefill and decode nodes answer alike on their HTTP port: GET /health,
/// GET /metrics, 404 outside /internal/, 401 without the shared secret, and the body of
/// POST /internal/cancel. Each node handles only its own /internal/ calls.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "hack/http/http_server.h"

namespace hack::server {

struct NodeEndpoints {
  std::string secret;                            ///< "" = internal endpoints open
  std::function<std::string()> health_json;      ///< GET /health body
  std::function<std::string()> metrics_text;     ///< GET /metrics body (Prometheus text)
};

/// Answers the shared endpoints and refusals. Returns true when `res` got its answer;
/// false when `req` is an authorized /internal/ call for the node itself.
bool answer_common_node_request(const HttpRequest& req, Responder& res, const NodeEndpoints& endpoints);

/// The request id of a POST /internal/cancel body; on a malformed body answers 400 itself
/// and returns nothing.
std::optional<uint64_t> cancel_request_id(const HttpRequest& req, Responder& res);

/// 404 naming the method and path.
void answer_unknown_endpoint(const HttpRequest& req, Responder& res);

}  // namespace hack::server
