// bench/fidelity: what KV compression costs in model quality, on the real code paths
// (DESIGN.md §7). Every number compares a compressed cache with the same engine, backend
// and paged cache in fp32 (KvMode::fp, f32 pages), so only KV compression differs.
//
// Sections (--sections):
//   decode   teacher-forced decode: prefill --prefill-tokens with Engine::prefill (chunked),
//            then feed the next --decode-tokens one at a time with Engine::decode; score each
//            next-token distribution: KL(p_fp ‖ p_kv) mean and p99, top-1 agreement, Δppl %.
//   prefill  the same windows prefilled whole with all_logits in chunks, every position scored.
//   copy     filler + a random span + ~--copy-gap filler + the span again; the repeat is
//            teacher-forced through decode: NLL and top-1 accuracy on it (lost tokens show).
//   passkey  passkey retrieval (plain text, no chat template) at --passkey-lengths ×
//            --passkey-depths × --passkey-keys keys; greedy 8 tokens must contain the key.
//   greedy   --chats short instructions in the model's chat template, greedy --chat-tokens:
//            fraction identical to fp and mean common-prefix length.
// A configuration with "fdc=R" runs the model with FDC (--fdc's artifact, default
// <model>/fdc.safetensors) at removal rate R ("fp32 fdc=R": FDC alone; "k4v4 fdc=R": FDC +
// HACK); "fdc-uniform=R" gives every head the mean ranks of rate R (no adaptive ranks);
// "fdc-qk=R" compresses Q/K at rate R and keeps V whole.
// "matmul=bf16" runs the prefill GEMMs in bf16 (--matmul-precision bf16; with "fp32" or "bf16"
// as the KV part: "fp32 matmul=bf16" measures the arithmetic alone).
// "weights=native|dequant" runs a GGUF --model with its blocks kept (int8 activations, llama.cpp's
// arithmetic) or dequantized to f32; the reference holds --weights (default dequant), so
// "fp32 weights=native" measures what the quantized matmuls cost against the exact weights.
// "keep=γ" (with keep-tokens=, keep-recent=, keep-window=, keep-scope=) runs MPCache's static
// eviction in every prefill (EngineOptions::keep); with --passkey-question-decode the question
// goes through decode, so the eviction cannot see it.
// "vault=int8-head|exact" (decode section) prefills each window as a prefix hit, as a prefill
// node with a prefix cache does: the window is prefilled once and its full blocks captured
// with that block codec, then the scored sequence restores them (all but the last token's
// block) and computes the rest; "exact" gives the computed prompt's numbers bit for bit.
// KL, top-1 and Δppl carry 95 % block-bootstrap intervals (32-position blocks across
// windows, 1000 resamples, fixed seed). --ablation turns each config into three rows:
// codes only (dequantized attention), + INT8 Q/P (homomorphic), + quantized prefill.
//   fidelity --model DIR --text FILE --configs "k2v2;k4v2 recent=64" [--sections ...] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <tuple>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/read_file.h"
#include "hack/kv/hack_allocation.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/kv/static_eviction.h"
#include "hack/model/fdc.h"
#include "hack/model/generation_config.h"
#include "hack/model/gguf_model.h"
#include "hack/model/weights.h"
#include "hack/prefill/prefix_cache.h"
#include "hack/runtime/prefix_fingerprint.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;
constexpr int kBootstrapBlockTokens = 32;
constexpr int kBootstrapResamples = 1000;
constexpr uint64_t kBootstrapSeed = 20261125;
constexpr int kCopyLeadTokens = 256;  // filler before the copy probe's span
constexpr const char* kSections[] = {"decode", "prefill", "copy", "passkey", "greedy"};

// ---------------------------------------------------------------- configurations

struct Config {
  std::string label;  // as given in --configs (plus the ablation step)
  hack::KvCacheOptions options;
  double fdc_rate = -1;                 // "fdc=R": FDC (--fdc's artifact) at removal rate R; < 0: none
  bool fdc_uniform = false;             // "fdc-uniform=R": every head at the mean ranks of rate R (the
                                        // no-adaptive-ranks ablation, about the same bytes)
  bool fdc_qk_only = false;             // "fdc-qk=R": Q/K at rate R, V kept whole
  const hack::Model* model = nullptr;   // the model the config runs (FDC applied), set in main; null = --model's
  hack::KeepOptions keep;               // "keep=γ": static eviction in prefill (kv/static_eviction.h)
  hack::cpu::MatmulPrecision matmul = hack::cpu::MatmulPrecision::f32;  // "matmul=bf16": prefill GEMMs in bf16
  std::optional<hack::BlockCodec> vault;  // "vault=int8-head|exact": decode path as a prefix hit (below)
  std::optional<hack::WeightFormat> weights;  // "weights=native|dequant": a GGUF's blocks kept or dequantized
};

// One configuration of --configs: "k2v2 block=64 recent=64 kg=64 vg=32 sinks=4 deq qprefill",
// "alloc=FILE" (a per-layer allocation; a later recent= overrides its window),
// or "bf16" (the fp cache with bf16 pages: what storing exact tokens in bf16 costs, which
// every HACK config pays for its sinks, open block and recent window). Space or ','
// separated; unnamed fields keep the defaults of the other flags.
hack::KvCacheOptions parse_config(const std::string& spec, hack::KvCacheOptions o, hack::KeepOptions& keep,
                                  hack::cpu::MatmulPrecision& matmul) {
  std::string item;
  std::string norm = spec;
  for (char& ch : norm) if (ch == ',') ch = ' ';
  std::istringstream in(norm);
  while (in >> item) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), val = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key.size() >= 4 && key[0] == 'k' && key.find('v') != std::string::npos && eq == std::string::npos) {
      o.k_bits = std::stoi(key.substr(1, key.find('v') - 1));
      o.v_bits = std::stoi(key.substr(key.find('v') + 1));
    } else if (key == "block") o.block_tokens = std::stoi(val);
    else if (key == "recent") o.recent_tokens = std::stoi(val);
    else if (key == "kg") o.k_group = std::stoi(val);
    else if (key == "vg") o.v_group = std::stoi(val);
    else if (key == "sinks") o.sinks = std::stoi(val);
    else if (key == "deq") o.attention = hack::HackAttention::dequantized;
    else if (key == "qprefill") o.exact_prefill = false;
    else if (key == "stochastic") o.rounding = hack::Rounding::stochastic;
    else if (key == "alloc") {  // a hack_kv.json (hack-calibrate --hack): per-layer bits and its window
      const hack::HackAllocation a = hack::load_hack_allocation(val);
      o.layer_bits = a.layers;
      if (a.recent_tokens) o.recent_tokens = *a.recent_tokens;
    }
    // MPCache page selection (backend/cpu_page_selector.h): "select=0.2 bound=quest|mpcache share=2",
    // baselines at the same budget "select=0.2 select-baseline=streaming|random|oracle".
    else if (key == "select") o.select.ratio = std::stod(val);
    else if (key == "select-tokens") o.select.tokens = std::stoi(val);
    else if (key == "bound" || key == "select-baseline") o.select.score = hack::parse_page_score(val);
    else if (key == "alpha") o.select.alpha = std::stof(val);
    else if (key == "group") o.select.group_pages = std::stoi(val);
    else if (key == "coarse") o.select.coarse_ratio = std::stod(val);
    else if (key == "dense") o.select.dense_layers = std::stoi(val);
    else if (key == "share") o.select.share_layers = std::stoi(val);
    else if (key == "select-min-tokens") o.select.min_tokens = std::stoi(val);
    else if (key == "select-min-context") o.select.min_context = std::stoi(val);
    // MPCache static eviction (kv/static_eviction.h): "keep=0.2 keep-recent=32 keep-scope=layer".
    else if (key == "keep") keep.ratio = std::stof(val);
    else if (key == "keep-tokens") keep.tokens = std::stoi(val);
    else if (key == "keep-recent") keep.recent = std::stoi(val);
    else if (key == "keep-window") keep.window = std::stof(val);
    else if (key == "keep-scope") keep.scope = hack::parse_keep_scope(val);
    else if (key == "matmul") matmul = hack::cpu::parse_matmul_precision(val);
    else if (key == "bf16") {
      o.mode = hack::KvMode::fp;
      o.fp_dtype = hack::DType::bf16;
    }
    else hack::fail("--configs: unknown field '{}' in '{}'", item, spec);
  }
  return o;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

