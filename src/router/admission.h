// Admission: a request body parsed and validated (openai_protocol.h), its prompt rendered and
// tokenized, its length fitted, and the nodes checked (503 without a healthy pair, 429 when
// every queue is past --max-queue-tokens), before any node sees it.
#pragma once

#include "src/router/request_state.h"  // first: Asio's coroutine support (http/coro.h)

#include <string>
#include <variant>
#include <vector>

#include "hack/router/router_server.h"
#include "src/router/node_directory.h"
#include "src/router/served_model.h"

namespace hack::server::router {

class Admission {
 public:
  Admission(const RouterConfig& config, const ServedModel& model, NodeDirectory& nodes)
      : config_(config), model_(model), nodes_(nodes) {}

  /// One part per prompt (a /v1/completions list of prompts gives several, sharing one
  /// response id), or why the request is turned away.
  std::variant<std::vector<AdmittedRequest>, Rejection> admit(const std::string& body, Endpoint endpoint,
                                                              Clock::time_point t_arrival) const;

 private:
  std::variant<AdmittedRequest, Rejection> admit_prompt(CompletionRequest request, Endpoint endpoint,
                                                         Clock::time_point t_arrival) const;

  const RouterConfig& config_;
  const ServedModel& model_;
  NodeDirectory& nodes_;
};

}  // namespace hack::server::router
