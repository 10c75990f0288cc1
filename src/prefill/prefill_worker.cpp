// The prefill node's engine loop (include/hack/prefill/prefill_worker.h).
#include "hack/prefill/prefill_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "hack/core/clock.h"
#include "hack/kv/kv_stream.h"
#include "hack/node/node_protocol.h"

namespace hack::server {

namespace {

// How long the engine thread, with jobs draining and none it may start, waits on the oldest
// drain before it looks at the queue, cancels and the other drains again.
constexpr double kIdlePollS = 0.005;
// How long an ended job waits for UCX to let go of its borrowed pages before the worker moves
// on (the sequence is then freed later), and how often such sequences are looked at again.
constexpr double kReleaseWaitS = 0.5;
// How long shutdown waits for UCX to let go of such pages once their endpoints are closed.
constexpr double kShutdownReleaseS = 5.0;

std::string peer_key(const DecodePeer& peer) {
  return peer.worker_address.empty() ? peer.host + ":" + std::to_string(peer.port) : "worker " + peer.worker_address;
}

void throw_if_failed(const Status& s) {
  if (!s) throw Error(s.message());
}

// The request_done message: the first token in the node protocol's words.
std::vector<std::byte> done_payload(const SampleResult& first, uint64_t seed, int prompt_tokens) {
  const std::string text = to_json(FirstToken{first, seed, prompt_tokens});
  const auto* b = reinterpret_cast<const std::byte*>(text.data());
  return {b, b + text.size()};
}

}  // namespace

PrefillWorker::PrefillWorker(EngineParts engine, net::UcxWorker& ucx, PrefillWorkerOptions options)
    : config_(engine.backend->config()), ucx_(ucx), options_(std::move(options)) {
  HACK_CHECK(options_.send_timeout_s > 0, "prefill worker: send_timeout_s must be positive");
  HACK_CHECK(engine.kv && engine.backend && engine.engine, "prefill worker: an engine with its KV and backend is required");
  kv_ = std::move(engine.kv);
  backend_ = std::move(engine.backend);
  engine_ = std::move(engine.engine);
  HACK_CHECK(options_.send_retries >= 0, "prefill worker: send_retries must not be negative");
  HACK_CHECK(options_.max_draining_jobs >= 0, "prefill worker: max_draining_jobs must not be negative");
  net::KvSenderCallbacks sender_callbacks;
  // A failed send means the transport to that decode node broke, even when UCX has not (yet)
  // failed the endpoint itself: left cached, it would fail every later job to the node.
  sender_callbacks.on_transport_failed = [this](net::EndpointId endpoint, const Status& error) { drop_endpoint(endpoint, error); };
  sender_ = std::make_unique<net::KvSender>(ucx_, std::move(sender_callbacks), options_.sender);
  if (options_.prefix_cache)
    prefix_ = std::make_unique<PrefixCache>(options_.prefix_fingerprint, kv_->shape(), options_.kv.block_tokens,
                                            kv_->exact_dtype(), *options_.prefix_cache, &ucx_);
  disconnect_token_ = ucx_.add_disconnect_handler([this](net::EndpointId endpoint, const Status&) {
    std::lock_guard lock(mutex_);
    std::erase_if(peers_, [&](const auto& entry) { return entry.second == endpoint; });
    lost_endpoints_.push_back(endpoint);
    if (lost_endpoints_.size() > 64) lost_endpoints_.pop_front();
  });
  thread_ = std::thread([this] { run(); });
}

PrefillWorker::~PrefillWorker() {
  std::deque<Queued> left;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (Draining* d : computing_) d->cancelled = true;
    for (const auto& d : draining_) d->cancelled = true;
    left.swap(queue_);
    queued_tokens_ = 0;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();  // after the draining jobs have ended
  // Pages UCX may still read must outlive its sends: close the endpoints of such requests
  // (their sends fail) and wait; if UCX still holds them, the cache is left allocated.
  for (const Unsent& u : unsent_) ucx_.close(u.endpoint);
  for (const Unsent& u : unsent_) {
    if (sender_->wait_request_closed(u.request_id, kShutdownReleaseS)) continue;
    spdlog::error("prefill worker: UCX still holds KV pages of request {} at shutdown; the KV cache is not freed",
                  u.request_id);
    (void)engine_.release();  // the engine refers to the cache
    (void)backend_.release();
    (void)kv_.release();
    break;
  }
  // Before the members its callbacks use (mutex_, peers_) go: ~KvSender unhooks them.
  sender_.reset();
  for (Queued& q : left) {
    if (q.job.on_done) q.job.on_done(q.job.request_id, Status::error("the prefill worker is shutting down"));
  }
  try {
    ucx_.remove_disconnect_handler(disconnect_token_);
  } catch (const std::exception& e) {
    spdlog::error("prefill worker: {}", e.what());
  }
}

Status PrefillWorker::submit(PrefillJob job) {
  const int vocab = config_.vocab_size;
  if (job.tokens.empty()) return Status::error(fmt::format("request {}: empty prompt", job.request_id));
  if (job.generated_tokens < 0 || job.generated_tokens >= static_cast<int>(job.tokens.size()))
    return Status::error(fmt::format("request {}: {} generated tokens after a prompt of {}", job.request_id,
                                     job.generated_tokens, static_cast<int>(job.tokens.size()) - job.generated_tokens));
  for (int t : job.tokens)
    if (t < 0 || t >= vocab)
      return Status::error(fmt::format("request {}: token {} is outside the vocabulary [0, {})", job.request_id, t, vocab));
  try {
    job.sampling.validate(vocab);
  } catch (const Error& e) {
    return Status::error(fmt::format("request {}: {}", job.request_id, e.what()));
  }
  if (!job.peer.endpoint && (job.peer.host.empty() || job.peer.port == 0))
    return Status::error(fmt::format("request {}: no decode peer (endpoint or host:port)", job.request_id));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Status::error("the prefill worker is shutting down");
    const bool known = std::any_of(computing_.begin(), computing_.end(),
                                   [&](const Draining* d) { return d->queued.job.request_id == job.request_id; }) ||
                       std::any_of(draining_.begin(), draining_.end(),
                                   [&](const auto& d) { return !d->reported && d->queued.job.request_id == job.request_id; }) ||
                       std::any_of(queue_.begin(), queue_.end(),
                                   [&](const Queued& q) { return q.job.request_id == job.request_id; });
    if (known) return Status::error(fmt::format("request {} is already queued or running", job.request_id));
    queued_tokens_ += static_cast<int64_t>(job.tokens.size());
    queue_.push_back(Queued{std::move(job), monotonic_s()});
  }
  wake_.notify_one();
  return Status::ok();
}