hack::KvCacheOptions reference_options();

// --configs, with --ablation's three error sources per configuration.
std::vector<Config> parse_configs(const std::string& specs, const hack::KvCacheOptions& base, bool ablation) {
  std::vector<Config> out;
  for (const std::string& raw : hack::split_list(specs, ';')) {
    const std::string spec = trim(raw);
    // "fdc=R" (FDC at removal rate R) selects the model; "fp32" the f32 fp cache (FDC alone).
    std::string rest;
    double fdc_rate = -1;
    bool fdc_uniform = false, fdc_qk_only = false;
    std::optional<hack::BlockCodec> vault;
    std::optional<hack::WeightFormat> weights;
    hack::KvCacheOptions o = base;
    std::istringstream words(spec);
    for (std::string w; words >> w;) {
      if (w.rfind("fdc=", 0) == 0) fdc_rate = std::stod(w.substr(4));
      else if (w.rfind("fdc-uniform=", 0) == 0) fdc_rate = std::stod(w.substr(12)), fdc_uniform = true;
      else if (w.rfind("fdc-qk=", 0) == 0) fdc_rate = std::stod(w.substr(7)), fdc_qk_only = true;
      else if (w == "fp32") o = reference_options();
      else if (w.rfind("vault=", 0) == 0) vault = hack::parse_block_codec(w.substr(6));
      else if (w.rfind("weights=", 0) == 0) weights = hack::parse_weight_format(w.substr(8));
      else rest += w + " ";
    }
    hack::KeepOptions keep;
    hack::cpu::MatmulPrecision matmul = hack::cpu::MatmulPrecision::f32;
    o = parse_config(rest, o, keep, matmul);
    keep.sinks = o.sinks;
    hack::validate(keep);
    HACK_CHECK(!weights || fdc_rate < 0, "--configs '{}': weights= and fdc= together are not supported", spec);
    if (!ablation) {
      out.push_back({spec, o, fdc_rate, fdc_uniform, fdc_qk_only, nullptr, keep, matmul, vault, weights});
      continue;
    }
    HACK_CHECK(!vault, "--ablation: vault= is not supported");
    HACK_CHECK(!weights, "--ablation: weights= is not supported");
    Config codes{spec + " | codes only", o, fdc_rate, fdc_uniform, fdc_qk_only},
        int8{spec + " | +int8 Q/P", o, fdc_rate, fdc_uniform, fdc_qk_only},
        qprefill{spec + " | +qprefill", o, fdc_rate, fdc_uniform, fdc_qk_only};
    codes.options.attention = hack::HackAttention::dequantized;
    codes.options.exact_prefill = int8.options.exact_prefill = true;
    int8.options.attention = qprefill.options.attention = hack::HackAttention::homomorphic;
    qprefill.options.exact_prefill = false;
    out.insert(out.end(), {codes, int8, qprefill});
  }
  HACK_CHECK(!out.empty(), "--configs is empty");
  return out;
}

hack::KvCacheOptions reference_options() {
  hack::KvCacheOptions o;
  o.mode = hack::KvMode::fp;
  o.fp_dtype = hack::DType::f32;
  return o;
}

// ---------------------------------------------------------------- running the model

// What every run shares: the model, its tokenizer and the engine's chunking.
struct Bench {
  const hack::Model& model;
  hack::ThreadPool& pool;
  const hack::Tokenizer& tok;
  hack::KvShape shape;
  int prefill_chunk = 512;
  std::vector<int> eos_ids;
  size_t vocab = 0;
  double bf16_bytes_per_token = 0;  // 2 (K, V) · layers · kv_heads · head_dim · 2 bytes
  bool measure_sharing = false;      // --measure-sharing (page selection's layer commonality)
  bool question_decode = false;      // --passkey-question-decode
};

// Log-probabilities, [positions][vocab].
struct Logprobs {
  size_t vocab = 0;
  std::vector<float> data;
  size_t rows() const { return data.size() / vocab; }
  const float* row(size_t i) const { return data.data() + i * vocab; }
};

const hack::Model& model_of(const Bench& b, const Config& c) { return c.model != nullptr ? *c.model : b.model; }

hack::EngineOptions engine_options(const Bench& b, const Config& c) {
  return hack::EngineOptions{b.prefill_chunk, c.keep, c.matmul};
}

void log_softmax(float* row, size_t n) {
  const float m = *std::max_element(row, row + n);
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i] - m));
  const float lse = m + static_cast<float>(std::log(s));
  for (size_t i = 0; i < n; ++i) row[i] -= lse;
}

struct Run {
  Logprobs logprobs;
  double attend_bytes_per_token = 0;  // what attention reads at the final context, per token
};

// Bytes attention reads for the sequence at its final length (sinks, pages, recent window
// and open block included), per token of context.
double attend_bytes_per_token(const hack::CpuPagedKvCache& kv, int seq, int layers) {
  size_t bytes = 0;
  for (int l = 0; l < layers; ++l) bytes += kv.attend_bytes(seq, l);
  return static_cast<double>(bytes) / kv.length(seq, 0);
}

enum class Path { decode, prefill };

