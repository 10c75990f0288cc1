// Continuous batching against the single-sequence reference: every request of a mixed,
// concurrent batch must produce what generate() produces alone; memory pressure must
// preempt and still finish everything; cancellation, timeouts and rejections end requests
// cleanly with the pool back at zero.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/kv/kv_stream.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "hack/decode/decode_scheduler.h"
#include "support/test_support.h"

namespace hack::server {
namespace {

const Model& tiny_model() {
  static const Model model = Model::load((test::source_dir() / "models" / "hack-tiny").string());
  return model;
}


KvCacheOptions kv_options(KvMode mode, size_t capacity_bytes = 0) {
  KvCacheOptions o;
  o.mode = mode;
  o.fp_dtype = DType::bf16;
  o.capacity_bytes = capacity_bytes;
  return o;
}

// One node: a backend, a cache and an engine on a small pool.
struct Node {
  explicit Node(const KvCacheOptions& options)
      : pool(2),
        kv(make_paged_kv_cache(kv_shape(tiny_model().config), options)),
        backend(make_cpu_backend(tiny_model(), pool, *kv)),
        engine(*backend) {}
  ThreadPool pool;
  std::unique_ptr<CpuPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  Engine engine;
};

std::vector<int> prompt_of(int length, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < length; ++i) ids.push_back(((i + 1) * 31 + salt * 7) % 4000 + 10);
  return ids;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

// Greedy, and the sampled token's logprob reported (so it can be compared).
SamplingParams greedy_logprobs(int max_tokens) {
  SamplingParams p = greedy(max_tokens);
  p.logprobs = 0;
  return p;
}

// Collects a request's events.
struct Outcome {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  std::vector<DecodeEventKind> kinds;
  FinishReason reason = FinishReason::length;
  std::string error;
  bool done = false;
};

class Collector {
 public:
  DecodeEventFn sink(uint64_t id) {
    return [this, id](const DecodeEvent& e) {
      std::lock_guard lock(mutex_);
      Outcome& o = outcomes_[id];
      o.kinds.push_back(e.kind);
      if (e.kind == DecodeEventKind::token) {
        o.tokens.push_back(e.sample.token);
        o.logprobs.push_back(e.sample.logprob);
      }
      if (e.kind == DecodeEventKind::finished) {
        o.reason = e.finish_reason;
        o.done = true;
      }
      if (e.kind == DecodeEventKind::failed) {
        o.error = e.message;
        o.done = true;
      }
      if (e.kind == DecodeEventKind::accepted) accepted_cv_.notify_all();
      if (o.done) done_cv_.notify_all();
    };
  }
  bool wait_done(size_t n, double timeout_s) {
    std::unique_lock lock(mutex_);
    return done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
      size_t d = 0;
      for (auto& [id, o] : outcomes_) d += o.done;
      return d >= n;
    });
  }
  bool wait_accepted(uint64_t id, double timeout_s) {
    std::unique_lock lock(mutex_);
    return accepted_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
      auto it = outcomes_.find(id);
      return it != outcomes_.end() && !it->second.kinds.empty() && it->second.kinds[0] == DecodeEventKind::accepted;
    });
  }
  Outcome get(uint64_t id) {
    std::lock_guard lock(mutex_);
    return outcomes_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_, accepted_cv_;
  std::map<uint64_t, Outcome> outcomes_;
};

// One sequence alone on a fresh node: what each request of a scheduler must match.
GenerationResult reference_result(const KvCacheOptions& options, const std::vector<int>& prompt,
                                  const SamplingParams& params, const std::vector<int>& eos_ids) {
  Node ref(options);
  ref.engine.add_sequence(0, static_cast<int>(prompt.size()) + params.max_tokens);
  return generate(ref.engine, 0, prompt, params, eos_ids);
}

std::vector<int> reference(const KvCacheOptions& options, const std::vector<int>& prompt, const SamplingParams& params) {
  return reference_result(options, prompt, params, tiny_model().config.eos_token_ids).tokens;
}

