// Disaggregated serving as it runs for real: hack-prefill and hack-decode processes on
// loopback, KV over UCX (tcp, and with shared memory enabled), requests driven by
// DisaggregatedCall as the router drives them.
//   - Greedy output equals hack-run (one process, one sequence) token for token, for
//     concurrent requests of mixed prompt lengths, --kv fp and --kv hack.
//   - Faults: a node killed (-9) during transfer, generation or prefill, a corrupt page, a
//     caller that goes away. Each time the affected request ends with an explicit error,
//     the surviving nodes serve a new request, and every surviving node frees all its KV.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hack/http/http_client.h"
#include "hack/router/node_client.h"
#include "hack/node/node_protocol.h"
#include "support/daemon_process.h"
#include "support/run_process.h"
#include "support/test_support.h"

using namespace hack;
using namespace hack::server;

namespace {

using Clock = std::chrono::steady_clock;

// hack-tiny's vocabulary is 4096 ids; 4091..4095 are its special tokens.
constexpr int kFirstSpecialToken = 4091;
const std::string kTcp = "tcp";
// Shared memory enabled; tcp stays in the list for UCX's connection manager (net/ucx_worker.h).
const std::string kShm = "posix,sysv,cma,self,tcp";

std::atomic<uint64_t> next_request_id{1000};

std::string model_dir() { return (test::source_dir() / "models" / "hack-tiny").string(); }
std::string bin(const std::string& name) { return (test::binary_dir() / "bin" / name).string(); }

// The model and KV flags, the same for hack-run and both daemons. `kv` is the --kv value,
// optionally followed by more KV flags ("hack --hack-k-bits 4 ...").
std::vector<std::string> model_flags(const std::string& kv) {
  std::vector<std::string> flags{"--model", model_dir(), "--kv"};
  std::istringstream words(kv);
  for (std::string w; words >> w;) flags.push_back(w);
  for (const char* f : {"--kv-dtype", "bf16", "--max-model-len", "4096", "--threads", "1"}) flags.push_back(f);
  return flags;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Node {
  std::unique_ptr<test::DaemonProcess> process;
  NodeAddress address;
};

// A node's UCX environment: the test's transports, loopback only (no container bridge that
// comes and goes while other tests run).
std::vector<std::string> node_env(const std::string& tls) { return {"UCX_TLS=" + tls, "UCX_NET_DEVICES=lo"}; }

Node start_decode(const std::string& kv, const std::string& tls, const std::vector<std::string>& extra = {}) {
  Node n;
  n.process = std::make_unique<test::DaemonProcess>(
      concat(concat({bin("hack-decode")}, model_flags(kv)), concat({"--port", "0", "--ucx-port", "0"}, extra)),
      node_env(tls));
  n.address = NodeAddress{"decode", "127.0.0.1", static_cast<uint16_t>(n.process->ready_int("http")),
                          n.process->ready_word("ucx")};
  return n;
}

Node start_prefill(const std::string& kv, const std::string& tls, const std::vector<std::string>& extra = {}) {
  Node n;
  n.process = std::make_unique<test::DaemonProcess>(
      concat(concat({bin("hack-prefill")}, model_flags(kv)), concat({"--port", "0"}, extra)),
      node_env(tls));
  n.address = NodeAddress{"prefill", "127.0.0.1", static_cast<uint16_t>(n.process->ready_int("http")), ""};
  return n;
}

// A decode node that sleeps `delay_ms` after every step: its requests stay in the batch longer.
Node start_slow_decode(const std::string& kv, const std::string& tls, int delay_ms) {
  return start_decode(kv, tls, {"--enable-test-hooks", "--test-step-delay-ms", std::to_string(delay_ms)});
}

// A prefill node whose every layer takes `delay_ms` longer: its transfers last long enough
// to be interrupted.
Node start_slow_prefill(const std::string& kv, const std::string& tls, int delay_ms) {
  return start_prefill(kv, tls, {"--enable-test-hooks", "--test-layer-delay-ms", std::to_string(delay_ms)});
}

// Deterministic pseudo-random prompt ids, no special tokens.
std::vector<int> prompt_ids(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(0, kFirstSpecialToken - 1);
  std::vector<int> ids(static_cast<size_t>(length));
  for (int& t : ids) t = id(rng);
  return ids;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

GenerateJob greedy_job(std::vector<int> prompt, int max_tokens, bool ignore_eos = false) {
  GenerateJob job;
  job.request_id = next_request_id++;
  job.prompt = std::move(prompt);
  job.params.temperature = 0;
  job.params.max_tokens = max_tokens;
  job.params.ignore_eos = ignore_eos;
  job.params.logprobs = 2;  // for the report when a token differs
  return job;
}

// One request through a prefill + decode pair; `hook` sees every event (false on a token
// stops the request early).
struct Generated {
  GenerateOutcome outcome;
  std::vector<SampleResult> samples;
  Clock::time_point first_token_at, last_token_at;
};

Generated generate(const NodeAddress& prefill, const NodeAddress& decode, GenerateJob job,
                   GenerateOptions options = {}, const std::function<bool(const NodeEvent&)>& hook = {}) {
  options.timeout_s = 60;
  Generated g;
  DisaggregatedCall call(prefill, decode, std::move(job), options);
  g.outcome = call.run([&](const NodeEvent& e) {
    if (e.kind == NodeEventKind::token) {
      g.last_token_at = Clock::now();
      if (g.samples.empty()) g.first_token_at = g.last_token_at;
      g.samples.push_back(e.sample);
    }
    return hook ? hook(e) : true;
  });
  return g;
}

std::vector<int> tokens_of(const Generated& g) {
  std::vector<int> ids;
  for (const SampleResult& s : g.samples) ids.push_back(s.token);
  return ids;
}

// A request that must succeed: the nodes are serving.
void require_serves(const NodeAddress& prefill, const NodeAddress& decode, int prompt_length = 100) {
  const Generated g = generate(prefill, decode, greedy_job(prompt_ids(prompt_length, 7), 8, true));
  INFO(g.outcome.status.message());
  REQUIRE(g.outcome.status.is_ok());
  REQUIRE(g.samples.size() == 8);
  REQUIRE(g.outcome.completion_tokens == 8);
}

// Polls /health until the node holds no KV and runs nothing (the accounting check).
void require_drained(const Node& node, double timeout_s = 15) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  NodeHealth h;
  for (;;) {
    h = fetch_health(node.address);
    if (h.kv_sequences == 0 && h.kv_bytes_used == 0 && h.running == 0 && h.waiting == 0) return;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO(node.address.name << " /health after " << timeout_s << " s: " << to_json(h) << "\nlog:\n"
                         << node.process->log());
  FAIL("the node did not free its KV");
}

// Polls until `ready(health)` holds (the state a fault is injected in). Returns false on timeout.
bool wait_health(const NodeAddress& node, const std::function<bool(const NodeHealth&)>& ready, double timeout_s = 15) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (ready(fetch_health(node))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// --- The calls by hand, without DisaggregatedCall (which cancels the other node when one
// fails): what each node does on its own when its peer or caller vanishes.

HttpClientRequest node_call(const NodeAddress& node, const std::string& target, std::string body) {
  HttpClientRequest r;
  r.host = node.host;
  r.port = node.port;
  r.method = "POST";
  r.target = target;
  r.body = std::move(body);
  r.timeout_s = 60;
  return r;
}

struct StreamEnd {
  int status = 0;
  std::vector<NodeEvent> events;
  std::string error;  // the client call threw (connection lost)
  bool ended_with_error() const { return !events.empty() && events.back().kind == NodeEventKind::error; }
};

// POST /internal/generate on a decode node, read on a thread of its own. `accepted` is set
// on the accepted event; `hook` returning false on an event closes the connection.
std::future<StreamEnd> open_decode_stream(const NodeAddress& decode, const GenerateJob& job,
                                          std::shared_ptr<std::promise<void>> accepted,
                                          std::function<bool(const NodeEvent&)> hook = {}) {
  return std::async(std::launch::async, [=] {
    StreamEnd end;
    try {
      end.status = http_stream(node_call(decode, "/internal/generate", to_json(job)), [&](std::string_view data) {
                     end.events.push_back(parse_node_event(data));
                     if (end.events.back().kind == NodeEventKind::accepted) accepted->set_value();
                     return hook ? hook(end.events.back()) : true;
                   }).status;
    } catch (const std::exception& e) {
      end.error = e.what();
    }
    return end;
  });
}

struct CallEnd {
  int status = 0;
  std::string body;
  std::string error;  // the client call threw
};

// POST /internal/prefill of `job` towards `decode`, on a thread of its own.
std::future<CallEnd> call_prefill(const NodeAddress& prefill, const NodeAddress& decode, const GenerateJob& job,
                                  HttpCancel* cancel = nullptr) {
  const PrefillCall call{.request_id = job.request_id,
                         .prompt = job.prompt,
                         .params = job.params,
                         .decode_ucx = decode.ucx_address,
                         .decode_ucx_worker = decode.ucx_worker,
                         .decode_host_id = decode.host_id};
  return std::async(std::launch::async, [=] {
    CallEnd end;
    try {
      const HttpResponse r = http_request(node_call(prefill, "/internal/prefill", to_json(call)), cancel);
      end.status = r.status;
      end.body = r.body;
    } catch (const std::exception& e) {
      end.error = e.what();
    }
    return end;
  });
}

template <typename T>
bool ready_within(const std::future<T>& f, double timeout_s) {
  return f.wait_for(std::chrono::duration<double>(timeout_s)) == std::future_status::ready;
}

// Some KV has arrived (pages are allocated as they are imported, not when reserved).
bool holds_kv(const NodeHealth& h) { return h.kv_sequences > 0 && h.kv_bytes_used > 0; }

// A transfer that lasts: 1000 prompt tokens are 2 prefill chunks × 6 layers, each layer
// delayed kLayerDelayMs on the slow prefill node (about 1.8 s in all).
constexpr int kLongPrompt = 1000;
constexpr int kLayerDelayMs = 150;
// The equality test's decode node sleeps this long after every step: its shortest request
// (8 tokens) then decodes for at least 0.4 s while the other prompts are prefilled, so the
// requests share batched steps even where the build runs many times slower (a TSan run
// without the delay once served all sixteen one after another).
constexpr int kBatchingStepDelayMs = 50;
constexpr double kWaitS = 20;  // for a state the test waits for (generous: the box may be loaded)

// A counter without labels from the node's GET /metrics.
double metric(const NodeAddress& node, const std::string& name) {
  HttpClientRequest r;
  r.host = node.host;
  r.port = node.port;
  r.target = "/metrics";
  const HttpResponse m = http_request(r);
  const size_t at = m.body.find("\n" + name + " ");
  if (at == std::string::npos) throw std::runtime_error("no " + name + " in /metrics:\n" + m.body);
  return std::stod(m.body.substr(at + name.size() + 2));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// hack-run's greedy output for one prompt, the reference.
struct Reference {
  std::vector<int> ids;
  std::vector<std::array<float, 2>> top2;  // logprobs of the two best tokens at each step
  std::string finish_reason;
  std::string error;  // non-empty when hack-run failed
};

Reference run_reference(const std::string& kv, const std::vector<int>& prompt, int max_tokens, bool ignore_eos) {
  std::string command = bin("hack-run");
  for (const std::string& f : model_flags(kv)) command += " " + test::shell_quote(f);
  command += " --temperature 0 --json --logprobs 2 --max-tokens " + std::to_string(max_tokens) + " --prompt-ids " +
             join_ids(prompt) + (ignore_eos ? " --ignore-eos" : "");
  const test::ProcessResult r = test::run_process(command);
  Reference ref;
  if (r.exit_code != 0) {
    ref.error = "hack-run exited " + std::to_string(r.exit_code) + ": " + r.err;
    return ref;
  }
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ref.ids = j["ids"].get<std::vector<int>>();
  ref.finish_reason = j["finish_reason"].get<std::string>();
  for (const auto& step : j["logprobs"]) {
    ref.top2.push_back({step["top"][0]["logprob"].get<float>(), step["top"][1]["logprob"].get<float>()});
  }
  return ref;
}

// The mix of the equality test: awkward lengths around the 64-token page, 1 and 2, and
// long prompts that take several 512-token prefill chunks.
struct Case {
  std::vector<int> prompt;
  int max_tokens;
  bool ignore_eos;
};

std::vector<Case> equality_cases() {
  const int lengths[] = {1, 2, 5, 17, 63, 64, 65, 127, 128, 129, 300, 500, 511, 777, 1000, 2000};
  std::vector<Case> cases;
  for (size_t i = 0; i < std::size(lengths); ++i) {
    cases.push_back(Case{prompt_ids(lengths[i], static_cast<uint32_t>(100 + i)), 8 + static_cast<int>(i * 5 % 17),
                         i % 2 == 1});
  }
  return cases;
}

// hack-run over every case, two at a time (the box has two cores).
std::vector<Reference> run_references(const std::string& kv, const std::vector<Case>& cases) {
  std::vector<Reference> refs(cases.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < cases.size();) {
      refs[i] = run_reference(kv, cases[i].prompt, cases[i].max_tokens, cases[i].ignore_eos);
    }
  };
  std::thread other(work);
  work();
  other.join();
  return refs;
}

// What differs between a disaggregated result and hack-run, with the logits margin at the
// first differing token ("" when they agree).
std::string describe_mismatch(const Case& c, const Reference& ref, const Generated& g) {
  const std::vector<int> got = tokens_of(g);
  const std::string finish(finish_reason_name(g.outcome.finish_reason));
  if (got == ref.ids && finish == ref.finish_reason) return "";
  size_t k = 0;
  while (k < got.size() && k < ref.ids.size() && got[k] == ref.ids[k]) ++k;
  std::string s = "prompt of " + std::to_string(c.prompt.size()) + " tokens: hack-run [" + join_ids(ref.ids) + "] (" +
                  ref.finish_reason + "), disaggregated [" + join_ids(got) + "] (" + finish + "); first difference at " +
                  std::to_string(k);
  if (k < ref.top2.size()) {
    s += "; hack-run top-2 logprobs there " + std::to_string(ref.top2[k][0]) + ", " + std::to_string(ref.top2[k][1]) +
         " (margin " + std::to_string(ref.top2[k][0] - ref.top2[k][1]) + ")";
  }
  if (k < g.samples.size() && g.samples[k].top_logprobs.size() == 2) {
    const auto& t = g.samples[k].top_logprobs;
    s += "; decode node's " + std::to_string(t[0].logprob) + ", " + std::to_string(t[1].logprob);
  }
  return s;
}

// `logprob_tolerance`: how far a logprob of the decode node may be from hack-run's once their
// tokens agree (see the check below). `prefill_flags`: more flags of the prefill node;
// `transports`: the UCX_TLS settings to run (each a cluster).
void check_equal_to_hack_run(const std::string& kv, double logprob_tolerance = 1e-3,
                             const std::vector<std::string>& prefill_flags = {},
                             const std::vector<std::string>& transports = {kTcp, kShm}) {
  const std::vector<Case> cases = equality_cases();
  const std::vector<Reference> refs = run_references(kv, cases);
  for (const Reference& r : refs) {
    INFO(r.error);
    REQUIRE(r.error.empty());
  }
  for (const std::string& tls : transports) {
    INFO("--kv " << kv << ", UCX_TLS=" << tls);
    Node decode = start_slow_decode(kv, tls, kBatchingStepDelayMs);
    Node prefill = start_prefill(kv, tls, prefill_flags);
    std::vector<Generated> results(cases.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < cases.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = generate(prefill.address, decode.address,
                              greedy_job(cases[i].prompt, cases[i].max_tokens, cases[i].ignore_eos));
      });
    }
    for (std::thread& t : threads) t.join();
    std::string mismatches;
    double max_logprob_diff = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const GenerateOutcome& out = results[i].outcome;
      INFO("prompt of " << cases[i].prompt.size() << " tokens: " << out.status.message());
      REQUIRE(out.status.is_ok());
      // The prefill node's reply: the first token it sampled, and the KV it sent.
      REQUIRE(!results[i].samples.empty());
      CHECK(out.prefill.first.sample.token == results[i].samples[0].token);
      CHECK(out.prefill.kv_bytes > 0);
      const std::string m = describe_mismatch(cases[i], refs[i], results[i]);
      if (!m.empty()) mismatches += m + "\n";
      for (size_t k = 0; k < results[i].samples.size() && k < refs[i].top2.size(); ++k) {
        if (results[i].samples[k].token != refs[i].ids[k]) break;
        max_logprob_diff = std::max<double>(max_logprob_diff,
                                            std::fabs(results[i].samples[k].logprob - refs[i].top2[k][0]));
      }
    }
    // Requests decoding at the same time on one node shared its batched steps.
    int most_at_once = 0;
    for (const Generated& a : results) {
      int n = 0;
      for (const Generated& b : results) n += b.first_token_at <= a.first_token_at && a.first_token_at <= b.last_token_at;
      most_at_once = std::max(most_at_once, n);
    }
    INFO(mismatches);
    CHECK(mismatches.empty());
    // The decode node's rows of a batched step run the same kernels as hack-run's single
    // sequence (bitwise equal here); 1e-3 leaves room for a blocked GEMM that sums in
    // another order, while any KV damage in transfer moves logprobs by far more.
    INFO("largest |logprob(decode) - logprob(hack-run)| " << max_logprob_diff);
    CHECK(max_logprob_diff <= logprob_tolerance);
    // The comparison covered batched decoding, not one request after another.
    INFO("most requests decoding at once " << most_at_once);
    CHECK(most_at_once >= 2);
    // Both nodes run on this host: prefill opened its KV endpoint by the decode node's UCX
    // worker address (so with shared memory enabled, UCX carried the KV over it).
    CHECK(metric(prefill.address, "hack:kv_connects_total{by=\"address\"}") >= 1);
    if (std::find(prefill_flags.begin(), prefill_flags.end(), "--prefill-batch-jobs") != prefill_flags.end())
      CHECK(metric(prefill.address, "hack:prefill_batched_jobs_total") >= 2);
    require_drained(decode);
    require_drained(prefill);
  }
}

}  // namespace