// decode: prefill tokens[0, n_prefill), then decode tokens[n_prefill, n − 1) one at a time;
//         rows predict tokens[n_prefill + 1, n).
// prefill: tokens[0, n − 1) prefilled with all_logits; rows predict tokens[1, n).
// With `vault` (decode path only) the prompt is prefilled as a prefix hit, as a prefill node
// with a prefix cache does it: once into a cache that captures its full blocks (the block
// codec, local LRU), then again into the scored sequence, which restores every restorable
// block from that cache (codec → its exact pages) and computes only the rest.
void prefill_as_hit(const hack::Model& model, hack::CpuEngine& e, const hack::KvCacheOptions& opt,
                    hack::BlockCodec codec, std::span<const int> prompt, std::vector<float>& logits) {
  hack::Engine& engine = *e.engine;
  const hack::DType exact = hack::cache_exact_dtype(opt);
  hack::server::PrefixCacheOptions po;
  po.codec = codec;
  po.local_bytes = size_t{4} << 30;
  hack::server::PrefixCache cache(hack::prefix_fingerprint(model, "cpu", opt, exact, codec), hack::kv_shape(model),
                                  opt.block_tokens, exact, po, nullptr);
  const std::vector<hack::BlockKey> keys = cache.keys(prompt);
  constexpr int kCaptureSeq = 1;
  engine.add_sequence(kCaptureSeq, static_cast<int>(prompt.size()));
  hack::server::PrefixJob job;
  cache.begin_capture(job, keys, 0, static_cast<int>(keys.size()));
  engine.prefill(kCaptureSeq, prompt, logits, false, {}, [&](int layer) { cache.capture_layer(job, *e.kv, kCaptureSeq, layer); });
  HACK_CHECK(cache.finish_capture(job) == static_cast<int>(keys.size()), "vault=: not every block was captured");
  engine.remove_sequence(kCaptureSeq);
  const int restorable = std::min(static_cast<int>(keys.size()), cache.restorable_blocks(prompt.size()));
  e.kv->begin_prefill(0);
  const hack::server::PrefixRestoreResult rr =
      cache.restore(*e.kv, 0, std::span<const hack::BlockKey>(keys).first(static_cast<size_t>(restorable)), job);
  HACK_CHECK(rr.tokens == restorable * opt.block_tokens, "vault=: restored {} of {} blocks", rr.tokens / opt.block_tokens,
             restorable);
  engine.adopt_sequence(0);
  engine.prefill(0, prompt.subspan(static_cast<size_t>(rr.tokens)), logits);
  std::fprintf(stderr, "  [%s vault=%s] prefix hit: %d tokens restored, %zu computed\n", hack::describe(opt).c_str(),
               std::string(hack::block_codec_name(codec)).c_str(), rr.tokens, prompt.size() - static_cast<size_t>(rr.tokens));
}

Run run_path(const Bench& b, const hack::Model& model, const hack::KvCacheOptions& opt, Path path,
             std::span<const int> tokens, int n_prefill, const hack::EngineOptions& eo,
             std::optional<hack::BlockCodec> vault = std::nullopt) {
  hack::CpuEngine e = hack::make_cpu_engine(model, b.pool, opt, eo);
  hack::Engine& engine = *e.engine;
  engine.add_sequence(0, static_cast<int>(tokens.size()));
  e.backend->set_measure_sharing(b.measure_sharing);
  Run run;
  run.logprobs.vocab = b.vocab;
  std::vector<float> logits;
  if (path == Path::prefill) {
    HACK_CHECK(!vault, "vault= runs on the decode path only");
    engine.prefill(0, tokens.first(tokens.size() - 1), logits, /*all_logits=*/true);
    run.logprobs.data.swap(logits);
    for (size_t i = 0; i < run.logprobs.rows(); ++i) log_softmax(run.logprobs.data.data() + i * b.vocab, b.vocab);
  } else {
    if (vault) prefill_as_hit(model, e, opt, *vault, tokens.first(static_cast<size_t>(n_prefill)), logits);
    else engine.prefill(0, tokens.first(static_cast<size_t>(n_prefill)), logits);
    // What a prefill node would ship: the prompt's KV after prefill (pages, sinks, exact tail).
    std::fprintf(stderr, "  [%s%s] prompt KV after prefill: %d of %d tokens, %.2f MB\n", hack::describe(opt).c_str(),
                 eo.keep.enabled() ? " keep" : "", e.kv->length(0, 0), n_prefill, e.kv->stats().bytes_used / 1e6);
    const int seq = 0;
    for (size_t t = static_cast<size_t>(n_prefill); t + 1 < tokens.size(); ++t) {
      engine.decode(std::span<const int>(&seq, 1), tokens.subspan(t, 1), logits);
      log_softmax(logits.data(), b.vocab);
      run.logprobs.data.insert(run.logprobs.data.end(), logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(b.vocab));
    }
  }
  run.attend_bytes_per_token = attend_bytes_per_token(*e.kv, 0, b.shape.num_layers);
  if (const hack::PageSelectStats* st = e.backend->page_select_stats(); st && st->context_tokens > 0) {
    // Selection: the share of the context the selecting layers attended to, and (with
    // --measure-sharing) how much of each sharing layer's own choice the shared one held.
    std::fprintf(stderr, "  [%s] selected %.1f %% of the context", hack::describe(opt).c_str(),
                 100 * st->selected_tokens / st->context_tokens);
    if (st->shared_pages > 0) std::fprintf(stderr, "; sharing: %.1f %% of a layer's own pages", 100 * st->shared_hits / st->shared_pages);
    std::fprintf(stderr, "\n");
  }
  return run;
}

// Greedy continuation (stops at EOS or max_tokens).
std::vector<int> greedy(const Bench& b, const hack::Model& model, const hack::KvCacheOptions& opt,
                        std::span<const int> prompt, int max_tokens, const hack::EngineOptions& eo) {
  hack::CpuEngine e = hack::make_cpu_engine(model, b.pool, opt, eo);
  hack::Engine& engine = *e.engine;
  engine.add_sequence(0, static_cast<int>(prompt.size()) + max_tokens);
  hack::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  return hack::generate(engine, 0, prompt, sp, b.eos_ids).tokens;
}

// ---------------------------------------------------------------- scoring and statistics

struct PositionScore {
  float kl = 0;                  // KL(p_fp ‖ p_kv), nats
  float nll_ref = 0, nll_kv = 0; // −log p(target)
  bool agree = false;            // same argmax
  bool hit_ref = false, hit_kv = false;  // argmax == target
};

std::vector<PositionScore> score(const Logprobs& ref, const Logprobs& got, std::span<const int> targets) {
  HACK_CHECK(ref.rows() == got.rows() && ref.rows() == targets.size(), "scoring {} vs {} rows for {} targets",
             ref.rows(), got.rows(), targets.size());
  std::vector<PositionScore> out(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const float *p = ref.row(i), *q = got.row(i);
    double kl = 0;
    size_t a1 = 0, a2 = 0;
    for (size_t v = 0; v < ref.vocab; ++v) {
      kl += std::exp(static_cast<double>(p[v])) * (p[v] - q[v]);
      if (p[v] > p[a1]) a1 = v;
      if (q[v] > q[a2]) a2 = v;
    }
    const size_t t = static_cast<size_t>(targets[i]);
    out[i] = {static_cast<float>(std::max(kl, 0.0)), -p[t], -q[t], a1 == a2, a1 == t, a2 == t};
  }
  return out;
}

