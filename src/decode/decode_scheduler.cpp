#include "hack/decode/decode_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <variant>

#include <spdlog/spdlog.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "hack/decode/kv_recorder.h"

namespace hack::server {

namespace {
using Clock = std::chrono::steady_clock;
}

struct DecodeScheduler::Request {
  enum class State { waiting, receiving, recomputing, running };

  DecodeRequest req;
  DecodeEventFn on_event;
  State state = State::waiting;
  int seq_id = 0;                 // 0: no KV held
  int reserved_tokens = 0;        // the sequence's current reservation
  std::unique_ptr<Sampler> sampler;
  std::vector<int> generated;
  int next_token = -1;            // input of the next decode step
  Clock::time_point admitted_at;
  // receiving: the KV messages imported so far, the engine time they took, the last one's arrival
  int kv_messages = 0;
  double kv_import_s = 0;
  Clock::time_point first_kv_at, last_kv_at;
  std::unique_ptr<KvRecorder> recorder;  // options_.record_block_tokens > 0
  std::vector<int> recompute;     // recomputing: the tokens whose KV is being recomputed
  size_t recomputed = 0;          // recomputing: of them, run so far
};

struct DecodeScheduler::Command {
  struct Submit {
    DecodeRequest request;
    DecodeEventFn on_event;
  };
  struct Cancel {
    uint64_t id;
  };
  struct KvMessage {
    uint64_t id;
    uint32_t layer;
    KvMessageKind kind;
    std::shared_ptr<const void> owner;  // keeps `bytes` valid
    std::span<const std::byte> bytes;
    std::span<const std::byte> payload() const { return bytes; }
  };
  struct KvComplete {
    uint64_t id;
    SampleResult first;
    uint64_t seed;
  };
  struct KvFailed {
    uint64_t id;
    std::string message;
  };
  std::variant<Submit, Cancel, KvMessage, KvComplete, KvFailed> body;
};

DecodeScheduler::DecodeScheduler(Engine& engine, PagedKv& kv, DecodeSchedulerOptions options)
    : engine_(engine),
      kv_(kv),
      options_(options),
      vocab_(engine.config().vocab_size),
      recompute_budget_(std::max(options.recompute_chunk_tokens, 1)) {
  HACK_CHECK(&engine.kv() == &kv, "DecodeScheduler: the engine must run on the given cache");
  HACK_CHECK(options_.recompute_chunk_tokens >= 0, "recompute_chunk_tokens must not be negative, got {}",
             options_.recompute_chunk_tokens);
  HACK_CHECK(options_.max_batch > 0, "max_batch must be positive, got {}", options_.max_batch);
  HACK_CHECK(options_.reserve_ahead_tokens > 0, "reserve_ahead_tokens must be positive, got {}",
             options_.reserve_ahead_tokens);
  capacity_bytes_ = kv_.stats().bytes_capacity;
  publish_stats();
  thread_ = std::thread([this] { run(); });
}

DecodeScheduler::~DecodeScheduler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Status DecodeScheduler::submit(DecodeRequest request, DecodeEventFn on_event) {
  if (request.prompt.empty()) return Status::error("empty prompt");
  for (int t : request.prompt) {
    if (t < 0 || t >= vocab_) return Status::error(fmt::format("prompt token {} is outside the vocabulary (0..{})", t, vocab_ - 1));
  }
  for (int t : request.generated) {
    if (t < 0 || t >= vocab_) return Status::error(fmt::format("generated token {} is outside the vocabulary (0..{})", t, vocab_ - 1));
  }
  if (request.generated.size() >= static_cast<size_t>(std::max(request.params.max_tokens, 0)))
    return Status::error(fmt::format("{} generated tokens leave nothing to generate under max_tokens {}",
                                     request.generated.size(), request.params.max_tokens));
  try {
    request.params.validate(vocab_);
  } catch (const Error& e) {
    return Status::error(e.what());
  }
  if (request.params.max_tokens < 1) return Status::error("max_tokens must be at least 1");
  const int total = static_cast<int>(request.prompt.size()) + request.params.max_tokens;
  // capacity_bytes_, not kv_.stats(): the cache belongs to the engine thread.
  const size_t capacity = capacity_bytes_;
  if (capacity > 0 && kv_.sequence_bytes(total) > capacity) {
    return Status::error(fmt::format("prompt ({} tokens) + max_tokens ({}) needs {} KV bytes; this node holds {}",
                                     request.prompt.size(), request.params.max_tokens, kv_.sequence_bytes(total),
                                     capacity));
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Status::error("decode node shutting down");
    if (!known_ids_.insert(request.id).second) {
      return Status::error(fmt::format("request {} is already open on this node", request.id));
    }
  }
  post(Command{Command::Submit{std::move(request), std::move(on_event)}});
  return Status::ok();
}

void DecodeScheduler::cancel(uint64_t id) { post(Command{Command::Cancel{id}}); }

void DecodeScheduler::import_kv(uint64_t id, uint32_t layer, KvMessageKind kind, std::span<const std::byte> payload,
                                std::shared_ptr<const void> owner) {
  ++(owner ? kv_in_place_ : kv_copied_);
  if (!owner) {
    std::shared_ptr<std::byte[]> copy = std::make_shared_for_overwrite<std::byte[]>(payload.size());
    if (!payload.empty()) std::memcpy(copy.get(), payload.data(), payload.size());
    payload = {copy.get(), payload.size()};
    owner = std::move(copy);
  }
  post(Command{Command::KvMessage{id, layer, kind, std::move(owner), payload}});
}

void DecodeScheduler::kv_complete(uint64_t id, SampleResult first, uint64_t seed) {
  post(Command{Command::KvComplete{id, std::move(first), seed}});
}

void DecodeScheduler::kv_failed(uint64_t id, const Status& error) {
  post(Command{Command::KvFailed{id, error.message()}});
}

DecodeSchedulerStats DecodeScheduler::stats() const {
  std::lock_guard lock(mutex_);
  DecodeSchedulerStats s = stats_;
  s.kv_messages_in_place = kv_in_place_;
  s.kv_messages_copied = kv_copied_;
  return s;
}

bool DecodeScheduler::wait_idle(double timeout_s) const {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return known_ids_.empty(); });
}