TEST_CASE("disaggregated greedy output equals hack-run token for token (--kv fp)", "[e2e][disaggregation]") {
  check_equal_to_hack_run("fp");
}

TEST_CASE("disaggregated greedy output equals hack-run token for token (--kv hack)", "[e2e][disaggregation]") {
  check_equal_to_hack_run("hack --hack-bits 2");
}

TEST_CASE("disaggregated greedy output equals hack-run token for token (--kv hack, default K4/V4)",
          "[e2e][disaggregation]") {
  // The default widths of a model without a calibrated allocation. Tokens must agree exactly;
  // logprobs differ from hack-run's by rounding, as in every mode (2-bit codes: < 1e-3; fp:
  // < 1e-4): a batch's matmul kernels sum in another order than one row's (unit_decode,
  // "batched decode…": fp 4.0e-4, K2/V2 1.4e-3, K4/V4 6.1e-4 with six requests in one
  // process, while KV imported as messages is bit for bit at K4/V4). Here 1.4e-3 to 7.2e-3 in
  // the runs of 2026-11-28/29, the largest with UCX over tcp; the bound is about 3x that. Why
  // 4-bit codes amplify the rounding more than 2-bit codes across this cluster's batches is
  // not pinned down. Pages damaged in flight are caught by their checksums (the corruption
  // test below).
  check_equal_to_hack_run("hack", 2e-2);
}

