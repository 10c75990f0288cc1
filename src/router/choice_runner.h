// One choice of a request, from the first attempt to its end: node pairs picked, a failed
// attempt retried (before any token) or migrated (after tokens: prompt + tokens so far on
// another pair, same seed), a silent stream checked for a stall, and every token relayed
// (token_relay.h) and counted in the metrics. Runs as a coroutine on the request's strand.
#pragma once

#include "src/router/request_state.h"  // first: Asio's coroutine support (http/coro.h)

#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "hack/http/http_server.h"
#include "hack/node/metrics.h"
#include "hack/router/router_server.h"
#include "src/router/node_directory.h"
#include "src/router/served_model.h"
#include "src/router/token_relay.h"

namespace hack::server::router {

// One attempt of a choice on a node pair.
struct Attempt {
  NodePair nodes;
  ChoiceText text;
  std::string kept;  // a whole response's text so far
  Clock::time_point last_token = Clock::now();
};

// One choice of a request while it runs.
struct ChoiceRun {
  const AdmittedRequest& req;
  RequestGauge& gauge;
  SamplingParams params;
  ChoiceStream stream;
  ChoiceOutcome& out;
  std::vector<int> generated;  // every token relayed so far, over all attempts (a migration resends them)
};

// One attempt's stall clock. A watcher coroutine on the attempt's strand sleeps on `timer`
// until `stall` after the last node event; then it asks whether the stream is stuck (a
// health round trip) and, when it is, marks the attempt stalled and cancels its call. The
// timers of every attempt sit in the io_context's one timer queue: no thread per attempt.
struct StallClock {
  explicit StallClock(const asio::any_io_executor& ex) : timer(ex), done(ex) {}
  Clock::time_point last = Clock::now();  // the last node event
  bool stop = false;                      // the attempt has ended
  bool fired = false;                     // the watcher found it stalled
  asio::steady_timer timer;
  CoEvent done;                           // the watcher has returned
};

class ChoiceRunner {
 public:
  ChoiceRunner(const RouterConfig& config, const ServedModel& model, NodeDirectory& nodes, Metrics& metrics,
               HttpConnectionPool& connections)
      : config_(config), model_(model), nodes_(nodes), metrics_(metrics), connections_(connections) {}

  /// Runs choice `index` of `req` (its sampling seed; `reported`: its index in the response)
  /// to its end; with `stream`, its chunks are sent as its text settles.
  Task<ChoiceOutcome> run_choice(RequestContext& ctx, const AdmittedRequest& req, int index, int reported,
                                 RequestGauge& gauge, Responder* stream);

 private:
  Task<std::variant<NodePair, ProtocolError>> acquire_live_nodes(RequestContext& ctx, const AdmittedRequest& req,
                                                                 const SamplingParams& params,
                                                                 const std::set<std::string>& bad_prefill,
                                                                 const std::set<std::string>& bad_decode,
                                                                 int64_t generated, bool after_failure);
  std::optional<FinishReason> ended_by_last_token(const ChoiceRun& run) const;
  Task<GenerateOutcome> run_attempt(RequestContext& ctx, ChoiceRun& run, Attempt& a, int attempt, bool& stalled);
  Task<void> watch_stall(StallClock& clock, const NodePair& nodes, const bool& any_token, AsyncDisaggregatedCall& call);
  Task<bool> stream_stalled(const NodePair& nodes, const bool& any_token);
  Task<bool> node_alive(const NodeAddress& node) { return async_node_alive(node, 1.0, &connections_); }
  bool on_node_event(ChoiceRun& run, Attempt& a, const NodeEvent& e);
  void count_token(ChoiceRun& run, Attempt& a);
  void relay_prompt_logprobs(ChoiceRun& run, const std::vector<SampleResult>& samples);
  bool relay_token(ChoiceRun& run, Attempt& a, const SampleResult& sample);
  void finish_choice(ChoiceRun& run, Attempt& a, FinishReason node_finish);
  Task<bool> exclude_failed_nodes(const NodePair& nodes, std::set<std::string>& bad_prefill,
                                  std::set<std::string>& bad_decode, bool streaming = false);

  const RouterConfig& config_;
  const ServedModel& model_;
  NodeDirectory& nodes_;
  Metrics& metrics_;
  HttpConnectionPool& connections_;
};

}  // namespace hack::server::router
