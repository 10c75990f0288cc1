#include "src/router/choice_runner.h"  // first: Asio's coroutine support (http/coro.h)

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace hack::server::router {

// Runs one choice to its end. An attempt that fails before any token is retried once on
// other nodes; one that fails after tokens (node lost, stream broken, stalled) is migrated:
// prompt + the tokens so far go to another node pair, which continues the same stream
// (same seed, sampler step = tokens so far), at most --max-migrations times. The text
// state (detokenizer, stop strings) spans every attempt, so the client sees one stream.
// With `stream`, chunks are sent as text settles.
// `index`: the choice's number within its prompt (its sampling seed); `reported`: its index
// in the response.
Task<ChoiceOutcome> ChoiceRunner::run_choice(RequestContext& ctx, const AdmittedRequest& req, int index, int reported,
                               RequestGauge& gauge, Responder* stream) {
  const CompletionRequest& r = req.request;
  const bool chat = r.endpoint == Endpoint::kChatCompletions;
  ChoiceOutcome out;
  ChoiceRun run{req, gauge, choice_params(req.params, index), ChoiceStream(stream, req.meta, reported, chat), out};
  // A migrated stream draws on its new nodes what it would have drawn on the first pair only
  // with the same seed: pick it here when the client gave none.
  if (!run.params.seed) run.params.seed = random_id();
  out.choice.index = reported;
  if (run.params.logprobs >= 0) out.choice.logprobs.emplace();
  const std::string echo = r.echo && !chat ? req.prompt_text : std::string();
  if (!stream) out.choice.text = echo;
  run.stream.open(echo);

  std::set<std::string> bad_prefill, bad_decode;
  Attempt a{NodePair{}, ChoiceText(model_.tokenizer, r)};
  int retries = 0, migrations = 0;
  for (int attempt = 0;; ++attempt) {
    out.error.reset();  // an earlier attempt's failure is not this one's
    auto nodes = co_await acquire_live_nodes(ctx, req, run.params, bad_prefill, bad_decode,
                                    static_cast<int64_t>(run.generated.size()), attempt > 0);
    if (auto* e = std::get_if<ProtocolError>(&nodes)) {
      out.error = *e;
      if (!run.generated.empty())
        out.error->message = fmt::format("generation failed after {} tokens: {}", run.generated.size(), e->message);
      co_return out;
    }
    a.nodes = std::get<NodePair>(std::move(nodes));
    bool stalled = false;
    const GenerateOutcome g = co_await run_attempt(ctx, run, a, attempt, stalled);
    if (g.status.is_ok()) {
      finish_choice(run, a, g.finish_reason);
      co_return out;
    }
    if (ctx.cancelled()) {
      out.error = internal_error("cancelled");
      co_return out;
    }
    // The stream broke after its last token, before the node said it had finished.
    if (auto finish = ended_by_last_token(run)) {
      finish_choice(run, a, *finish);
      co_return out;
    }
    const std::string why = stalled ? fmt::format("no token for {} s (stalled)", config_.stall_timeout_s)
                                    : g.status.message();
    const bool decode_lost = co_await exclude_failed_nodes(a.nodes, bad_prefill, bad_decode, !run.generated.empty());
    if (run.generated.empty()) {
      if (retries >= std::max(1, config_.max_migrations)) {
        out.error = internal_error(why);
        co_return out;
      }
      ++retries;
      metrics_.count_request_retry(stalled ? "stalled" : "node_failure");
      spdlog::warn("request {}: attempt {} on {} + {} failed before any token: {}", req.meta.id, attempt + 1,
                   a.nodes.prefill_node.name, a.nodes.decode_node.name, why);
    } else {
      if (migrations >= config_.max_migrations) {
        out.error = internal_error(fmt::format("generation failed after {} tokens and {} migrations: {}",
                                               run.generated.size(), migrations, why));
        co_return out;
      }
      ++migrations;
      const char* cause = stalled ? "stalled" : decode_lost ? "node_lost" : "stream_broken";
      metrics_.count_request_migration(cause);
      spdlog::warn("request {}: choice {} migrates after {} tokens ({}: {} + {}: {})", req.meta.id, reported,
                   run.generated.size(), cause, a.nodes.prefill_node.name, a.nodes.decode_node.name, why);
    }
    a.nodes = NodePair{};  // out of the failed nodes' load before the next pick
  }
}

// acquire_nodes for a retry or migration: when the pick falls back to a node excluded as
// failed (no other was free) and it still does not answer, wait for the pool to offer a
// live one (a restarted node, or the health poll dropping the dead one) for up to
// stall_timeout_s (at least 5 s) rather than spend an attempt on a dead node.
Task<std::variant<NodePair, ProtocolError>> ChoiceRunner::acquire_live_nodes(RequestContext& ctx, const AdmittedRequest& req,
                                                               const SamplingParams& params,
                                                               const std::set<std::string>& bad_prefill,
                                                               const std::set<std::string>& bad_decode,
                                                               int64_t generated, bool after_failure) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(5.0f, config_.stall_timeout_s)));
  for (;;) {
    auto nodes = nodes_.acquire(req.prompt, params.max_tokens, bad_prefill, bad_decode, generated);
    if (!after_failure || Clock::now() >= deadline || ctx.cancelled()) co_return nodes;
    if (auto* pair = std::get_if<NodePair>(&nodes)) {
      const bool prefill_ok =
          !bad_prefill.contains(pair->prefill_node.name) || co_await node_alive(pair->prefill_node);
      const bool decode_ok = !bad_decode.contains(pair->decode_node.name) || co_await node_alive(pair->decode_node);
      if (prefill_ok && decode_ok) co_return nodes;
    }
    co_await co_sleep(0.2);
  }
}