bool PrefillWorker::cancel(uint64_t request_id) {
  std::optional<Queued> removed;
  {
    std::lock_guard lock(mutex_);
    for (Draining* d : computing_) {
      if (d->queued.job.request_id != request_id) continue;
      d->cancelled = true;  // it stops at its next layer boundary
      return true;
    }
    for (const auto& d : draining_) {
      if (d->settled || d->queued.job.request_id != request_id) continue;
      d->cancelled = true;  // the engine thread sees it at its next look (a layer, or kIdlePollS)
      return true;
    }
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.job.request_id == request_id; });
    if (it == queue_.end()) return false;
    removed = std::move(*it);
    queue_.erase(it);
    queued_tokens_ -= static_cast<int64_t>(removed->job.tokens.size());
    ++stats_.jobs_failed;
  }
  if (removed->job.on_done)
    removed->job.on_done(request_id, Status::error(fmt::format("request {} was cancelled before prefill", request_id)));
  return true;
}

int64_t PrefillWorker::queue_tokens() const {
  std::lock_guard lock(mutex_);
  return queued_tokens_ + computing_tokens_ + draining_tokens_;
}

PrefillWorkerStats PrefillWorker::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void PrefillWorker::drop_endpoint(net::EndpointId endpoint, const Status& reason) {
  bool cached = false;
  {
    std::lock_guard lock(mutex_);
    if (std::find(lost_endpoints_.begin(), lost_endpoints_.end(), endpoint) != lost_endpoints_.end()) return;
    cached = std::erase_if(peers_, [&](const auto& entry) { return entry.second == endpoint; }) > 0;
    lost_endpoints_.push_back(endpoint);
    if (lost_endpoints_.size() > 64) lost_endpoints_.pop_front();
    ++stats_.endpoints_dropped;
  }
  spdlog::warn("prefill: closing decode endpoint {}{}: its transport broke: {}", endpoint,
               cached ? " (the next job to its node connects again)" : "", reason.message());
  ucx_.close(endpoint);  // its other queued sends fail now, not after UCX's own timeout
}

