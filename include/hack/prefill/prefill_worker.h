/// @file prefill_worker.h
/// @brief The prefill node's engine loop: one thread owns an Engine over a paged KV (either device) and
/// runs prefill jobs in FIFO order. Each layer's KV is exported (kv/kv_stream.h) and sent
/// to the job's decode node (net/kv_transfer.h) from the layer callback, so the transfer
/// of layer l overlaps the compute of layers l+1..; then the first token is sampled, sent
/// in request_done's payload, and the job ends once every message has left.
///
/// With PrefillWorkerOptions::batch_jobs > 1, short prompts waiting together are computed in
/// one forward (Engine::prefill_batch), each still exported, sampled and drained as its own job.
///
/// Jobs are pipelined: once job i's compute has ended, its messages drain while the engine
/// thread computes job i+1. A job starts while at most PrefillWorkerOptions::max_draining_jobs
/// earlier ones drain, and only when the cache's byte budget can reserve its sequence beside
/// theirs. The engine thread watches the drains itself (between layers while it computes,
/// waiting on the oldest while it has nothing to start), so no other thread touches the cache:
/// a drain that ends while a job computes is reported at once and its sequence freed once that
/// compute ends. A drain that fails (a lost decode node, a cancel, a timeout) fails that job only.
///
/// request_done payload (JSON): {"token": id, "logprob": lp, "top_logprobs": [[id, lp], ...],
/// "seed": u64, "prompt_tokens": n} — logprob/top_logprobs as SampleResult (0 / [] unless
/// requested). The decode node continues with Sampler{seed}, add_prompt_tokens(prompt),
/// record_token(token), so sampled continuations match one process.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/kv/paged_kv.h"
#include "hack/model/sampler.h"
#include "hack/net/kv_transfer.h"
#include "hack/net/ucx_worker.h"
#include "hack/prefill/prefix_cache.h"