// A stream that broke after the token that ended it (max_tokens reached, a stop id or EOS
// sampled) has nothing left to generate: how it finished, or nullopt when it has not.
std::optional<FinishReason> ChoiceRunner::ended_by_last_token(const ChoiceRun& run) const {
  if (run.generated.empty()) return std::nullopt;
  const int last = run.generated.back();
  const auto& stops = run.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), last) != stops.end()) return FinishReason::stop;
  if (!run.params.ignore_eos && std::find(model_.eos_ids.begin(), model_.eos_ids.end(), last) != model_.eos_ids.end())
    return FinishReason::stop;
  if (static_cast<int>(run.generated.size()) >= run.params.max_tokens) return FinishReason::length;
  return std::nullopt;
}

// Generates on the attempt's nodes until the request ends, fails, or a stop string matches.
// Generates on the attempt's nodes until the request ends, fails, stalls (`stalled` set:
// no token for config_.stall_timeout_s and stream_stalled says so) or a stop string matches.
// A migrated stream (run.generated not empty) continues from its tokens so far.
Task<GenerateOutcome> ChoiceRunner::run_attempt(RequestContext& ctx, ChoiceRun& run, Attempt& a, int attempt, bool& stalled) {
  GenerateJob job{random_id(), run.req.prompt, run.params, true};
  job.generated = run.generated;
  if (!run.generated.empty()) job.params.prompt_logprobs = -1;  // the prompt's were relayed with the first token
  GenerateOptions go{config_.secret, config_.request_timeout_s, false};
  AsyncDisaggregatedCall call(a.nodes.prefill_node, a.nodes.decode_node, job, go, &connections_);
  ctx.add(&call);
  spdlog::debug("request {}: choice {} attempt {} on prefill {} + decode {} (node request {}, {} tokens so far)",
                run.req.meta.id, run.out.choice.index, attempt + 1, a.nodes.prefill_node.name,
                a.nodes.decode_node.name, job.request_id, run.generated.size());
  bool any_token = false;
  const auto ex = co_await asio::this_coro::executor;
  StallClock clock(ex);
  if (config_.stall_timeout_s > 0) {
    asio::co_spawn(ex, watch_stall(clock, a.nodes, any_token, call), asio::detached);
  } else {
    clock.done.set();
  }
  GenerateOutcome g = co_await call.run([&](const NodeEvent& e) {
    clock.last = Clock::now();
    // The attempt's first token is sampled by prefill: that node's part is done.
    if (e.kind == NodeEventKind::token && !any_token) {
      any_token = true;
      a.nodes.prefill.release();
    }
    return on_node_event(run, a, e);
  });
  clock.stop = true;
  clock.timer.cancel();
  co_await clock.done.wait();
  stalled = clock.fired;
  ctx.remove(&call);
  co_return g;
}

