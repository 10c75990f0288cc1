// attention_bench: one decode step of attention at the Llama-3-8B shape (32 query heads,
// 8 KV heads, head_dim 128) over the paged KV cache, for fp32 and bf16 pages and HACK
// 2/4/8-bit, contexts 1K..64K, batch 1 and 8. Prints time per step, KV bytes read,
// achieved GB/s and that as a share of this machine's read bandwidth, measured here the
// way bench/membw measures it (hack::measure_read_bandwidth_gbs). Times are the best of 7
// trials and the bandwidth the best of its passes, so a shared machine disturbs both alike.
//
// Decode reads every layer's KV once per step, so the bench cycles through enough layers
// that their KV exceeds the last-level cache (at most 32, like the model): small contexts
// are then measured from memory, as in a real step, not from cache.
//
//   attention_bench [--contexts 1024,...,65536] [--batch 1,8] [--modes fp32,bf16,hack2,hack4,hack8]
//                   [--block 64] [--threads N] [--min-time-s 0.3] [--max-gb 5] [--layers N] [--json]
//                   [--fdc-dims 64:48,32:32,...] [--balance 0|1] [--chunk N]
// A mode with the suffix "+fdc" (hack2+fdc) stores the 8 KV heads at --fdc-dims (k_dim:v_dim
// per head, every layer), as an FDC artifact's per-head ranks do; --balance 0 turns off the
// plan's load balancing (fixed row blocks, all heads in one decode task, plan order);
// --chunk N times a prefill chunk of N tokens at the end of the context instead of a decode
// step. The imbalance columns are the plan's simulated busiest worker over the mean, for
// this pool's threads and for the step planned for 132 workers (an H100's SMs, where few
// tasks per worker make balance matter most).
// (--layers forces the number of layers cycled; 1 keeps small KV in cache, for diagnosis)
// A HACK mode with the suffix "+qNN" or "+mNN" (hack2+q20) runs MPCache page selection at a
// budget of NN % of the context (Quest or MPCache scores), a new selection every
// --select-share layers as the backend makes it (no dense layers here); its step time
// includes that share of the scoring, and select_us is one selection (all KV heads) alone.
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/core/cpu_features.h"
#include "hack/core/membw.h"
#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/hack_page.h"
#include "hack/backend/cpu_page_selector.h"
#include "hack/backend/cpu_paged_kv_cache.h"

using namespace hack;
using Clock = std::chrono::steady_clock;