// The statistics of one set of positions.
struct Point {
  double kl_mean = 0, kl_p99 = 0, top1 = 0, dppl_pct = 0;
  double nll_ref = 0, nll_kv = 0, acc_ref = 0, acc_kv = 0;
};

Point measure(const std::vector<PositionScore>& s, std::vector<float>& kl_scratch) {
  Point p;
  kl_scratch.clear();
  for (const PositionScore& x : s) {
    p.kl_mean += x.kl;
    p.top1 += x.agree;
    p.nll_ref += x.nll_ref;
    p.nll_kv += x.nll_kv;
    p.acc_ref += x.hit_ref;
    p.acc_kv += x.hit_kv;
    kl_scratch.push_back(x.kl);
  }
  const double n = static_cast<double>(s.size());
  for (double* v : {&p.kl_mean, &p.top1, &p.nll_ref, &p.nll_kv, &p.acc_ref, &p.acc_kv}) *v /= n;
  const size_t k = std::min(s.size() - 1, static_cast<size_t>(std::ceil(0.99 * n)) - 1);
  std::nth_element(kl_scratch.begin(), kl_scratch.begin() + static_cast<std::ptrdiff_t>(k), kl_scratch.end());
  p.kl_p99 = kl_scratch[k];
  p.dppl_pct = 100 * std::expm1(p.nll_kv - p.nll_ref);
  return p;
}

struct Interval {
  double value = 0, lo = 0, hi = 0;
};

struct Summary {
  size_t positions = 0;
  Point point;
  Interval kl_mean, kl_p99, top1, dppl_pct;  // 95 % block-bootstrap intervals
};

// Block bootstrap: the positions of every sample are cut into 32-position blocks (the last
// may be shorter); each resample draws as many blocks, with replacement, from all samples.
Summary summarize(const std::vector<std::vector<PositionScore>>& samples) {
  std::vector<std::span<const PositionScore>> blocks;
  std::vector<PositionScore> all;
  for (const auto& s : samples) {
    for (size_t i = 0; i < s.size(); i += kBootstrapBlockTokens)
      blocks.push_back(std::span<const PositionScore>(s).subspan(i, std::min<size_t>(kBootstrapBlockTokens, s.size() - i)));
    all.insert(all.end(), s.begin(), s.end());
  }
  HACK_CHECK(!all.empty(), "nothing scored");
  std::vector<float> scratch;
  Summary out;
  out.positions = all.size();
  out.point = measure(all, scratch);
  std::mt19937_64 rng(kBootstrapSeed);
  std::uniform_int_distribution<size_t> pick(0, blocks.size() - 1);
  std::vector<double> kl, p99, top1, dppl;
  std::vector<PositionScore> resample;
  for (int r = 0; r < kBootstrapResamples; ++r) {
    resample.clear();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& blk = blocks[pick(rng)];
      resample.insert(resample.end(), blk.begin(), blk.end());
    }
    const Point p = measure(resample, scratch);
    kl.push_back(p.kl_mean);
    p99.push_back(p.kl_p99);
    top1.push_back(p.top1);
    dppl.push_back(p.dppl_pct);
  }
  auto interval = [](std::vector<double>& v, double value) {
    std::sort(v.begin(), v.end());
    const size_t lo = static_cast<size_t>(0.025 * static_cast<double>(v.size()));
    return Interval{value, v[lo], v[v.size() - 1 - lo]};
  };
  out.kl_mean = interval(kl, out.point.kl_mean);
  out.kl_p99 = interval(p99, out.point.kl_p99);
  out.top1 = interval(top1, out.point.top1);
  out.dppl_pct = interval(dppl, out.point.dppl_pct);
  return out;
}

// ---------------------------------------------------------------- output