// The stall watcher of one attempt (StallClock): when no node event has come for
// stall_timeout_s, asks stream_stalled; a stuck stream is marked and its call cancelled.
Task<void> ChoiceRunner::watch_stall(StallClock& clock, const NodePair& nodes, const bool& any_token, AsyncDisaggregatedCall& call) {
  const auto stall = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.stall_timeout_s));
  try {
    while (!clock.stop) {
      if (Clock::now() < clock.last + stall) {
        clock.timer.expires_at(clock.last + stall);
        boost::system::error_code ec;
        co_await clock.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      const Clock::time_point seen = clock.last;
      const bool stuck = co_await stream_stalled(nodes, any_token);
      if (clock.stop) break;
      if (clock.last != seen) continue;  // a token came while the nodes were asked
      if (stuck) {
        clock.fired = true;
        call.cancel();
        break;
      }
      clock.last = Clock::now();  // alive and not stuck: give it another stall_timeout_s
    }
  } catch (const std::exception& e) {
    spdlog::error("stall watcher: {}", e.what());
  }
  clock.done.set();
}

// Whether an attempt silent for stall_timeout_s is stuck: its decode node does not answer
// its health check (hung, e.g. SIGSTOP, or dead), or after a token it is running requests
// yet sent none of ours; before the first token, also when the prefill node does not answer
// (a decode node waiting for KV, or a prefill queue, is not a stall).
Task<bool> ChoiceRunner::stream_stalled(const NodePair& nodes, const bool& any_token) {
  std::optional<NodeHealth> h;
  try {
    h = co_await async_fetch_health(nodes.decode_node, 1.0, &connections_);
  } catch (const std::exception&) {
  }
  if (!h) co_return true;
  if (any_token) co_return h->running > 0;
  co_return !co_await node_alive(nodes.prefill_node);
}

// One event of the decode stream; false stops generation (a stop string matched).
bool ChoiceRunner::on_node_event(ChoiceRun& run, Attempt& a, const NodeEvent& e) {
  if (e.kind == NodeEventKind::accepted) {
    metrics_.observe_request_queue_time_s(seconds_since(run.req.t_arrival));
    return true;
  }
  if (e.kind != NodeEventKind::token) return true;
  if (e.index < static_cast<int>(run.generated.size())) return true;  // relayed before a migration
  run.generated.push_back(e.sample.token);
  count_token(run, a);
  if (!e.prompt_logprobs.empty()) relay_prompt_logprobs(run, e.prompt_logprobs);
  return relay_token(run, a, e.sample);
}

// A token in the metrics and the decode node's load (run_attempt ends the prefill node's
// lease at each attempt's first token).
void ChoiceRunner::count_token(ChoiceRun& run, Attempt& a) {
  const auto now = Clock::now();
  if (run.out.completion_tokens == 0) {
    if (run.gauge.first_token()) metrics_.observe_time_to_first_token_s(seconds_since(run.req.t_arrival));
  } else {
    metrics_.observe_inter_token_latency_s(std::chrono::duration<double>(now - a.last_token).count());
  }
  a.last_token = now;
  ++run.out.completion_tokens;
  metrics_.add_generation_tokens(1);
  a.nodes.decode.set_tokens(static_cast<int64_t>(run.req.prompt.size()) + run.params.max_tokens -
                            run.out.completion_tokens);
}

