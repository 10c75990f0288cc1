// node_direct_bench: what hack-router adds to a request. The same short requests (random
// token-id prompts of --prompt-tokens, --max-tokens output tokens, greedy, EOS ignored) are
// sent closed-loop at each --concurrency level two ways, from this one process:
//
//   direct  hack::server::DisaggregatedCall straight to a prefill + decode node pair: open the
//           decode stream (POST /internal/generate), wait for "accepted", POST
//           /internal/prefill, read tokens until "finished" — the router's own node path,
//           without the router process;
//   router  POST /v1/completions (stream, prompt as a token-id list) to hack-router, read SSE
//           chunks until [DONE]. The router then does the direct path itself, plus its HTTP
//           parsing, validation, node choice, detokenization and the extra hop.
//
// Per (concurrency, mode): requests/s (completed requests / wall time), request latency p50 /
// p90 / p99 / mean (send → last byte), time to the first token (direct: first token event;
// router: first SSE chunk) p50 / p99, errors. Then per concurrency the router overhead =
// router − direct latency (p50, p99) and the router's share of the node path's requests/s,
// which is the bound: the router can at best match the node path it drives.
// Both modes share the client threads and prompts (prompt i is the same in both); modes
// alternate within each concurrency level so slow drift of the machine hits both alike.
// On one machine the client, router and nodes share the cores: the overhead measured is the
// router's CPU as well as its latency.
//
//   node_direct_bench --prefill HOST:PORT --decode HOST:PORT [--router HOST:PORT]
//                     [--modes direct,router] [--concurrency 1,2,4,8,16,32]
//                     [--requests 400] [--warmup 20] [--prompt-tokens 8] [--max-tokens 1]
//                     [--min-id 100] [--max-id 4000] [--secret-file F] [--timeout 60] [--seed 1]
//                     [--json]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/http/http_client.h"
#include "hack/router/node_client.h"
#include "hack/node/node_protocol.h"
#include "hack/router/routing.h"

using namespace hack;
using namespace hack::server;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

struct Args {
  std::string prefill, decode, router, secret;
  std::vector<std::string> modes = {"direct", "router"};
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32};
  int requests = 400;
  int warmup = 20;
  int prompt_tokens = 8;
  int max_tokens = 1;
  int min_id = 100;
  int max_id = 4000;
  float timeout_s = 60;
  int seed = 1;
  bool json = false;
};

std::optional<Args> parse(int argc, char** argv) {
  Args a;
  std::string modes = "direct,router", concurrency = "1,2,4,8,16,32";
  FlagSet flags("node_direct_bench",
                "Short requests straight to a prefill+decode pair and through hack-router: the router's overhead.",
                "HACK_NODE_DIRECT_BENCH");
  flags.add_string("prefill", &a.prefill, "prefill node HTTP host:port");
  flags.add_string("decode", &a.decode, "decode node HTTP host:port (its UCX address is read from /health)");
  flags.add_string("router", &a.router, "hack-router host:port (needed for --modes router)");
  flags.add_secret("secret", &a.secret, "the nodes' shared secret (X-Hack-Secret)");
  flags.add_string("modes", &modes, "direct and/or router");
  flags.add_string("concurrency", &concurrency, "closed-loop concurrency levels, comma-separated");
  flags.add_int("requests", &a.requests, "measured requests per (concurrency, mode)");
  flags.add_int("warmup", &a.warmup, "unmeasured requests before each (concurrency, mode)");
  flags.add_int("prompt-tokens", &a.prompt_tokens, "prompt length in tokens");
  flags.add_int("max-tokens", &a.max_tokens, "output tokens per request (EOS ignored)");
  flags.add_int("min-id", &a.min_id, "smallest prompt token id");
  flags.add_int("max-id", &a.max_id, "prompt token ids are below this (keep clear of special tokens)");
  flags.add_float("timeout", &a.timeout_s, "idle timeout of each connection, seconds");
  flags.add_int("seed", &a.seed, "prompt RNG seed");
  flags.add_bool("json", &a.json, "JSON output");
  if (!flags.parse(argc, argv)) return std::nullopt;
  a.modes = split_list(modes);
  a.concurrency = parse_int_list(concurrency, "concurrency");
  for (const auto& m : a.modes) HACK_CHECK(m == "direct" || m == "router", "--modes takes direct and/or router, not '{}'", m);
  HACK_CHECK(!a.prefill.empty() || std::find(a.modes.begin(), a.modes.end(), "direct") == a.modes.end(),
             "--prefill is required for --modes direct");
  HACK_CHECK(!a.decode.empty() || std::find(a.modes.begin(), a.modes.end(), "direct") == a.modes.end(),
             "--decode is required for --modes direct");
  HACK_CHECK(!a.router.empty() || std::find(a.modes.begin(), a.modes.end(), "router") == a.modes.end(),
             "--router is required for --modes router");
  for (int c : a.concurrency) HACK_CHECK(c >= 1, "--concurrency levels must be at least 1");
  HACK_CHECK(a.requests >= 1 && a.warmup >= 0, "--requests must be at least 1 and --warmup at least 0");
  HACK_CHECK(a.prompt_tokens >= 1 && a.max_tokens >= 1, "--prompt-tokens and --max-tokens must be at least 1");
  HACK_CHECK(0 <= a.min_id && a.min_id < a.max_id, "need 0 <= --min-id < --max-id");
  return a;
}