TEST_CASE("batched short-prompt prefill: greedy output equals hack-run token for token", "[e2e][disaggregation]") {
  // --prefill-batch-jobs 8: the 13 of 16 prompts of at most 512 tokens that queue together
  // share prefill forwards (the metric below says they did). A batch rounds the prompt's
  // logits and KV in the last bits (RESULTS "Batched short-prompt prefill": ≤ 3e-4 of max|logit|
  // on hack-tiny), so logprobs get the K4/V4 case's bound; greedy tokens must still agree.
  check_equal_to_hack_run("hack --hack-bits 2", 2e-2, {"--prefill-batch-jobs", "8"}, {kShm});
}

TEST_CASE("disaggregated greedy output equals hack-run under a per-layer bit allocation", "[e2e][disaggregation]") {
  // Layers of different K/V widths and a 40-token recent window (the allocation's): blocks
  // inside the window cross the wire as exact tokens, older ones as each layer's pages.
  const std::string allocation = (test::fixtures_dir() / "allocations" / "hack-tiny-mixed.hack_kv.json").string();
  check_equal_to_hack_run("hack --hack-allocation " + allocation + " --hack-block 32");
}

// --- Faults. Each: the request ends with an explicit error, the surviving nodes serve a new
// request, and every surviving node frees all its KV.

