#include "hack/router/node_client.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace hack::server {

namespace {

HttpClientRequest node_request(const NodeAddress& node, std::string method, std::string target, std::string body,
                               const std::string& secret, double timeout_s) {
  HttpClientRequest r;
  r.host = node.host;
  r.port = node.port;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.timeout_s = timeout_s;
  if (!secret.empty()) r.headers.emplace_back(std::string(kSecretHeader), secret);
  return r;
}

std::string where(const NodeAddress& node) { return node.host + ":" + std::to_string(node.port); }

// How long a request that finished on the decode node waits for its prefill reply.
constexpr double kPrefillReplyGraceS = 2.0;

}  // namespace

DisaggregatedCall::DisaggregatedCall(NodeAddress prefill, NodeAddress decode, GenerateJob job, GenerateOptions options)
    : prefill_(std::move(prefill)), decode_(std::move(decode)), job_(std::move(job)), options_(std::move(options)) {
  job_.remote_kv = true;
  job_.kv_format = prefill_.kv_format;  // each node refuses a partner whose KV format differs from its own
}

DisaggregatedCall::~DisaggregatedCall() {
  if (prefill_thread_.joinable()) {
    cancel_prefill();
    prefill_thread_.join();
  }
}

void DisaggregatedCall::start_prefill() {
  PrefillCall call{.request_id = job_.request_id,
                   .prompt = job_.prompt,
                   .params = job_.params,
                   .decode_ucx = decode_.ucx_address,
                   .decode_ucx_worker = decode_.ucx_worker,
                   .decode_host_id = decode_.host_id,
                   .corrupt_page = options_.corrupt_page,
                   .kv_format = decode_.kv_format,
                   .generated = job_.generated};
  prefill_thread_ = std::thread([this, body = to_json(call)]() mutable {
    std::string error;
    PrefillReply reply;
    try {
      HttpResponse r = http_request(
          node_request(prefill_, "POST", "/internal/prefill", std::move(body), options_.secret, options_.timeout_s),
          &prefill_cancel_);
      if (r.status != 200) {
        error = fmt::format("prefill node {} answered {}: {}", where(prefill_), r.status, parse_node_error(r.body));
      } else {
        reply = parse_prefill_reply(r.body);
      }
    } catch (const std::exception& e) {
      error = fmt::format("prefill node {}: {}", where(prefill_), e.what());
    }
    bool abandoned;
    {
      std::lock_guard lock(mutex_);
      prefill_done_ = true;
      prefill_error_ = error;
      prefill_reply_ = reply;
      abandoned = prefill_abandoned_;
    }
    prefill_cv_.notify_all();
    if (!error.empty() && !cancelled_ && !abandoned) {
      // The decode side would wait for KV that never comes: end it now.
      spdlog::warn("request {}: {}", job_.request_id, error);
      decode_cancel_.cancel();
      send_cancel(decode_, job_.request_id, options_.secret);
    }
  });
}

// The prefill node answers once its KV has left, so by the first token its reply is at most
// a moment away; the token waits for it (only requests asking for prompt logprobs do).
void DisaggregatedCall::attach_prompt_logprobs(NodeEvent& first) {
  std::unique_lock lock(mutex_);
  prefill_cv_.wait_for(lock, std::chrono::duration<double>(options_.timeout_s),
                       [&] { return prefill_done_ || cancelled_; });
  HACK_CHECK(prefill_done_ && prefill_error_.empty(), "request {}: no prompt logprobs: {}", job_.request_id,
             prefill_done_ ? prefill_error_ : "the prefill node did not answer");
  HACK_CHECK(prefill_reply_.prompt_logprobs.size() + 1 == job_.prompt.size(),
             "request {}: the prefill node sent {} prompt logprobs for a prompt of {} tokens", job_.request_id,
             prefill_reply_.prompt_logprobs.size(), job_.prompt.size());
  first.prompt_logprobs = prefill_reply_.prompt_logprobs;
}

void DisaggregatedCall::cancel_prefill() {
  {
    std::lock_guard lock(mutex_);
    prefill_abandoned_ = true;
  }
  prefill_cancel_.cancel();
  send_cancel(prefill_, job_.request_id, options_.secret);
}

void DisaggregatedCall::cancel() {
  // Only closes the connections: callers cancel from io threads and under locks, and a node
  // that does not answer would hold them for the cancel's timeout. run() tells the nodes.
  cancelled_ = true;
  decode_cancel_.cancel();
  prefill_cancel_.cancel();
}