struct Output {
  bool json = false;
  void line(const char* fmt, auto... args) const {
    if (!json) std::printf(fmt, args...);
  }
  void record(Json j) const {
    if (json) std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
};

std::string format_number(const char* fmt, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string with_ci(const Interval& x, const char* fmt) {
  char buf[96];
  const std::string f = std::string(fmt) + " [" + fmt + ", " + fmt + "]";
  std::snprintf(buf, sizeof buf, f.c_str(), x.value, x.lo, x.hi);
  return buf;
}

Json interval_json(const Interval& x) { return Json{{"value", x.value}, {"lo", x.lo}, {"hi", x.hi}}; }

// ---------------------------------------------------------------- scored sections

// One prompt of a scored section: its tokens and, on the decode path, how many are prefilled.
struct Sample {
  std::vector<int> tokens;
  int n_prefill = 0;
};

// Per configuration (index 0: the fp32 reference itself), the scores of every sample and the
// attention bytes per token at the last sample's final context.
struct Compared {
  std::vector<std::vector<PositionScore>> scores;
  double attend_bytes_per_token = 0;
};

std::vector<Compared> compare(const Bench& b, Path path, const std::vector<Sample>& samples,
                              const std::vector<Config>& configs) {
  std::vector<Compared> out(configs.size() + 1);
  for (const Sample& s : samples) {
    const std::span<const int> tokens(s.tokens);
    const std::span<const int> targets =
        path == Path::decode ? tokens.subspan(static_cast<size_t>(s.n_prefill) + 1) : tokens.subspan(1);
    const Run ref = run_path(b, b.model, reference_options(), path, tokens, s.n_prefill, hack::EngineOptions{b.prefill_chunk});
    out[0].scores.push_back(score(ref.logprobs, ref.logprobs, targets));
    out[0].attend_bytes_per_token = ref.attend_bytes_per_token;
    for (size_t c = 0; c < configs.size(); ++c) {
      const Run got = run_path(b, model_of(b, configs[c]), configs[c].options, path, tokens, s.n_prefill, engine_options(b, configs[c]),
                               path == Path::decode ? configs[c].vault : std::nullopt);
      out[c + 1].scores.push_back(score(ref.logprobs, got.logprobs, targets));
      out[c + 1].attend_bytes_per_token = got.attend_bytes_per_token;
    }
  }
  return out;
}

// decode / prefill: KL, top-1, Δppl with intervals, and the bytes attention reads.
void report_distributions(const Bench& b, const Output& out, const char* section, const std::vector<Config>& configs,
                          const std::vector<Compared>& results, int context_tokens) {
  out.line("%-28s %-30s %-30s %-26s %-26s %8s %8s\n", "kv", "KL mean [95% CI]", "KL p99 [95% CI]",
           "top-1 [95% CI]", "Δppl % [95% CI]", "closed%", "ctx%");
  for (size_t c = 0; c < results.size(); ++c) {
    const hack::KvCacheOptions opt = c == 0 ? reference_options() : configs[c - 1].options;
    const std::string label = c == 0 ? "fp32 (reference)" : configs[c - 1].label;
    const Summary s = summarize(results[c].scores);
    const hack::KvShape shape = c == 0 ? b.shape : hack::kv_shape(model_of(b, configs[c - 1]));
    const double closed_pct = 100 * hack::kv_bytes_per_token(shape, opt) / b.bf16_bytes_per_token;
    const double ctx_pct = 100 * results[c].attend_bytes_per_token / b.bf16_bytes_per_token;
    if (c == 0) {
      out.line("%-28s %-30s %-30s %-26s %-26s %8.1f %8.1f\n", label.c_str(), "0", "0", "1",
               ("ppl " + format_number("%.3f", std::exp(s.point.nll_ref))).c_str(), closed_pct, ctx_pct);
    } else {
      out.line("%-28s %-30s %-30s %-26s %-26s %8.1f %8.1f\n", label.c_str(), with_ci(s.kl_mean, "%.2e").c_str(),
               with_ci(s.kl_p99, "%.2e").c_str(), with_ci(s.top1, "%.4f").c_str(),
               with_ci(s.dppl_pct, "%+.2f").c_str(), closed_pct, ctx_pct);
    }
    out.record(Json{{"section", section}, {"config", label}, {"kv", hack::describe(opt)}, {"positions", s.positions},
                    {"kl_mean", interval_json(s.kl_mean)}, {"kl_p99", interval_json(s.kl_p99)},
                    {"top1", interval_json(s.top1)}, {"ppl_delta_pct", interval_json(s.dppl_pct)},
                    {"ppl_ref", std::exp(s.point.nll_ref)}, {"ppl", std::exp(s.point.nll_kv)},
                    {"closed_bytes_per_token", hack::kv_bytes_per_token(shape, opt)}, {"closed_pct_bf16", closed_pct},
                    {"context_tokens", context_tokens}, {"attend_bytes_per_token", results[c].attend_bytes_per_token},
                    {"attend_pct_bf16", ctx_pct}});
  }
}

// Windows of bos + prefill_tokens + decode_tokens − 1 tokens of the text, back to back: the
// decode path prefills prefill_tokens and decodes (and scores) decode_tokens.
std::vector<Sample> text_windows(const std::vector<int>& text, int bos, int windows, int prefill_tokens,
                                 int decode_tokens) {
  std::vector<Sample> out;
  const size_t take = static_cast<size_t>(prefill_tokens + decode_tokens);
  for (int w = 0; w < windows; ++w) {
    const size_t begin = static_cast<size_t>(w) * take;
    HACK_CHECK(begin + take <= text.size(), "the text has {} tokens, {} windows of {} need {}", text.size(), windows,
               take, static_cast<size_t>(windows) * take);
    Sample s{{bos}, prefill_tokens};
    s.tokens.insert(s.tokens.end(), text.begin() + static_cast<std::ptrdiff_t>(begin),
                    text.begin() + static_cast<std::ptrdiff_t>(begin + take));
    out.push_back(std::move(s));
  }
  return out;
}

// Copy probes: bos + lead filler + span + gap filler + span; the repeat is decoded and its
// tokens after the first are scored. Span ids are drawn from the non-special vocabulary.
std::vector<Sample> copy_probes(const Bench& b, const std::vector<int>& text, int bos, int probes, int span_tokens,
                                int gap_tokens) {
  constexpr size_t kLeadTokens = kCopyLeadTokens;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> id(0, static_cast<int>(b.vocab) - 1);
  std::vector<Sample> out;
  const size_t filler = kLeadTokens + static_cast<size_t>(gap_tokens);
  HACK_CHECK(text.size() > filler, "the text has {} tokens, a copy probe needs {}", text.size(), filler);
  for (int p = 0; p < probes; ++p) {
    const size_t at = (static_cast<size_t>(p) * 3001) % (text.size() - filler);
    std::vector<int> span;
    while (span.size() < static_cast<size_t>(span_tokens)) {
      const int t = id(rng);
      if (t < b.tok.vocab_size() && !b.tok.is_special(t)) span.push_back(t);
    }
    auto filler_at = [&](size_t from, size_t n) {
      return std::span<const int>(text).subspan(at + from, n);
    };
    Sample s{{bos}, 0};
    for (auto part : {filler_at(0, kLeadTokens), std::span<const int>(span),
                      filler_at(kLeadTokens, static_cast<size_t>(gap_tokens))})
      s.tokens.insert(s.tokens.end(), part.begin(), part.end());
    s.n_prefill = static_cast<int>(s.tokens.size());  // the repeat is decoded: rows predict its tokens 1..span−1
    s.tokens.insert(s.tokens.end(), span.begin(), span.end());
    out.push_back(std::move(s));
  }
  return out;
}

void report_copy(const Output& out, const std::vector<Config>& configs, const std::vector<Compared>& results) {
  out.line("%-28s %10s %10s %10s %10s %-28s %-26s\n", "kv", "NLL fp", "NLL kv", "acc fp", "acc kv", "KL mean [95% CI]",
           "top-1 vs fp [95% CI]");
  for (size_t c = 0; c < results.size(); ++c) {
    const std::string label = c == 0 ? "fp32 (reference)" : configs[c - 1].label;
    const hack::KvCacheOptions opt = c == 0 ? reference_options() : configs[c - 1].options;
    const Summary s = summarize(results[c].scores);
    const Point& p = s.point;
    out.line("%-28s %10.4f %10.4f %10.4f %10.4f %-28s %-26s\n", label.c_str(), p.nll_ref, p.nll_kv, p.acc_ref, p.acc_kv,
             with_ci(s.kl_mean, "%.2e").c_str(), with_ci(s.top1, "%.4f").c_str());
    out.record(Json{{"section", "copy"}, {"config", label}, {"kv", hack::describe(opt)}, {"positions", s.positions}, {"nll_ref", p.nll_ref},
                    {"nll", p.nll_kv}, {"acc_ref", p.acc_ref}, {"acc", p.acc_kv}, {"kl_mean", interval_json(s.kl_mean)},
                    {"top1", interval_json(s.top1)}});
  }
}

// ---------------------------------------------------------------- generation sections

// The classic passkey prompt (Mohtashami & Jaggi) as plain text: instruction, filler
// sentences, the key at `depth` of the filler, the question. About `length` tokens.
std::vector<int> passkey_prompt(const Bench& b, int bos, int length, double depth, const std::string& key,
                                size_t* question_tokens = nullptr) {
  const auto enc = [&](const std::string& s) { return b.tok.encode(s, false); };
  const std::vector<int> head = enc(
      "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
      "I will quiz you about the important information there.");
  const std::vector<int> unit = enc(" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.");
  const std::vector<int> needle = enc(" The pass key is " + key + ". Remember it. " + key + " is the pass key.");
  const std::vector<int> question = enc(" What is the pass key? The pass key is");
  const int fixed = 1 + static_cast<int>(head.size() + needle.size() + question.size());
  const int units = std::max(1, (length - fixed) / static_cast<int>(unit.size()));
  const int at = static_cast<int>(std::lround(depth * units));
  std::vector<int> out{bos};
  out.insert(out.end(), head.begin(), head.end());
  for (int u = 0; u <= units; ++u) {
    if (u == at) out.insert(out.end(), needle.begin(), needle.end());
    if (u < units) out.insert(out.end(), unit.begin(), unit.end());
  }
  out.insert(out.end(), question.begin(), question.end());
  if (question_tokens) *question_tokens = question.size();
  return out;
}

// For every row: prefill the prefix, feed the question through decode token by token (so
// page selection sees it), then greedy max_tokens. Prefills once per group of rows that differ
// only in their page selection (it acts in decode only, so the prefilled pages are the same): the group's prefilled
// sequence is forked for each row and decoded by an engine whose backend selects with the
// row's options.
std::vector<std::vector<int>> question_decode_answers(const Bench& b, const std::vector<Config>& rows,
                                                      std::span<const int> prefix, std::span<const int> question,
                                                      int max_tokens) {
  std::vector<std::vector<int>> answers(rows.size());
  std::vector<bool> done(rows.size(), false);
  const int total = static_cast<int>(prefix.size() + question.size()) + max_tokens;
  const auto prefill_key = [&](const Config& c) {
    hack::KvCacheOptions o = c.options;
    o.select = {};
    const hack::KeepOptions& k = c.keep;  // static eviction acts in prefill: part of the key
    return fmt::format("{} keep {} {} {} {} {} matmul {}", hack::describe(o), k.ratio, k.tokens, k.recent, k.window,
                       static_cast<int>(k.scope), static_cast<int>(c.matmul));
  };
  for (size_t first = 0; first < rows.size(); ++first) {
    if (done[first]) continue;
    const hack::Model& model = model_of(b, rows[first]);
    hack::KvCacheOptions base = rows[first].options;
    base.select = {};
    hack::CpuEngine prefilled =
        hack::make_cpu_engine(model, b.pool, base, engine_options(b, rows[first]));
    prefilled.engine->add_sequence(0, total);
    std::vector<float> logits;
    prefilled.engine->prefill(0, prefix, logits);
    hack::CpuPagedKvCache& kv = *prefilled.kv;
    for (size_t r = first; r < rows.size(); ++r) {
      if (done[r] || &model_of(b, rows[r]) != &model || prefill_key(rows[r]) != prefill_key(rows[first])) continue;
      kv.set_select_options(rows[r].options.select);
      const std::unique_ptr<hack::Backend> backend = hack::make_cpu_backend(model, b.pool, kv);
      hack::Engine engine(*backend, hack::EngineOptions{b.prefill_chunk});
      const int seq = 1;
      kv.fork_sequence(0, seq, kv.length(0, 0), total);  // the kept tokens, when eviction pruned the prefix
      engine.adopt_sequence(seq, static_cast<int>(prefix.size()));
      for (size_t t = 0; t < question.size(); ++t) engine.decode(std::span<const int>(&seq, 1), question.subspan(t, 1), logits);
      for (int i = 0; i < max_tokens; ++i) {
        const int next = static_cast<int>(
            std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(b.vocab)) - logits.begin());
        answers[r].push_back(next);
        if (std::find(b.eos_ids.begin(), b.eos_ids.end(), next) != b.eos_ids.end() || i + 1 == max_tokens) break;
        engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&next, 1), logits);
      }
      engine.remove_sequence(seq);
      done[r] = true;
    }
  }
  return answers;
}