bool PrefillWorker::retryable(const Draining& d) const {
  if (d.queued.job.peer.endpoint || !d.peer || d.cancelled || stopping_) return false;
  if (d.queued.attempt >= options_.send_retries) return false;
  // The transport broke under this job: its endpoint was lost or dropped after a failed send.
  return std::find(lost_endpoints_.begin(), lost_endpoints_.end(), *d.peer) != lost_endpoints_.end();
}

net::EndpointId PrefillWorker::resolve(const DecodePeer& peer) {
  if (peer.endpoint) return *peer.endpoint;
  const std::string key = peer_key(peer);
  {
    std::lock_guard lock(mutex_);
    if (auto it = peers_.find(key); it != peers_.end()) return it->second;
  }
  // Failure arrives as a disconnect. An address UCX cannot use (ucp_ep_create refused it)
  // leaves the listener, which every decode node has.
  std::optional<net::EndpointId> by_address;
  if (!peer.worker_address.empty()) {
    try {
      by_address = ucx_.connect_address(peer.worker_address);
    } catch (const Error& e) {
      spdlog::warn("prefill: cannot connect to decode node {}:{} by its worker address ({}); using its listener",
                   peer.host, peer.port, e.what());
    }
  }
  if (by_address)
    spdlog::info("prefill: KV endpoint {} to decode node {}:{} opened by worker address (same host): {}", *by_address,
                 peer.host, peer.port, ucx_.transports(*by_address));
  const net::EndpointId endpoint = by_address ? *by_address : ucx_.connect(peer.host, peer.port);
  std::lock_guard lock(mutex_);
  ++(by_address ? stats_.connects_by_address : stats_.connects_by_listener);
  // A connect to a node that is restarting can fail before it is cached here; caching it then
  // would fail every later request to that node (seen under chaos: 720 in a row).
  if (std::find(lost_endpoints_.begin(), lost_endpoints_.end(), endpoint) == lost_endpoints_.end()) peers_[key] = endpoint;
  return endpoint;
}

void PrefillWorker::release_unsent() {
  if (unsent_.empty()) return;
  const size_t before = unsent_.size();
  std::erase_if(unsent_, [&](const Unsent& u) {
    if (!sender_->wait_request_closed(u.request_id, 0.0)) return false;
    engine_->remove_sequence(u.seq);
    return true;
  });
  if (unsent_.size() == before) return;
  std::lock_guard lock(mutex_);
  update_kv_stats();
}

void PrefillWorker::update_kv_stats() {
  const KvCacheStats kv = kv_->stats();
  stats_.kv_sequences = kv.sequences;
  stats_.kv_bytes_used = kv.bytes_used;
}

bool PrefillWorker::may_start(const Queued& next, size_t batch_bytes) const {
  const auto holding = std::count_if(draining_.begin(), draining_.end(), [](const auto& d) { return !d->freed; });
  // Nothing to wait for: a cache too small fails the job as before.
  if (holding == 0 && batch_bytes == 0) return true;
  if (holding > options_.max_draining_jobs) return false;
  // Its reservation must fit beside the sequences still draining (which go soon) and the
  // batch's; otherwise it waits for them rather than failing.
  const KvCacheStats kv = kv_->stats();
  return kv.bytes_capacity == 0 ||
         kv.bytes_reserved + batch_bytes + kv_->sequence_bytes(static_cast<int>(next.job.tokens.size())) <= kv.bytes_capacity;
}

bool PrefillWorker::batchable(const Queued& q) const {
  const int n = static_cast<int>(q.job.tokens.size());
  return n <= options_.engine.prefill_chunk_tokens && q.job.sampling.prompt_logprobs < 0 && !engine_->evicts(n);
}