// bits 0: the fp cache (bf16 pages); 2, 4: HACK K and V codes of that width.
KvCacheOptions kv_options_of_bits(int bits) {
  KvCacheOptions o = kv_options(bits == 0 ? KvMode::fp : KvMode::hack);
  if (bits) o.k_bits = o.v_bits = bits;
  return o;
}

TEST_CASE("continuous batching gives each request the single-sequence result", "[server][scheduler]") {
  const std::vector<int> lengths{1, 3, 4, 5, 63, 64, 65, 131, 300, 517};
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    Node node(kv_options(mode));
    Collector events;
    {
      DecodeScheduler scheduler(node.engine, *node.kv, DecodeSchedulerOptions{.max_batch = 6});
      for (size_t i = 0; i < lengths.size(); ++i) {
        DecodeRequest r{.id = i + 1, .prompt = prompt_of(lengths[i], static_cast<int>(i)),
                        .params = greedy(12 + static_cast<int>(i) * 3), .eos_ids = tiny_model().config.eos_token_ids,
                        .remote_kv = false};
        REQUIRE(scheduler.submit(r, events.sink(r.id)).is_ok());
      }
      REQUIRE(events.wait_done(lengths.size(), 120));
      REQUIRE(scheduler.wait_idle(5));
      const DecodeSchedulerStats st = scheduler.stats();
      CHECK(st.finished == lengths.size());
      CHECK(st.sequences == 0);
      CHECK(st.kv_bytes_reserved == 0);
      CHECK(st.queue_tokens == 0);
    }
    for (size_t i = 0; i < lengths.size(); ++i) {
      INFO("request " << i + 1 << " prompt " << lengths[i]);
      const Outcome o = events.get(i + 1);
      REQUIRE(o.error.empty());
      CHECK(o.tokens == reference(kv_options(mode), prompt_of(lengths[i], static_cast<int>(i)),
                                  greedy(12 + static_cast<int>(i) * 3)));
    }
    CHECK(node.kv->stats().bytes_used == 0);
  }
}

TEST_CASE("batched decode: each request's tokens, and its logprobs within rounding, at fp, K2/V2, K4/V4",
          "[server][scheduler]") {
  // A batch of rows runs other matmul kernels than one row (summation order), so logprobs
  // differ from the single sequence's by rounding, in every KV mode; a wrong page, position
  // or mask would move them by far more (and the tokens).
  const std::vector<int> lengths{5, 64, 65, 131, 300, 517};
  for (int bits : {0, 2, 4}) {
    const KvCacheOptions o = kv_options_of_bits(bits);
    INFO("kv " << kv_mode_name(o.mode) << " bits " << bits);
    Node node(o);
    Collector events;
    {
      DecodeScheduler scheduler(node.engine, *node.kv, DecodeSchedulerOptions{.max_batch = 6});
      for (size_t i = 0; i < lengths.size(); ++i) {
        DecodeRequest r{.id = i + 1, .prompt = prompt_of(lengths[i], static_cast<int>(i)),
                        .params = greedy_logprobs(20), .eos_ids = {}, .remote_kv = false};
        REQUIRE(scheduler.submit(r, events.sink(r.id)).is_ok());
      }
      REQUIRE(events.wait_done(lengths.size(), 120));
    }
    double largest = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      INFO("request " << i + 1 << " prompt " << lengths[i]);
      const Outcome out = events.get(i + 1);
      REQUIRE(out.error.empty());
      const GenerationResult g =
          reference_result(o, prompt_of(lengths[i], static_cast<int>(i)), greedy_logprobs(20), {});
      REQUIRE(out.tokens == g.tokens);
      for (size_t k = 0; k < g.samples.size(); ++k)
        largest = std::max<double>(largest, std::fabs(out.logprobs[k] - g.samples[k].logprob));
    }
    INFO("largest |logprob(batched) - logprob(single)| " << largest);
    // Measured 2026-11-29: fp 4.0e-4, K2/V2 1.4e-3, K4/V4 6.1e-4.
    CHECK(largest <= 5e-3);
  }
}