GenerateOutcome DisaggregatedCall::run(const std::function<bool(const NodeEvent&)>& on_event) {
  GenerateOutcome out;
  out.prompt_tokens = static_cast<int>(job_.prompt.size());
  bool ended = false, stopped_early = false;
  std::string stream_error;
  try {
    HttpResponse r = http_stream(
        node_request(decode_, "POST", "/internal/generate", to_json(job_), options_.secret, options_.timeout_s),
        [&](std::string_view data) {
          NodeEvent e = parse_node_event(data);
          switch (e.kind) {
            case NodeEventKind::accepted:
              // The admitting process's own listener; the health poll's copy may be older.
              if (!e.ucx_address.empty()) decode_.ucx_address = e.ucx_address;
              if (!e.ucx_address.empty() || !e.ucx_worker.empty()) {
                decode_.ucx_worker = e.ucx_worker;
                decode_.host_id = e.host_id;
              }
              if (!prefill_thread_.joinable()) start_prefill();
              on_event(e);
              return true;
            case NodeEventKind::token:
              if (!out.started && job_.params.prompt_logprobs >= 0) attach_prompt_logprobs(e);
              out.started = true;
              ++out.completion_tokens;
              if (!on_event(e)) {
                stopped_early = true;
                return false;
              }
              return true;
            case NodeEventKind::finished:
              ended = true;
              out.finish_reason = e.finish_reason;
              out.prompt_tokens = e.prompt_tokens;
              out.completion_tokens = e.completion_tokens;
              return true;
            case NodeEventKind::error:
              ended = true;
              stream_error = e.message;
              return true;
          }
          return true;
        },
        &decode_cancel_);
    if (r.status != 200) {
      stream_error = fmt::format("decode node {} answered {}: {}", where(decode_), r.status, parse_node_error(r.body));
    } else if (!ended && !stopped_early && stream_error.empty()) {
      stream_error = fmt::format("decode node {} closed the stream before the request ended", where(decode_));
    }
  } catch (const std::exception& e) {
    stream_error = fmt::format("decode node {}: {}", where(decode_), e.what());
  }
  if (stopped_early || cancelled_) send_cancel(decode_, job_.request_id, options_.secret);
  if (prefill_thread_.joinable()) {
    bool prefill_running;
    {
      std::unique_lock lock(mutex_);
      // Once a token has come, decode had all the KV, so the prefill node's reply is
      // moments away (it answers once its sends complete): wait for it rather than cancel
      // a job that succeeded (also when the caller stopped early on a stop string).
      if (out.started && !cancelled_) {
        prefill_cv_.wait_for(lock, std::chrono::duration<double>(kPrefillReplyGraceS), [&] { return prefill_done_; });
      }
      prefill_running = !prefill_done_;
    }
    if (prefill_running || cancelled_) cancel_prefill();
    prefill_thread_.join();
  }
  if (stopped_early) {
    out.finish_reason = FinishReason::stop;
    return out;
  }
  std::lock_guard lock(mutex_);
  if (prefill_error_.empty()) out.prefill = prefill_reply_;
  // A prefill call this run abandoned itself (the decode side had already failed) only
  // says "cancelled": the cause is the stream's error.
  const bool prefill_failed = !prefill_error_.empty() && !prefill_abandoned_;
  if (cancelled_) {
    out.status = Status::error("cancelled");
  } else if (prefill_failed && !ended) {
    out.status = Status::error(prefill_error_);
  } else if (!stream_error.empty()) {
    out.status = Status::error(prefill_failed ? prefill_error_ + "; " + stream_error : stream_error);
  }
  return out;
}

NodeHealth fetch_health(const NodeAddress& node, double timeout_s) {
  HttpResponse r = http_request(node_request(node, "GET", "/health", "", "", timeout_s));
  HACK_CHECK(r.status == 200, "{} /health answered {}", where(node), r.status);
  return parse_node_health(r.body);
}

void send_cancel(const NodeAddress& node, uint64_t request_id, const std::string& secret) {
  try {
    http_request(node_request(node, "POST", "/internal/cancel", cancel_body(request_id), secret, 2));
  } catch (const std::exception& e) {
    spdlog::debug("request {}: cancel at {} failed: {}", request_id, where(node), e.what());
  }
}

}  // namespace hack::server
