/// @file decode_scheduler.h
/// @brief Continuous batching for a decode node: one engine thread owns the Engine and its
/// paged KV (either device); requests arrive from I/O threads through a queue, get KV either from a
/// prefill node (messages imported between steps) or by a local prefill, and every running
/// request advances one token per step in one batched forward.
///
/// Memory policy (KV pages):
///   - Admission: FIFO. The head of the waiting queue is admitted when its prompt plus
///     `reserve_ahead_tokens` (capped at its max length) fits in the KV byte budget; later
///     requests wait behind it, so a big request is not starved by small ones.
///   - Growth: a running request's reservation grows by `reserve_ahead_tokens` whenever it
///     is about to pass it.
///   - Preemption (recompute): when a reservation cannot grow, the most recently admitted
///     running request is preempted (it may be the one growing): its pages are freed and it
///     goes back to the front of the waiting queue keeping its sampler and generated tokens;
///     on readmission its KV is recomputed by a local prefill over prompt + generated
///     tokens, and it continues. Requests still receiving KV are never preempted.
///   - A request whose prompt + max_tokens cannot fit in the whole budget is rejected at
///     submission, so some request can always make progress.
///   - Idle trim: once no request has been open for `idle_trim_s`, the free slabs of the page
///     pools and malloc's free pages go back to the system, so RSS follows the load instead of
///     keeping the high-water mark of the busiest burst (pools and allocator arenas only grow).
///     The recompute runs in pieces of `recompute_chunk_tokens`, one per decode step and in
///     the same forward as the running streams' tokens (chunked prefill beside decode), so
///     the streams keep their pace instead of waiting for the whole recompute.
///   Recomputed KV is computed by prefill, not by the decode steps that first produced it,
///   so after a preemption the rounding of later tokens may differ from an unpreempted run
///   (as in vLLM's recompute mode); greedy equality with hack-run holds without preemption.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "hack/backend/engine.h"
#include "hack/decode/recompute_budget.h"
#include "hack/core/error.h"
#include "hack/kv/kv_stream.h"
#include "hack/kv/paged_kv.h"
#include "hack/model/sampler.h"

namespace hack::server {

class KvRecorder;

/// A finished request's KV as the scheduler hands it to on_finished_kv (engine thread, before
/// its pages are freed): the tokens whose KV is stored are prompt + generated minus the last
/// generated token (sampled, never run through the model).
struct FinishedKv {
  uint64_t id = 0;
  std::span<const int> prompt;
  std::span<const int> generated;
  int stored_tokens = 0;
  const KvRecorder* recorder = nullptr;  ///< exact KV from recorder->first_token() on
};

struct DecodeSchedulerOptions {
  int max_batch = 64;               ///< running requests per step at most
  int reserve_ahead_tokens = 64;    ///< reservation step beyond the current length
  double kv_wait_timeout_s = 120;   ///< an admitted request waiting for remote KV fails after this
  int test_step_delay_ms = 0;       ///< tests: sleep this long after each decode step (long streams on a tiny model)
  /// A preempted request's KV is recomputed this many tokens per decode step, batched with
  /// the running streams' tokens; 0 = the whole recompute at once when it is readmitted
  /// (every running stream waits for it). A prompt that static eviction prunes is recomputed
  /// at once. Equal pieces keep every step of the recompute alike: on SmolLM2 (2 cores) the
  /// streams' p99 gap is 1.3× their median with pieces of 16 and the 2K recompute takes 15 s
  /// (bench/RESULTS.md "Decode node: a recompute in pieces").
  int recompute_chunk_tokens = 16;
  /// Pieces of at most recompute_chunk_tokens, fewer when that keeps a step within 2× a plain
  /// decode step (decode/recompute_budget.h, measured as the node runs). Off by default: a
  /// piece's cost is mostly fixed (the step leaves the GEMV path), so the budget shrinks pieces
  /// to one token, the recompute takes ~12× longer and the streams' p99 gap rises to 2.4×
  /// their median (same bench).
  bool recompute_adaptive = false;
  double idle_trim_s = 1.0;         ///< idle this long after requests: free memory back to the system (0 = never)
  /// > 0: keep each sequence's exact KV from its prompt's last full `record_block_tokens`
  /// block on (decode/kv_recorder.h) and hand it to on_finished_kv when the request finishes
  /// (the decode node stores the conversation's new blocks in the vault). Policy: finished
  /// requests only; a preempted request is recomputed, not swapped to the vault.
  int record_block_tokens = 0;
  std::function<void(const FinishedKv&)> on_finished_kv;
  /// Builds requests' grammar constraints (SamplingParams::grammar); null: grammar requests fail.
  const LogitsConstraintFactory* constraints = nullptr;
};

/// A request as the decode node gets it. The caller fills prompt and params; eos_ids are
/// the model's (generation_config.json).
struct DecodeRequest {
  uint64_t id = 0;
  std::vector<int> prompt;
  SamplingParams params;
  std::vector<int> eos_ids;
  /// true: KV and the first token come from a prefill node (import_*, kv_complete);
  /// false: this node prefills the prompt itself.
  bool remote_kv = true;
  /// A migrated stream (GenerateJob::generated): tokens already generated elsewhere. The KV
  /// holds prompt + generated before the next token; they count as this request's output
  /// (max_tokens, min_tokens, penalties, the sampler's step, token indices).
  std::vector<int> generated;
};

enum class DecodeEventKind {
  accepted,  ///< KV reserved: the request's prefill may be sent now (remote KV)
  token,     ///< one generated token (sample)
  finished,  ///< generation ended (finish_reason); no event follows
  failed,    ///< the request failed (message); no event follows
};

struct DecodeEvent {
  DecodeEventKind kind = DecodeEventKind::token;
  SampleResult sample;                       ///< token
  int index = 0;                             ///< token: its index in the completion
  FinishReason finish_reason = FinishReason::length;  ///< finished
  int prompt_tokens = 0;                     ///< finished
  int completion_tokens = 0;                 ///< finished
  std::string message;                       ///< failed
};

/// Runs on the engine thread; must not block.
using DecodeEventFn = std::function<void(const DecodeEvent&)>;

struct DecodeSchedulerStats {
  int running = 0;               ///< admitted: decoding or receiving KV
  int waiting = 0;               ///< not yet admitted (incl. preempted)
  int64_t queue_tokens = 0;      ///< waiting prompts + tokens still to generate, all requests
  double kv_usage = 0;           ///< reserved / capacity bytes (0 when unbounded)
  size_t kv_bytes_reserved = 0;
  size_t kv_bytes_used = 0;      ///< bytes of pages held
  int64_t kv_tokens = 0;         ///< tokens stored in the cache
  int64_t sequences = 0;         ///< sequences open in the cache
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t recompute_pieces = 0;            ///< pieces of recomputes run (recompute_chunk_tokens)
  uint64_t recompute_pieces_batched = 0;    ///< of them, in the same forward as running streams' tokens
  uint64_t finished = 0;
  uint64_t failed = 0;
  uint64_t idle_trims = 0;       ///< times the idle node gave free memory back (idle_trim_s)
  /// KV messages import_kv took with the memory they lie in (copied once, into the cache) and
  /// those it had to copy first (twice in all): the decode side's copies per page.
  uint64_t kv_messages_in_place = 0;
  uint64_t kv_messages_copied = 0;
};

class DecodeScheduler {
 public:
  /// The scheduler takes over `engine` (and its cache, which must be `kv`) on its own
  /// thread; nothing else may touch them until it is destroyed.
  DecodeScheduler(Engine& engine, PagedKv& kv, DecodeSchedulerOptions options = {});
  /// Fails every open request ("decode node shutting down") and joins the thread.
  ~DecodeScheduler();
  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;