namespace hack::server {

struct PrefillWorkerOptions {
  KvCacheOptions kv;                 ///< the prefill cache (must match the decode node's)
  EngineOptions engine;              ///< prefill chunk size
  net::KvSenderOptions sender;       ///< flow-control window per decode node
  double send_timeout_s = 60.0;      ///< a job fails if its KV has not left by then after prefill
  /// A job whose KV could not be sent because the transport to its decode node broke (a
  /// send failed or the endpoint was lost: a restarted node behind a stale endpoint, a
  /// reset, a timeout) runs again this many times on a freshly connected endpoint before it
  /// fails, so the router's retry on another node pair is the last resort, not the first.
  /// Only for jobs addressed by host:port (DecodePeer::endpoint names a fixed endpoint).
  int send_retries = 1;
  /// Before such a retry: seconds to wait for the failed attempt's messages to be dropped.
  double retry_wait_s = 5.0;
  int test_layer_delay_ms = 0;       ///< fault tests: sleep after each layer (long transfers)
  /// Prefix caching (prefill/prefix_cache.h): set to restore repeated prefixes.
  std::optional<PrefixCacheOptions> prefix_cache;
  KvFingerprint prefix_fingerprint;  ///< what the cached blocks depend on (prefix_fingerprint())
  /// Also send each layer's last partial prompt block as an exact_copy message (kv_stream.h),
  /// so a decode node that stores finished conversations in the vault has those tokens exactly
  /// (hack mode: it otherwise gets the block's first tokens only inside a quantized page).
  bool send_exact_tail = false;
  /// Builds jobs' grammar constraints (SamplingParams::grammar); null: grammar jobs fail.
  const LogitsConstraintFactory* constraints = nullptr;
  /// A job starts its compute only while at most this many earlier jobs' KV is still
  /// draining (each holds its sequence's KV until its last message has left), and only when
  /// the cache's byte budget can reserve its sequence beside theirs. 0: a job starts only
  /// once the previous one has drained (no pipelining).
  int max_draining_jobs = 4;
  /// Up to this many queued short prompts share one forward (a batched prefill step, as
  /// llama.cpp's server and vLLM batch waiting prompts): consecutive jobs at the queue's head
  /// whose prompts each and all together fit one prefill chunk (EngineOptions::
  /// prefill_chunk_tokens), without prompt logprobs or static eviction, and whose sequences the
  /// byte budget holds together. Each job keeps its own restore, capture, export, cancel and
  /// failure; a job that fails or is cancelled inside the step fails alone. 1 (the default):
  /// every job alone, so the cluster's output is hack-run's bit for bit; > 1 rounds a batched
  /// prompt's logits differently in the last bits (GEMMs of other shapes), so its first token
  /// may differ where two candidates are nearly tied (RESULTS "Batched short-prompt prefill").
  int batch_jobs = 1;
};

/// Where a job's KV goes: an endpoint of the worker's UcxWorker, or a decode node's UCX
/// worker address (a node on this host: UCX may then use shared memory), or host:port;
/// connected on first use and reused by later jobs (an endpoint that was lost or on which a
/// send failed is closed and dropped; the next job to that node dials again).
struct DecodePeer {
  std::optional<net::EndpointId> endpoint;
  std::string worker_address;  ///< hex; when set, host:port is not used
  std::string host;
  uint16_t port = 0;
};

struct PrefillTimings {
  double queue_s = 0;     ///< submit → start
  double prefill_s = 0;   ///< start → the last layer's KV handed to the sender (the stages below to compute_s)
  double drain_s = 0;     ///< after sample_s and store_s, until every message of the job had left
  double total_s = 0;     ///< submit → done
  // prefill_s in stages (a prefix hit's restore is in PrefillResult::prefix):
  double setup_s = 0;     ///< decode endpoint resolved, sequence added, sampler primed with the prompt
  double compute_s = 0;   ///< the model over the uncached tail: prefill_s less the rest
  double export_s = 0;    ///< per-layer KV export (restored and computed pages) handed to the sender
  double quantize_s = 0;  ///< of export_s, closing the blocks still open at the last chunk (HACK: quantizing them)
  double send_s = 0;      ///< of export_s, in the sender's calls (send, flush, layer_done); the rest
                          ///< reads pages and packs the exact messages
  double capture_s = 0;   ///< the tail's new full blocks encoded for the prefix cache
  // after prefill_s:
  double sample_s = 0;    ///< logits → first token, request_done handed to the sender
  double store_s = 0;     ///< captured blocks into the local cache and to the vault
};

struct PrefillResult {
  SampleResult first;     ///< the first generated token
  uint64_t seed = 0;      ///< the sampler's seed (the decode node continues with it)
  size_t kv_bytes = 0;    ///< payload bytes of the KV messages
  size_t kv_messages = 0;
  int prompt_tokens = 0;
  std::vector<SampleResult> prompt_logprobs;  ///< when sampling.prompt_logprobs >= 0 (prompt_logprobs())
  PrefixRestoreResult prefix;  ///< what was restored instead of computed
  int step_jobs = 1;           ///< jobs in the forward that computed it (> 1: a batched step, batch_jobs)
  PrefillTimings timings;
};

/// Either the result or why the job failed.
using PrefillOutcome = std::variant<PrefillResult, Status>;

struct PrefillJob {
  uint64_t request_id = 0;         ///< names the request on the wire; unique among live jobs
  std::vector<int> tokens;         ///< the prompt, then generated_tokens already generated (a migrated stream)
  int generated_tokens = 0;        ///< trailing tokens of `tokens` that an earlier node pair generated: the
                                   ///< sampler records them and samples step generated_tokens
  SamplingParams sampling;
  std::vector<int> eos_ids;        ///< the model's EOS ids (for min_tokens)
  DecodePeer peer;
  bool corrupt_page_for_test = false;  ///< fault tests: the first HACK page gets a flipped byte
  /// Runs once per accepted job: on the worker's thread (once the job's sequence is freed,
  /// unless the job's drain ended while another job computed: then at once, and the sequence
  /// goes when that compute ends), or on the thread that calls cancel() / the destructor for a
  /// job still queued then.
  std::function<void(uint64_t request_id, PrefillOutcome outcome)> on_done;
};

struct PrefillWorkerStats {
  uint64_t jobs_done = 0;
  uint64_t jobs_failed = 0;        ///< cancelled ones included
  uint64_t send_retries = 0;       ///< jobs run again on a fresh endpoint after a broken transport
  uint64_t endpoints_dropped = 0;  ///< decode endpoints closed after a failed send or a loss
  uint64_t connects_by_address = 0;   ///< decode endpoints opened by worker address (same host)
  uint64_t connects_by_listener = 0;  ///< decode endpoints opened by host:port
  uint64_t kv_bytes_sent = 0;      ///< KV payload bytes of jobs that succeeded
  uint64_t batched_steps = 0;      ///< forwards that prefilled several jobs together (batch_jobs)
  uint64_t batched_jobs = 0;       ///< the jobs in them
  int64_t kv_sequences = 0;        ///< sequences in the prefill cache after the last job (0: all freed)
  size_t kv_bytes_used = 0;        ///< its bytes then
};

class PrefillWorker {
 public:
  /// Takes over `engine` (its KV, built with options.kv, and the backend over it, on either
  /// device: runtime/model_runtime.h build_engine or make_cpu_engine_parts); ucx and what the
  /// engine was built from (model, thread pool) must outlive the worker. Builds the sender
  /// and starts the engine thread.
  PrefillWorker(EngineParts engine, net::UcxWorker& ucx, PrefillWorkerOptions options);
  /// Fails queued jobs ("shutting down"), lets the running one finish its current layer
  /// and fail likewise, and joins the thread.
  ~PrefillWorker();
  PrefillWorker(const PrefillWorker&) = delete;
  PrefillWorker& operator=(const PrefillWorker&) = delete;

