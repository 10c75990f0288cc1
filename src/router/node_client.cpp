#include "hack/router/async_node_call.h"  // first: Asio's coroutine support (http/coro.h)

#include <boost/asio/io_context.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <optional>
#include <type_traits>

#include "hack/router/node_client.h"

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

asio::steady_timer::time_point after_s(double s) {
  return asio::steady_timer::clock_type::now() +
         std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(s));
}

// Runs `task` on a one-thread io_context of its own until it returns (the blocking forms).
template <class T>
T run_blocking(Task<T> task) {
  asio::io_context ioc;
  std::exception_ptr error;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr e) { error = e; });
    ioc.run();
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<T> result;
    asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr e, T value) {
      error = e;
      if (!e) result.emplace(std::move(value));
    });
    ioc.run();
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

}  // namespace

// ---- the coroutine ----------------------------------------------------------------------

AsyncDisaggregatedCall::AsyncDisaggregatedCall(NodeAddress prefill, NodeAddress decode, GenerateJob job,
                                               GenerateOptions options, HttpConnectionPool* pool)
    : prefill_(std::move(prefill)), decode_(std::move(decode)), job_(std::move(job)), options_(std::move(options)),
      pool_(pool) {
  job_.remote_kv = true;
  job_.kv_format = prefill_.kv_format;  // each node refuses a partner whose KV format differs from its own
}

Task<void> AsyncDisaggregatedCall::prefill_call(std::string body) {
  std::string error;
  PrefillReply reply;
  try {
    HttpResponse r = co_await async_http_request(
        node_request(prefill_, "POST", "/internal/prefill", std::move(body), options_.secret, options_.timeout_s),
        &prefill_cancel_, pool_);
    if (r.status != 200) {
      error = fmt::format("prefill node {} answered {}: {}", where(prefill_), r.status, parse_node_error(r.body));
    } else {
      reply = parse_prefill_reply(r.body);
    }
  } catch (const std::exception& e) {
    error = fmt::format("prefill node {}: {}", where(prefill_), e.what());
  }
  prefill_error_ = error;
  prefill_reply_ = std::move(reply);
  prefill_done_->set();
  if (!error.empty() && !cancelled_ && !prefill_abandoned_) {
    // The decode side would wait for KV that never comes: end it now.
    spdlog::warn("request {}: {}", job_.request_id, error);
    decode_cancel_.cancel();
    co_await async_send_cancel(decode_, job_.request_id, options_.secret, pool_);
  }
  prefill_finished_->set();
}

// The prefill node answers once its KV has left, so by the first token its reply is at most
// a moment away; the token waits for it (only requests asking for prompt logprobs do).
Task<void> AsyncDisaggregatedCall::attach_prompt_logprobs(NodeEvent& first) {
  co_await prefill_done_->wait_until(after_s(options_.timeout_s));
  HACK_CHECK(prefill_done_->is_set() && prefill_error_.empty(), "request {}: no prompt logprobs: {}", job_.request_id,
             prefill_done_->is_set() ? prefill_error_ : "the prefill node did not answer");
  HACK_CHECK(prefill_reply_.prompt_logprobs.size() + 1 == job_.prompt.size(),
             "request {}: the prefill node sent {} prompt logprobs for a prompt of {} tokens", job_.request_id,
             prefill_reply_.prompt_logprobs.size(), job_.prompt.size());
  first.prompt_logprobs = prefill_reply_.prompt_logprobs;
}

Task<void> AsyncDisaggregatedCall::cancel_prefill() {
  prefill_abandoned_ = true;
  prefill_cancel_.cancel();
  co_await async_send_cancel(prefill_, job_.request_id, options_.secret, pool_);
}

void AsyncDisaggregatedCall::cancel() {
  // Only closes the connections: callers cancel from io threads and under locks, and a node
  // that does not answer would hold them for the cancel's timeout. run() tells the nodes.
  cancelled_ = true;
  decode_cancel_.cancel();
  prefill_cancel_.cancel();
}

