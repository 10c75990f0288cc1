// The prefill worker end to end over real UCX on loopback (TCP): the worker prefills and
// streams each layer; a KvReceiver queues what arrives, and the test thread (the decode
// node) imports it into its own CpuPagedKvCache and decodes greedily from the first token in
// request_done's payload. Output must equal generate() on one engine (hack-run) for fp
// and hack, prompts of mixed lengths; cancel and a lost receiver end jobs with errors and
// give every KV byte back.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_stream.h"
#include "hack/model/config.h"
#include "hack/model/weights.h"
#include "hack/prefill/prefill_worker.h"
#include "unit/net/net_test_util.h"
#include "support/synthetic_model.h"

using namespace hack;
using namespace hack::server;

namespace {

KvCacheOptions kv_options(KvMode mode) { return test::synthetic_kv_options(mode, 32); }

// What the receiver saw, queued for the test thread (callbacks run on the progress thread).
struct Inbox {
  struct Event {
    enum Kind { page, exact, layer_done, done, error } kind;
    uint64_t id = 0;
    uint32_t layer = 0;
    std::vector<std::byte> bytes;
    std::string message;  // of an error
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Event> events;
  std::map<uint64_t, int> seen;  // messages per request

  void push(Event e) {
    std::lock_guard lock(mutex);
    ++seen[e.id];
    events.push_back(std::move(e));
    changed.notify_all();
  }
  net::KvReceiverCallbacks callbacks() {
    net::KvReceiverCallbacks c;
    c.on_page = [this](uint64_t id, uint32_t layer, std::span<const std::byte> b) {
      push({Event::page, id, layer, {b.begin(), b.end()}, {}});
    };
    c.on_exact = [this](uint64_t id, uint32_t layer, std::span<const std::byte> b) {
      push({Event::exact, id, layer, {b.begin(), b.end()}, {}});
    };
    c.on_layer_done = [this](uint64_t id, uint32_t layer) { push({Event::layer_done, id, layer, {}, {}}); };
    c.on_request_done = [this](uint64_t id, std::span<const std::byte> b) {
      push({Event::done, id, 0, {b.begin(), b.end()}, {}});
    };
    c.on_request_error = [this](uint64_t id, const Status& s) { push({Event::error, id, 0, {}, s.message()}); };
    return c;
  }
  // Pops the next event, waiting up to timeout_s.
  std::optional<Event> next(double timeout_s) {
    std::unique_lock lock(mutex);
    if (!changed.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !events.empty(); }))
      return std::nullopt;
    Event e = std::move(events.front());
    events.pop_front();
    return e;
  }
  bool wait_seen(uint64_t id, double timeout_s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return seen[id] > 0; });
  }
};

// Outcomes reported by the worker.
struct Outcomes {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, PrefillOutcome> by_id;
  std::function<void(uint64_t, PrefillOutcome)> callback() {
    return [this](uint64_t id, PrefillOutcome o) {
      std::lock_guard lock(mutex);
      by_id.emplace(id, std::move(o));
      changed.notify_all();
    };
  }
  bool wait(uint64_t id, double timeout_s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return by_id.contains(id); });
  }
  std::string error_of(uint64_t id) {
    std::lock_guard lock(mutex);
    auto it = by_id.find(id);
    if (it == by_id.end() || !std::holds_alternative<Status>(it->second)) return "";
    return std::get<Status>(it->second).message();
  }
};

// A greedy job of `length` random prompt tokens (seeded by its id) for the decode node
// listening on 127.0.0.1:port, reporting to `outcomes`.
PrefillJob greedy_job(uint64_t id, int length, int vocab_size, uint16_t port, Outcomes& outcomes) {
  PrefillJob job;
  job.request_id = id;
  job.tokens = test::random_prompt(length, vocab_size, static_cast<uint32_t>(id));
  job.sampling.temperature = 0.0f;
  job.peer.host = "127.0.0.1";
  job.peer.port = port;
  job.on_done = outcomes.callback();
  return job;
}

// Holds a UCX worker's progress thread (a stalled node) from construction until let_go() or
// destruction, so a failed REQUIRE never leaves it held.
class ProgressHold {
 public:
  explicit ProgressHold(net::UcxWorker& worker)
      : thread_([this, &worker] {
          worker.run_on_worker([this] {
            std::unique_lock lock(mutex_);
            held_ = true;
            changed_.notify_all();
            changed_.wait(lock, [&] { return release_; });
          });
        }) {}
  ~ProgressHold() { let_go(); }
  ProgressHold(const ProgressHold&) = delete;
  ProgressHold& operator=(const ProgressHold&) = delete;