// echo's logprobs (the prompt's, first token null): a chunk after the echoed text, or the
// head of the whole response's list.
void ChoiceRunner::relay_prompt_logprobs(ChoiceRun& run, const std::vector<SampleResult>& samples) {
  std::vector<PositionLogprobs> lps;
  lps.reserve(samples.size() + 1);
  lps.push_back(PositionLogprobs{model_.tokenizer.decode(std::span<const int>(run.req.prompt).first(1), false), 0.0f, {}, true});
  for (const SampleResult& s : samples) lps.push_back(logprob_entry(model_.tokenizer, s));
  if (run.stream.streaming()) {
    run.stream.send_prompt_logprobs(std::move(lps));
  } else if (run.out.choice.logprobs) {
    run.out.choice.logprobs->insert(run.out.choice.logprobs->begin(), lps.begin(), lps.end());
  }
}

// A token's text and logprobs: sent as a chunk, or kept for the whole response. False once
// a stop string has matched.
bool ChoiceRunner::relay_token(ChoiceRun& run, Attempt& a, const SampleResult& sample) {
  std::optional<std::vector<PositionLogprobs>> lps;
  if (run.params.logprobs >= 0) lps = std::vector<PositionLogprobs>{logprob_entry(model_.tokenizer, sample)};
  ToolParseStep step = a.text.feed(sample.token);
  if (run.stream.streaming()) {
    run.stream.send(std::move(step.content), std::move(lps), std::nullopt, std::move(step.calls));
  } else {
    a.kept += step.content;
    if (lps) run.out.choice.logprobs->push_back(std::move(lps->front()));
  }
  return !a.text.stopped();
}

// The end of a choice whose generation succeeded: the text held back, and why it finished.
void ChoiceRunner::finish_choice(ChoiceRun& run, Attempt& a, FinishReason node_finish) {
  ToolParseStep tail = a.text.finish();
  FinishReason finish =
      a.text.stopped() || node_finish == FinishReason::stop ? FinishReason::stop : FinishReason::length;
  // As vLLM: a choice that called tools and was not cut off finishes with "tool_calls".
  // A named tool_choice finishes with "stop", as OpenAI reports it.
  if (finish == FinishReason::stop && !a.text.tool_calls().empty() && run.req.request.tool_choice_function.empty())
    finish = FinishReason::tool_calls;
  run.out.choice.finish_reason = finish;
  if (run.stream.streaming()) {
    run.stream.send(std::move(tail.content), std::nullopt, finish, std::move(tail.calls));
  } else {
    run.out.choice.text += a.kept + tail.content;
    run.out.choice.tool_calls = a.text.tool_calls();
  }
}

// Retry away from the node at fault. Which one failed is not always clear from the error
// (a dead decode node also fails the prefill job), so ask both: a node that does not
// answer its health check is excluded and its pool told (failures in a row take it out
// of rotation); when both answer, neither is trusted for the retry. After tokens
// (`streaming`) the prefill node's part was done, so only a prefill node that is down is
// excluded. Returns whether the decode node is down.
Task<bool> ChoiceRunner::exclude_failed_nodes(const NodePair& nodes, std::set<std::string>& bad_prefill,
                                std::set<std::string>& bad_decode, bool streaming) {
  const NodeAddress& prefill = nodes.prefill_node;
  const NodeAddress& decode = nodes.decode_node;
  const bool prefill_down = !co_await node_alive(prefill);
  const bool decode_down = !co_await node_alive(decode);
  if (prefill_down) nodes_.prefill_pool().report_failure(prefill.name);
  if (decode_down) nodes_.decode_pool().report_failure(decode.name);
  if (prefill_down || (!decode_down && !streaming)) bad_prefill.insert(prefill.name);
  if (decode_down || !prefill_down || streaming) bad_decode.insert(decode.name);
  co_return decode_down;
}

}  // namespace hack::server::router