TEST_CASE("decode node killed during the KV transfer: the prefill job fails and frees, a new decode node is served",
          "[e2e][disaggregation][fault]") {
  Node decode = start_decode("hack", kTcp);
  Node prefill = start_slow_prefill("hack", kTcp, kLayerDelayMs);
  const GenerateJob job = greedy_job(prompt_ids(kLongPrompt, 1), 16);
  const std::string failed_line = "prefill: request " + std::to_string(job.request_id) + " failed";

  SECTION("through DisaggregatedCall") {
    auto accepted = std::make_shared<std::promise<void>>();
    auto run = std::async(std::launch::async, [&] {
      return generate(prefill.address, decode.address, job, {}, [&](const NodeEvent& e) {
        if (e.kind == NodeEventKind::accepted) accepted->set_value();
        return true;
      });
    });
    REQUIRE(ready_within(accepted->get_future(), kWaitS));
    REQUIRE(wait_health(decode.address, holds_kv));  // the transfer is under way
    decode.process->kill_hard();
    const Generated g = run.get();
    INFO(g.outcome.status.message());
    REQUIRE(!g.outcome.status.is_ok());
    // The decode stream breaks at once; the prefill node notices the lost peer at its next
    // send, so its error may come first.
    REQUIRE((contains(g.outcome.status.message(), "decode node 127.0.0.1:" + std::to_string(decode.address.port)) ||
             contains(g.outcome.status.message(), "lost the receiver")));
  }
  SECTION("prefill called alone (it must notice the lost UCX peer itself)") {
    auto accepted = std::make_shared<std::promise<void>>();
    auto stream = open_decode_stream(decode.address, job, accepted);
    REQUIRE(ready_within(accepted->get_future(), kWaitS));
    auto call = call_prefill(prefill.address, decode.address, job);
    REQUIRE(wait_health(decode.address, holds_kv));
    decode.process->kill_hard();
    REQUIRE(ready_within(call, kWaitS));
    const CallEnd end = call.get();
    INFO(end.status << " " << end.body << end.error << "\nprefill log:\n" << prefill.process->log());
    REQUIRE(end.status == 502);
    REQUIRE(contains(parse_node_error(end.body), "request " + std::to_string(job.request_id) + ": lost the receiver"));
    (void)stream.get();
  }
  require_drained(prefill);  // the job has ended
  INFO(prefill.process->log());
  REQUIRE(contains(prefill.process->log(), failed_line));
  Node decode2 = start_decode("hack", kTcp);
  require_serves(prefill.address, decode2.address);
  require_drained(prefill);
  require_drained(decode2);
}