NodeAddress address_of(const std::string& name, const std::string& host_port) {
  NodeAddress n = parse_node_address(host_port, "--" + name);
  n.name = name;
  return n;
}

struct Sample {
  double latency_s = 0;
  double ttft_s = 0;
};

// One request; returns its timings, or the error text.
struct Outcome {
  bool ok = false;
  Sample sample;
  std::string error;
};

struct Target {
  std::string mode;
  NodeAddress prefill, decode, router;
  std::string secret;
  double timeout_s = 60;
  int max_tokens = 1;
};

Outcome run_direct(const Target& t, const std::vector<int>& prompt, uint64_t request_id) {
  Outcome o;
  GenerateJob job;
  job.request_id = request_id;
  job.prompt = prompt;
  job.params.temperature = 0;
  job.params.max_tokens = t.max_tokens;
  job.params.ignore_eos = true;
  GenerateOptions options{t.secret, t.timeout_s, false};
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> first;
  DisaggregatedCall call(t.prefill, t.decode, job, options);
  const GenerateOutcome g = call.run([&](const NodeEvent& e) {
    if (e.kind == NodeEventKind::token && !first) first = Clock::now();
    return true;
  });
  const auto t1 = Clock::now();
  if (!g.status.is_ok()) {
    o.error = g.status.message();
    return o;
  }
  if (g.completion_tokens != t.max_tokens) {
    o.error = fmt::format("{} completion tokens, expected {}", g.completion_tokens, t.max_tokens);
    return o;
  }
  o.ok = true;
  o.sample.latency_s = std::chrono::duration<double>(t1 - t0).count();
  o.sample.ttft_s = std::chrono::duration<double>((first ? *first : t1) - t0).count();
  return o;
}

Outcome run_router(const Target& t, const std::vector<int>& prompt) {
  Outcome o;
  HttpClientRequest req;
  req.host = t.router.host;
  req.port = t.router.port;
  req.method = "POST";
  req.target = "/v1/completions";
  req.timeout_s = t.timeout_s;
  req.body = json{{"prompt", prompt},     {"max_tokens", t.max_tokens}, {"temperature", 0},
                  {"stream", true},       {"ignore_eos", true},          {"stream_options", {{"include_usage", true}}}}
                 .dump();
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> first;
  bool done = false;
  int completion_tokens = -1;
  std::string error;
  try {
    HttpResponse r = http_stream(req, [&](std::string_view data) {
      if (data == "[DONE]") {
        done = true;
        return true;
      }
      json j = json::parse(data, nullptr, false);
      if (j.is_discarded()) {
        error = "unparsable SSE chunk";
        return true;
      }
      if (j.contains("error")) {
        error = j["error"].value("message", std::string("error chunk"));
        return true;
      }
      if (j.contains("usage") && j["usage"].is_object()) completion_tokens = j["usage"].value("completion_tokens", -1);
      if (!first && j.contains("choices") && !j["choices"].empty()) first = Clock::now();
      return true;
    });
    if (r.status != 200) error = fmt::format("router answered {}: {}", r.status, r.body.substr(0, 200));
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto t1 = Clock::now();
  if (error.empty() && !done) error = "stream ended without [DONE]";
  if (error.empty() && completion_tokens != t.max_tokens) {
    error = fmt::format("{} completion tokens, expected {}", completion_tokens, t.max_tokens);
  }
  if (!error.empty()) {
    o.error = error;
    return o;
  }
  o.ok = true;
  o.sample.latency_s = std::chrono::duration<double>(t1 - t0).count();
  o.sample.ttft_s = std::chrono::duration<double>((first ? *first : t1) - t0).count();
  return o;
}

struct LevelResult {
  std::string mode;
  int concurrency = 0;
  int ok = 0, errors = 0;
  double wall_s = 0;
  std::vector<Sample> samples;
  std::string first_error;
  double rps() const { return wall_s > 0 ? ok / wall_s : 0; }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank)), hi = static_cast<size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// Runs `count` requests closed-loop on `concurrency` threads; prompts are taken in order