void run_passkey(const Bench& b, const Output& out, const std::vector<Config>& configs, int bos,
                 const std::vector<int>& lengths, const std::vector<double>& depths, int keys) {
  std::vector<Config> rows{{"fp32 (reference)", reference_options()}};
  rows.insert(rows.end(), configs.begin(), configs.end());
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> digits(10000, 99999);
  // hits[row][length index]
  std::vector<std::vector<int>> hits(rows.size(), std::vector<int>(lengths.size(), 0));
  const int trials = static_cast<int>(depths.size()) * keys;
  for (size_t li = 0; li < lengths.size(); ++li) {
    for (double depth : depths) {
      for (int k = 0; k < keys; ++k) {
        const std::string key = std::to_string(digits(rng));
        size_t q_tokens = 0;
        const std::vector<int> prompt = passkey_prompt(b, bos, lengths[li], depth, key, &q_tokens);
        const std::span<const int> all(prompt);
        const std::vector<std::vector<int>> answers =
            b.question_decode ? question_decode_answers(b, rows, all.first(all.size() - q_tokens), all.last(q_tokens), 8)
                              : std::vector<std::vector<int>>{};
        for (size_t r = 0; r < rows.size(); ++r) {
          const std::vector<int> ids =
              b.question_decode ? answers[r] : greedy(b, model_of(b, rows[r]), rows[r].options, prompt, 8, engine_options(b, rows[r]));
          const std::string answer = b.tok.decode(ids, true);
          hits[r][li] += answer.find(key) != std::string::npos;
        }
      }
    }
  }
  out.line("%-28s", "kv");
  for (int len : lengths) out.line(" %10s", ("L=" + std::to_string(len)).c_str());
  out.line(" %10s\n", "all");
  for (size_t r = 0; r < rows.size(); ++r) {
    out.line("%-28s", rows[r].label.c_str());
    Json per_length = Json::object();
    int total = 0;
    for (size_t li = 0; li < lengths.size(); ++li) {
      out.line(" %10s", (std::to_string(hits[r][li]) + "/" + std::to_string(trials)).c_str());
      per_length[std::to_string(lengths[li])] = static_cast<double>(hits[r][li]) / trials;
      total += hits[r][li];
    }
    const double acc = static_cast<double>(total) / (trials * static_cast<double>(lengths.size()));
    out.line(" %10.3f\n", acc);
    out.record(Json{{"section", "passkey"}, {"config", rows[r].label}, {"kv", hack::describe(rows[r].options)},
                    {"trials_per_length", trials},
                    {"accuracy_by_length", per_length}, {"accuracy", acc}});
  }
}

constexpr const char* kChatPrompts[] = {
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "Give three tips for staying healthy.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Describe a cat in two sentences.",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "List five fruits that are red.",
    "How do I boil an egg?",
};