void PrefillWorker::poll_drains(bool may_free) {
  bool erase = false;
  for (const auto& entry : draining_) {  // only this thread changes the list
    Draining& d = *entry;
    const uint64_t id = d.queued.job.request_id;
    if (!d.settled) {
      Status status = d.status;
      bool settled = !status.is_ok();
      if (!settled && d.cancelled) {
        status = Status::error(fmt::format("request {} was cancelled", id));
        settled = true;
      } else if (!settled) {
        // Success only once every message has left (a lost peer fails the job instead).
        const Status s = sender_->wait_request(id, 0.0);
        if (s) {
          settled = true;
        } else if (!sender_->request_pending(id)) {
          // It settled between the two calls (its last message left, or it failed): `s` is
          // the stale "not yet sent", so ask again for the outcome.
          const Status outcome = sender_->wait_request(id, 0.0);
          if (!outcome) {
            const std::string prefix = fmt::format("request {}", id);
            status = Status::error(outcome.message().starts_with(prefix) ? outcome.message()
                                                                         : prefix + ": " + outcome.message());
          }
          settled = true;
        } else if (monotonic_s() > d.t_stored + options_.send_timeout_s) {
          status = Status::error(fmt::format("request {}: KV not sent after {} s ({} bytes)", id,
                                             options_.send_timeout_s, d.result.kv_bytes));
          settled = true;
        }
      }
      if (!settled) continue;
      {
        std::lock_guard lock(mutex_);  // cancel() reads `settled`
        d.settled = true;
      }
      d.status = status;
      d.t_end = monotonic_s();
      d.close_by_s = d.t_end + kReleaseWaitS;
      if (!status.is_ok()) {
        spdlog::warn("prefill: request {} failed: {}", id, status.message());
        if (d.peer) sender_->cancel(*d.peer, id, status.message());
        std::lock_guard lock(mutex_);
        d.retry = retryable(d);
        // Same request id from seq 0 on a new endpoint: the sender must let go of the failed
        // attempt first (its messages on the closed endpoint fail or are dropped).
        if (d.retry) d.close_by_s += options_.retry_wait_s;
      }
    }
    if (!d.reported) {
      // The sequence's pages went out borrowed (send_page_borrowed): they stay until UCX is
      // done with every message of the request — at once on success (every message left) and
      // soon after a broken transport (its sends fail). A decode node that stalls holds them
      // longer: the sequence is then freed later (release_unsent) and the worker goes on.
      const bool must_close = (d.added && d.peer) || d.retry;
      d.closed = !must_close || sender_->wait_request_closed(id, 0.0);
      if (!d.closed && monotonic_s() < d.close_by_s) continue;
      if (d.retry && !d.closed) d.retry = false;
      if (may_free) free_sequence(d);  // before on_done: a caller then sees the cache without it
      report(d);
    }
    if (!d.freed && may_free) free_sequence(d);
    erase = erase || d.freed;
  }
  if (!erase) return;
  std::lock_guard lock(mutex_);
  std::erase_if(draining_, [](const std::unique_ptr<Draining>& d) { return d->reported && d->freed; });
  update_kv_stats();
}

void PrefillWorker::free_sequence(Draining& d) {
  d.freed = true;
  if (!d.added) return;
  if (d.closed) {
    engine_->remove_sequence(d.seq);
    return;
  }
  spdlog::warn("prefill: request {}: UCX still holds some of its KV pages; freed once it lets go", d.queued.job.request_id);
  unsent_.push_back(Unsent{d.queued.job.request_id, d.seq, *d.peer});
}

void PrefillWorker::report(Draining& d) {
  const uint64_t id = d.queued.job.request_id;
  const Status status = d.status;
  if (status.is_ok()) {
    PrefillTimings& tm = d.result.timings;
    tm.drain_s = d.t_end - d.t_stored;
    tm.total_s = d.t_end - d.queued.submitted_s;
    const PrefixRestoreResult& pr = d.result.prefix;
    const size_t tokens = d.queued.job.tokens.size();
    spdlog::info("prefill: request {}: {} tokens ({} restored, {} computed) in {:.1f} ms: queue {:.1f}, setup {:.1f}, "
                 "restore {:.1f} (lookup {:.1f}, vault wait {:.1f}, decode {:.1f}, import {:.1f}; {} blocks' pages kept, tail {} tokens), compute {:.1f}, "
                 "export {:.1f} (of it quantize {:.1f}, handing to the sender {:.1f}), capture {:.1f}, sample {:.1f}, store {:.1f}, drain {:.1f} ms; {} KV bytes in {} messages; "
                 "{} job(s) in its prefill step",
                 id, tokens, pr.tokens, tokens - static_cast<size_t>(pr.tokens), tm.total_s * 1e3, tm.queue_s * 1e3, tm.setup_s * 1e3,
                 pr.restore_s * 1e3, pr.lookup_s * 1e3, pr.vault_wait_s * 1e3, pr.decode_s * 1e3, pr.import_s * 1e3, pr.page_blocks, pr.tail_tokens,
                 tm.compute_s * 1e3, tm.export_s * 1e3, tm.quantize_s * 1e3, tm.send_s * 1e3, tm.capture_s * 1e3, tm.sample_s * 1e3, tm.store_s * 1e3,
                 tm.drain_s * 1e3, d.result.kv_bytes, d.result.kv_messages, d.result.step_jobs);
  }
  PrefillJob job;
  {
    // Book-keeping first, so a caller woken by on_done sees the job gone. `reported` under
    // mutex_: submit() reads it to tell a resubmitted id from one still in flight.
    std::lock_guard lock(mutex_);
    d.reported = true;
    draining_tokens_ -= static_cast<int64_t>(d.queued.job.tokens.size());
    if (d.retry) {
      spdlog::warn("prefill: request {}: sending again on a new endpoint to {}:{} after: {}", id, d.queued.job.peer.host,
                   d.queued.job.peer.port, status.message());
      ++stats_.send_retries;
      queued_tokens_ += static_cast<int64_t>(d.queued.job.tokens.size());
      queue_.push_front(Queued{std::move(d.queued.job), d.queued.submitted_s, d.queued.attempt + 1});
      d.queued.job.request_id = id;  // still named in draining_ until its sequence is freed
      return;
    }
    if (status.is_ok()) {
      ++stats_.jobs_done;
      stats_.kv_bytes_sent += d.result.kv_bytes;
    } else {
      ++stats_.jobs_failed;
    }
    if (d.freed) update_kv_stats();
    job.on_done = std::move(d.queued.job.on_done);
  }
  if (!job.on_done) return;
  if (status.is_ok()) {
    job.on_done(id, std::move(d.result));
  } else {
    job.on_done(id, status);
  }
}