  // Whether the progress thread is held now (waits up to timeout_s for it).
  bool wait_held(double timeout_s) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return held_; });
  }
  // Lets the progress thread go on and waits until it has.
  void let_go() {
    {
      std::lock_guard lock(mutex_);
      release_ = true;
      changed_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false, release_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The decode node's side: adopts `seq` (its KV imported) and decodes greedily from the first
// token until `n` tokens, the first included.
std::vector<int> continue_greedy(Engine& decode, int seq, int first, int n) {
  decode.adopt_sequence(seq);
  std::vector<int> tokens = {first};
  std::vector<float> logits;
  while (static_cast<int>(tokens.size()) < n) {
    const int token = tokens.back();
    decode.decode(std::span<const int>(&seq, 1), std::span<const int>(&token, 1), logits);
    tokens.push_back(static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  return tokens;
}

struct Fixture {
  ModelConfig cfg = test::small_synthetic_config();
  Model model = Model::synthetic(cfg, 99);
  ThreadPool prefill_pool{1}, decode_pool{1};
  KvShape shape = kv_shape(cfg);
};

}  // namespace

TEST_CASE("prefill worker: prefill here + decode there equals one engine", "[server][prefill]") {
  Fixture f;
  const int new_tokens = 12;
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    const KvCacheOptions o = kv_options(mode);
    Inbox inbox;
    net::UcxWorker rx_worker(net::test::options_for("tcp")), tx_worker(net::test::options_for("tcp"));
    net::KvReceiver receiver(rx_worker, inbox.callbacks());
    const uint16_t port = rx_worker.listen("127.0.0.1", 0);
    PrefillWorkerOptions wo;
    wo.kv = o;
    wo.engine.prefill_chunk_tokens = 64;
    Outcomes outcomes;
    PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);

    // The decode node: its cache, one sequence per request, opened before the KV arrives.
    CpuPagedKvCache decode_kv(f.shape, o);
    const std::vector<int> lengths = {1, 5, 37, 64, 200, 700};
    std::map<uint64_t, std::vector<int>> prompts;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const uint64_t id = 1000 + i;
      prompts[id] = test::random_prompt(lengths[i], f.cfg.vocab_size, static_cast<uint32_t>(i));
      decode_kv.add_sequence(static_cast<int>(id), lengths[i] + new_tokens);
      PrefillJob job;
      job.request_id = id;
      job.tokens = prompts[id];
      job.sampling.temperature = 0.0f;
      job.sampling.max_tokens = new_tokens;
      job.sampling.logprobs = i == 2 ? 3 : -1;
      job.eos_ids = f.cfg.eos_token_ids;
      job.peer.host = "127.0.0.1";
      job.peer.port = port;
      job.on_done = outcomes.callback();
      REQUIRE(worker.submit(std::move(job)).is_ok());
    }
    CHECK(worker.queue_tokens() > 0);
    // A duplicate id and a bad job are refused at submit.
    PrefillJob dup;
    dup.request_id = 1005;
    dup.tokens = {1, 2};
    dup.peer.host = "127.0.0.1";
    dup.peer.port = port;
    CHECK_THAT(worker.submit(dup).message(), Catch::Contains("already queued or running"));
    dup.request_id = 77;
    dup.tokens = {f.cfg.vocab_size};
    CHECK_THAT(worker.submit(dup).message(), Catch::Contains("outside the vocabulary"));

    // Apply what arrives, in order, until every request is done.
    std::map<uint64_t, nlohmann::json> done;
    while (done.size() < lengths.size()) {
      auto e = inbox.next(net::test::kWaitS);
      REQUIRE(e.has_value());
      const int seq = static_cast<int>(e->id);
      switch (e->kind) {
        case Inbox::Event::page: import_message(decode_kv, seq, static_cast<int>(e->layer), KvMessageKind::hack_page, e->bytes); break;
        case Inbox::Event::exact: import_message(decode_kv, seq, static_cast<int>(e->layer), KvMessageKind::exact, e->bytes); break;
        case Inbox::Event::layer_done:
          CHECK(decode_kv.length(seq, static_cast<int>(e->layer)) == static_cast<int>(prompts[e->id].size()));
          break;
        case Inbox::Event::done:
          done[e->id] = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size()));
          break;
        case Inbox::Event::error: FAIL("request " << e->id << ": " << e->message);
      }
    }
    for (const auto& [id, prompt] : prompts) REQUIRE(outcomes.wait(id, net::test::kWaitS));

    const std::unique_ptr<Backend> decode_backend = make_cpu_backend(f.model, f.decode_pool, decode_kv);
    Engine decode(*decode_backend);
    for (const auto& [id, prompt] : prompts) {
      INFO("request " << id << ", " << prompt.size() << " prompt tokens");
      const auto& outcome = outcomes.by_id.at(id);
      REQUIRE(std::holds_alternative<PrefillResult>(outcome));
      const PrefillResult& r = std::get<PrefillResult>(outcome);
      const nlohmann::json& j = done.at(id);
      CHECK(j["token"].get<int>() == r.first.token);
      CHECK(j["seed"].get<uint64_t>() == r.seed);
      CHECK(j["prompt_tokens"].get<int>() == static_cast<int>(prompt.size()));
      CHECK(r.kv_bytes > 0);

      // hack-run: generate() on one engine and one cache.
      CpuPagedKvCache ref_kv(f.shape, o);
      const std::unique_ptr<Backend> ref_backend = make_cpu_backend(f.model, f.decode_pool, ref_kv);
      Engine ref(*ref_backend);
      ref.add_sequence(1, static_cast<int>(prompt.size()) + new_tokens);
      SamplingParams sp;
      sp.temperature = 0.0f;
      sp.max_tokens = new_tokens;
      sp.ignore_eos = true;
      sp.logprobs = id == 1002 ? 3 : -1;
      const GenerationResult expected = generate(ref, 1, prompt, sp, {});

      // The decode node: continue from the first token.
      const int seq = static_cast<int>(id);
      CHECK(continue_greedy(decode, seq, j["token"].get<int>(), new_tokens) == expected.tokens);
      if (id == 1002) {
        CHECK(j["logprob"].get<float>() == expected.samples[0].logprob);
        REQUIRE(j["top_logprobs"].size() == 3);
        for (size_t k = 0; k < 3; ++k) {
          CHECK(j["top_logprobs"][k][0].get<int>() == expected.samples[0].top_logprobs[k].token);
          CHECK(j["top_logprobs"][k][1].get<float>() == expected.samples[0].top_logprobs[k].logprob);
        }
      }
      decode.remove_sequence(seq);
    }
    CHECK(decode_kv.stats().bytes_used == 0);
    CHECK(worker.kv().stats().bytes_used == 0);
    CHECK(worker.kv().stats().sequences == 0);
    CHECK(worker.queue_tokens() == 0);
    const PrefillWorkerStats st = worker.stats();
    CHECK(st.jobs_done == lengths.size());
    CHECK(st.jobs_failed == 0);
    CHECK(st.kv_bytes_sent > 0);
    CHECK(receiver.open_requests() == 0);
  }
}

