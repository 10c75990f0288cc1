#include "hack/node/node_http.h"

#include "hack/core/error.h"
#include "hack/node/node_protocol.h"

namespace hack::server {

bool answer_common_node_request(const HttpRequest& req, Responder& res, const NodeEndpoints& endpoints) {
  if (req.method == "GET" && req.path == "/health") {
    res.send(200, "application/json", endpoints.health_json());
    return true;
  }
  if (req.method == "GET" && req.path == "/metrics") {
    res.send(200, "text/plain; version=0.0.4", endpoints.metrics_text());
    return true;
  }
  if (!req.path.starts_with("/internal/")) {
    answer_unknown_endpoint(req, res);
    return true;
  }
  if (!secret_matches(req.header(kSecretHeader), endpoints.secret)) {
    res.send(401, "application/json", node_error_body("missing or wrong X-Hack-Secret", "unauthorized"));
    return true;
  }
  return false;
}

std::optional<uint64_t> cancel_request_id(const HttpRequest& req, Responder& res) {
  try {
    return parse_cancel_body(req.body);
  } catch (const Error& e) {
    res.send(400, "application/json", node_error_body(e.what(), "invalid_request_error"));
    return std::nullopt;
  }
}

void answer_unknown_endpoint(const HttpRequest& req, Responder& res) {
  res.send(404, "application/json", node_error_body("no such endpoint: " + req.method + " " + req.path, "not_found"));
}

}  // namespace hack::server