void DecodeScheduler::post(Command command) {
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(std::move(command));
  }
  wake_.notify_one();
}

void DecodeScheduler::run() {
  std::vector<Command> commands;
  for (;;) {
    admit();  // a step may have freed KV for the waiting head
    const bool decodable = std::any_of(running_.begin(), running_.end(), [&](uint64_t id) {
      const Request::State s = requests_.at(id)->state;
      return s == Request::State::running || s == Request::State::recomputing;
    });
    const bool receiving = !running_.empty() && !decodable;
    bool idle_long = false;
    {
      std::unique_lock lock(mutex_);
      if (!decodable && inbox_.empty() && !stopping_) {
        // Nothing to step: sleep until a command arrives (or, with KV outstanding, until
        // the next timeout check; or, after requests, until the node has been idle long
        // enough to trim).
        const auto woken = [&] { return !inbox_.empty() || stopping_; };
        if (receiving) {
          wake_.wait_for(lock, std::chrono::milliseconds(100));
        } else if (trim_due_ && requests_.empty() && options_.idle_trim_s > 0) {
          idle_long = !wake_.wait_for(lock, std::chrono::duration<double>(options_.idle_trim_s), woken);
        } else {
          wake_.wait(lock, woken);
        }
      }
      if (stopping_) break;
      commands.swap(inbox_);
    }
    if (idle_long) trim_idle_memory();
    for (Command& c : commands) handle(c);
    commands.clear();
    expire_kv_waits();
    admit();
    step();
    publish_stats();
  }
  // Shutting down: every open request ends with an error.
  std::vector<uint64_t> ids;
  for (auto& [id, r] : requests_) ids.push_back(id);
  for (uint64_t id : ids) fail(*requests_.at(id), "decode node shutting down");
  publish_stats();
}