namespace {

int g_select_share = 2;  // --select-share (read by make_mode)

struct Args {
  std::vector<int> contexts = {1024, 2048, 4096, 8192, 16384, 32768, 65536};
  std::vector<int> batches = {1, 8};
  std::vector<std::string> modes = {"fp32", "bf16", "hack2", "hack4", "hack8"};
  int block = 64;
  int threads = 0;
  double min_time_s = 0.3;
  double max_gb = 5.0;
  int layers = 0;  // 0: enough to exceed the LLC
  int split_pages = PlanPolicy{}.split_segments;  // split-K unit of the plan
  bool json = false;
  std::vector<std::pair<int, int>> fdc_dims;  // per KV head (k_dim, v_dim) for "+fdc" modes
  bool balance = true;
  int chunk = 1;  // new tokens per sequence in the step: 1 = decode, more = a prefill chunk
};

// Parses the flags (hack::FlagSet: --help, HACK_ATTN_BENCH_* mirrors, --config); nullopt
// after --help.
std::optional<Args> parse(int argc, char** argv) {
  Args a;
  std::string contexts = "1024,2048,4096,8192,16384,32768,65536", batches = "1,8",
              modes = "fp32,bf16,hack2,hack4,hack8";
  float min_time_s = 0.3f, max_gb = 5.0f;
  // A spread like FDC's adaptive ranks (~0.55 of the dims on average).
  std::string fdc_dims = "48:64,32:48,80:64,48:32,64:80,32:64,96:96,48:32";
  FlagSet flags("attention_bench", "One decode step of attention at the Llama-3-8B shape over the paged KV cache.",
                "HACK_ATTN_BENCH");
  flags.add_string("contexts", &contexts, "context lengths, comma-separated");
  flags.add_string("batch", &batches, "batch sizes, comma-separated");
  flags.add_string("modes", &modes, "fp32, bf16, hack2, hack4, hack8, hack-kKvV (e.g. hack-k4v2)");
  flags.add_int("block", &a.block, "tokens per page (Π)");
  flags.add_int("threads", &a.threads, "threads (0 = all cores)");
  flags.add_float("min-time-s", &min_time_s, "minimum time per trial");
  flags.add_float("max-gb", &max_gb, "most KV bytes (GB) built for one configuration");
  flags.add_int("layers", &a.layers, "layers cycled (0 = enough to exceed the LLC)");
  flags.add_int("split-pages", &a.split_pages, "split-K unit of the attention plan: pages (segments) per task");
  flags.add_bool("json", &a.json, "JSON output");
  flags.add_string("fdc-dims", &fdc_dims, "k_dim:v_dim of each of the 8 KV heads for '+fdc' modes (multiples of 16)");
  flags.add_bool("balance", &a.balance, "balance the attention plan (equal-cost tasks, longest first)");
  flags.add_int("select-share", &g_select_share, "'+qNN' / '+mNN' modes: layers sharing one page selection");
  flags.add_int("chunk", &a.chunk, "new tokens per sequence: 1 = a decode step, N = a prefill chunk of N tokens");
  if (!flags.parse(argc, argv)) return std::nullopt;
  a.contexts = parse_int_list(contexts, "contexts");
  a.batches = parse_int_list(batches, "batch");
  a.modes = split_list(modes);
  a.min_time_s = min_time_s;
  a.max_gb = max_gb;
  for (const std::string& pair : split_list(fdc_dims)) {
    const size_t colon = pair.find(':');
    HACK_CHECK(colon != std::string::npos, "--fdc-dims: expected k_dim:v_dim, got '{}'", pair);
    a.fdc_dims.emplace_back(std::stoi(pair.substr(0, colon)), std::stoi(pair.substr(colon + 1)));
  }
  HACK_CHECK(a.chunk >= 1, "--chunk must be at least 1, got {}", a.chunk);
  HACK_CHECK(a.fdc_dims.size() == 8, "--fdc-dims: give the 8 KV heads, got {}", a.fdc_dims.size());
  return a;
}

size_t llc_bytes() {
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return static_cast<size_t>(v);
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string s;
  if (f >> s && !s.empty()) {
    size_t n = std::stoul(s);
    if (s.back() == 'K') n <<= 10;
    if (s.back() == 'M') n <<= 20;
    return n;
  }
  return size_t{32} << 20;
}


struct Mode {
  std::string name;
  KvCacheOptions options;
  bool fdc = false;
};

// The bench's shape (8 KV heads × 128, group 4) over `layers` layers, with the FDC dims.
KvShape bench_shape(int layers, const Mode& mode, const Args& args) {
  KvShape shape{layers, 8, 128, 4, {}, {}};
  if (mode.fdc)
    for (int l = 0; l < layers; ++l)
      for (const auto& [k, v] : args.fdc_dims) {
        shape.k_dims.push_back(k);
        shape.v_dims.push_back(v);
      }
  return shape;
}

Mode make_mode(std::string name, int block) {
  const std::string full_name = name;
  KvCacheOptions o;
  if (const size_t plus = name.find("+q") != std::string::npos ? name.find("+q") : name.find("+m");
      plus != std::string::npos) {  // hack2+q20: page selection at 20 %
    o.select.score = name[plus + 1] == 'q' ? PageScore::quest : PageScore::mpcache;
    o.select.ratio = std::stod(name.substr(plus + 2)) / 100.0;
    o.select.dense_layers = 0;
    o.select.share_layers = g_select_share;
    name = name.substr(0, plus) + name.substr(std::min(name.size(), name.find('+', plus + 1)));
  }
  const bool fdc = name.size() > 4 && name.ends_with("+fdc");
  if (fdc) name.resize(name.size() - 4);
  o.block_tokens = block;
  if (name == "fp32" || name == "bf16") {
    o.mode = KvMode::fp;
    o.fp_dtype = name == "fp32" ? DType::f32 : DType::bf16;
  } else if (name.rfind("hack-k", 0) == 0 && name.find('v', 6) != std::string::npos) {  // hack-k4v2
    o.mode = KvMode::hack;
    o.k_bits = std::stoi(name.substr(6));
    o.v_bits = std::stoi(name.substr(name.find('v', 6) + 1));
  } else if (name.rfind("hack", 0) == 0) {
    o.mode = KvMode::hack;
    o.k_bits = o.v_bits = std::stoi(name.substr(4));
  } else {
    std::fprintf(stderr, "unknown mode %s\n", name.c_str());
    std::exit(2);
  }
  return {full_name, o, fdc};
}

struct Result {
  std::string mode;
  int context = 0, batch = 0, layers = 0, threads = 0;
  double step_us = 0, kv_bytes = 0, gbs = 0, bw_share = 0, bytes_per_token = 0;
  double imbalance = 1;      // plan_imbalance of layer 0 on the pool's threads
  double imbalance_132 = 1;  // ... on 132 workers
  double select_us = 0, selected = 1;  // one selection's time; tokens attended / context
  bool skipped = false;
};

// Fills `layers` × `batch` sequences with `context` tokens of random K/V.
void fill(CpuPagedKvCache& cache, const KvShape& shape, int batch, int context, std::mt19937& rng) {
  const int H = shape.num_kv_heads, d = shape.head_dim;
  const size_t token_floats = static_cast<size_t>(H) * static_cast<size_t>(d);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int chunk = 256;
  std::vector<float> k(chunk * token_floats), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  const KvCacheOptions& o = cache.options();
  if (o.mode == KvMode::fp) {
    for (int s = 0; s < batch; ++s)
      for (int l = 0; l < shape.num_layers; ++l)
        for (int pos = 0; pos < context; pos += chunk) cache.append(l, s, pos, std::min(chunk, context - pos), k.data(), v.data());
    return;
  }
  // HACK: quantize a few distinct blocks once, then replicate their bytes (header patched).
  const int T = o.block_tokens, S = o.sinks;
  const int n_pages = std::max(0, context - S - 1) / T;  // keep a partly filled open block
  std::vector<std::vector<std::byte>> templates;
  {
    KvShape one_layer = shape;  // every layer has the same dims here
    one_layer.num_layers = 1;
    one_layer.k_dims.resize(shape.k_dims.empty() ? 0 : static_cast<size_t>(H));
    one_layer.v_dims.resize(one_layer.k_dims.size());
    auto maker = make_paged_kv_cache(one_layer, o);
    maker->add_sequence(0, S + 9 * T);
    for (int pos = 0; pos < S + 8 * T + 1; pos += chunk) {
      const int n = std::min(chunk, S + 8 * T + 1 - pos);
      maker->append(0, 0, pos, n, k.data() + static_cast<size_t>(pos % chunk) * 0, v.data());
    }
    for (int i = 0; i < maker->hack_page_count(0, 0); ++i) {
      const auto p = maker->hack_page(0, 0, i);
      templates.emplace_back(p.begin(), p.end());
    }
  }
  for (int s = 0; s < batch; ++s)
    for (int l = 0; l < shape.num_layers; ++l) {
      cache.append(l, s, 0, S, k.data(), v.data());
      for (int i = 0; i < n_pages; ++i) {
        std::vector<std::byte>& page = templates[static_cast<size_t>(i) % templates.size()];
        const uint32_t layer = static_cast<uint32_t>(l);
        const uint64_t first = static_cast<uint64_t>(S) + static_cast<uint64_t>(i) * T;
        std::memcpy(page.data() + offsetof(HackPageHeader, layer), &layer, sizeof layer);
        std::memcpy(page.data() + offsetof(HackPageHeader, first_token), &first, sizeof first);
        cache.append_hack_page(l, s, page.data(), page.size());
      }
      const int done = S + n_pages * T;
      cache.append(l, s, done, context - done, k.data(), v.data());
    }
}

Result run_one(const Mode& mode, int context, int batch, ThreadPool& pool, const Args& args, size_t llc, double bw) {
  Result r;
  r.mode = mode.name;
  r.context = context;
  r.batch = batch;
  r.threads = pool.size();
  r.bytes_per_token = kv_bytes_per_token(bench_shape(1, mode, args), mode.options);
  const double layer_bytes = r.bytes_per_token * context * batch;
  r.layers = args.layers > 0 ? args.layers
                             : static_cast<int>(std::clamp(std::ceil(3.0 * static_cast<double>(llc) / layer_bytes), 1.0, 32.0));
  if (layer_bytes * r.layers > args.max_gb * 1e9) {
    r.layers = static_cast<int>(args.max_gb * 1e9 / layer_bytes);
    if (r.layers < 1) {
      r.skipped = true;
      return r;
    }
  }
  const KvShape shape = bench_shape(r.layers, mode, args);
  auto cache = make_paged_kv_cache(shape, mode.options);
  std::mt19937 rng(42);
  for (int s = 0; s < batch; ++s) cache->add_sequence(s, context);
  // A decode step as the backend runs it (or with --chunk N, a prefill chunk of N tokens
  // ending at the context): plan the batch's new tokens, append them in every layer, then
  // run the plan layer after layer.
  const int n = args.chunk;
  fill(*cache, shape, batch, context - n, rng);
  std::vector<PlanItem> items;
  for (int s = 0; s < batch; ++s) items.push_back(PlanItem{s, context - n, n, s * n});
  AttentionPlan plan;
  cache->plan(items, PlanPolicy{.split_segments = args.split_pages, .balance = args.balance, .workers = pool.size()}, plan);
  r.imbalance = plan_imbalance(plan, 0, pool.size());
  {  // the same step planned for 132 workers (an H100's SMs), simulated
    AttentionPlan wide;
    cache->plan(items, PlanPolicy{.split_segments = args.split_pages, .balance = args.balance, .workers = 132}, wide);
    r.imbalance_132 = plan_imbalance(wide, 0, 132);
  }
  {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> k(static_cast<size_t>(n) * 8 * 128), v(k.size());
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (int s = 0; s < batch; ++s)
      for (int l = 0; l < r.layers; ++l) cache->append(l, s, context - n, n, k.data(), v.data());
  }

  const size_t q_floats = 32 * 128;
  std::vector<float> q(static_cast<size_t>(batch) * static_cast<size_t>(n) * q_floats), out(q.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  r.kv_bytes = 0;
  for (int s = 0; s < batch; ++s) r.kv_bytes += static_cast<double>(cache->attend_bytes(s, 0));
  AttentionWorkspace ws;
  const float scale = 1.0f / std::sqrt(128.0f);
  CpuPageSelector selector(mode.options.select);
  AttentionPlan selected;
  auto step = [&](int layer) {
    if (!selector.active()) {
      cache->run(plan, layer, q.data(), q_floats, out.data(), q_floats, scale, pool, ws);
      return;
    }
    if (selector.selects_in(layer % r.layers) || selected.items.empty()) {
      copy_plan(plan, selected);
      selector.select(*cache, selected, PlanPolicy{.split_segments = args.split_pages, .balance = args.balance, .workers = pool.size()}, layer,
                      q.data(), q_floats, pool);
    }
    cache->run(selected, layer, q.data(), q_floats, out.data(), q_floats, scale, pool, ws);
  };
  if (selector.active()) {  // one selection alone, best of many
    double best_sel = 1e30;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = Clock::now();
      copy_plan(plan, selected);
      selector.select(*cache, selected, PlanPolicy{.split_segments = args.split_pages, .balance = args.balance, .workers = pool.size()}, i % r.layers,
                      q.data(), q_floats, pool);
      best_sel = std::min(best_sel, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    r.select_us = best_sel * 1e6;
    r.selected = selector.stats().selected_tokens / selector.stats().context_tokens;
  }
  for (int l = 0; l < r.layers; ++l) step(l);  // warm up
  // Best of 7 trials, each cycling all layers for min_time/7: on a shared machine the best
  // trial is the one least disturbed by other processes (the bandwidth is measured alike).
  double best = 1e30;
  for (int trial = 0; trial < 7; ++trial) {
    int steps = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    while (elapsed < args.min_time_s / 7 || steps < r.layers) {
      step(steps % r.layers);
      ++steps;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    best = std::min(best, elapsed / steps);
  }
  r.step_us = best * 1e6;
  r.gbs = r.kv_bytes / best / 1e9;
  r.bw_share = r.gbs / bw;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Args> parsed;
  try {
    parsed = parse(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 2;
  }
  if (!parsed) return 0;
  const Args& args = *parsed;
  ThreadPool pool(args.threads > 0 ? args.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const size_t llc = llc_bytes();
  const double bw = hack::measure_read_bandwidth_gbs(pool, size_t{1} << 30, 5);
  const double bf16_per_token = bf16_kv_bytes_per_token(KvShape{1, 8, 128, 4, {}, {}});
  if (!args.json) {
    std::printf("attention_bench: decode attention, 32 q heads / 8 KV heads / head_dim 128, block %d\n", args.block);
    std::printf("cpu: %s; kernels: %s; threads %d; LLC %.0f MiB\n", cpu_features().describe().c_str(),
                cpu_isa_name(cpu_isa()), pool.size(), static_cast<double>(llc) / (1 << 20));
    std::printf("measured read bandwidth (%d threads, 1 GiB, best of 1/4/8/16 streams x 5, as bench/membw): %.1f GB/s\n", pool.size(), bw);
    std::printf("KV bytes per token per layer:");
    for (const auto& m : args.modes) {
      const Mode mode = make_mode(m, args.block);
      const double b = kv_bytes_per_token(bench_shape(1, mode, args), mode.options);
      std::printf("  %s %.0f (%.1f%% of bf16)", m.c_str(), b, 100.0 * b / bf16_per_token);
    }
    std::printf("\n\n%-10s %7s %5s %6s %11s %11s %8s %7s %9s %9s %8s\n", "mode", "context", "batch", "layers", "step_us",
                "KV_MB", "GB/s", "%bw", "vs_fp32", "imbalance", "imb@132");
  }
  nlohmann::json results = nlohmann::json::array();
  for (int batch : args.batches)
    for (int context : args.contexts) {
      double fp32_us = 0;
      for (const auto& m : args.modes) {
        const Result r = run_one(make_mode(m, args.block), context, batch, pool, args, llc, bw);
        if (m == "fp32" && !r.skipped) fp32_us = r.step_us;
        const double speedup = fp32_us > 0 && !r.skipped ? fp32_us / r.step_us : 0;
        if (!args.json) {
          if (r.skipped) std::printf("%-10s %7d %5d   (skipped: KV exceeds --max-gb)\n", m.c_str(), context, batch);
          else
            std::printf("%-10s %7d %5d %6d %11.1f %11.2f %8.1f %6.0f%% %8.2fx %9.3f %8.2f", m.c_str(), context, batch,
                        r.layers, r.step_us, r.kv_bytes / 1e6, r.gbs, 100 * r.bw_share, speedup, r.imbalance,
                        r.imbalance_132);
          if (!r.skipped && r.select_us > 0)
            std::printf("  select_us %.1f attended %.1f%%", r.select_us, 100 * r.selected);
          std::printf("\n");
          std::fflush(stdout);
        }
        results.push_back({{"mode", m}, {"context", context}, {"batch", batch}, {"block", args.block},
                           {"threads", r.threads}, {"layers_cycled", r.layers}, {"skipped", r.skipped},
                           {"step_us", r.step_us}, {"kv_bytes", r.kv_bytes}, {"gbs", r.gbs},
                           {"bandwidth_share", r.bw_share}, {"speedup_vs_fp32", speedup},
                           {"plan_imbalance", r.imbalance}, {"plan_imbalance_132", r.imbalance_132}, {"balance", args.balance},
                           {"select_us", r.select_us}, {"selected_share", r.selected},
                           {"kv_bytes_per_token_layer", r.bytes_per_token},
                           {"kv_bytes_vs_bf16", r.bytes_per_token / bf16_per_token}});
      }
    }
  if (args.json) {
    nlohmann::json doc = {{"bench", "attention_bench"}, {"cpu", cpu_features().describe()},
                          {"isa", cpu_isa_name(cpu_isa())}, {"threads", pool.size()},
                          {"measured_read_gbs", bw}, {"llc_bytes", llc}, {"results", results}};
    std::printf("%s\n", doc.dump(2).c_str());
  }
  return 0;
}