TEST_CASE("an idle node trims its memory once, and requests after the trim are unchanged", "[server][scheduler]") {
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    Node node(kv_options(mode));
    Collector events;
    DecodeScheduler scheduler(node.engine, *node.kv, DecodeSchedulerOptions{.idle_trim_s = 0.05});
    const auto wait_trims = [&](uint64_t n) {
      for (int i = 0; i < 200 && scheduler.stats().idle_trims < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return scheduler.stats().idle_trims;
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(scheduler.stats().idle_trims == 0);  // nothing to give back before any request
    for (uint64_t id = 1; id <= 2; ++id) {
      DecodeRequest r{.id = id, .prompt = prompt_of(200, static_cast<int>(id)), .params = greedy(20),
                      .eos_ids = tiny_model().config.eos_token_ids, .remote_kv = false};
      REQUIRE(scheduler.submit(r, events.sink(id)).is_ok());
      REQUIRE(events.wait_done(id, 60));
      REQUIRE(wait_trims(id) == id);  // one trim after each request, once idle
      CHECK(node.kv->stats().bytes_used == 0);
      // The trimmed pages were handed out again: the stream is still the reference.
      CHECK(events.get(id).tokens == reference(kv_options(mode), prompt_of(200, static_cast<int>(id)), greedy(20)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(scheduler.stats().idle_trims == 2);  // idle without requests: no further trims
  }
}

TEST_CASE("idle_trim_s = 0 never trims", "[server][scheduler]") {
  Node node(kv_options(KvMode::hack));
  Collector events;
  DecodeScheduler scheduler(node.engine, *node.kv, DecodeSchedulerOptions{.idle_trim_s = 0});
  DecodeRequest r{.id = 1, .prompt = prompt_of(40, 1), .params = greedy(5), .eos_ids = tiny_model().config.eos_token_ids,
                  .remote_kv = false};
  REQUIRE(scheduler.submit(r, events.sink(1)).is_ok());
  REQUIRE(events.wait_done(1, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(scheduler.stats().idle_trims == 0);
}

TEST_CASE("remote KV imported between steps continues exactly where prefill stopped", "[server][scheduler]") {
  // fp, K2/V2 and K4/V4 (the default widths): tokens and logprobs bit for bit.
  for (int bits : {0, 2, 4}) {
    const KvCacheOptions options = kv_options_of_bits(bits);
    INFO("kv " << kv_mode_name(options.mode) << " bits " << bits);
    Node decode(options), prefill(options);
    Collector events;
    DecodeScheduler scheduler(decode.engine, *decode.kv, {});
    const std::vector<int> lengths{2, 70, 200};
    uint64_t messages = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const uint64_t id = 100 + i;
      const std::vector<int> prompt = prompt_of(lengths[i], 50 + static_cast<int>(i));
      const SamplingParams params = greedy_logprobs(16);
      REQUIRE(scheduler.submit(DecodeRequest{.id = id, .prompt = prompt, .params = params,
                                             .eos_ids = tiny_model().config.eos_token_ids},
                               events.sink(id))
                  .is_ok());
      REQUIRE(events.wait_accepted(id, 10));
      // The prefill side: compute, export every layer as it finishes, hand the messages over.
      prefill.engine.add_sequence(1, static_cast<int>(prompt.size()) + 1);
      KvExportCursor cursor;
      std::vector<float> logits;
      prefill.engine.prefill(1, prompt, logits, false, [&](int layer, bool last_chunk) {
        export_layer(*prefill.kv, 1, layer, last_chunk, cursor, [&](KvMessageKind kind, std::span<const std::byte> p) {
          // Every other message comes with the memory it lies in (as a UCX receive buffer
          // would): taken as is, not copied; the rest is copied first.
          if (++messages % 2 == 0) {
            auto held = std::make_shared<const std::vector<std::byte>>(p.begin(), p.end());
            const std::span<const std::byte> in_place(*held);
            scheduler.import_kv(id, static_cast<uint32_t>(layer), kind, in_place, std::move(held));
          } else {
            scheduler.import_kv(id, static_cast<uint32_t>(layer), kind, p);
          }
        });
      });
      Sampler sampler(params, tiny_model().config.vocab_size);
      sampler.add_prompt_tokens(prompt);
      const SampleResult first = sampler.sample(logits);
      prefill.engine.remove_sequence(1);
      scheduler.kv_complete(id, first, sampler.seed());
      REQUIRE(events.wait_done(i + 1, 60));
      const Outcome o = events.get(id);
      REQUIRE(o.error.empty());
      const GenerationResult g = reference_result(options, prompt, params, tiny_model().config.eos_token_ids);
      REQUIRE(o.tokens == g.tokens);
      CHECK(first.logprob == g.samples[0].logprob);
      for (size_t k = 0; k < g.samples.size(); ++k) {
        INFO("token " << k);
        CHECK(o.logprobs[k] == g.samples[k].logprob);
      }
    }
    REQUIRE(scheduler.wait_idle(5));
    CHECK(decode.kv->stats().bytes_used == 0);
    CHECK(prefill.kv->stats().bytes_used == 0);
    CHECK(scheduler.stats().kv_messages_in_place == messages / 2);
    CHECK(scheduler.stats().kv_messages_copied == messages - messages / 2);
  }
}

TEST_CASE("a migrated request (prompt + tokens generated elsewhere) continues the same stream", "[server][scheduler]") {
  // The router re-submits prompt + the k tokens already streamed; the node recomputes their KV
  // in one prefill (fp: the same K/V as the decode steps that made them), records them in the
  // sampler (penalties, step) and samples step k with the same seed. Penalties and a seeded
  // draw make a sampler that forgot the k tokens (or restarted at step 0) diverge. top_k keeps
  // the draw away from the dense tail, where ~1e-6 logit differences could flip it.
  SamplingParams penalized = greedy(24);
  penalized.frequency_penalty = 0.8f;
  penalized.presence_penalty = 0.4f;
  SamplingParams seeded = greedy(24);
  seeded.temperature = 0.9f;
  seeded.top_k = 8;
  seeded.seed = 4242;
  seeded.min_tokens = 20;
  const std::vector<int> prompt = prompt_of(37, 9);
  for (const SamplingParams& params : {penalized, seeded}) {
    INFO("temperature " << params.temperature);
    Node ref_node(kv_options(KvMode::fp));
    Collector ref_events;
    std::vector<int> full;
    {
      DecodeScheduler scheduler(ref_node.engine, *ref_node.kv, {});
      REQUIRE(scheduler.submit(DecodeRequest{.id = 1, .prompt = prompt, .params = params,
                                             .eos_ids = tiny_model().config.eos_token_ids, .remote_kv = false},
                               ref_events.sink(1))
                  .is_ok());
      REQUIRE(ref_events.wait_done(1, 60));
      full = ref_events.get(1).tokens;
    }
    REQUIRE(full.size() == 24);
    for (size_t k : {size_t{1}, size_t{7}, size_t{23}}) {
      INFO("migrated after " << k << " tokens");
      Node node(kv_options(KvMode::fp));
      Collector events;
      DecodeScheduler scheduler(node.engine, *node.kv, {});
      DecodeRequest r{.id = 2, .prompt = prompt, .params = params, .eos_ids = tiny_model().config.eos_token_ids,
                      .remote_kv = false};
      r.generated.assign(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k));
      REQUIRE(scheduler.submit(r, events.sink(2)).is_ok());
      REQUIRE(events.wait_done(1, 60));
      const Outcome o = events.get(2);
      REQUIRE(o.error.empty());
      CHECK(o.tokens == std::vector<int>(full.begin() + static_cast<std::ptrdiff_t>(k), full.end()));
      CHECK(o.reason == FinishReason::length);  // max_tokens counts the tokens generated before the move
      REQUIRE(scheduler.wait_idle(5));
      CHECK(node.kv->stats().bytes_used == 0);
    }
  }
  // Nothing left to generate is refused at submission.
  Node node(kv_options(KvMode::fp));
  DecodeScheduler scheduler(node.engine, *node.kv, {});
  DecodeRequest done{.id = 3, .prompt = prompt, .params = greedy(2), .remote_kv = false};
  done.generated = {5, 6};
  CHECK_FALSE(scheduler.submit(done, [](const DecodeEvent&) {}).is_ok());
}

TEST_CASE("KV pressure preempts, recomputes and still finishes every request", "[server][scheduler]") {
  // Room for one and a half of the eight requests' full length: two are admitted (their
  // bf16 open blocks dominate) and the first HACK page either of them adds overflows.
  // Recomputes run in pieces beside the running streams' tokens, or (0) all at once.
  const int chunk = GENERATE(16, 0);
  const bool adaptive = GENERATE(false, true);
  INFO("recompute_chunk_tokens " << chunk << (adaptive ? ", adaptive" : ", fixed"));
  const KvCacheOptions probe = kv_options(KvMode::hack);
  Node sizing(probe);
  const size_t one = sizing.kv->sequence_bytes(64 + 200);
  Node node(kv_options(KvMode::hack, one * 3 / 2));
  Collector events;
  DecodeSchedulerStats st;
  {
    DecodeScheduler scheduler(node.engine, *node.kv,
                              DecodeSchedulerOptions{.reserve_ahead_tokens = 16, .recompute_chunk_tokens = chunk,
                                                     .recompute_adaptive = adaptive});
    for (uint64_t id = 1; id <= 8; ++id) {
      SamplingParams p = greedy(200);
      p.ignore_eos = true;
      REQUIRE(scheduler.submit(DecodeRequest{.id = id, .prompt = prompt_of(64, static_cast<int>(id)), .params = p,
                                             .eos_ids = tiny_model().config.eos_token_ids, .remote_kv = false},
                               events.sink(id))
                  .is_ok());
    }
    REQUIRE(events.wait_done(8, 300));
    REQUIRE(scheduler.wait_idle(5));
    st = scheduler.stats();
  }
  CHECK(st.preemptions > 0);
  CHECK(st.finished == 8);
  if (chunk > 0) {
    CHECK(st.recompute_pieces >= 2 * st.preemptions);  // a recompute of 64+ tokens takes several pieces
  } else {
    CHECK(st.recompute_pieces == 0);
  }
  for (uint64_t id = 1; id <= 8; ++id) {
    const Outcome o = events.get(id);
    INFO("request " << id << ": " << o.error);
    CHECK(o.error.empty());
    CHECK(o.tokens.size() == 200);
    CHECK(o.reason == FinishReason::length);
  }
  CHECK(node.kv->stats().bytes_used == 0);
}

TEST_CASE("a recompute runs in pieces beside a stream that keeps decoding", "[server][scheduler]") {
  // Request 3 is admitted last and preempted when the reservations grow; it is readmitted when
  // request 1 ends, while request 2 (longer) still decodes: its recompute then shares steps
  // with request 2's tokens, and request 2 gets a token every one of those steps.
  // fp pages (64 tokens) make the budget a page count: 8 pages, and three reservations of
  // length + 16 pass it near 48 tokens each, long before request 1 ends at 120.
  Node sizing(kv_options(KvMode::fp));
  const size_t room = sizing.kv->sequence_bytes(64 + 60) + sizing.kv->sequence_bytes(64 + 300);
  Node node(kv_options(KvMode::fp, room));
  Collector events;
  DecodeSchedulerStats st;
  const int max_tokens[] = {120, 300, 200};
  {
    DecodeScheduler scheduler(node.engine, *node.kv,
                              DecodeSchedulerOptions{.reserve_ahead_tokens = 16, .recompute_chunk_tokens = 8});
    for (uint64_t id = 1; id <= 3; ++id) {
      SamplingParams p = greedy(max_tokens[id - 1]);
      p.ignore_eos = true;
      REQUIRE(scheduler.submit(DecodeRequest{.id = id, .prompt = prompt_of(64, static_cast<int>(id)), .params = p,
                                             .eos_ids = tiny_model().config.eos_token_ids, .remote_kv = false},
                               events.sink(id))
                  .is_ok());
    }
    REQUIRE(events.wait_done(3, 300));
    REQUIRE(scheduler.wait_idle(5));
    st = scheduler.stats();
  }
  CHECK(st.preemptions > 0);
  CHECK(st.finished == 3);
  CHECK(st.recompute_pieces_batched > 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    const Outcome o = events.get(id);
    INFO("request " << id << ": " << o.error);
    CHECK(o.error.empty());
    CHECK(static_cast<int>(o.tokens.size()) == max_tokens[id - 1]);
  }
  CHECK(node.kv->stats().bytes_used == 0);
}

TEST_CASE("cancel, timeouts, transfer errors and impossible requests end cleanly", "[server][scheduler]") {
  Node node(kv_options(KvMode::hack, 4 << 20));
  Collector events;
  DecodeScheduler scheduler(node.engine, *node.kv, DecodeSchedulerOptions{.kv_wait_timeout_s = 0.3});
  const auto eos = tiny_model().config.eos_token_ids;

  SECTION("cancel mid-generation: no event after it, KV freed") {
    SamplingParams p = greedy(100000 / 100);
    p.ignore_eos = true;
    REQUIRE(scheduler.submit(DecodeRequest{.id = 1, .prompt = prompt_of(10, 1), .params = p, .eos_ids = eos,
                                           .remote_kv = false},
                             events.sink(1))
                .is_ok());
    for (int i = 0; i < 200 && events.get(1).tokens.size() < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    scheduler.cancel(1);
    REQUIRE(scheduler.wait_idle(5));
    const size_t n = events.get(1).tokens.size();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(events.get(1).tokens.size() == n);
    CHECK(n < 1000);
    CHECK_FALSE(events.get(1).done);
  }
  SECTION("no KV arrives: the request times out") {
    REQUIRE(scheduler.submit(DecodeRequest{.id = 2, .prompt = prompt_of(10, 2), .params = greedy(4), .eos_ids = eos},
                             events.sink(2))
                .is_ok());
    REQUIRE(events.wait_done(1, 10));
    CHECK_THAT(events.get(2).error, Catch::Contains("timed out"));
  }
  SECTION("a failed transfer fails the request") {
    REQUIRE(scheduler.submit(DecodeRequest{.id = 3, .prompt = prompt_of(10, 3), .params = greedy(4), .eos_ids = eos},
                             events.sink(3))
                .is_ok());
    REQUIRE(events.wait_accepted(3, 10));
    scheduler.import_kv(3, 0, KvMessageKind::hack_page, std::vector<std::byte>(17));
    REQUIRE(events.wait_done(1, 10));
    CHECK_THAT(events.get(3).error, Catch::Contains("bad KV"));
  }
  SECTION("completion without every layer's KV fails") {
    REQUIRE(scheduler.submit(DecodeRequest{.id = 4, .prompt = prompt_of(10, 3), .params = greedy(4), .eos_ids = eos},
                             events.sink(4))
                .is_ok());
    REQUIRE(events.wait_accepted(4, 10));
    scheduler.kv_complete(4, SampleResult{.token = 5}, 1);
    REQUIRE(events.wait_done(1, 10));
    CHECK_THAT(events.get(4).error, Catch::Contains("incomplete KV"));
  }
  SECTION("requests that can never fit or reuse an id are refused at once") {
    const Status big = scheduler.submit(
        DecodeRequest{.id = 5, .prompt = prompt_of(10, 3), .params = greedy(1 << 20), .eos_ids = eos}, events.sink(5));
    CHECK_FALSE(big.is_ok());
    CHECK_THAT(big.message(), Catch::Contains("KV bytes"));
    REQUIRE(scheduler.submit(DecodeRequest{.id = 6, .prompt = prompt_of(10, 3), .params = greedy(4), .eos_ids = eos},
                             events.sink(6))
                .is_ok());
    CHECK_FALSE(scheduler.submit(DecodeRequest{.id = 6, .prompt = prompt_of(10, 3), .params = greedy(4), .eos_ids = eos},
                                 events.sink(6))
                    .is_ok());
    CHECK_FALSE(scheduler.submit(DecodeRequest{.id = 7, .prompt = {}, .params = greedy(4)}, events.sink(7)).is_ok());
    CHECK_FALSE(scheduler.submit(DecodeRequest{.id = 8, .prompt = {999999}, .params = greedy(4)}, events.sink(8)).is_ok());
    scheduler.cancel(6);
  }
  REQUIRE(scheduler.wait_idle(10));
  CHECK(scheduler.stats().sequences == 0);
  CHECK(node.kv->stats().bytes_used == 0);
}

}  // namespace
}  // namespace hack::server