  /// Queues a request. Returns an error (and sends no event) if the id is in use or the
  /// request can never fit; otherwise events follow on the engine thread.
  Status submit(DecodeRequest request, DecodeEventFn on_event);
  /// Ends a request early: frees its KV, drops queued KV messages; no further event.
  /// Unknown ids are ignored.
  void cancel(uint64_t id);

  /// KV from a prefill node, in the order it was sent (any thread). `owner`, when given,
  /// keeps the memory `payload` lies in valid (UcxWorker::retain_received_payload: UCX's
  /// receive buffer, shared by the pages of one message) until the engine thread has copied
  /// the payload into the cache, its only copy; otherwise the payload is copied here first.
  void import_kv(uint64_t id, uint32_t layer, KvMessageKind kind, std::span<const std::byte> payload,
                 std::shared_ptr<const void> owner = nullptr);
  /// Every layer has arrived; `first` was sampled by the prefill node with `seed`.
  void kv_complete(uint64_t id, SampleResult first, uint64_t seed);
  /// The transfer failed (bad page, lost prefill node): the request fails with `error`.
  void kv_failed(uint64_t id, const Status& error);

  DecodeSchedulerStats stats() const;
  /// Blocks until no request is open (tests).
  bool wait_idle(double timeout_s) const;

 private:
  struct Request;
  struct Command;

  void post(Command command);
  void run();
  void handle(Command& command);
  void admit();
  bool admit_one(Request& r);
  void step();
  bool grow_or_preempt(Request& r);
  void preempt(Request& victim);
  void finish(Request& r, FinishReason reason);
  void fail(Request& r, const std::string& message);
  void erase(uint64_t id);
  void expire_kv_waits();
  void emit_token(Request& r, const SampleResult& s);
  void start_decoding(Request& r, const SampleResult& first);
  int64_t reserve_target(const Request& r, int length) const;
  void publish_stats();
  void trim_idle_memory();

  Engine& engine_;
  PagedKv& kv_;
  DecodeSchedulerOptions options_;
  int vocab_ = 0;
  size_t capacity_bytes_ = 0;  // the cache's budget (fixed), readable from any thread

  // I/O threads → engine thread.
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;
  std::vector<Command> inbox_;
  bool stopping_ = false;
  std::set<uint64_t> known_ids_;        // ids submitted and not yet ended (guards duplicates)
  std::atomic<uint64_t> kv_in_place_{0}, kv_copied_{0};  // import_kv (any thread)
  DecodeSchedulerStats stats_;          // published copy
  mutable std::condition_variable idle_;

  // Engine thread only.
  std::map<uint64_t, std::unique_ptr<Request>> requests_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;  // admission order
  int next_seq_id_ = 1;
  uint64_t preemptions_ = 0, steps_ = 0, finished_ = 0, failed_ = 0, idle_trims_ = 0;
  uint64_t recompute_pieces_ = 0, recompute_pieces_batched_ = 0;
  bool trim_due_ = false;  // a request arrived since the last idle trim
  std::vector<Request*> step_batch_;  // reused by step(): no allocation once warm
  std::vector<int> batch_ids_, batch_tokens_;
  std::vector<float> logits_;
  RecomputeBudget recompute_budget_;  // recompute_chunk_tokens > 0: piece sizes
  std::thread thread_;
};

}  // namespace hack::server
