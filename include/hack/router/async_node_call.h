/// @file async_node_call.h
/// @brief node_client.h's calls as coroutines (http/coro.h), for the router's I/O threads:
/// one request on a prefill + decode pair, a node's health, a cancel. The blocking
/// DisaggregatedCall runs the same coroutine on an io_context of its own.
#pragma once

#include "hack/http/coro.h"  // first: Asio's coroutine support

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "hack/http/async_http_client.h"
#include "hack/router/node_client.h"

namespace hack::server {

/// One job (remote KV) on a prefill + decode pair: open the decode stream, and once decode
/// has reserved the KV ("accepted") send the prefill call beside it; relay events until the
/// stream ends. A failed prefill cancels the decode side; cancel() ends both. Start run() on
/// a strand (or a one-thread io_context): the call's own steps all run there.
class AsyncDisaggregatedCall {
 public:
  /// `pool`: keep-alive connections to the nodes (nullptr: a connection per call).
  AsyncDisaggregatedCall(NodeAddress prefill, NodeAddress decode, GenerateJob job, GenerateOptions options,
                         HttpConnectionPool* pool = nullptr);
  AsyncDisaggregatedCall(const AsyncDisaggregatedCall&) = delete;
  AsyncDisaggregatedCall& operator=(const AsyncDisaggregatedCall&) = delete;

  /// DisaggregatedCall::run's contract; returns only after the prefill call has ended too.
  Task<GenerateOutcome> run(std::function<bool(const NodeEvent&)> on_event);
  /// Aborts run() from any thread: closes both connections; run() then tells both nodes.
  void cancel();

 private:
  Task<void> prefill_call(std::string body);
  Task<void> attach_prompt_logprobs(NodeEvent& first);
  Task<void> cancel_prefill();

  NodeAddress prefill_, decode_;
  GenerateJob job_;
  GenerateOptions options_;
  HttpConnectionPool* pool_;
  HttpCancel decode_cancel_, prefill_cancel_;
  std::atomic<bool> cancelled_{false};
  // On run()'s executor only:
  std::optional<CoEvent> prefill_done_;      // the prefill call answered or failed
  std::optional<CoEvent> prefill_finished_;  // ... and its coroutine has returned
  bool prefill_started_ = false;
  bool prefill_abandoned_ = false;  // run() cancelled the call itself: its failure is no news
  std::string prefill_error_;       // set when the prefill call failed
  PrefillReply prefill_reply_;      // set when it succeeded
};

/// GET /health of a node. Throws hack::Error when it cannot be reached or answers badly.
Task<NodeHealth> async_fetch_health(const NodeAddress& node, double timeout_s, HttpConnectionPool* pool);
/// Whether the node answers its health check within timeout_s.
Task<bool> async_node_alive(const NodeAddress& node, double timeout_s, HttpConnectionPool* pool);
/// POST /internal/cancel (best effort: errors are ignored).
Task<void> async_send_cancel(const NodeAddress& node, uint64_t request_id, const std::string& secret,
                             HttpConnectionPool* pool);

}  // namespace hack::server
