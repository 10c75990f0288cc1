#include "src/router/answer.h"  // first: Asio's coroutine support (http/coro.h)

#include <spdlog/spdlog.h>

namespace hack::server::router {

void send_error(Responder& res, const ProtocolError& e) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.status == 429) headers.emplace_back("Retry-After", "1");
  res.send(e.status, "application/json", error_body(e), std::move(headers));
}

void answer_request(Responder& res, const RequestContext& ctx, const AdmittedRequest& req, int prompt_tokens,
                    std::vector<ChoiceOutcome> outcomes, Metrics& metrics) {
  const CompletionRequest& r = req.request;
  Usage usage{prompt_tokens, 0};
  std::optional<ProtocolError> error;
  std::vector<Choice> choices;
  for (ChoiceOutcome& o : outcomes) {
    usage.completion_tokens += o.completion_tokens;
    if (o.error && !error) error = o.error;
    choices.push_back(std::move(o.choice));
  }
  if (ctx.cancelled()) {
    metrics.count_request_error("cancelled");
    spdlog::info("request {}: cancelled (client went away)", req.meta.id);
    return;
  }
  if (error) {
    metrics.count_request_error(error->status == 503 ? "unavailable" : "node_failure");
    spdlog::warn("request {}: failed: {}", req.meta.id, error->message);
    if (r.stream) {
      res.send_event(error_body(*error));
      res.send_event("[DONE]");
      res.end();
    } else {
      send_error(res, *error);
    }
    return;
  }
  for (const Choice& c : choices) metrics.count_request_success(finish_reason_name(c.finish_reason));
  spdlog::info("request {}: done, {} completion tokens in {:.3f} s", req.meta.id, usage.completion_tokens,
               seconds_since(req.t_arrival));
  if (r.stream) {
    if (r.include_usage) res.send_event(usage_chunk(req.meta, r.endpoint, usage));
    res.send_event("[DONE]");
    res.end();
    return;
  }
  const std::string body =
      r.endpoint == Endpoint::kCompletions
          ? completion_response(req.meta, choices, usage,
                                r.echo && req.params.prompt_logprobs < 0 ? count_code_points(req.prompt_text) : 0)
          : chat_completion_response(req.meta, choices, usage);
  res.send(200, "application/json", body);
}

}  // namespace hack::server::router