  /// Queues a job. Returns an error (and does not call on_done) for a bad job: empty
  /// prompt, a request id already queued or running, sampling params out of range,
  /// a token outside the vocabulary, no peer.
  Status submit(PrefillJob job);
  /// Cancels a queued job (removed at once), the computing one (it stops at the next layer
  /// boundary) or a draining one (at the engine thread's next look); the receiver is told, the sequence
  /// freed, on_done gets an error. False when no such job is queued, computing or draining.
  bool cancel(uint64_t request_id);

  /// Prompt tokens of queued jobs plus the computing and draining ones (the router's queue
  /// length: a job counts until its reply).
  int64_t queue_tokens() const;
  PrefillWorkerStats stats() const;
  /// The cache (for tests and metrics; touched by the engine thread only while jobs run).
  const PagedKv& kv() const { return *kv_; }

 private:
  struct Queued {
    PrefillJob job;
    double submitted_s = 0;
    int attempt = 0;  ///< runs so far that failed on a broken transport (send_retries)
  };
  /// A job whose compute has ended: its messages drain (or it failed) while later jobs compute.
  /// Engine thread only, but for `cancelled` (cancel() sets it) and the list entry itself
  /// (cancel() and submit() read request ids under mutex_).
  struct Draining {
    Queued queued;
    int seq = 0;
    bool added = false;                   ///< the sequence is in the cache
    std::optional<net::EndpointId> peer;  ///< where its KV went, once resolved
    PrefillResult result;
    Status status;                        ///< the compute's failure, then the drain's
    double t_stored = 0;                  ///< compute, sample and store done
    std::atomic<bool> cancelled{false};
    bool settled = false;     ///< the outcome is known (every message left, or it failed)
    double t_end = 0;         ///< when it settled
    double close_by_s = 0;    ///< settled: how long to wait for UCX to let go of its messages
    bool retry = false;       ///< failed on a broken transport: runs again (send_retries)
    bool closed = false;      ///< UCX let go of every page (else the sequence goes to unsent_)
    bool reported = false;    ///< on_done ran (or the job was queued again)
    bool freed = false;       ///< its sequence is freed (or handed to unsent_)
  };
  void run();
  /// One job's compute in progress (the .cpp): what its layer callbacks and its end share.
  struct Run;
  /// The job's compute: the prefill, its KV handed to the sender, the first token sampled and
  /// request_done queued. A failure is left in d.status.
  void compute(Draining& d);
  /// Several short jobs' computes in one forward (batch_jobs); each as compute() would, each
  /// failure left in its own d.status.
  void compute_batch(std::span<Draining* const> jobs);
  /// compute()'s steps: setup and prefix restore (throws on failure); one layer's capture and
  /// export; the first token sampled from the job's logits (`all`: [prompt][vocab] when prompt
  /// logprobs are wanted, else its last row) and request_done handed to the sender.
  void begin_run(Run& r);
  void capture_layer(Run& r, int layer);
  void export_layer(Run& r, int layer, bool last_chunk);
  void end_run(Run& r, std::span<float> logits);
  /// Leaves the failure in d.status, named by the request.
  static void set_failure(Draining& d, const std::exception& e);
  /// Whether a queued job may share a batched prefill step (batch_jobs).
  bool batchable(const Queued& q) const;
  /// Engine thread: moves every draining job on without waiting — settles it (its messages
  /// left, it failed, was cancelled or timed out), waits for UCX to let go of it (up to a
  /// deadline), reports it (or queues it again) and, with may_free (no forward running), frees
  /// its sequence.
  void poll_drains(bool may_free);
  void free_sequence(Draining& d);
  /// Books the ended job and calls on_done, or queues it again (retry).
  void report(Draining& d);
  /// Whether `next` may start now beside the jobs still draining and, in a batched step, the
  /// `batch_bytes` its earlier jobs reserve (mutex_ held).
  bool may_start(const Queued& next, size_t batch_bytes = 0) const;
  net::EndpointId resolve(const DecodePeer& peer);
  /// Closes an endpoint whose transport broke and forgets it (any thread).
  void drop_endpoint(net::EndpointId endpoint, const Status& reason);
  /// Whether a failed job is worth running again on a fresh endpoint (see send_retries; mutex_ held).
  bool retryable(const Draining& d) const;
  /// Frees the sequences of ended requests whose borrowed pages UCX has now let go of.
  void release_unsent();
  /// Refreshes stats_'s KV fields from the cache (mutex_ held).
  void update_kv_stats();