void DecodeScheduler::handle(Command& command) {
  std::visit(
      [&](auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Command::Submit>) {
          auto r = std::make_unique<Request>();
          const uint64_t id = c.request.id;
          r->req = std::move(c.request);
          r->generated = r->req.generated;  // a migrated stream continues its output
          r->on_event = std::move(c.on_event);
          requests_.emplace(id, std::move(r));
          waiting_.push_back(id);
          trim_due_ = true;
        } else if constexpr (std::is_same_v<T, Command::Cancel>) {
          if (requests_.contains(c.id)) {
            spdlog::debug("request {}: cancelled", c.id);
            erase(c.id);
          }
        } else {
          auto it = requests_.find(c.id);
          if (it == requests_.end()) return;  // cancelled or ended: late messages are dropped
          Request& r = *it->second;
          if constexpr (std::is_same_v<T, Command::KvFailed>) {
            fail(r, c.message);
          } else if (!r.req.remote_kv || r.state != Request::State::receiving) {
            fail(r, r.state == Request::State::waiting ? "KV arrived before the request was admitted (prefill sent "
                                                          "before the decode node accepted)"
                                                        : "unexpected KV message for a request that is not receiving");
          } else if constexpr (std::is_same_v<T, Command::KvMessage>) {
            if (c.kind == KvMessageKind::exact_copy) {
              // Only for the vault: a bad one costs the vault store, never the request.
              try {
                if (r.recorder) r.recorder->add_exact_message(static_cast<int>(c.layer), c.payload());
              } catch (const Error& e) {
                spdlog::warn("request {}: exact copy dropped: {}", c.id, e.what());
              }
              return;
            }
            try {
              const Clock::time_point t0 = Clock::now();
              import_message(kv_, r.seq_id, static_cast<int>(c.layer), c.kind, c.payload());
              const Clock::time_point t1 = Clock::now();
              if (r.kv_messages++ == 0) r.first_kv_at = t0;
              r.last_kv_at = t1;
              r.kv_import_s += std::chrono::duration<double>(t1 - t0).count();
            } catch (const Error& e) {
              fail(r, fmt::format("bad KV from the prefill node: {}", e.what()));
            }
          } else if constexpr (std::is_same_v<T, Command::KvComplete>) {
            try {
              // A prefill node's static eviction (--kv-keep-*) may have pruned the prompt: every
              // layer then holds the same kept tokens, fewer than the prompt, and new tokens take
              // their positions after the whole prompt (the prompt's length minus what arrived
              // is the tokens dropped). A migrated stream's prompt includes its tokens so far.
              const int prompt = static_cast<int>(r.req.prompt.size() + r.generated.size());
              const int kept = kv_.length(r.seq_id, 0);
              for (int l = 0; l < kv_.shape().num_layers; ++l) {
                const int n = kv_.length(r.seq_id, l);
                HACK_CHECK(n == kept && n > 0 && n <= prompt, "layer {} holds {} tokens of a {}-token prompt (layer 0: {})",
                           l, n, prompt, kept);
              }
              engine_.adopt_sequence(r.seq_id, prompt);
              if (kept < prompt && r.recorder) {  // pruned KV is no conversation prefix for the vault
                kv_.set_append_observer(r.seq_id, nullptr);
                r.recorder.reset();
              }
              r.req.params.seed = c.seed;
              r.sampler = std::make_unique<Sampler>(r.req.params, vocab_, options_.constraints, r.req.eos_ids);
              r.sampler->add_prompt_tokens(r.req.prompt);
              for (int t : r.generated) r.sampler->record_token(t);
              r.sampler->record_token(c.first.token);
              const auto ms_since_accept = [&](Clock::time_point t) {
                return r.kv_messages > 0 ? std::chrono::duration<double, std::milli>(t - r.admitted_at).count() : 0.0;
              };
              spdlog::info("request {}: KV of {} tokens in: {} messages imported in {:.1f} ms; after accept: first "
                           "message {:.1f} ms, last {:.1f} ms, request_done {:.1f} ms",
                           c.id, kept, r.kv_messages, r.kv_import_s * 1e3, ms_since_accept(r.first_kv_at),
                           ms_since_accept(r.last_kv_at),
                           std::chrono::duration<double, std::milli>(Clock::now() - r.admitted_at).count());
              start_decoding(r, c.first);
            } catch (const Error& e) {
              fail(r, fmt::format("incomplete KV from the prefill node: {}", e.what()));
            }
          }
        }
      },
      command.body);
}

int64_t DecodeScheduler::reserve_target(const Request& r, int length) const {
  const int64_t limit = static_cast<int64_t>(r.req.prompt.size()) + r.req.params.max_tokens;
  return std::min<int64_t>(limit, static_cast<int64_t>(length) + options_.reserve_ahead_tokens);
}

void DecodeScheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_batch) {
    Request& r = *requests_.at(waiting_.front());
    if (!admit_one(r)) return;  // FIFO: later requests wait behind the head
  }
}