void PrefillWorker::run() {
  for (;;) {
    release_unsent();
    poll_drains(true);
    std::vector<std::unique_ptr<Draining>> batch;  // the job, or a batched step's jobs
    const Draining* oldest = nullptr;  // to wait on when nothing may start
    {
      std::unique_lock lock(mutex_);
      if (stopping_) break;
      if (!queue_.empty() && may_start(queue_.front())) {
        // The head job, and with batch_jobs the short ones right behind it that fit one chunk
        // with it (FIFO: the first that does not fit ends the batch).
        const bool batching = options_.batch_jobs > 1 && batchable(queue_.front());
        size_t batch_bytes = 0;
        int64_t batch_tokens = 0;
        do {
          const auto n = static_cast<int64_t>(queue_.front().job.tokens.size());
          auto d = std::make_unique<Draining>();
          d->queued = std::move(queue_.front());
          queue_.pop_front();
          queued_tokens_ -= n;
          batch_tokens += n;
          batch_bytes += kv_->sequence_bytes(static_cast<int>(n));
          computing_.push_back(d.get());
          batch.push_back(std::move(d));
        } while (batching && !queue_.empty() && static_cast<int>(batch.size()) < options_.batch_jobs &&
                 batchable(queue_.front()) &&
                 batch_tokens + static_cast<int64_t>(queue_.front().job.tokens.size()) <= options_.engine.prefill_chunk_tokens &&
                 may_start(queue_.front(), batch_bytes));
        computing_tokens_ = batch_tokens;
      } else if (!draining_.empty()) {
        oldest = draining_.front().get();
      } else {
        const auto ready = [&] { return stopping_ || !queue_.empty(); };
        if (unsent_.empty()) {
          wake_.wait(lock, ready);
        } else {
          wake_.wait_for(lock, std::chrono::duration<double>(kReleaseWaitS), ready);  // then look at them again
        }
        continue;
      }
    }
    if (oldest != nullptr) {
      // Jobs drain and none may start: wake when the oldest's messages have left (or UCX let
      // go of them), or soon, to see new jobs, cancels and the other drains.
      const uint64_t id = oldest->queued.job.request_id;
      if (oldest->settled) {
        (void)sender_->wait_request_closed(id, kIdlePollS);
      } else {
        (void)sender_->wait_request(id, kIdlePollS);
      }
      continue;
    }
    if (batch.size() == 1) {
      compute(*batch.front());
    } else {
      std::vector<Draining*> jobs;
      for (const auto& d : batch) jobs.push_back(d.get());
      compute_batch(jobs);
    }
    {
      std::lock_guard lock(mutex_);
      computing_.clear();
      computing_tokens_ = 0;
      for (auto& d : batch) {
        draining_tokens_ += static_cast<int64_t>(d->queued.job.tokens.size());
        draining_.push_back(std::move(d));
      }
    }
  }
  // Shutting down: the destructor cancelled the draining jobs; end them.
  for (;;) {
    poll_drains(true);
    if (draining_.empty()) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(kIdlePollS));
  }
}