TEST_CASE("prefill worker: cancel a queued and a running job", "[server][prefill]") {
  Fixture f;
  Inbox inbox;
  net::UcxWorker rx_worker(net::test::options_for("tcp")), tx_worker(net::test::options_for("tcp"));
  net::KvReceiver receiver(rx_worker, inbox.callbacks());
  const uint16_t port = rx_worker.listen("127.0.0.1", 0);
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::hack);
  wo.engine.prefill_chunk_tokens = 64;
  Outcomes outcomes;
  PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);
  auto job_of = [&](uint64_t id, int length) { return greedy_job(id, length, f.cfg.vocab_size, port, outcomes); };
  REQUIRE(worker.submit(job_of(1, 3500)).is_ok());  // 55 chunks: long enough to be caught running
  REQUIRE(worker.submit(job_of(2, 100)).is_ok());
  CHECK(worker.queue_tokens() == 3600);
  CHECK(worker.cancel(2));  // still queued
  REQUIRE(outcomes.wait(2, 1.0));
  CHECK_THAT(outcomes.error_of(2), Catch::Contains("cancelled before prefill"));
  CHECK(worker.queue_tokens() == 3500);
  REQUIRE(inbox.wait_seen(1, net::test::kWaitS));  // job 1 is streaming
  CHECK(worker.cancel(1));
  CHECK_FALSE(worker.cancel(12345));
  REQUIRE(outcomes.wait(1, net::test::kWaitS));
  CHECK_THAT(outcomes.error_of(1), Catch::Contains("cancelled"));
  // The receiver hears of it; the prefill cache is empty again.
  bool receiver_told = false;
  while (auto e = inbox.next(net::test::kWaitS)) {
    if (e->kind == Inbox::Event::error && e->id == 1) {
      CHECK_THAT(e->message, Catch::Contains("cancelled by the sender"));
      receiver_told = true;
      break;
    }
    REQUIRE(e->kind != Inbox::Event::done);
  }
  CHECK(receiver_told);
  CHECK(worker.kv().stats().bytes_used == 0);
  CHECK(worker.kv().stats().sequences == 0);
  CHECK(worker.queue_tokens() == 0);
  CHECK(worker.stats().jobs_failed == 2);
  CHECK(worker.stats().jobs_done == 0);

  // The worker goes on serving.
  REQUIRE(worker.submit(job_of(3, 50)).is_ok());
  REQUIRE(outcomes.wait(3, net::test::kWaitS));
  CHECK(std::holds_alternative<PrefillResult>(outcomes.by_id.at(3)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // late stragglers of job 1 are dropped
  CHECK(receiver.open_requests() == 0);
}

TEST_CASE("prefill worker: losing the decode node fails the job and frees its KV", "[server][prefill]") {
  Fixture f;
  Inbox inbox;
  auto rx_worker = std::make_unique<net::UcxWorker>(net::test::options_for("tcp"));
  net::UcxWorker tx_worker(net::test::options_for("tcp"));
  auto receiver = std::make_unique<net::KvReceiver>(*rx_worker, inbox.callbacks());
  const uint16_t port = rx_worker->listen("127.0.0.1", 0);
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::fp);
  wo.engine.prefill_chunk_tokens = 64;
  // No second attempt: it would dial the port of a receiver being torn down, whose worker may
  // still accept it for a moment and drop its messages unread (UCX: no handler for the id) or
  // fail them ("Invalid parameter" for a rendezvous one), so the outcome would depend on timing
  // (CI under ASan once aborted after such an attempt). The retry has its own test below.
  wo.send_retries = 0;
  Outcomes outcomes;
  PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);
  PrefillJob job;
  job.request_id = 5;
  job.tokens = test::random_prompt(3500, f.cfg.vocab_size, 5);
  job.sampling.temperature = 0.0f;
  job.peer.host = "127.0.0.1";
  job.peer.port = port;
  job.on_done = outcomes.callback();
  REQUIRE(worker.submit(std::move(job)).is_ok());
  REQUIRE(inbox.wait_seen(5, net::test::kWaitS));
  receiver.reset();
  rx_worker.reset();
  REQUIRE(outcomes.wait(5, 120.0));
  const std::string error = outcomes.error_of(5);
  INFO(error);
  // Either the endpoint's failure or a send that failed on it ends the job; both say so.
  CHECK_THAT(error, Catch::StartsWith("request 5") && Catch::Contains("lost the receiver"));
  CHECK(worker.kv().stats().bytes_used == 0);
  CHECK(worker.kv().stats().sequences == 0);
  CHECK(worker.stats().jobs_failed == 1);
  CHECK(worker.stats().send_retries == 0);
}

TEST_CASE("prefill worker: pages a stalled decode node still holds are freed once UCX lets go, and the worker goes on",
          "[server][prefill]") {
  Fixture f;
  Inbox inbox_a, inbox_b;
  net::UcxWorker rx_a(net::test::options_for("tcp")), rx_b(net::test::options_for("tcp"));
  net::KvReceiver receiver_a(rx_a, inbox_a.callbacks()), receiver_b(rx_b, inbox_b.callbacks());
  const uint16_t port_a = rx_a.listen("127.0.0.1", 0), port_b = rx_b.listen("127.0.0.1", 0);
  net::UcxWorker tx_worker(net::test::options_for("tcp"));
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::hack);  // closed HACK pages leave borrowed from the cache
  wo.engine.prefill_chunk_tokens = 64;
  wo.send_timeout_s = 1.0;  // the job gives up on a node that takes nothing
  Outcomes outcomes;
  PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);
  auto job_of = [&](uint64_t id, uint16_t port) { return greedy_job(id, 1500, f.cfg.vocab_size, port, outcomes); };

  // Node A is stalled (its progress thread held) before the job dials it.
  ProgressHold hold(rx_a);
  REQUIRE(hold.wait_held(net::test::kWaitS));
  // The job fails (its KV never leaves) while UCX still holds its pages for A.
  REQUIRE(worker.submit(job_of(1, port_a)).is_ok());
  REQUIRE(outcomes.wait(1, net::test::kWaitS));
  CHECK_THAT(outcomes.error_of(1), Catch::Contains("not sent"));
  CHECK(worker.stats().kv_sequences == 1);  // its pages are not freed under a send

  // The worker serves the next job meanwhile.
  REQUIRE(worker.submit(job_of(2, port_b)).is_ok());
  REQUIRE(outcomes.wait(2, net::test::kWaitS));
  CHECK(std::holds_alternative<PrefillResult>(outcomes.by_id.at(2)));

  // A resumes: UCX lets go of the pages and the worker frees the sequence on its own.
  hold.let_go();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (worker.stats().kv_sequences != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(worker.stats().kv_sequences == 0);
  CHECK(worker.stats().kv_bytes_used == 0);
}

namespace {

// Every KV message of one request as the receiver got it, in order: (kind, layer, bytes).
using Messages = std::vector<std::tuple<int, uint32_t, std::vector<std::byte>>>;

// Runs `prompts` through a worker with `wo` (in order, one at a time) and returns what the
// receiver got for each, plus the worker's results.
std::pair<std::vector<Messages>, std::vector<PrefillResult>> run_prompts(Fixture& f, PrefillWorkerOptions wo,
                                                                         const std::vector<std::vector<int>>& prompts) {
  Inbox inbox;
  net::UcxWorker rx_worker(net::test::options_for("tcp")), tx_worker(net::test::options_for("tcp"));
  net::KvReceiver receiver(rx_worker, inbox.callbacks());
  const uint16_t port = rx_worker.listen("127.0.0.1", 0);
  PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);
  Outcomes outcomes;
  std::vector<Messages> got;
  std::vector<PrefillResult> results;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const uint64_t id = 500 + i;
    PrefillJob job;
    job.request_id = id;
    job.tokens = prompts[i];
    job.sampling.temperature = 0.0f;
    job.sampling.max_tokens = 4;
    job.peer.host = "127.0.0.1";
    job.peer.port = port;
    job.on_done = outcomes.callback();
    REQUIRE(worker.submit(std::move(job)).is_ok());
    Messages m;
    for (;;) {
      auto e = inbox.next(net::test::kWaitS);
      REQUIRE(e.has_value());
      REQUIRE(e->kind != Inbox::Event::error);
      if (e->kind == Inbox::Event::done) break;
      m.emplace_back(static_cast<int>(e->kind), e->layer, std::move(e->bytes));
    }
    REQUIRE(outcomes.wait(id, net::test::kWaitS));
    REQUIRE(std::holds_alternative<PrefillResult>(outcomes.by_id.at(id)));
    results.push_back(std::get<PrefillResult>(outcomes.by_id.at(id)));
    got.push_back(std::move(m));
  }
  CHECK(worker.kv().stats().sequences == 0);
  return {got, results};
}