bool DecodeScheduler::admit_one(Request& r) {
  const uint64_t id = r.req.id;
  // Preempted (it has sampled, so its last token is not yet run through the model) rather than
  // new; a new request may still bring tokens generated elsewhere (a migrated stream).
  const bool recompute = r.sampler != nullptr;
  // Tokens whose KV the sequence will hold right after admission.
  const int length = static_cast<int>(r.req.prompt.size() + r.generated.size()) - (recompute ? 1 : 0);
  const int target = static_cast<int>(reserve_target(r, length + 1));
  const KvCacheStats kv = kv_.stats();
  if (kv.bytes_capacity > 0 && kv_.sequence_bytes(target) > kv.bytes_capacity - kv.bytes_reserved) {
    return false;  // not enough free KV yet
  }
  const int seq = next_seq_id_++;
  waiting_.pop_front();
  try {
    engine_.add_sequence(seq, target);
  } catch (const Error& e) {
    fail(r, fmt::format("cannot open its KV: {}", e.what()));
    return true;
  }
  // A migrated stream's KV is not recorded for the vault: the exact copies prefill sends
  // would start at its last full block of prompt + generated, not of the prompt.
  if (options_.record_block_tokens > 0 && r.req.generated.empty()) {
    if (!r.recorder) {
      const int block = options_.record_block_tokens;
      r.recorder = std::make_unique<KvRecorder>(kv_.shape(), static_cast<int>(r.req.prompt.size()) / block * block);
    }
    kv_.set_append_observer(seq, r.recorder.get());
  }
  running_.push_back(id);
  r.seq_id = seq;
  r.reserved_tokens = target;
  r.admitted_at = Clock::now();
  if (r.req.remote_kv && !r.sampler) {
    r.state = Request::State::receiving;
    r.on_event(DecodeEvent{.kind = DecodeEventKind::accepted});
    return true;
  }
  try {
    std::vector<int> tokens = r.req.prompt;
    tokens.insert(tokens.end(), r.generated.begin(), r.generated.end() - (recompute ? 1 : 0));
    if (recompute && options_.recompute_chunk_tokens > 0 && !engine_.evicts(static_cast<int>(tokens.size()))) {
      r.state = Request::State::recomputing;  // step() runs it piece by piece beside the decode tokens
      r.recompute = std::move(tokens);
      r.recomputed = 0;
      return true;
    }
    engine_.prefill(seq, tokens, logits_);
    if (r.recorder && kv_.length(seq, 0) < engine_.position(seq)) {  // pruned (--kv-keep-*): not recordable
      kv_.set_append_observer(seq, nullptr);
      r.recorder.reset();
    }
    if (recompute) {
      r.state = Request::State::running;
      r.next_token = r.generated.back();
      return true;
    }
    r.sampler = std::make_unique<Sampler>(r.req.params, vocab_, options_.constraints, r.req.eos_ids);
    r.sampler->add_prompt_tokens(r.req.prompt);
    for (int t : r.generated) r.sampler->record_token(t);
    std::span<float> row(logits_.data(), static_cast<size_t>(vocab_));
    suppress_ending_tokens(row, r.req.params, r.req.eos_ids, static_cast<int>(r.generated.size()));
    start_decoding(r, r.sampler->sample(row));
  } catch (const Error& e) {
    fail(r, fmt::format("prefill failed: {}", e.what()));
  }
  return true;
}

void DecodeScheduler::start_decoding(Request& r, const SampleResult& first) {
  r.state = Request::State::running;
  emit_token(r, first);
}

void DecodeScheduler::emit_token(Request& r, const SampleResult& s) {
  r.generated.push_back(s.token);
  DecodeEvent e{.kind = DecodeEventKind::token, .sample = s, .index = static_cast<int>(r.generated.size()) - 1};
  r.on_event(e);
  if (r.sampler->is_stop_token(s.token, r.req.eos_ids)) {
    finish(r, FinishReason::stop);
  } else if (static_cast<int>(r.generated.size()) >= r.req.params.max_tokens) {
    finish(r, FinishReason::length);
  } else {
    r.next_token = s.token;
  }
}