TEST_CASE("decode node killed during a KV transfer over shared memory: prefill notices and serves a new decode node",
          "[e2e][disaggregation][fault]") {
  // Both nodes on this host with shared memory enabled: prefill opens its endpoint by the
  // decode node's worker address and UCX puts the KV on sysv/posix, where a dead peer is
  // found by keepalive (the nodes set UCX_KEEPALIVE_INTERVAL=1s), not by a reset socket.
  Node decode = start_decode("hack", kShm);
  Node prefill = start_slow_prefill("hack", kShm, kLayerDelayMs);
  const NodeHealth h = fetch_health(decode.address);
  REQUIRE(!h.ucx_worker.empty());
  REQUIRE(!h.host_id.empty());
  decode.address.ucx_worker = h.ucx_worker;
  decode.address.host_id = h.host_id;
  const GenerateJob job = greedy_job(prompt_ids(kLongPrompt, 3), 16);
  auto accepted = std::make_shared<std::promise<void>>();
  auto stream = open_decode_stream(decode.address, job, accepted);
  REQUIRE(ready_within(accepted->get_future(), kWaitS));
  auto call = call_prefill(prefill.address, decode.address, job);
  REQUIRE(wait_health(decode.address, holds_kv));  // the transfer is under way
  const auto killed = Clock::now();
  decode.process->kill_hard();
  REQUIRE(ready_within(call, kWaitS));
  const double noticed_s = std::chrono::duration<double>(Clock::now() - killed).count();
  const CallEnd end = call.get();
  INFO(end.status << " " << end.body << end.error << "\nprefill log:\n" << prefill.process->log());
  CHECK(contains(prefill.process->log(), "opened by worker address (same host): lane[0]:"));
  CHECK((contains(prefill.process->log(), "sysv/memory") || contains(prefill.process->log(), "posix/memory")));
  REQUIRE(end.status == 502);
  REQUIRE(contains(parse_node_error(end.body), "request " + std::to_string(job.request_id) + ": lost the receiver"));
  INFO("prefill's call ended " << noticed_s << " s after the kill");
  CHECK(noticed_s < 10);
  (void)stream.get();
  require_drained(prefill);
  CHECK(metric(prefill.address, "hack:kv_connects_total{by=\"address\"}") >= 1);
  Node decode2 = start_decode("hack", kShm);
  require_serves(prefill.address, decode2.address);
  require_drained(prefill);
  require_drained(decode2);
}