// A hack-mode worker in 64-token chunks with a 64 MiB local prefix cache of `codec`.
PrefillWorkerOptions cached_options(BlockCodec codec, const char* fingerprint) {
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::hack);
  wo.engine.prefill_chunk_tokens = 64;
  PrefixCacheOptions po;
  po.codec = codec;
  po.local_bytes = size_t{64} << 20;
  wo.prefix_cache = po;
  wo.prefix_fingerprint.add("test", fingerprint);
  return wo;
}

}  // namespace

TEST_CASE("prefill worker: a prefix restored from the cache sends the same bytes as one computed",
          "[server][prefill][prefix]") {
  Fixture f;
  for (KvMode mode : {KvMode::hack, KvMode::fp}) {
    INFO("kv " << kv_mode_name(mode));
    PrefillWorkerOptions plain;
    plain.kv = kv_options(mode);
    plain.engine.prefill_chunk_tokens = 64;
    PrefillWorkerOptions cached = plain;
    PrefixCacheOptions po;
    po.codec = BlockCodec::exact;
    po.local_bytes = size_t{64} << 20;
    po.whole_chunks = true;
    cached.prefix_cache = po;
    cached.prefix_fingerprint.add("test", "prefix");
    // B shares A's first 6 blocks (Π = 32) and goes on differently; C is A again.
    const std::vector<int> a = test::random_prompt(230, f.cfg.vocab_size, 1);
    std::vector<int> b(a.begin(), a.begin() + 200);
    const std::vector<int> tail = test::random_prompt(90, f.cfg.vocab_size, 2);
    b.insert(b.end(), tail.begin(), tail.end());
    const auto [want, want_results] = run_prompts(f, plain, {a, b, a});
    const auto [got, got_results] = run_prompts(f, cached, {a, b, a});
    // Whole 64-token chunks (2 blocks) only: B restores 6 of its 6 shared blocks, A 6 of the
    // 7 it could ((230 − 1) / 32: the last token is always computed).
    CHECK(got_results[0].prefix.tokens == 0);
    CHECK(got_results[1].prefix.local_blocks == 6);
    CHECK(got_results[2].prefix.local_blocks == 6);
    for (size_t i = 0; i < 3; ++i) {
      INFO("prompt " << i);
      CHECK(got_results[i].first.token == want_results[i].first.token);
      CHECK(got_results[i].first.logprob == want_results[i].first.logprob);
      // The stage timings partition the job: none negative, none counted twice.
      const PrefillTimings& t = got_results[i].timings;
      const PrefixRestoreResult& r = got_results[i].prefix;
      for (double s : {t.setup_s, t.compute_s, t.export_s, t.send_s, t.capture_s, t.sample_s, t.store_s, t.drain_s})
        CHECK(s >= 0.0);
      CHECK(t.quantize_s >= 0.0);
      CHECK(t.quantize_s + t.send_s <= t.export_s + 1e-9);
      CHECK(t.setup_s + r.restore_s + t.compute_s + t.export_s + t.capture_s <= t.prefill_s + 1e-9);
      CHECK(t.queue_s + t.prefill_s + t.sample_s + t.store_s + t.drain_s <= t.total_s + 1e-9);
      CHECK(r.lookup_s + r.vault_wait_s + r.decode_s + r.import_s <= r.restore_s + 1e-9);
      if (r.tokens > 0) {  // blocks were decoded and imported, so both took time
        CHECK(r.decode_s > 0.0);
        CHECK(r.import_s > 0.0);
      }
      // Per layer, in order (a restored prefix's pages go out with the first chunk, so layers
      // interleave differently than when every chunk is computed).
      auto by_layer = [](const Messages& ms) {
        std::map<uint32_t, std::vector<std::pair<int, std::vector<std::byte>>>> out;
        for (const auto& [kind, layer, bytes] : ms) out[layer].emplace_back(kind, bytes);
        return out;
      };
      const auto g = by_layer(got[i]), w = by_layer(want[i]);
      REQUIRE(g.size() == w.size());
      for (const auto& [layer, msgs] : w) {
        INFO("layer " << layer);
        REQUIRE(g.at(layer).size() == msgs.size());
        for (size_t m = 0; m < msgs.size(); ++m) CHECK(g.at(layer)[m] == msgs[m]);
      }
    }
  }
}

TEST_CASE("prefill worker: a prefix hit sends the pages the computing prompt closed, not the codec's requantized ones",
          "[server][prefill][prefix]") {
  Fixture f;
  PrefillWorkerOptions wo = cached_options(BlockCodec::int8_head, "pages");  // lossy: pages quantized from its values differ
  // A (230 tokens) computed; A again (7 blocks restored, 38 tokens in one chunk: the pages are
  // closed at the end); C = A's first 224 tokens and 150 more (3 chunks: the restored blocks'
  // pages go out with the first chunk, before any close).
  const std::vector<int> a = test::random_prompt(230, f.cfg.vocab_size, 3);
  std::vector<int> c(a.begin(), a.begin() + 224);
  const std::vector<int> tail = test::random_prompt(150, f.cfg.vocab_size, 4);
  c.insert(c.end(), tail.begin(), tail.end());
  // Page messages per layer, in order: page i of a layer is its i-th.
  auto pages = [](const Messages& ms) {
    std::map<uint32_t, std::vector<std::vector<std::byte>>> out;
    for (const auto& [kind, layer, bytes] : ms)
      if (kind == Inbox::Event::page) out[layer].push_back(bytes);
    return out;
  };
  // Sinks 4, Π 32: page b holds tokens [4 + 32b, 36 + 32b), so 7 restored blocks hold 6 whole pages.
  const int known = 6;
  for (bool keep : {true, false}) {
    INFO("keep_pages " << keep);
    wo.prefix_cache->keep_pages = keep;
    const auto [got, results] = run_prompts(f, wo, {a, a, c});
    REQUIRE(results[1].prefix.local_blocks == 7);
    REQUIRE(results[2].prefix.local_blocks == 7);
    const auto cold = pages(got[0]);
    int differing = 0;
    for (size_t i : {size_t{1}, size_t{2}}) {
      INFO("prompt " << i);
      CHECK(results[i].prefix.page_blocks == (keep ? known : 0));
      const auto hit = pages(got[i]);
      REQUIRE(hit.size() == cold.size());
      for (const auto& [layer, want] : cold) {
        REQUIRE(hit.at(layer).size() >= static_cast<size_t>(known));
        for (int b = 0; b < known; ++b) {
          const bool same = hit.at(layer)[static_cast<size_t>(b)] == want[static_cast<size_t>(b)];
          if (keep) CHECK(same);
          differing += same ? 0 : 1;
        }
      }
    }
    // Without the kept pages the hit's pages come from int8-head values: not the cold bytes.
    if (!keep) CHECK(differing > 0);
  }
}