struct PrefillWorker::Run {
  explicit Run(Draining& job) : d(job) {}
  Draining& d;
  int seq = 0;
  std::optional<Sampler> sampler;
  bool evicting = false;    // static eviction: the KV leaves at the last chunk (sinks excepted)
  bool all_logits = false;  // prompt logprobs: every position's logits
  KvExportCursor cursor;
  int restored = 0;               // tokens restored from the prefix cache
  PrefixJob prefix;               // its restore's pages and its capture (prefix_ set)
  std::span<const int> compute;   // the tokens computed: the prompt after `restored`
  double t_start = 0;
  double export_s = 0, quantize_s = 0, send_s = 0, capture_s = 0;  // summed over layers and chunks
  bool live = true;               // not failed inside a batched step
};

void PrefillWorker::set_failure(Draining& d, const std::exception& e) {
  const std::string what = e.what();
  const std::string prefix = fmt::format("request {}", d.queued.job.request_id);
  d.status = Status::error(what.starts_with(prefix) ? what : prefix + ": " + what);
}

void PrefillWorker::begin_run(Run& r) {
  Draining& d = r.d;
  PrefillJob& job = d.queued.job;
  const uint64_t id = job.request_id;
  r.t_start = monotonic_s();
  const int seq = r.seq = d.seq = next_seq_id_++;
  d.peer = resolve(job.peer);
  engine_->add_sequence(seq, static_cast<int>(job.tokens.size()));
  d.added = true;
  if (job.corrupt_page_for_test) sender_->corrupt_next_page_for_test(id);
  Sampler& sampler = r.sampler.emplace(job.sampling, config_.vocab_size, options_.constraints, job.eos_ids);
  // A migrated stream: the prompt counts as prompt, the generated tail as this sampler's own
  // output (penalties, step), so the next draw is the one the first node pair would have made.
  const size_t prompt_len = job.tokens.size() - static_cast<size_t>(job.generated_tokens);
  sampler.add_prompt_tokens(std::span<const int>(job.tokens).first(prompt_len));
  for (size_t i = prompt_len; i < job.tokens.size(); ++i) sampler.record_token(job.tokens[i]);
  // Static eviction decides which tokens stay only once the prompt's last chunk is done: its
  // KV leaves then (sinks excepted), not as blocks fill.
  r.evicting = engine_->evicts(static_cast<int>(job.tokens.size()));
  if (!r.evicting) r.cursor.prompt_tokens = static_cast<int>(job.tokens.size());  // pages stream as blocks fill
  r.all_logits = job.sampling.prompt_logprobs >= 0;
  d.result.timings.setup_s = monotonic_s() - r.t_start;
  if (prefix_) {
    // Restore the longest cached prefix into the prefill bracket, so the rest of the prompt
    // attends to it exactly as to computed KV; then capture the prompt's new full blocks.
    const std::vector<BlockKey> keys = prefix_->keys(job.tokens);
    int restorable = std::min(static_cast<int>(keys.size()), prefix_->restorable_blocks(job.tokens.size()));
    // With whole_chunks, restore whole prefill chunks only: the rest of the prompt is then
    // computed in the same chunks as without a cache, so its KV and logits are the same bits
    // (GEMMs of other shapes round differently).
    const int block = options_.kv.block_tokens, chunk = options_.engine.prefill_chunk_tokens;
    const int align_blocks = options_.prefix_cache->whole_chunks ? std::lcm(block, chunk) / block : 1;
    restorable = restorable / align_blocks * align_blocks;
    if (r.all_logits) restorable = 0;  // every position's logits are wanted
    kv_->begin_prefill(seq);
    const std::span<const BlockKey> restorable_keys = std::span<const BlockKey>(keys).first(static_cast<size_t>(restorable));
    PrefixRestoreResult rr = prefix_->restore(*kv_, seq, restorable_keys, r.prefix);
    // A kept tail this prompt continues (its own, or an earlier turn's), so that only what
    // is new is computed.
    if (!r.all_logits && restorable == prefix_->restorable_blocks(job.tokens.size()))
      prefix_->restore_tail(*kv_, seq, job.tokens, restorable_keys, rr);
    r.restored = rr.tokens;
    if (r.restored > 0) engine_->adopt_sequence(seq);
    const int restored_blocks = (r.restored - rr.tail_tokens) / options_.kv.block_tokens;
    // The prompt's own tail is captured unless it is the one restored.
    const bool own_tail = r.restored == static_cast<int>(job.tokens.size()) - 1 && rr.tail_tokens > 0;
    prefix_->begin_capture(r.prefix, keys, restored_blocks, static_cast<int>(keys.size()),
                           own_tail ? std::span<const int>() : std::span<const int>(job.tokens));
    // The restored blocks' cached pages (if any) go out as they are, not quantized again.
    r.cursor.known_pages = PrefixCache::known_pages(r.prefix);
    d.result.prefix = std::move(rr);
  }
  r.compute = std::span<const int>(job.tokens).subspan(static_cast<size_t>(r.restored));
}