TEST_CASE("decode node killed during generation: the request fails, prefill serves a new decode node",
          "[e2e][disaggregation][fault]") {
  Node decode = start_decode("hack", kTcp);
  Node prefill = start_prefill("hack", kTcp);
  auto some_tokens = std::make_shared<std::promise<void>>();
  auto run = std::async(std::launch::async, [&] {
    return generate(prefill.address, decode.address, greedy_job(prompt_ids(100, 2), 3000, true), {},
                    [&](const NodeEvent& e) {
                      if (e.kind == NodeEventKind::token && e.index == 20) some_tokens->set_value();
                      return true;
                    });
  });
  REQUIRE(ready_within(some_tokens->get_future(), kWaitS));
  decode.process->kill_hard();
  const Generated g = run.get();
  INFO(g.outcome.status.message());
  REQUIRE(!g.outcome.status.is_ok());
  REQUIRE(g.outcome.started);
  REQUIRE(g.samples.size() < 3000);
  REQUIRE(contains(g.outcome.status.message(), "decode node 127.0.0.1:" + std::to_string(decode.address.port)));
  require_drained(prefill);
  Node decode2 = start_decode("hack", kTcp);
  require_serves(prefill.address, decode2.address);
  require_drained(prefill);
  require_drained(decode2);
}