Task<GenerateOutcome> AsyncDisaggregatedCall::run(std::function<bool(const NodeEvent&)> on_event) {
  const auto ex = co_await asio::this_coro::executor;
  prefill_done_.emplace(ex);
  prefill_finished_.emplace(ex);
  GenerateOutcome out;
  out.prompt_tokens = static_cast<int>(job_.prompt.size());
  bool ended = false, stopped_early = false;
  std::string stream_error;
  const std::function<Task<bool>(std::string_view)> on_data = [&](std::string_view data) -> Task<bool> {
    NodeEvent e = parse_node_event(data);
    switch (e.kind) {
      case NodeEventKind::accepted:
        // The admitting process's own listener; the health poll's copy may be older.
        if (!e.ucx_address.empty()) decode_.ucx_address = e.ucx_address;
        if (!e.ucx_address.empty() || !e.ucx_worker.empty()) {
          decode_.ucx_worker = e.ucx_worker;
          decode_.host_id = e.host_id;
        }
        if (!prefill_started_) {
          prefill_started_ = true;
          PrefillCall call{.request_id = job_.request_id,
                           .prompt = job_.prompt,
                           .params = job_.params,
                           .decode_ucx = decode_.ucx_address,
                           .decode_ucx_worker = decode_.ucx_worker,
                           .decode_host_id = decode_.host_id,
                           .corrupt_page = options_.corrupt_page,
                           .kv_format = decode_.kv_format,
                           .generated = job_.generated};
          asio::co_spawn(ex, prefill_call(to_json(call)), asio::detached);
        }
        on_event(e);
        co_return true;
      case NodeEventKind::token:
        if (!out.started && job_.params.prompt_logprobs >= 0) co_await attach_prompt_logprobs(e);
        out.started = true;
        ++out.completion_tokens;
        if (!on_event(e)) {
          stopped_early = true;
          co_return false;
        }
        co_return true;
      case NodeEventKind::finished:
        ended = true;
        out.finish_reason = e.finish_reason;
        out.prompt_tokens = e.prompt_tokens;
        out.completion_tokens = e.completion_tokens;
        co_return true;
      case NodeEventKind::error:
        ended = true;
        stream_error = e.message;
        co_return true;
    }
    co_return true;
  };
  try {
    HttpResponse r = co_await async_http_stream(
        node_request(decode_, "POST", "/internal/generate", to_json(job_), options_.secret, options_.timeout_s), on_data,
        &decode_cancel_, pool_);
    if (r.status != 200) {
      stream_error = fmt::format("decode node {} answered {}: {}", where(decode_), r.status, parse_node_error(r.body));
    } else if (!ended && !stopped_early && stream_error.empty()) {
      stream_error = fmt::format("decode node {} closed the stream before the request ended", where(decode_));
    }
  } catch (const std::exception& e) {
    stream_error = fmt::format("decode node {}: {}", where(decode_), e.what());
  }
  if (stopped_early || cancelled_) co_await async_send_cancel(decode_, job_.request_id, options_.secret, pool_);
  if (prefill_started_) {
    // Once a token has come, decode had all the KV, so the prefill node's reply is moments
    // away (it answers once its sends complete): wait for it rather than cancel a job that
    // succeeded (also when the caller stopped early on a stop string).
    if (out.started && !cancelled_) co_await prefill_done_->wait_until(after_s(kPrefillReplyGraceS));
    if (!prefill_done_->is_set() || cancelled_) co_await cancel_prefill();
    co_await prefill_finished_->wait();
  }
  if (stopped_early) {
    out.finish_reason = FinishReason::stop;
    co_return out;
  }
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
  co_return out;
}

Task<NodeHealth> async_fetch_health(const NodeAddress& node, double timeout_s, HttpConnectionPool* pool) {
  HttpResponse r = co_await async_http_request(node_request(node, "GET", "/health", "", "", timeout_s), nullptr, pool);
  HACK_CHECK(r.status == 200, "{} /health answered {}", where(node), r.status);
  co_return parse_node_health(r.body);
}

Task<bool> async_node_alive(const NodeAddress& node, double timeout_s, HttpConnectionPool* pool) {
  try {
    co_await async_fetch_health(node, timeout_s, pool);
    co_return true;
  } catch (const std::exception&) {
    co_return false;
  }
}

Task<void> async_send_cancel(const NodeAddress& node, uint64_t request_id, const std::string& secret,
                             HttpConnectionPool* pool) {
  try {
    co_await async_http_request(node_request(node, "POST", "/internal/cancel", cancel_body(request_id), secret, 2),
                                nullptr, pool);
  } catch (const std::exception& e) {
    spdlog::debug("request {}: cancel at {} failed: {}", request_id, where(node), e.what());
  }
}

// ---- the blocking forms -----------------------------------------------------------------

DisaggregatedCall::DisaggregatedCall(NodeAddress prefill, NodeAddress decode, GenerateJob job, GenerateOptions options)
    : call_(std::make_unique<AsyncDisaggregatedCall>(std::move(prefill), std::move(decode), std::move(job),
                                                     std::move(options))) {}

DisaggregatedCall::~DisaggregatedCall() = default;

GenerateOutcome DisaggregatedCall::run(const std::function<bool(const NodeEvent&)>& on_event) {
  return run_blocking(call_->run(on_event));
}

void DisaggregatedCall::cancel() { call_->cancel(); }

NodeHealth fetch_health(const NodeAddress& node, double timeout_s) {
  return run_blocking(async_fetch_health(node, timeout_s, nullptr));
}

void send_cancel(const NodeAddress& node, uint64_t request_id, const std::string& secret) {
  run_blocking(async_send_cancel(node, request_id, secret, nullptr));
}

}  // namespace hack::server