void PrefillWorker::capture_layer(Run& r, int layer) {
  // The whole prompt, still exact and not yet pruned: a pruned prompt's pages are no
  // prefix of anything, its full blocks before eviction are.
  if (!prefix_) return;
  const double t = monotonic_s();
  prefix_->capture_layer(r.prefix, *kv_, r.seq, layer);
  r.capture_s += monotonic_s() - t;
}

void PrefillWorker::export_layer(Run& r, int layer, bool last_chunk) {
  const uint64_t id = r.d.queued.job.request_id;
  const int seq = r.seq;
  const net::EndpointId peer = *r.d.peer;
  if (r.d.cancelled) fail("request {} was cancelled", id);
  if (r.evicting && !last_chunk) return;
  const double t_layer = monotonic_s();
  double layer_capture_s = 0;  // counted as capture, not export
  const auto l = static_cast<uint32_t>(layer);
  if (last_chunk && options_.send_exact_tail && !r.evicting) {  // a pruned prompt is not recorded
    const int n = kv_->length(seq, layer), from = n / options_.kv.block_tokens * options_.kv.block_tokens;
    if (from < n) throw_if_failed(sender_->send_exact_copy(peer, id, l, encode_exact_tokens(*kv_, seq, layer, from, n - from)));
  }
  if (last_chunk) {
    // What export_layer does first on the last chunk, done here to time it on its own: the
    // blocks left open (a prefix hit's restored tokens, HACK: all of them) are quantized.
    const double t_quantize = monotonic_s();
    kv_->close_pending_blocks(seq, layer, r.cursor.known_pages);
    r.quantize_s += monotonic_s() - t_quantize;
    if (prefix_ && !r.evicting) {  // the closed pages of the prompt's new blocks, for the next hit
      const double t_capture = monotonic_s();
      prefix_->capture_pages(r.prefix, *kv_, seq, layer);
      layer_capture_s = monotonic_s() - t_capture;
      r.capture_s += layer_capture_s;
    }
  }
  hack::export_layer(*kv_, seq, layer, last_chunk, r.cursor, [&](KvMessageKind kind, std::span<const std::byte> payload) {
    const double t_send = monotonic_s();
    if (kind == KvMessageKind::hack_page && r.cursor.payload_in_cache) {
      // A closed HACK page of this sequence: immutable and kept until the sender has let go
      // of the request (below), so UCX reads it in place.
      throw_if_failed(sender_->send_page_borrowed(peer, id, l, payload));
    } else if (kind == KvMessageKind::hack_page) {
      throw_if_failed(sender_->send_page(peer, id, l, payload));  // peeked early into scratch memory
    } else {
      throw_if_failed(sender_->send_exact(peer, id, l, std::vector<std::byte>(payload.begin(), payload.end())));
    }
    r.send_s += monotonic_s() - t_send;
  });
  // A chunk's pages of this layer leave now, not with the next chunk's (layer_done sends
  // what is pending too).
  const double t_flush = monotonic_s();
  throw_if_failed(last_chunk ? sender_->layer_done(peer, id, l) : sender_->flush(peer, id));
  const double t_layer_end = monotonic_s();
  r.send_s += t_layer_end - t_flush;
  r.export_s += t_layer_end - t_layer - layer_capture_s;
}