// starting at `first_prompt` (cyclically).
LevelResult run_level(const Target& t, int concurrency, int count, const std::vector<std::vector<int>>& prompts,
                      size_t first_prompt, std::mt19937_64& ids) {
  LevelResult res;
  res.mode = t.mode;
  res.concurrency = concurrency;
  std::atomic<int> next{0};
  std::mutex mu;
  const uint64_t id_base = ids() & 0x7fffffff00000000ull;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < concurrency; ++w) {
    threads.emplace_back([&] {
      for (;;) {
        const int i = next.fetch_add(1);
        if (i >= count) return;
        const auto& prompt = prompts[(first_prompt + i) % prompts.size()];
        Outcome o = t.mode == "direct" ? run_direct(t, prompt, id_base + static_cast<uint64_t>(i) + 1)
                                       : run_router(t, prompt);
        std::lock_guard lock(mu);
        if (o.ok) {
          ++res.ok;
          res.samples.push_back(o.sample);
        } else {
          ++res.errors;
          if (res.first_error.empty()) res.first_error = o.error;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  res.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, ttft_p50 = 0, ttft_p99 = 0;
};

Stats stats_of(const LevelResult& r) {
  std::vector<double> lat, ttft;
  for (const Sample& s : r.samples) {
    lat.push_back(s.latency_s * 1e3);
    ttft.push_back(s.ttft_s * 1e3);
  }
  return {percentile(lat, 50), percentile(lat, 90), percentile(lat, 99), mean(lat), percentile(ttft, 50),
          percentile(ttft, 99)};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    setup_logging("error", false);  // DisaggregatedCall warns on every benign early prefill cancel (see RESULTS)
    const auto parsed = parse(argc, argv);
    if (!parsed) return 0;
    const Args& a = *parsed;

    Target base;
    base.secret = a.secret;
    base.timeout_s = a.timeout_s;
    base.max_tokens = a.max_tokens;
    if (!a.prefill.empty()) base.prefill = address_of("prefill", a.prefill);
    if (!a.decode.empty()) {
      base.decode = address_of("decode", a.decode);
      base.decode.ucx_address = fetch_health(base.decode).ucx_address;
      HACK_CHECK(!base.decode.ucx_address.empty(), "decode node {} reports no UCX address", a.decode);
    }
    if (!a.router.empty()) base.router = address_of("router", a.router);

    // Enough distinct prompts that every measured request of a level has its own.
    int max_conc = *std::max_element(a.concurrency.begin(), a.concurrency.end());
    const size_t n_prompts = static_cast<size_t>(a.requests + a.warmup + max_conc);
    std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
    std::uniform_int_distribution<int> tok(a.min_id, a.max_id - 1);
    std::vector<std::vector<int>> prompts(n_prompts);
    for (auto& p : prompts) {
      p.resize(a.prompt_tokens);
      for (int& x : p) x = tok(rng);
    }
    std::mt19937_64 ids(std::random_device{}());

    if (!a.json) {
      std::printf("node_direct_bench: %d measured + %d warm-up requests per level, prompt %d tokens, max_tokens %d, "
                  "greedy, ignore_eos\n",
                  a.requests, a.warmup, a.prompt_tokens, a.max_tokens);
      if (!a.prefill.empty()) {
        std::printf("  direct: prefill %s, decode %s (ucx %s)\n", a.prefill.c_str(), a.decode.c_str(),
                    base.decode.ucx_address.c_str());
      }
      if (!a.router.empty()) std::printf("  router: http://%s/v1/completions (stream)\n", a.router.c_str());
      std::printf("\n| concurrency | mode | req/s | p50 ms | p90 ms | p99 ms | mean ms | ttft p50 | ttft p99 | errors |\n");
      std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
      std::fflush(stdout);
    }

    std::vector<LevelResult> results;
    for (int c : a.concurrency) {
      for (const std::string& mode : a.modes) {
        Target t = base;
        t.mode = mode;
        if (a.warmup > 0) run_level(t, c, a.warmup, prompts, 0, ids);
        LevelResult r = run_level(t, c, a.requests, prompts, static_cast<size_t>(a.warmup), ids);
        if (!a.json) {
          const Stats s = stats_of(r);
          std::printf("| %d | %s | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |\n", c, mode.c_str(), r.rps(),
                      s.p50, s.p90, s.p99, s.mean, s.ttft_p50, s.ttft_p99, r.errors);
          if (!r.first_error.empty()) std::printf("    first error: %s\n", r.first_error.c_str());
          std::fflush(stdout);
        }
        results.push_back(std::move(r));
      }
    }

    // Router overhead per concurrency: router − direct.
    json overhead = json::array();
    std::map<int, std::map<std::string, const LevelResult*>> by;
    for (const LevelResult& r : results) by[r.concurrency][r.mode] = &r;
    if (!a.json && by.begin()->second.size() == 2) {
      std::printf("\nRouter overhead (router − direct; bound: the direct node path's latency and req/s)\n\n");
      std::printf("| concurrency | Δp50 ms | Δp99 ms | Δp50 / direct p50 | router req/s / direct req/s |\n");
      std::printf("|---|---|---|---|---|\n");
    }
    for (const auto& [c, modes] : by) {
      if (modes.size() != 2) continue;
      const Stats d = stats_of(*modes.at("direct")), r = stats_of(*modes.at("router"));
      const double rps_d = modes.at("direct")->rps(), rps_r = modes.at("router")->rps();
      const double share = rps_d > 0 ? rps_r / rps_d : 0;
      const double rel = d.p50 > 0 ? (r.p50 - d.p50) / d.p50 : 0;
      overhead.push_back({{"concurrency", c},
                          {"delta_p50_ms", r.p50 - d.p50},
                          {"delta_p99_ms", r.p99 - d.p99},
                          {"delta_p50_rel", rel},
                          {"rps_share", share}});
      if (!a.json) {
        std::printf("| %d | %+.2f | %+.2f | %+.0f %% | %.0f %% |\n", c, r.p50 - d.p50, r.p99 - d.p99, rel * 100,
                    share * 100);
      }
    }
    double best_router = 0, best_direct = 0;
    int best_router_c = 0, best_direct_c = 0;
    for (const LevelResult& r : results) {
      if (r.errors > 0) continue;
      double& best = r.mode == "router" ? best_router : best_direct;
      int& best_c = r.mode == "router" ? best_router_c : best_direct_c;
      if (r.rps() > best) {
        best = r.rps();
        best_c = r.concurrency;
      }
    }
    if (a.json) {
      json levels = json::array();
      for (const LevelResult& r : results) {
        const Stats s = stats_of(r);
        levels.push_back({{"mode", r.mode},       {"concurrency", r.concurrency}, {"requests", r.ok},
                          {"errors", r.errors},   {"first_error", r.first_error}, {"wall_s", r.wall_s},
                          {"rps", r.rps()},       {"p50_ms", s.p50},              {"p90_ms", s.p90},
                          {"p99_ms", s.p99},      {"mean_ms", s.mean},            {"ttft_p50_ms", s.ttft_p50},
                          {"ttft_p99_ms", s.ttft_p99}});
      }
      json out = {{"prompt_tokens", a.prompt_tokens}, {"max_tokens", a.max_tokens}, {"levels", levels},
                  {"overhead", overhead},           {"max_rps_router", best_router},
                  {"max_rps_router_concurrency", best_router_c}, {"max_rps_direct", best_direct},
                  {"max_rps_direct_concurrency", best_direct_c}};
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      if (best_router > 0) {
        std::printf("\nmax req/s through the router: %.1f (concurrency %d)", best_router, best_router_c);
        if (best_direct > 0) {
          std::printf("; node path without it: %.1f (concurrency %d); %.0f %% of the bound", best_direct, best_direct_c,
                      100 * best_router / best_direct);
        }
        std::printf("\n");
      } else if (best_direct > 0) {
        std::printf("\nmax req/s on the node path: %.1f (concurrency %d)\n", best_direct, best_direct_c);
      }
    }
    int errors = 0;
    for (const LevelResult& r : results) errors += r.errors;
    return errors > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "node_direct_bench: error: %s\n", e.what());
    return 2;
  }
}