TEST_CASE("prefill worker: the same prompt again restores its tail too and computes only its last token",
          "[server][prefill][prefix]") {
  Fixture f;
  PrefillWorkerOptions wo = cached_options(BlockCodec::exact, "tail");  // bit copies: the restored tail is the computed one
  // Π 32: A (230 tokens) has 7 restorable blocks and a tail of 5 tokens [224, 229). A2 differs
  // in its last token only (not part of the tail: its KV is computed anyway); A3 in token 226.
  // A4 and A5 extend A (by 20 and by 60 tokens: the next turn of a conversation): A's 7 blocks,
  // then the longest kept tail they continue (A5's block 7 is full but not cached), then what
  // is new is computed.
  const std::vector<int> a = test::random_prompt(230, f.cfg.vocab_size, 5);
  std::vector<int> a2 = a, a3 = a, a4 = a, a5 = a;
  a2.back() = (a2.back() + 1) % f.cfg.vocab_size;
  a3[226] = (a3[226] + 1) % f.cfg.vocab_size;
  const std::vector<int> more = test::random_prompt(60, f.cfg.vocab_size, 6);
  a4.insert(a4.end(), more.begin(), more.begin() + 20);
  a5.insert(a5.end(), more.begin(), more.end());
  std::map<bool, std::vector<SampleResult>> extended;  // A4's and A5's first tokens, with and without tails
  for (bool keep : {true, false}) {
    INFO("keep_tail " << keep);
    wo.prefix_cache->keep_tail = keep;
    const auto [got, results] = run_prompts(f, wo, {a, a, a2, a3, a4, a5});
    CHECK(results[0].prefix.tokens == 0);
    for (size_t i : {size_t{1}, size_t{2}, size_t{4}}) {
      INFO("prompt " << i);
      CHECK(results[i].prefix.tail_tokens == (keep ? 5 : 0));
      CHECK(results[i].prefix.tokens == (keep ? 229 : 224));
    }
    // A5 continues A4's tail (25 tokens [224, 249)) as well as A's (5): the longer is taken.
    CHECK(results[5].prefix.tail_tokens == (keep ? 25 : 0));
    CHECK(results[5].prefix.tokens == (keep ? 249 : 224));
    CHECK(results[3].prefix.tail_tokens == 0);
    CHECK(results[3].prefix.tokens == 224);
    for (size_t i : {size_t{4}, size_t{5}}) extended[keep].push_back(results[i].first);
    // The same prompt gives the same first token (its last token's logits differ only by the
    // shape of the computation: 1 row instead of 6).
    CHECK(results[1].first.token == results[0].first.token);
    CHECK(std::abs(results[1].first.logprob - results[0].first.logprob) < 1e-4f);
    if (!keep) continue;
    // Every exact token but the last equals the computed one, bit for bit.
    auto exact_rows = [&](const Messages& ms, uint32_t layer) {
      std::vector<std::byte> rows;
      for (const auto& [kind, l, bytes] : ms) {
        if (kind != Inbox::Event::exact || l != layer) continue;
        const ExactTokensHeader h = decode_exact_header(bytes);
        const size_t row = static_cast<size_t>(h.num_kv_heads) * h.head_dim * dtype_size(h.dtype);
        const size_t kept = std::min<uint64_t>(h.n_tokens, std::max<int64_t>(0, 229 - static_cast<int64_t>(h.first_token)));
        const std::byte* k = bytes.data() + kExactTokensHeaderBytes;
        rows.insert(rows.end(), k, k + kept * row);                      // K rows before the last token
        rows.insert(rows.end(), k + h.n_tokens * row, k + (h.n_tokens + kept) * row);  // V rows
      }
      return rows;
    };
    for (uint32_t layer = 0; layer < static_cast<uint32_t>(f.cfg.num_layers); ++layer) {
      INFO("layer " << layer);
      const auto want = exact_rows(got[0], layer);
      CHECK_FALSE(want.empty());
      CHECK(exact_rows(got[1], layer) == want);
    }
  }
  // The extensions' first tokens are the same whether A's tail was restored or computed again
  // (exact codec: the restored tail is A's computed bits; the rest differs only by chunk shape).
  REQUIRE(extended[true].size() == 2);
  REQUIRE(extended[false].size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(extended[true][i].token == extended[false][i].token);
    CHECK(std::abs(extended[true][i].logprob - extended[false][i].logprob) < 1e-4f);
  }
}

TEST_CASE("prefill worker: an unreachable vault means recompute, not a failed job", "[server][prefill][prefix]") {
  Fixture f;
  uint16_t dead_port = 0;
  {
    net::UcxWorker probe(net::test::options_for("tcp"));
    dead_port = probe.listen("127.0.0.1", 0);
  }
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::hack);
  wo.engine.prefill_chunk_tokens = 64;
  PrefixCacheOptions po;
  po.local_bytes = 0;
  po.vault = net::VaultClientOptions{"127.0.0.1", dead_port};
  po.vault_timeout_s = 1.0;
  wo.prefix_cache = po;
  const std::vector<int> a = test::random_prompt(200, f.cfg.vocab_size, 3);
  const auto [got, results] = run_prompts(f, wo, {a, a});
  CHECK(results[1].prefix.tokens == 0);
  CHECK_FALSE(results[1].prefix.vault_error.empty());
}