TEST_CASE("prefill node killed mid-prefill: decode frees the request and serves with a new prefill node",
          "[e2e][disaggregation][fault]") {
  Node decode = start_decode("hack", kTcp);
  Node prefill = start_slow_prefill("hack", kTcp, kLayerDelayMs);
  const GenerateJob job = greedy_job(prompt_ids(kLongPrompt, 3), 16);

  SECTION("through DisaggregatedCall") {
    auto accepted = std::make_shared<std::promise<void>>();
    auto run = std::async(std::launch::async, [&] {
      return generate(prefill.address, decode.address, job, {}, [&](const NodeEvent& e) {
        if (e.kind == NodeEventKind::accepted) accepted->set_value();
        return true;
      });
    });
    REQUIRE(ready_within(accepted->get_future(), kWaitS));
    REQUIRE(wait_health(decode.address, holds_kv));
    prefill.process->kill_hard();
    const Generated g = run.get();
    INFO(g.outcome.status.message());
    REQUIRE(!g.outcome.status.is_ok());
    REQUIRE(!g.outcome.started);
    // Whichever notices first: the prefill call's broken connection, or the decode node
    // its lost UCX peer.
    REQUIRE((contains(g.outcome.status.message(), "prefill node 127.0.0.1:" + std::to_string(prefill.address.port)) ||
             contains(g.outcome.status.message(), "lost the sender")));
  }
  SECTION("decode stream alone (decode must notice the lost UCX peer itself)") {
    auto accepted = std::make_shared<std::promise<void>>();
    auto stream = open_decode_stream(decode.address, job, accepted);
    REQUIRE(ready_within(accepted->get_future(), kWaitS));
    auto call = call_prefill(prefill.address, decode.address, job);
    REQUIRE(wait_health(decode.address, holds_kv));
    prefill.process->kill_hard();
    REQUIRE(ready_within(stream, kWaitS));
    const StreamEnd end = stream.get();
    INFO(end.error << "\ndecode log:\n" << decode.process->log());
    REQUIRE(end.status == 200);
    REQUIRE(end.ended_with_error());
    INFO("error event: " << end.events.back().message);
    // Whichever decode notices first: the endpoint's failure ("lost the sender"), or a page
    // in flight whose rendezvous receive fails with it (pages past UCX's eager size, as
    // K4/V4 pages of hack-tiny are: "lost a N-byte kv_page").
    const std::string request = "request " + std::to_string(job.request_id) + ": ";
    REQUIRE((contains(end.events.back().message, request + "lost the sender") ||
             contains(end.events.back().message, request + "lost a ")));
    (void)call.get();
  }
  require_drained(decode);
  Node prefill2 = start_prefill("hack", kTcp);
  require_serves(prefill2.address, decode.address);
  require_drained(decode);
  require_drained(prefill2);
}

TEST_CASE("a page corrupted in flight fails its request with a checksum error, both nodes keep serving",
          "[e2e][disaggregation][fault]") {
  for (const std::string kv : {"fp", "hack"}) {
    INFO("--kv " << kv);
    Node decode = start_decode(kv, kTcp);
    Node prefill = start_prefill(kv, kTcp, {"--enable-test-hooks"});
    GenerateOptions corrupt;
    corrupt.corrupt_page = true;
    const Generated g = generate(prefill.address, decode.address, greedy_job(prompt_ids(300, 4), 8), corrupt);
    INFO(g.outcome.status.message());
    REQUIRE(!g.outcome.status.is_ok());
    REQUIRE(!g.outcome.started);
    REQUIRE(contains(g.outcome.status.message(), "checksum"));
    require_drained(decode);
    require_drained(prefill);
    require_serves(prefill.address, decode.address, 300);
    require_drained(decode);
    require_drained(prefill);
  }
}