  const ModelConfig& config_;
  net::UcxWorker& ucx_;
  PrefillWorkerOptions options_;
  std::unique_ptr<PagedKv> kv_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<net::KvSender> sender_;
  std::unique_ptr<PrefixCache> prefix_;  // engine thread only
  int disconnect_token_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  // The computing jobs (one, or a batched step's): cancel() sets their `cancelled`. Owned by
  // the engine thread's run() while they compute.
  std::vector<Draining*> computing_;
  int64_t computing_tokens_ = 0;   // their prompt tokens
  int64_t draining_tokens_ = 0;    // prompt tokens of draining jobs not yet reported
  int64_t queued_tokens_ = 0;
  // Jobs past their compute, oldest first. Changed by the engine thread only, under mutex_ (so
  // cancel() and submit() may read it).
  std::list<std::unique_ptr<Draining>> draining_;
  PrefillWorkerStats stats_;
  std::map<std::string, net::EndpointId> peers_;  // "host:port" → endpoint
  std::deque<net::EndpointId> lost_endpoints_;  // recently lost or dropped (mutex_): never cached again
  int next_seq_id_ = 1;
  // Ended requests UCX still held pages of (a stalled decode node): their sequences are freed
  // by release_unsent once the sender has let go. Engine thread only (then the destructor).
  struct Unsent {
    uint64_t request_id;
    int seq;
    net::EndpointId endpoint;
  };
  std::vector<Unsent> unsent_;
  std::thread thread_;
};

}  // namespace hack::server
