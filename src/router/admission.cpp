#include "src/router/admission.h"  // first: Asio's coroutine support (http/coro.h)

#include <fmt/format.h>

#include "hack/core/error.h"
#include "hack/router/tool_calls.h"

namespace hack::server::router {

// Parses and validates a request, and checks that the nodes can take it. One part per
// prompt (a /v1/completions list of prompts gives several, sharing one response id).
std::variant<std::vector<AdmittedRequest>, Rejection> Admission::admit(const std::string& body, Endpoint endpoint,
                                                                       Clock::time_point t_arrival) const {
  ParseResult parsed = parse_request(body, endpoint, model_.limits);
  if (auto* e = std::get_if<ProtocolError>(&parsed)) return Rejection{*e, "invalid_request"};
  CompletionRequest request = std::get<CompletionRequest>(std::move(parsed));
  std::vector<CompletionRequest> prompts;
  if (request.batch.empty()) {
    prompts.push_back(std::move(request));
  } else {
    for (auto& p : request.batch) {
      CompletionRequest one = request;
      one.batch.clear();
      if (auto* text = std::get_if<std::string>(&p)) {
        one.prompt_text = *text;
      } else {
        one.prompt_token_ids = std::get<std::vector<int>>(p);
      }
      prompts.push_back(std::move(one));
    }
  }
  std::vector<AdmittedRequest> parts;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto part = admit_prompt(std::move(prompts[i]), endpoint, t_arrival);
    if (auto* no = std::get_if<Rejection>(&part)) {
      if (prompts.size() > 1) no->error.message = fmt::format("prompt {}: {}", i, no->error.message);
      return *no;
    }
    parts.push_back(std::get<AdmittedRequest>(std::move(part)));
    parts.back().meta = parts.front().meta;
  }
  return parts;
}

std::variant<AdmittedRequest, Rejection> Admission::admit_prompt(CompletionRequest request, Endpoint endpoint,
                                                                  Clock::time_point t_arrival) const {
  AdmittedRequest req;
  req.request = std::move(request);
  if (req.request.endpoint == Endpoint::kChatCompletions && req.request.tools.is_array() &&
      !req.request.tools.empty() && !req.request.tool_choice_none) {
    req.request.tool_parser = model_.tool_parser;
    // Mistral's [TOOL_CALLS] is a special token: keep it in the text (vLLM does the same).
    if (model_.tool_parser == ToolParserKind::mistral) req.request.skip_special_tokens = false;
    if (req.request.tool_choice_required || !req.request.tool_choice_function.empty()) {
      try {  // the reply is forced to be calls, in the syntax the parser reads
        req.request.grammar = forced_tool_calls_gbnf(model_.tool_parser, req.request.tools, req.request.tool_choice_function,
                                                     req.request.parallel_tool_calls);
      } catch (const Error& e) {
        ProtocolError pe;
          pe.message = e.what();
          pe.param = "tool_choice";
          return Rejection{pe, "invalid_request"};
      }
    }
  }
  const CompletionRequest& r = req.request;
  auto tokens = model_.prompt_tokens(r, req.prompt_text);
  if (auto* e = std::get_if<ProtocolError>(&tokens)) return Rejection{*e, "invalid_request"};
  req.prompt = std::get<std::vector<int>>(std::move(tokens));
  auto fitted = fit_max_tokens(r, static_cast<int>(req.prompt.size()), model_.max_model_len);
  if (auto* e = std::get_if<ProtocolError>(&fitted)) return Rejection{*e, "invalid_request"};
  if (nodes_.prefill_pool().healthy_count() == 0 || nodes_.decode_pool().healthy_count() == 0) {
    const char* role = nodes_.prefill_pool().healthy_count() == 0 ? "prefill" : "decode";
    return Rejection{unavailable_error(fmt::format("no healthy {} node", role)), "unavailable"};
  }
  // Prefill queues decide the time to first token; decode queues, how long a stream waits
  // for a batch slot. Each has its own bound.
  if ((config_.max_queue_tokens > 0 && nodes_.prefill_pool().saturated(config_.max_queue_tokens)) ||
      (config_.max_decode_queue_tokens > 0 && nodes_.decode_pool().saturated(config_.max_decode_queue_tokens))) {
    return Rejection{overloaded_error(), "overloaded"};
  }
  req.params = to_sampling_params(r, std::get<int>(fitted), model_.defaults);
  req.meta = ResponseMeta{make_request_id(endpoint), r.model, unix_seconds_now(), r.stream && r.include_usage};
  req.t_arrival = t_arrival;
  return req;
}

}  // namespace hack::server::router