// A decode node restarted on its old UCX port while the prefill node still holds an endpoint
// to the old process (it has not yet polled the old connection's end): the next job resolves
// to that stale endpoint. Its sends fail (or are lost), the endpoint is closed and dropped, and
// with send_retries the job runs again on a fresh endpoint to the new node instead of failing
// (with 0 it fails, as before, and only the job after it reconnects).
TEST_CASE("prefill worker: a decode node restarted on its port behind a stale endpoint gets the job on a fresh one",
          "[server][prefill]") {
  for (int retries : {1, 0}) {
    INFO("send_retries " << retries);
    Fixture f;
    // The new listener takes the old one's port while the old connection lingers (TIME_WAIT /
    // FIN_WAIT2); UCX's TCP connection manager reads this from the environment only.
    ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
    const net::UcxOptions rx_options = net::test::options_for("tcp");
    Inbox inbox_a;
    auto rx_a = std::make_unique<net::UcxWorker>(rx_options);
    auto receiver_a = std::make_unique<net::KvReceiver>(*rx_a, inbox_a.callbacks());
    const uint16_t port = rx_a->listen("127.0.0.1", 0);
    net::UcxWorker tx_worker(net::test::options_for("tcp"));
    PrefillWorkerOptions wo;
    wo.kv = kv_options(KvMode::fp);
    wo.engine.prefill_chunk_tokens = 64;
    wo.send_retries = retries;
    Outcomes outcomes;
    PrefillWorker worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo);
    auto job_of = [&](uint64_t id) { return greedy_job(id, 200, f.cfg.vocab_size, port, outcomes); };
    REQUIRE(worker.submit(job_of(1)).is_ok());
    REQUIRE(outcomes.wait(1, net::test::kWaitS));
    REQUIRE(std::holds_alternative<PrefillResult>(outcomes.by_id.at(1)));

    // Hold the prefill side's progress thread while the node restarts, so the old
    // connection's end is still unread when job 2 picks its endpoint.
    ProgressHold hold(tx_worker);
    REQUIRE(hold.wait_held(net::test::kWaitS));
    receiver_a.reset();
    rx_a.reset();
    Inbox inbox_b;
    net::UcxWorker rx_b(rx_options);
    net::KvReceiver receiver_b(rx_b, inbox_b.callbacks());
    REQUIRE(rx_b.listen("127.0.0.1", port) == port);
    REQUIRE(worker.submit(job_of(2)).is_ok());
    // The job prefills and queues its messages on the stale endpoint; they go nowhere until
    // the progress thread runs again (the job waits for them, up to send_timeout_s).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    hold.let_go();
    REQUIRE(outcomes.wait(2, net::test::kWaitS));
    if (retries > 0) {
      INFO(outcomes.error_of(2));
      REQUIRE(std::holds_alternative<PrefillResult>(outcomes.by_id.at(2)));
      CHECK(worker.stats().send_retries == 1);
      // The new node got the whole request.
      bool done = false;
      while (auto e = inbox_b.next(net::test::kWaitS)) {
        REQUIRE(e->id == 2);
        REQUIRE(e->kind != Inbox::Event::error);
        if (e->kind == Inbox::Event::done) {
          done = true;
          break;
        }
      }
      CHECK(done);
    } else {
      CHECK_THAT(outcomes.error_of(2), Catch::Contains("lost the receiver"));
      CHECK(worker.stats().send_retries == 0);
    }
    // Either way the stale endpoint is gone: the next job goes to the new node first time.
    const uint64_t retried = worker.stats().send_retries;
    REQUIRE(worker.submit(job_of(3)).is_ok());
    REQUIRE(outcomes.wait(3, net::test::kWaitS));
    CHECK(std::holds_alternative<PrefillResult>(outcomes.by_id.at(3)));
    CHECK(worker.stats().send_retries == retried);
    CHECK(worker.kv().stats().sequences == 0);
  }
}

// Pipelining: job i's KV drains while job i+1 computes. A decode node whose progress thread is
// held (ProgressHold) holds the drain of every job sent to it: its KV (1500 tokens of HACK
// pages, rendezvous messages) cannot leave until the node runs again.
namespace {

struct TwoNodes {
  Inbox inbox_a, inbox_b;
  net::UcxWorker rx_a{net::test::options_for("tcp")}, rx_b{net::test::options_for("tcp")};
  net::KvReceiver receiver_a{rx_a, inbox_a.callbacks()}, receiver_b{rx_b, inbox_b.callbacks()};
  uint16_t port_a = rx_a.listen("127.0.0.1", 0), port_b = rx_b.listen("127.0.0.1", 0);
  net::UcxWorker tx_worker{net::test::options_for("tcp")};
};

PrefillWorkerOptions pipelined_options(int max_draining_jobs) {
  PrefillWorkerOptions wo;
  wo.kv = kv_options(KvMode::hack);
  wo.engine.prefill_chunk_tokens = 64;
  wo.send_timeout_s = 60.0;  // a held drain stays held; the test lets it go
  wo.max_draining_jobs = max_draining_jobs;
  return wo;
}

// What every pipelining test starts from: two decode nodes, a prefill worker sending to
// them with `wo`, and node A's network thread held (its drains stay pending until let go).
struct HeldPipeline {
  TwoNodes nodes;
  Outcomes outcomes;
  PrefillWorker worker;
  ProgressHold hold;
  HeldPipeline(Fixture& f, const PrefillWorkerOptions& wo)
      : worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), nodes.tx_worker, wo),
        hold(nodes.rx_a) {
    REQUIRE(hold.wait_held(net::test::kWaitS));
  }
};

bool has_outcome(Outcomes& outcomes, uint64_t id) {
  std::lock_guard lock(outcomes.mutex);
  return outcomes.by_id.contains(id);
}

bool succeeded(Outcomes& outcomes, uint64_t id) {
  std::lock_guard lock(outcomes.mutex);
  auto it = outcomes.by_id.find(id);
  return it != outcomes.by_id.end() && std::holds_alternative<PrefillResult>(it->second);
}

