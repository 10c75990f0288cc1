// The end of a request: usage, the metrics of how it finished, and its answer — the whole
// response, the end of its stream, or its first error.
#pragma once

#include "src/router/request_state.h"  // first: Asio's coroutine support (http/coro.h)

#include <vector>

#include "hack/http/http_server.h"
#include "hack/node/metrics.h"

namespace hack::server::router {

/// An error response (429 with Retry-After).
void send_error(Responder& res, const ProtocolError& e);

/// Answers from the choices' outcomes: the first error, else the response (when streaming,
/// the usage chunk and the end of the stream). Nothing once the client has gone.
void answer_request(Responder& res, const RequestContext& ctx, const AdmittedRequest& req, int prompt_tokens,
                    std::vector<ChoiceOutcome> outcomes, Metrics& metrics);

}  // namespace hack::server::router