void PrefillWorker::end_run(Run& r, std::span<float> logits) {
  Draining& d = r.d;
  PrefillJob& job = d.queued.job;
  PrefillResult& result = d.result;
  const double t_prefilled = monotonic_s();
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  if (r.all_logits) {
    result.prompt_logprobs = prompt_logprobs(logits, job.tokens,
                                             static_cast<int>(vocab), job.sampling.prompt_logprobs);
  }
  // The first token, as generate() samples it.
  const std::span<float> row = logits.subspan(r.all_logits ? (job.tokens.size() - 1) * vocab : 0, vocab);
  suppress_ending_tokens(row, job.sampling, job.eos_ids, job.generated_tokens);
  result.first = r.sampler->sample(row);
  result.seed = r.sampler->seed();
  result.prompt_tokens = static_cast<int>(job.tokens.size());
  result.kv_bytes = r.cursor.bytes;
  result.kv_messages = r.cursor.messages;
  throw_if_failed(sender_->request_done(*d.peer, job.request_id, done_payload(result.first, result.seed, result.prompt_tokens)));
  const double t_sampled = monotonic_s();
  if (prefix_) prefix_->finish_capture(r.prefix);
  const double t_stored = monotonic_s();

  d.t_stored = t_stored;
  PrefillTimings& tm = result.timings;
  tm.export_s = r.export_s;
  tm.send_s = r.send_s;
  tm.quantize_s = r.quantize_s;
  tm.capture_s = r.capture_s;
  tm.queue_s = r.t_start - d.queued.submitted_s;
  tm.prefill_s = t_prefilled - r.t_start;
  tm.sample_s = t_sampled - t_prefilled;
  tm.store_s = t_stored - t_sampled;
}

void PrefillWorker::compute(Draining& d) {
  Run r(d);
  try {
    begin_run(r);
    std::vector<float> logits;  // [vocab], or [prompt][vocab] when prompt logprobs are wanted
    const double t_compute = monotonic_s();
    engine_->prefill(r.seq, r.compute, logits, r.all_logits, [&](int layer, bool last_chunk) {
      if (!draining_.empty()) poll_drains(/*may_free=*/false);  // earlier jobs' drains end while this one computes
      export_layer(r, layer, last_chunk);
      if (options_.test_layer_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_layer_delay_ms));
    }, [&](int layer) { capture_layer(r, layer); });
    d.result.timings.compute_s = monotonic_s() - t_compute - r.export_s - r.capture_s;
    end_run(r, logits);
  } catch (const std::exception& e) {
    set_failure(d, e);
  }
}

void PrefillWorker::compute_batch(std::span<Draining* const> jobs) {
  std::vector<std::unique_ptr<Run>> runs;  // stable addresses: cursors point into their PrefixJob
  for (Draining* d : jobs) {
    auto r = std::make_unique<Run>(*d);
    try {
      begin_run(*r);
      runs.push_back(std::move(r));
    } catch (const std::exception& e) {
      set_failure(*d, e);  // fails alone; the others still share the step
    }
  }
  if (runs.empty()) return;
  if (runs.size() > 1) {
    std::lock_guard lock(mutex_);
    ++stats_.batched_steps;
    stats_.batched_jobs += runs.size();
  }
  std::vector<Engine::PrefillItem> items;
  for (const auto& r : runs) items.push_back(Engine::PrefillItem{r->seq, r->compute});
  std::vector<float> logits;  // [runs][vocab]
  const double t_compute = monotonic_s();
  try {
    engine_->prefill_batch(items, logits, [&](int layer) {
      if (!draining_.empty()) poll_drains(/*may_free=*/false);
      // Each job's layer is final here, as in a single prefill's last chunk. One that fails
      // (a cancel, a broken transport) drops out; its rows are still computed with the rest.
      for (const auto& r : runs) {
        if (!r->live) continue;
        try {
          capture_layer(*r, layer);
          export_layer(*r, layer, /*last_chunk=*/true);
        } catch (const std::exception& e) {
          set_failure(r->d, e);
          r->live = false;
        }
      }
      if (options_.test_layer_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_layer_delay_ms));
    });
  } catch (const std::exception& e) {
    for (const auto& r : runs) {
      if (r->live) set_failure(r->d, e);
      r->live = false;
    }
  }
  // The shared forward's time, less every job's export and capture inside it.
  double compute_s = monotonic_s() - t_compute;
  for (const auto& r : runs) compute_s -= r->export_s + r->capture_s;
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  for (size_t i = 0; i < runs.size(); ++i) {
    Run& r = *runs[i];
    if (!r.live) continue;
    r.d.result.timings.compute_s = compute_s;
    r.d.result.step_jobs = static_cast<int>(runs.size());
    try {
      end_run(r, std::span<float>(logits).subspan(i * vocab, vocab));
    } catch (const std::exception& e) {
      set_failure(r.d, e);
    }
  }
}

}  // namespace hack::server