bool DecodeScheduler::grow_or_preempt(Request& r) {
  const int needed = kv_.length(r.seq_id, 0) + 1;  // KV tokens (fewer than the position after a static eviction)
  if (needed <= r.reserved_tokens) return true;
  const int target = static_cast<int>(reserve_target(r, needed));
  for (;;) {
    if (kv_.try_extend_sequence(r.seq_id, target)) {
      r.reserved_tokens = target;
      return true;
    }
    // Preempt the most recently admitted decoding request (possibly r itself).
    Request* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Request& c = *requests_.at(*it);
      if (c.state == Request::State::running) {
        victim = &c;
        break;
      }
    }
    if (victim == nullptr) return false;
    const bool self = victim == &r;
    preempt(*victim);
    if (self) return false;
  }
}

void DecodeScheduler::preempt(Request& victim) {
  spdlog::info("request {}: preempted after {} tokens (KV full); its KV will be recomputed", victim.req.id,
                victim.generated.size());
  engine_.remove_sequence(victim.seq_id);
  victim.seq_id = 0;
  victim.reserved_tokens = 0;
  victim.state = Request::State::waiting;
  running_.erase(std::find(running_.begin(), running_.end(), victim.req.id));
  waiting_.push_front(victim.req.id);
  ++preemptions_;
}

void DecodeScheduler::step() {
  batch_ids_.clear();
  batch_tokens_.clear();
  // Candidates first: growing may preempt, which edits running_.
  std::vector<Request*>& batch = step_batch_;
  batch.clear();
  for (uint64_t id : running_) {
    Request* r = requests_.at(id).get();
    if (r->state == Request::State::running) batch.push_back(r);
  }
  size_t kept = 0;
  for (Request* r : batch) {
    // Skipped: preempted by an earlier grow, or no room to grow this step.
    if (r->state == Request::State::running && grow_or_preempt(*r)) batch[kept++] = r;
  }
  batch.resize(kept);
  // A later grow may have preempted an earlier member.
  std::erase_if(batch, [](Request* r) { return r->state != Request::State::running; });
  // One piece of the oldest recompute rides along (its reservation was made at admission).
  Request* recomputing = nullptr;
  for (uint64_t id : running_) {
    Request* r = requests_.at(id).get();
    if (r->state == Request::State::recomputing) {
      recomputing = r;
      break;
    }
  }
  if (batch.empty() && recomputing == nullptr) return;
  for (Request* r : batch) {
    batch_ids_.push_back(r->seq_id);
    batch_tokens_.push_back(r->next_token);
  }
  Engine::PrefillPiece piece;
  if (recomputing != nullptr) {
    Request& r = *recomputing;
    const int budget = options_.recompute_adaptive ? recompute_budget_.next_piece(static_cast<int>(batch.size()))
                                                   : options_.recompute_chunk_tokens;
    const size_t n = std::min(r.recompute.size() - r.recomputed, static_cast<size_t>(budget));
    piece = {r.seq_id, std::span<const int>(r.recompute).subspan(r.recomputed, n), r.recomputed == 0,
             r.recomputed + n == r.recompute.size()};
  }
  const auto t_step = Clock::now();
  try {
    engine_.step(batch_ids_, batch_tokens_, recomputing ? &piece : nullptr, logits_);
    recompute_budget_.record(std::chrono::duration<double>(Clock::now() - t_step).count(),
                             recomputing ? static_cast<int>(piece.tokens.size()) : 0, static_cast<int>(batch.size()));
  } catch (const Error& e) {
    for (Request* r : batch) fail(*r, fmt::format("decode step failed: {}", e.what()));
    if (recomputing) fail(*recomputing, fmt::format("recompute after preemption failed: {}", e.what()));
    return;
  }
  ++steps_;
  if (options_.test_step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_step_delay_ms));
  if (recomputing != nullptr) {
    Request& r = *recomputing;
    ++recompute_pieces_;
    if (!batch.empty()) ++recompute_pieces_batched_;
    r.recomputed += piece.tokens.size();
    if (piece.last) {  // its KV is whole again: it decodes from the next step on
      r.state = Request::State::running;
      r.next_token = r.generated.back();
      r.recompute = {};
      r.recomputed = 0;
    }
  }
  const size_t vocab = static_cast<size_t>(vocab_);
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *batch[i];
    std::span<float> row(logits_.data() + i * vocab, vocab);
    suppress_ending_tokens(row, r.req.params, r.req.eos_ids, static_cast<int>(r.generated.size()));
    SampleResult s;
    try {
      s = r.sampler->sample(row);
    } catch (const Error& e) {
      // This request's sampling alone failed (e.g. its grammar allows only EOS before
      // min_tokens): the others in the batch go on.
      fail(r, fmt::format("sampling failed: {}", e.what()));
      continue;
    }
    emit_token(r, s);
  }
}

