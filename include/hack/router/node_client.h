/// @file node_client.h
/// @brief One request across a prefill node and a decode node, as the router (and the e2e
/// tests) drive it: open the decode stream, wait until decode has reserved the KV
/// ("accepted"), send the prefill call, then relay tokens until the stream ends. A failed
/// prefill cancels the decode side; a cancelled caller cancels both. The coroutine forms
/// the router runs are in async_node_call.h.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "hack/core/error.h"
#include "hack/http/http_client.h"
#include "hack/node/node_protocol.h"
#include "hack/router/routing.h"

namespace hack::server {

struct GenerateOutcome {
  Status status;                 ///< ok, or why the request failed
  bool started = false;          ///< at least one token reached the caller
  FinishReason finish_reason = FinishReason::length;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  PrefillReply prefill;          ///< the prefill node's reply (remote KV)
};

struct GenerateOptions {
  std::string secret;            ///< the nodes' shared secret
  double timeout_s = 600;        ///< idle limit of each connection
  bool corrupt_page = false;     ///< test hook forwarded to the prefill node
};

/// Runs one job (remote KV) on a prefill + decode pair.
class AsyncDisaggregatedCall;

/// Runs one job (remote KV) on a prefill + decode pair, blocking the calling thread (the
/// e2e tests' driver; the router runs AsyncDisaggregatedCall on its I/O threads).
class DisaggregatedCall {
 public:
  DisaggregatedCall(NodeAddress prefill, NodeAddress decode, GenerateJob job, GenerateOptions options);
  ~DisaggregatedCall();
  DisaggregatedCall(const DisaggregatedCall&) = delete;
  DisaggregatedCall& operator=(const DisaggregatedCall&) = delete;

  /// Blocks until the request ends. `on_event` sees the accepted event (decode reserved the
  /// KV; the prefill call goes out) and every token event in order, and may return false on
  /// a token to stop early (both nodes are then cancelled; the outcome is ok with the
  /// tokens so far, finish_reason stop).
  GenerateOutcome run(const std::function<bool(const NodeEvent&)>& on_event);
  /// Aborts run() from another thread. Does not block: it closes both connections, and
  /// run() tells both nodes to drop the request before it returns.
  void cancel();

 private:
  std::unique_ptr<AsyncDisaggregatedCall> call_;
};

/// Fetches GET /health of a node. Throws hack::Error when it cannot be reached or answers badly.
NodeHealth fetch_health(const NodeAddress& node, double timeout_s = 2);

/// POST /internal/cancel (best effort: errors are ignored).
void send_cancel(const NodeAddress& node, uint64_t request_id, const std::string& secret);

}  // namespace hack::server
