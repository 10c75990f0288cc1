// The state one client request carries through the router's units (router_server.cpp's
// dispatch, admission.h, choice_runner.h, answer.h): what was admitted, its calls (so a
// closed connection or shutdown cancels them), each choice's outcome, the gauges.
#pragma once

#include "hack/router/async_node_call.h"  // first: Asio's coroutine support (http/coro.h)

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hack/router/openai_protocol.h"

namespace hack::server::router {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A node-side request id: random, so ids of several routers do not collide.
inline uint64_t random_id() {
  std::random_device rd;
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd()) >> 1;  // fits JSON readers that take ids as signed
}

// The calls of one client request (n choices, retries), so a closed connection or a
// shutdown can cancel them all.
class RequestContext {
 public:
  void add(AsyncDisaggregatedCall* call) {
    std::lock_guard lock(mutex_);
    if (cancelled_) call->cancel();
    calls_.insert(call);
  }
  void remove(AsyncDisaggregatedCall* call) {
    std::lock_guard lock(mutex_);
    calls_.erase(call);
  }
  // Once: calls added later are cancelled by add(), so a second cancel would only repeat
  // the nodes' cancel round trips.
  void cancel() {
    std::lock_guard lock(mutex_);
    if (cancelled_) return;
    cancelled_ = true;
    for (AsyncDisaggregatedCall* c : calls_) c->cancel();
  }
  bool cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }

 private:
  mutable std::mutex mutex_;
  bool cancelled_ = false;
  std::set<AsyncDisaggregatedCall*> calls_;
};

// What one choice produced.
struct ChoiceOutcome {
  Choice choice;
  int completion_tokens = 0;
  std::optional<ProtocolError> error;
};

// A request that passed validation and admission, as its choices run it.
struct AdmittedRequest {
  CompletionRequest request;
  std::vector<int> prompt;
  std::string prompt_text;  // echoed; completions' text offsets start after it
  SamplingParams params;    // choice 0's (choice_params)
  ResponseMeta meta;
  Clock::time_point t_arrival;
};

// Why a request was turned away before it reached a node: the answer, and the error
// metric it counts under.
struct Rejection {
  ProtocolError error;
  const char* metric;
};

// Choice i > 0 of a seeded request samples with seed + i: the choices differ, and replay.
inline SamplingParams choice_params(const SamplingParams& params, int index) {
  SamplingParams p = params;
  if (p.seed && index > 0) p.seed = *p.seed + static_cast<uint64_t>(index);
  return p;
}

// A request in the router's gauges: waiting from admission until the first token of any of
// its choices, running from then until it ends.
class RequestGauge {
 public:
  RequestGauge(std::atomic<int>& waiting, std::atomic<int>& running) : waiting_(waiting), running_(running) {
    ++waiting_;
  }
  ~RequestGauge() {
    if (first_token_seen_) {
      --running_;
    } else {
      --waiting_;
    }
  }
  RequestGauge(const RequestGauge&) = delete;
  RequestGauge& operator=(const RequestGauge&) = delete;

  // Moves the request to running; true for its first token only.
  bool first_token() {
    if (first_token_seen_.exchange(true)) return false;
    --waiting_;
    ++running_;
    return true;
  }

 private:
  std::atomic<int>& waiting_;
  std::atomic<int>& running_;
  std::atomic<bool> first_token_seen_{false};
};

}  // namespace hack::server::router