// Waits until the worker has freed every sequence (stats are refreshed as sequences go).
bool wait_kv_empty(PrefillWorker& worker, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (worker.stats().kv_sequences != 0 || worker.stats().kv_bytes_used != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

TEST_CASE("prefill worker: job i+1 computes while job i's KV drains, and with 0 draining jobs waits for the drain",
          "[server][prefill][pipeline]") {
  Fixture f;
  for (int max_draining : {4, 0}) {
    INFO("max_draining_jobs " << max_draining);
    HeldPipeline p(f, pipelined_options(max_draining));
    auto& [nodes, outcomes, worker, hold] = p;
    REQUIRE(worker.submit(greedy_job(1, 1500, f.cfg.vocab_size, nodes.port_a, outcomes)).is_ok());
    REQUIRE(worker.submit(greedy_job(2, 300, f.cfg.vocab_size, nodes.port_b, outcomes)).is_ok());
    if (max_draining > 0) {
      // Job 2 computed and its KV reached B while job 1's KV is still held for A.
      REQUIRE(outcomes.wait(2, net::test::kWaitS));
      CHECK(succeeded(outcomes, 2));
      CHECK_FALSE(has_outcome(outcomes, 1));
      CHECK(worker.queue_tokens() == 1500);  // job 1 counts until its reply
    } else {
      // Job 2 waits for job 1's drain.
      CHECK_FALSE(outcomes.wait(2, 2.0));
      CHECK_FALSE(has_outcome(outcomes, 1));
      CHECK(worker.queue_tokens() == 1800);
    }
    hold.let_go();
    REQUIRE(outcomes.wait(1, net::test::kWaitS));
    REQUIRE(outcomes.wait(2, net::test::kWaitS));
    CHECK(succeeded(outcomes, 1));
    CHECK(succeeded(outcomes, 2));
    if (max_draining == 0) {
      // One after the other: job 2 started only once job 1 had drained.
      const auto& r1 = std::get<PrefillResult>(outcomes.by_id.at(1));
      const auto& r2 = std::get<PrefillResult>(outcomes.by_id.at(2));
      CHECK(r2.timings.queue_s >= r1.timings.total_s - r1.timings.queue_s - 0.05);
    }
    CHECK(wait_kv_empty(worker, net::test::kWaitS));
    CHECK(worker.queue_tokens() == 0);
    CHECK(worker.stats().jobs_done == 2);
  }
}

TEST_CASE("prefill worker: at most max_draining_jobs jobs drain while the next one computes",
          "[server][prefill][pipeline]") {
  Fixture f;
  for (int max_draining : {1, 2}) {
    INFO("max_draining_jobs " << max_draining);
    HeldPipeline p(f, pipelined_options(max_draining));
    auto& [nodes, outcomes, worker, hold] = p;
    // Jobs 1 and 2 drain to the held node A; job 3 goes to B and needs a free draining slot.
    REQUIRE(worker.submit(greedy_job(1, 1500, f.cfg.vocab_size, nodes.port_a, outcomes)).is_ok());
    REQUIRE(worker.submit(greedy_job(2, 1500, f.cfg.vocab_size, nodes.port_a, outcomes)).is_ok());
    REQUIRE(worker.submit(greedy_job(3, 100, f.cfg.vocab_size, nodes.port_b, outcomes)).is_ok());
    if (max_draining >= 2) {
      REQUIRE(outcomes.wait(3, net::test::kWaitS));
      CHECK(succeeded(outcomes, 3));
    } else {
      CHECK_FALSE(outcomes.wait(3, 2.0));  // job 2 computed beside job 1's drain; job 3 may not
    }
    CHECK_FALSE(has_outcome(outcomes, 1));
    CHECK_FALSE(has_outcome(outcomes, 2));
    hold.let_go();
    for (uint64_t id : {1, 2, 3}) {
      REQUIRE(outcomes.wait(id, net::test::kWaitS));
      CHECK(succeeded(outcomes, id));
    }
    CHECK(wait_kv_empty(worker, net::test::kWaitS));
  }
}

TEST_CASE("prefill worker: a job waits for draining jobs when the KV budget cannot hold it beside them",
          "[server][prefill][pipeline]") {
  Fixture f;
  PrefillWorkerOptions wo = pipelined_options(4);
  // Room for one 1500-token sequence, not two.
  wo.kv.capacity_bytes = make_paged_kv_cache(f.shape, wo.kv)->sequence_bytes(1500) * 3 / 2;
  HeldPipeline p(f, wo);
  auto& [nodes, outcomes, worker, hold] = p;
  REQUIRE(worker.submit(greedy_job(1, 1500, f.cfg.vocab_size, nodes.port_a, outcomes)).is_ok());
  REQUIRE(worker.submit(greedy_job(2, 1500, f.cfg.vocab_size, nodes.port_b, outcomes)).is_ok());
  CHECK_FALSE(outcomes.wait(2, 2.0));  // neither run nor failed for want of memory
  hold.let_go();
  REQUIRE(outcomes.wait(1, net::test::kWaitS));
  REQUIRE(outcomes.wait(2, net::test::kWaitS));
  CHECK(succeeded(outcomes, 1));
  INFO(outcomes.error_of(2));
  CHECK(succeeded(outcomes, 2));
  CHECK(wait_kv_empty(worker, net::test::kWaitS));
}

TEST_CASE("prefill worker: a drain that fails or is cancelled fails its job only, not the one computing after it",
          "[server][prefill][pipeline]") {
  Fixture f;
  for (const bool cancel : {false, true}) {
    INFO((cancel ? "job 1 cancelled while draining" : "job 1's drain times out"));
    PrefillWorkerOptions wo = pipelined_options(4);
    wo.send_timeout_s = cancel ? 60.0 : 1.0;
    HeldPipeline p(f, wo);
    auto& [nodes, outcomes, worker, hold] = p;
    REQUIRE(worker.submit(greedy_job(1, 1500, f.cfg.vocab_size, nodes.port_a, outcomes)).is_ok());
    // Jobs 2 and 3 compute while job 1 drains, and are still in flight when it fails.
    REQUIRE(worker.submit(greedy_job(2, 2000, f.cfg.vocab_size, nodes.port_b, outcomes)).is_ok());
    REQUIRE(worker.submit(greedy_job(3, 300, f.cfg.vocab_size, nodes.port_b, outcomes)).is_ok());
    if (cancel) {
      REQUIRE(nodes.inbox_b.wait_seen(2, net::test::kWaitS));  // job 1 has computed: it drains now
      CHECK(worker.cancel(1));
    }
    REQUIRE(outcomes.wait(1, net::test::kWaitS));
    CHECK_THAT(outcomes.error_of(1), Catch::Contains(cancel ? "cancelled" : "not sent"));
    for (uint64_t id : {2, 3}) {
      REQUIRE(outcomes.wait(id, net::test::kWaitS));
      INFO("job " << id << ": " << outcomes.error_of(id));
      CHECK(succeeded(outcomes, id));
    }
    // B got jobs 2 and 3 whole; nothing of theirs failed.
    int done = 0;
    while (done < 2) {
      auto e = nodes.inbox_b.next(net::test::kWaitS);
      REQUIRE(e.has_value());
      REQUIRE(e->kind != Inbox::Event::error);
      if (e->kind == Inbox::Event::done) ++done;
    }
    CHECK(worker.stats().jobs_failed == 1);
    CHECK(worker.stats().jobs_done == 2);
    hold.let_go();  // UCX lets go of job 1's pages; the worker frees its sequence
    CHECK(wait_kv_empty(worker, net::test::kWaitS));
    CHECK(worker.queue_tokens() == 0);
  }
}

namespace {

// One decode node's receiver on loopback and a prefill worker sending to it with `wo`.
struct OneNode {
  Inbox inbox;
  net::UcxWorker rx_worker{net::test::options_for("tcp")}, tx_worker{net::test::options_for("tcp")};
  net::KvReceiver receiver{rx_worker, inbox.callbacks()};
  uint16_t port = rx_worker.listen("127.0.0.1", 0);
  Outcomes outcomes;
  PrefillWorker worker;
  OneNode(Fixture& f, const PrefillWorkerOptions& wo)
      : worker(make_cpu_engine_parts(f.model, f.prefill_pool, wo.kv, wo.engine), tx_worker, wo) {}
};

PrefillWorkerOptions batched_options(KvMode mode, int chunk, int batch_jobs) {
  PrefillWorkerOptions wo;
  wo.kv = kv_options(mode);
  wo.engine.prefill_chunk_tokens = chunk;
  wo.batch_jobs = batch_jobs;
  return wo;
}

}  // namespace

TEST_CASE("prefill worker: short prompts queued together share one batched step, and each decodes as hack-run's",
          "[server][prefill][batch]") {
  Fixture f;
  constexpr int kNew = 8;
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    const PrefillWorkerOptions wo = batched_options(mode, 64, 4);
    OneNode node(f, wo);
    auto& [inbox, rx_worker, tx_worker, receiver, port, outcomes, worker] = node;
    // Job 1 is long (computed alone); the short ones queue behind it. Jobs 2–5 fit one chunk of
    // 64 together (56 tokens) and share a step; job 6 would pass it and waits for the next.
    const std::map<uint64_t, int> lengths = {{1, 700}, {2, 10}, {3, 15}, {4, 1}, {5, 30}, {6, 20}};
    CpuPagedKvCache decode_kv(f.shape, wo.kv);
    for (const auto& [id, n] : lengths) {
      decode_kv.add_sequence(static_cast<int>(id), n + kNew);
      REQUIRE(worker.submit(greedy_job(id, n, f.cfg.vocab_size, port, outcomes)).is_ok());
    }
    std::map<uint64_t, int> first;
    while (first.size() < lengths.size()) {
      auto e = inbox.next(net::test::kWaitS);
      REQUIRE(e.has_value());
      const int seq = static_cast<int>(e->id);
      if (e->kind == Inbox::Event::page || e->kind == Inbox::Event::exact) {
        import_message(decode_kv, seq, static_cast<int>(e->layer),
                       e->kind == Inbox::Event::page ? KvMessageKind::hack_page : KvMessageKind::exact, e->bytes);
      } else if (e->kind == Inbox::Event::done) {
        first[e->id] = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size()))["token"];
      } else if (e->kind == Inbox::Event::error) {
        FAIL("request " << e->id << ": " << e->message);
      }
    }
    for (const auto& [id, n] : lengths) {
      REQUIRE(outcomes.wait(id, net::test::kWaitS));
      REQUIRE(succeeded(outcomes, id));
    }
    const PrefillWorkerStats st = worker.stats();
    CHECK(st.batched_steps == 1);
    CHECK(st.batched_jobs == 4);
    for (const auto& [id, n] : lengths) {
      const int expected_jobs = id >= 2 && id <= 5 ? 4 : 1;
      CHECK(std::get<PrefillResult>(outcomes.by_id.at(id)).step_jobs == expected_jobs);
    }
    // Each batched job's KV and first token continue as one engine's generate() does (greedy:
    // the batch's last-bit rounding does not move an argmax of this model).
    const std::unique_ptr<Backend> decode_backend = make_cpu_backend(f.model, f.decode_pool, decode_kv);
    Engine decode(*decode_backend);
    for (const auto& [id, n] : lengths) {
      INFO("request " << id << ", " << n << " prompt tokens");
      CpuPagedKvCache ref_kv(f.shape, wo.kv);
      const std::unique_ptr<Backend> ref_backend = make_cpu_backend(f.model, f.decode_pool, ref_kv);
      Engine ref(*ref_backend);
      ref.add_sequence(1, n + kNew);
      SamplingParams sp;
      sp.temperature = 0.0f;
      sp.max_tokens = kNew;
      sp.ignore_eos = true;
      const std::vector<int> prompt = test::random_prompt(n, f.cfg.vocab_size, static_cast<uint32_t>(id));
      const GenerationResult expected = generate(ref, 1, prompt, sp, {});
      const int seq = static_cast<int>(id);
      CHECK(decode_kv.length(seq, 0) == n);
      CHECK(continue_greedy(decode, seq, first.at(id), kNew) == expected.tokens);
      decode.remove_sequence(seq);
    }
    CHECK(wait_kv_empty(worker, net::test::kWaitS));
    CHECK(worker.queue_tokens() == 0);
  }
}