TEST_CASE("a caller that stops reading the decode stream: decode frees the request", "[e2e][disaggregation][fault]") {
  Node decode = start_decode("hack", kTcp);
  Node prefill = start_prefill("hack", kTcp);
  const GenerateJob job = greedy_job(prompt_ids(100, 5), 3000, true);

  SECTION("on_event returns false") {
    const Generated g = generate(prefill.address, decode.address, job, {},
                                 [](const NodeEvent& e) { return e.kind != NodeEventKind::token || e.index < 4; });
    INFO(g.outcome.status.message());
    REQUIRE(g.outcome.status.is_ok());
    REQUIRE(g.outcome.finish_reason == FinishReason::stop);
    REQUIRE(g.samples.size() == 5);
  }
  SECTION("cancel() from another thread") {
    auto some_tokens = std::make_shared<std::promise<void>>();
    std::atomic<DisaggregatedCall*> call{nullptr};
    auto run = std::async(std::launch::async, [&] {
      DisaggregatedCall c(prefill.address, decode.address, job, GenerateOptions{});
      call = &c;
      int tokens = 0;
      GenerateOutcome out = c.run([&](const NodeEvent& e) {
        if (e.kind == NodeEventKind::token && ++tokens == 5) some_tokens->set_value();
        return true;
      });
      return std::make_pair(out, tokens);
    });
    REQUIRE(ready_within(some_tokens->get_future(), kWaitS));
    call.load()->cancel();
    const auto [out, tokens] = run.get();
    INFO(out.status.message());
    REQUIRE(!out.status.is_ok());
    REQUIRE(contains(out.status.message(), "cancelled"));
    REQUIRE(tokens < 3000);
  }
  SECTION("the connection dropped, no cancel sent") {
    auto accepted = std::make_shared<std::promise<void>>();
    auto stream = open_decode_stream(decode.address, job, accepted,
                                     [](const NodeEvent& e) { return e.kind != NodeEventKind::token || e.index < 4; });
    REQUIRE(ready_within(accepted->get_future(), kWaitS));
    const CallEnd prefilled = call_prefill(prefill.address, decode.address, job).get();
    INFO(prefilled.body << prefilled.error);
    REQUIRE(prefilled.status == 200);
    const StreamEnd end = stream.get();
    REQUIRE(end.events.size() == 6);  // accepted and 5 tokens, then the caller hung up
    require_drained(decode);
    INFO(decode.process->log());
    REQUIRE(contains(decode.process->log(),
                     "request " + std::to_string(job.request_id) + ": caller went away, generation cancelled"));
  }
  require_drained(decode);
  // Freed because the caller left, not because the 3000 tokens were done.
  REQUIRE(metric(decode.address, "hack:generation_tokens_total") < 1000);
  require_drained(prefill);
  require_serves(prefill.address, decode.address);
  require_drained(decode);
  require_drained(prefill);
}

TEST_CASE("a prefill caller that disconnects mid-prefill: prefill cancels the job, decode frees the request",
          "[e2e][disaggregation][fault]") {
  Node decode = start_decode("hack", kTcp);
  Node prefill = start_slow_prefill("hack", kTcp, kLayerDelayMs);
  const GenerateJob job = greedy_job(prompt_ids(kLongPrompt, 6), 16);
  auto accepted = std::make_shared<std::promise<void>>();
  auto stream = open_decode_stream(decode.address, job, accepted);
  REQUIRE(ready_within(accepted->get_future(), kWaitS));
  HttpCancel hang_up;
  auto call = call_prefill(prefill.address, decode.address, job, &hang_up);
  REQUIRE(wait_health(decode.address, holds_kv));  // mid-prefill: the first layers have arrived
  REQUIRE(fetch_health(prefill.address).queue_tokens == kLongPrompt);
  hang_up.cancel();
  REQUIRE(call.get().error == "cancelled");
  // The prefill node cancels the job, which tells the decode node over UCX.
  REQUIRE(ready_within(stream, kWaitS));
  const StreamEnd end = stream.get();
  INFO(end.error << "\ndecode log:\n" << decode.process->log() << "\nprefill log:\n" << prefill.process->log());
  REQUIRE(end.ended_with_error());
  REQUIRE(contains(prefill.process->log(), "request " + std::to_string(job.request_id) +
                                               ": caller went away, prefill cancelled"));
  require_drained(prefill);
  require_drained(decode);
  require_serves(prefill.address, decode.address);
  require_drained(prefill);
  require_drained(decode);
}