void DecodeScheduler::expire_kv_waits() {
  const auto now = Clock::now();
  std::vector<uint64_t> expired;
  for (uint64_t id : running_) {
    const Request& r = *requests_.at(id);
    if (r.state == Request::State::receiving &&
        std::chrono::duration<double>(now - r.admitted_at).count() > options_.kv_wait_timeout_s) {
      expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    fail(*requests_.at(id), fmt::format("timed out after {} s waiting for KV from the prefill node",
                                        options_.kv_wait_timeout_s));
  }
}

void DecodeScheduler::finish(Request& r, FinishReason reason) {
  DecodeEvent e{.kind = DecodeEventKind::finished,
                .finish_reason = reason,
                .prompt_tokens = static_cast<int>(r.req.prompt.size()),
                .completion_tokens = static_cast<int>(r.generated.size())};
  DecodeEventFn fn = std::move(r.on_event);
  ++finished_;
  if (r.recorder && options_.on_finished_kv && r.seq_id != 0) {
    try {
      options_.on_finished_kv(FinishedKv{r.req.id, r.req.prompt, r.generated, kv_.length(r.seq_id, 0), r.recorder.get()});
    } catch (const std::exception& ex) {
      spdlog::warn("request {}: its KV was not stored: {}", r.req.id, ex.what());
    }
  }
  erase(r.req.id);
  fn(e);
}

void DecodeScheduler::fail(Request& r, const std::string& message) {
  spdlog::warn("request {}: {}", r.req.id, message);
  DecodeEvent e{.kind = DecodeEventKind::failed, .message = message};
  DecodeEventFn fn = std::move(r.on_event);
  ++failed_;
  erase(r.req.id);
  fn(e);
}

void DecodeScheduler::erase(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second->seq_id != 0) engine_.remove_sequence(it->second->seq_id);
  std::erase(waiting_, id);
  std::erase(running_, id);
  requests_.erase(it);
  publish_stats();  // before waking wait_idle, so stats() already shows the request gone
  {
    std::lock_guard lock(mutex_);
    known_ids_.erase(id);
  }
  idle_.notify_all();
}

// Engine thread, no request open: the page pools' free slabs and the allocator's free pages
// (all threads' arenas: KV messages are allocated on the UCX thread, requests on HTTP threads)
// go back to the system. A few milliseconds, off the decode path.
void DecodeScheduler::trim_idle_memory() {
  const size_t kv_bytes = kv_.release_free_slabs();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  trim_due_ = false;
  ++idle_trims_;
  spdlog::debug("decode scheduler: idle, {} KiB of free KV slabs given back", kv_bytes / 1024);
  publish_stats();
}

void DecodeScheduler::publish_stats() {
  DecodeSchedulerStats s;
  for (const auto& [id, r] : requests_) {
    const int64_t remaining = r->req.params.max_tokens - static_cast<int64_t>(r->generated.size());
    if (r->state == Request::State::waiting) {
      ++s.waiting;
      s.queue_tokens += static_cast<int64_t>(r->req.prompt.size()) + remaining;
    } else {
      ++s.running;
      s.queue_tokens += remaining;
    }
  }
  const KvCacheStats kv = kv_.stats();
  s.kv_bytes_reserved = kv.bytes_reserved;
  s.kv_bytes_used = kv.bytes_used;
  s.kv_usage = kv.bytes_capacity > 0 ? static_cast<double>(kv.bytes_reserved) / static_cast<double>(kv.bytes_capacity) : 0;
  s.kv_tokens = kv.tokens;
  s.sequences = kv.sequences;
  s.preemptions = preemptions_;
  s.steps = steps_;
  s.recompute_pieces = recompute_pieces_;
  s.recompute_pieces_batched = recompute_pieces_batched_;
  s.finished = finished_;
  s.failed = failed_;
  s.idle_trims = idle_trims_;
  std::lock_guard lock(mutex_);
  stats_ = s;
}

}  // namespace hack::server