TEST_CASE("prefill worker: in a batched step a cancelled job fails alone, and each job captures its own prefix blocks",
          "[server][prefill][batch][prefix]") {
  Fixture f;
  PrefillWorkerOptions wo = cached_options(BlockCodec::int8_head, "batch");
  wo.engine.prefill_chunk_tokens = 128;
  wo.batch_jobs = 8;
  wo.test_layer_delay_ms = 300;  // time to cancel job 3 inside the step
  OneNode node(f, wo);
  auto& [inbox, rx_worker, tx_worker, receiver, port, outcomes, worker] = node;
  // Job 1 (200 tokens, alone) holds the worker while jobs 2–4 (40 tokens each: one full block
  // of 32 and a tail) queue and then share one step.
  REQUIRE(worker.submit(greedy_job(1, 200, f.cfg.vocab_size, port, outcomes)).is_ok());
  for (uint64_t id : {2, 3, 4}) REQUIRE(worker.submit(greedy_job(id, 40, f.cfg.vocab_size, port, outcomes)).is_ok());
  REQUIRE(outcomes.wait(1, net::test::kWaitS));
  REQUIRE(inbox.wait_seen(2, net::test::kWaitS));  // the step has exported layer 0 of job 2
  CHECK(worker.cancel(3));
  for (uint64_t id : {2, 3, 4}) REQUIRE(outcomes.wait(id, net::test::kWaitS));
  CHECK(succeeded(outcomes, 2));
  CHECK(succeeded(outcomes, 4));
  CHECK_THAT(outcomes.error_of(3), Catch::Contains("request 3 was cancelled"));
  CHECK(worker.stats().batched_steps == 1);
  CHECK(std::get<PrefillResult>(outcomes.by_id.at(2)).step_jobs == 3);
  CHECK(wait_kv_empty(worker, net::test::kWaitS));

  // The same prompts again, as new requests: jobs 2 and 4 stored their own block and tail in the
  // step and restore all but their last token; job 3's capture ended with it.
  for (uint64_t id : {2, 3, 4}) {
    PrefillJob again = greedy_job(id, 40, f.cfg.vocab_size, port, outcomes);
    again.request_id = 10 + id;
    REQUIRE(worker.submit(std::move(again)).is_ok());
  }
  for (uint64_t id : {12, 13, 14}) {
    REQUIRE(outcomes.wait(id, net::test::kWaitS));
    REQUIRE(succeeded(outcomes, id));
  }
  // node.outcomes, not the binding: clang before 16 cannot capture a structured binding.
  const auto restored = [&](uint64_t id) { return std::get<PrefillResult>(node.outcomes.by_id.at(id)).prefix.tokens; };
  CHECK(restored(12) == 39);
  CHECK(restored(13) == 0);
  CHECK(restored(14) == 39);
  // A hit's first token is the computed one's.
  for (uint64_t id : {2, 4})
    CHECK(std::get<PrefillResult>(outcomes.by_id.at(id)).first.token ==
          std::get<PrefillResult>(outcomes.by_id.at(10 + id)).first.token);
  CHECK(wait_kv_empty(worker, net::test::kWaitS));
}