void run_greedy(const Bench& b, const Output& out, const std::vector<Config>& configs, const std::string& model_dir,
                int chats, int max_tokens) {
  const std::optional<std::string> source = hack::find_chat_template(model_dir, /*has_tools=*/false);
  HACK_CHECK(source.has_value(), "{} has no chat template (the greedy section needs one)", model_dir);
  const hack::ChatTemplate tmpl = hack::ChatTemplate::parse(*source, model_dir);
  hack::ChatRenderOptions ro;
  ro.add_generation_prompt = true;
  if (!b.tok.bos_token().empty()) ro.bos_token = b.tok.bos_token();
  if (!b.tok.eos_token().empty()) ro.eos_token = b.tok.eos_token();
  const int n = std::min<int>(chats, static_cast<int>(std::size(kChatPrompts)));
  std::vector<size_t> identical(configs.size(), 0), prefix(configs.size(), 0);
  size_t ref_tokens = 0, prompt_tokens = 0;
  for (int i = 0; i < n; ++i) {
    const Json messages = Json::array({Json{{"role", "user"}, {"content", kChatPrompts[i]}}});
    const std::vector<int> prompt = b.tok.encode(tmpl.render(messages, ro), false);  // the template writes BOS
    prompt_tokens += prompt.size();
    const std::vector<int> ref = greedy(b, b.model, reference_options(), prompt, max_tokens, hack::EngineOptions{b.prefill_chunk});
    ref_tokens += ref.size();
    for (size_t c = 0; c < configs.size(); ++c) {
      const std::vector<int> got = greedy(b, model_of(b, configs[c]), configs[c].options, prompt, max_tokens, engine_options(b, configs[c]));
      identical[c] += got == ref;
      prefix[c] += static_cast<size_t>(std::mismatch(ref.begin(), ref.end(), got.begin(), got.end()).first - ref.begin());
    }
  }
  out.line("%d chats, prompts %.1f tokens on average, fp32 generates %.1f tokens on average (≤ %d)\n", n,
           static_cast<double>(prompt_tokens) / n, static_cast<double>(ref_tokens) / n, max_tokens);
  out.line("%-28s %12s %18s\n", "kv", "identical", "common prefix");
  for (size_t c = 0; c < configs.size(); ++c) {
    const double same = static_cast<double>(identical[c]) / n, common = static_cast<double>(prefix[c]) / n;
    out.line("%-28s %12.3f %18.1f\n", configs[c].label.c_str(), same, common);
    out.record(Json{{"section", "greedy"}, {"config", configs[c].label}, {"kv", hack::describe(configs[c].options)},
                    {"chats", n}, {"identical", same},
                    {"common_prefix_tokens", common}, {"ref_tokens_mean", static_cast<double>(ref_tokens) / n}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, text_path, configs_spec = "k2v2;k4v2", sections = "decode,prefill,copy,passkey,greedy";
  std::string weights_flag = "dequant";
  std::string passkey_lengths = "1024,2048,4096,7168", passkey_depths = "0.1,0.5,0.9";
  int windows = 4, prefill_tokens = 1024, decode_tokens = 256, prefill_chunk = 512, threads = 0, sinks = 4;
  int copy_span = 64, copy_probes_n = 4, copy_gap = 1024, passkey_keys = 2, chats = 8, chat_tokens = 64;
  bool json = false, ablation = false, measure_sharing = false, question_decode = false;
  std::string fdc_path;
  hack::FlagSet flags("fidelity", "KV compression vs the fp32 cache on the real decode and prefill paths.", "HACK_FIDELITY");
  flags.add_string("model", &model_dir, "model directory (Hugging Face layout) or GGUF file");
  flags.add_string("weights", &weights_flag, "the reference's GGUF weights: dequant (f32) or native (blocks)");
  flags.add_string("text", &text_path, "held-out text file");
  flags.add_string("configs", &configs_spec, "';'-separated KV configurations, e.g. \"k2v2;k4v2 recent=64;k2v2 deq;k2v2 qprefill\"");
  flags.add_string("sections", &sections, "decode,prefill,copy,passkey,greedy");
  flags.add_bool("ablation", &ablation, "three rows per config: codes only, + int8 Q/P, + quantized prefill");
  flags.add_int("windows", &windows, "text windows (decode, prefill)");
  flags.add_int("prefill-tokens", &prefill_tokens, "tokens prefilled per window (bos included)");
  flags.add_int("decode-tokens", &decode_tokens, "tokens decoded (and scored) per window");
  flags.add_int("prefill-chunk", &prefill_chunk, "Engine prefill chunk, tokens");
  flags.add_int("copy-span", &copy_span, "random span length of the copy probe, tokens");
  flags.add_int("copy-probes", &copy_probes_n, "copy probes");
  flags.add_int("copy-gap", &copy_gap, "filler between the span and its repeat, tokens");
  flags.add_string("passkey-lengths", &passkey_lengths, "passkey prompt lengths, tokens");
  flags.add_string("passkey-depths", &passkey_depths, "passkey depths in [0, 1]");
  flags.add_int("passkey-keys", &passkey_keys, "random keys per length and depth");
  flags.add_int("chats", &chats, "chat prompts of the greedy section (at most 12)");
  flags.add_int("chat-tokens", &chat_tokens, "greedy tokens per chat");
  flags.add_int("sinks", &sinks, "bf16 sink tokens (configs may override)");
  flags.add_int("threads", &threads, "threads (0 = all)");
  flags.add_bool("json", &json, "JSON lines instead of tables");
  flags.add_bool("measure-sharing", &measure_sharing,
                 "configs with select=: measure how much of each sharing layer's own page choice the shared one holds");
  flags.add_bool("passkey-question-decode", &question_decode,
                 "passkey: feed the question through the decode path token by token (page selection reads it)");
  flags.add_string("fdc", &fdc_path, "FDC artifact for configs with fdc=R (hack-calibrate --fdc); default <model>/fdc.safetensors");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(!model_dir.empty() && !text_path.empty(), "--model and --text are required");
    hack::KvCacheOptions base;
    base.sinks = sinks;
    base.seed = 1;
    std::vector<Config> configs = parse_configs(configs_spec, base, ablation);
    const std::vector<std::string> wanted = hack::split_list(sections);
    const auto want = [&](const char* s) { return std::find(wanted.begin(), wanted.end(), s) != wanted.end(); };
    for (const std::string& w : wanted)
      HACK_CHECK(std::find(std::begin(kSections), std::end(kSections), w) != std::end(kSections),
                 "--sections: unknown section '{}' (decode, prefill, copy, passkey, greedy)", w);

    const hack::WeightFormat reference_weights = hack::parse_weight_format(weights_flag);
    const hack::Model model = hack::Model::load(model_dir, reference_weights);
    // The other weight format, loaded once if a config names it.
    std::optional<hack::Model> other_weights;
    for (Config& c : configs) {
      if (!c.weights || *c.weights == reference_weights) continue;
      if (!other_weights) other_weights.emplace(hack::Model::load(model_dir, *c.weights));
      c.model = &*other_weights;
    }
    // One FDC model per (removal rate, uniform, Q/K only) the configs name.
    std::map<std::tuple<double, bool, bool>, hack::Model> fdc_models;
    std::optional<hack::FdcArtifact> artifact;
    for (Config& c : configs) {
      if (c.fdc_rate < 0) continue;
      if (!artifact) artifact = hack::load_fdc_artifact(fdc_path.empty() ? hack::model_artifact_path(model_dir, "fdc.safetensors").string() : fdc_path);
      const std::tuple key{c.fdc_rate, c.fdc_uniform, c.fdc_qk_only};
      auto it = fdc_models.find(key);
      if (it == fdc_models.end()) {
        std::vector<hack::FdcRanks> ranks = hack::fdc_ranks_for_rate(*artifact, c.fdc_rate);
        if (c.fdc_uniform) {  // every head at the mean ranks, to the nearest multiple of 16
          double qk = 0, v = 0;
          for (const hack::FdcRanks& r : ranks) qk += r.d_qk, v += r.d_v;
          const auto round16 = [&](double x) {
            return std::clamp(static_cast<int>(std::lround(x / ranks.size() / 16)) * 16, 16, artifact->head_dim);
          };
          ranks.assign(ranks.size(), hack::FdcRanks{round16(qk), round16(v)});
        }
        if (c.fdc_qk_only)
          for (hack::FdcRanks& r : ranks) r.d_v = artifact->head_dim;
        it = fdc_models.emplace(key, hack::apply_fdc(model, *artifact, ranks)).first;
      }
      c.model = &it->second;
    }
    const hack::Tokenizer tok = hack::Tokenizer::load(model_dir);
    const hack::ModelConfig& cfg = model.config;
    const int bos = cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id();
    const std::vector<int> text = tok.encode(hack::read_file(text_path, "text"), false);
    hack::ThreadPool pool(threads);
    Bench b{model, pool, tok, hack::kv_shape(cfg)};
    b.prefill_chunk = prefill_chunk;
    b.eos_ids = hack::merge_eos_ids(cfg.eos_token_ids, hack::load_generation_config(model_dir), tok.eos_id());
    b.measure_sharing = measure_sharing;
    b.question_decode = question_decode;
    b.vocab = static_cast<size_t>(cfg.vocab_size);
    b.bf16_bytes_per_token = hack::bf16_kv_bytes_per_token(b.shape);
    const Output out{json};

    out.line("fidelity: %s (%d layers, %d q / %d kv heads, head_dim %d, vocab %zu), %s threads\n", model_dir.c_str(),
             cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, b.vocab,
             threads > 0 ? std::to_string(threads).c_str() : "all");
    out.line("reference: %s — the same engine, backend and paged cache with fp32 pages; bf16 = %.0f bytes/token\n",
             hack::describe(reference_options()).c_str(), b.bf16_bytes_per_token);
    out.line("text: %s, %zu tokens\n", text_path.c_str(), text.size());
    for (const Config& c : configs) {
      std::string fdc;
      if (c.model != nullptr) {
        const hack::KvShape s = hack::kv_shape(*c.model);
        double dims = 0;
        for (size_t i = 0; i < s.k_dims.size(); ++i) dims += s.k_dims[i] + s.v_dims[i];
        fdc = fmt::format(" + FDC r={} (K+V dims {:.1f}% of full)", c.fdc_rate,
                          100 * dims / (2.0 * s.num_layers * s.num_kv_heads * s.head_dim));
      }
      out.line("  %-28s = %s%s\n", c.label.c_str(), hack::describe(c.options).c_str(), fdc.c_str());
    }
    out.line("KL, top-1, Δppl: 95%% block-bootstrap CIs (%d-position blocks, %d resamples). closed%% = bytes/token of\n"
             "closed pages, ctx%% = bytes attention reads per token at the window's final context, both vs bf16.\n",
             kBootstrapBlockTokens, kBootstrapResamples);
    out.record(Json{{"section", "setup"}, {"model", model_dir}, {"text", text_path}, {"text_tokens", text.size()},
                    {"reference", hack::describe(reference_options())}, {"threads", threads},
                    {"bf16_bytes_per_token", b.bf16_bytes_per_token}});

    using clock = std::chrono::steady_clock;
    const auto section = [&](const char* name, const std::string& what, auto&& body) {
      if (!want(name)) return;
      out.line("\n== %s: %s\n", name, what.c_str());
      const auto t0 = clock::now();
      body();
      out.line("(%s: %.0f s)\n", name, std::chrono::duration<double>(clock::now() - t0).count());
      std::fflush(stdout);
    };
    const std::vector<Sample> wins =
        want("decode") || want("prefill") ? text_windows(text, bos, windows, prefill_tokens, decode_tokens)
                                          : std::vector<Sample>{};
    const int window_tokens = prefill_tokens + decode_tokens;
    section("decode", std::to_string(wins.size()) + " windows: prefill " + std::to_string(prefill_tokens) +
                          " (chunks of " + std::to_string(prefill_chunk) + "), then " + std::to_string(decode_tokens) +
                          " tokens decoded one at a time and scored (" + std::to_string(wins.size() * decode_tokens) +
                          " positions)",
            [&] { report_distributions(b, out, "decode", configs, compare(b, Path::decode, wins, configs), window_tokens); });
    section("prefill", std::to_string(wins.size()) + " windows of " + std::to_string(window_tokens) +
                           " tokens prefilled in chunks of " + std::to_string(prefill_chunk) +
                           " with all logits, every position scored",
            [&] { report_distributions(b, out, "prefill", configs, compare(b, Path::prefill, wins, configs), window_tokens); });
    section("copy", std::to_string(copy_probes_n) + " probes: " + std::to_string(kCopyLeadTokens) + " filler + " + std::to_string(copy_span) +
                        " random ids + " + std::to_string(copy_gap) + " filler + the span again, repeat decoded (" +
                        std::to_string(copy_span - 1) + " positions each)",
            [&] {
              const std::vector<Sample> probes = copy_probes(b, text, bos, copy_probes_n, copy_span, copy_gap);
              report_copy(out, configs, compare(b, Path::decode, probes, configs));
            });
    section("passkey", "plain text (no chat template), " + std::to_string(passkey_keys) + " keys × depths " +
                           passkey_depths + " per length, greedy 8 tokens must contain the key",
            [&] {
              std::vector<double> depths;
              for (const std::string& d : hack::split_list(passkey_depths)) depths.push_back(std::stod(d));
              run_passkey(b, out, configs, bos, hack::parse_int_list(passkey_lengths, "passkey-lengths"), depths,
                          passkey_keys);
            });
    section("greedy", "chat template, greedy " + std::to_string(chat_tokens) + " tokens vs fp32",
            [&] { run_greedy(b, out, configs, model_dir, chats, chat_tokens); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fidelity: %s\n", e.what());
    return 1;
  }
  return 0;
}
