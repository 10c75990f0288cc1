// hack-calibrate: offline calibration of a model's KV compression. `--hack` chooses HACK
// code bits per layer under a byte budget and an accuracy target (calibrate/hack_bits.h)
// and writes them beside the model as hack_kv.json, which hack-run and the nodes apply
// (`--hack-allocation auto`). `--fdc` computes the FDC artifact (calibrate/fdc_calibrate.h)
// at a removal rate, given or searched for under a KL target, and writes fdc.safetensors.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hack/backend/backend.h"
#include "hack/calibrate/fdc_calibrate.h"
#include "hack/calibrate/hack_bits.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/core/read_file.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/hack_allocation.h"
#include "hack/kv/kv_flags.h"
#include "hack/model/gguf_model.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

struct CalibrateConfig {
  std::string model;
  bool hack = false;
  bool fdc = false;
  std::string text;              // calibration text (never the test text)
  int windows = 2;
  int prefill_tokens = 512;
  int decode_tokens = 128;
  int prefill_chunk = 512;
  std::string base = "k2v2";
  std::string upgrade = "k4v2";
  float max_bytes_pct = 20.0f;
  float max_kl = 0.0f;
  std::string output;            // default: <model>/hack_kv.json (--hack), <model>/fdc.safetensors (--fdc)
  int threads = 0;
  hack::KvFlags kv;
  // --fdc
  int calib_tokens = 8192;
  int calib_seq_len = 2048;
  std::string calib_source = "random";
  int64_t seed = 0;
  std::string v_method = "weights";
  float fdc_rate = 0;
};

hack::HackLayerBits parse_bits(const std::string& s, const char* flag) {
  int k = 0, v = 0;
  HACK_CHECK(std::sscanf(s.c_str(), "k%dv%d", &k, &v) == 2, "--{} must look like k4v2, got '{}'", flag, s);
  for (const int bits : {k, v})
    HACK_CHECK(hack::is_hack_bits(bits), "--{}: bit widths are 2, 4 or 8, got '{}'", flag, s);
  return {k, v};
}

// Decode-path windows from the start of `ids`, each `per_window` tokens opened by `bos` (if
// ≥ 0), consecutive windows sharing one token. Returns how many ids they used.
size_t text_windows(const std::vector<int>& ids, int bos, int count, size_t per_window, const std::string& what,
                    std::vector<std::vector<int>>& windows) {
  size_t used = 0;
  for (size_t w = 0; static_cast<int>(w) < count; ++w) {
    const size_t begin = w * (per_window - 1);
    const size_t take = per_window - (bos >= 0 ? 1 : 0);
    HACK_CHECK(begin + per_window - 1 <= ids.size(), "{}: {} tokens, {} windows of {} need more", what, ids.size(),
               count, per_window);
    std::vector<int> win;
    if (bos >= 0) win.push_back(bos);
    win.insert(win.end(), ids.begin() + static_cast<std::ptrdiff_t>(begin),
               ids.begin() + static_cast<std::ptrdiff_t>(begin + take));
    windows.push_back(std::move(win));
    used = begin + take;
  }
  return used;
}

nlohmann::ordered_json score_json(const hack::DecodePathScore& s, double ref_nll) {
  return nlohmann::ordered_json{{"mean_kl", s.mean_kl}, {"top1", s.top1}, {"ppl_delta_pct", 100 * (std::exp(s.nll - ref_nll) - 1)}};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_hack(const CalibrateConfig& c) {
  HACK_CHECK(!c.text.empty(), "--hack needs --text");
  hack::HackBitsSearch search;
  search.base = parse_bits(c.base, "base");
  search.upgrade = parse_bits(c.upgrade, "upgrade");
  HACK_CHECK(c.max_bytes_pct > 0, "--max-bytes-pct must be positive");
  search.max_bytes_fraction = c.max_bytes_pct / 100.0;
  search.max_kl = c.max_kl;
  const auto t0 = std::chrono::steady_clock::now();
  const hack::Model model = hack::Model::load(c.model);
  const hack::Tokenizer tokenizer = hack::Tokenizer::load(c.model);
  const std::vector<int> ids = tokenizer.encode(hack::read_file(c.text, "calibration text"), false);
  const size_t per_window = static_cast<size_t>(c.prefill_tokens + c.decode_tokens);
  std::vector<std::vector<int>> windows;
  const int bos = model.config.bos_token_id >= 0 ? model.config.bos_token_id : tokenizer.bos_id();
  text_windows(ids, bos, c.windows, per_window, c.text, windows);
  hack::ThreadPool pool(c.threads);
  const hack::ModelConfig& cfg = model.config;
  const hack::KvShape shape = hack::kv_shape(cfg);
  hack::KvFlags kv = c.kv;
  kv.kv = "hack";
  const hack::KvCacheOptions options = hack::kv_options_from(kv, c.model, cfg.num_layers);
  std::fprintf(stderr, "hack-calibrate: %s, %d windows × (%d prefill + %d decode) tokens of %s; %s\n", c.model.c_str(),
               c.windows, c.prefill_tokens, c.decode_tokens, c.text.c_str(), hack::describe(options).c_str());
  const hack::DecodePathReference reference(model, pool, windows, c.prefill_tokens, c.prefill_chunk);
  const hack::HackBitsResult r = hack::search_hack_bits(reference, shape, options, search, [](const std::string& line) {
    std::fprintf(stderr, "  %s\n", line.c_str());
  });

  nlohmann::ordered_json cal;
  cal["tool"] = "hack-calibrate --hack";
  cal["text"] = c.text;
  cal["text_tokens"] = ids.size();
  cal["windows"] = c.windows;
  cal["prefill_tokens"] = c.prefill_tokens;
  cal["decode_tokens"] = c.decode_tokens;
  cal["options"] = hack::describe(options);
  cal["base"] = c.base;
  cal["upgrade"] = c.upgrade;
  cal["max_bytes_pct"] = c.max_bytes_pct;
  cal["max_kl"] = c.max_kl;
  cal["layers_raised"] = r.upgraded;
  cal["ranking"] = r.ranking;
  cal["layer_gain_kl"] = r.layer_gain_kl;
  const double ref_nll = reference.reference_nll();
  cal["base_score"] = score_json(r.base_score, ref_nll);
  cal["score"] = score_json(r.final_score, ref_nll);
  cal["bytes_pct_of_bf16"] = 100 * r.bytes_fraction;
  cal["measurements"] = r.measurements;
  cal["seconds"] = seconds_since(t0);
  hack::HackAllocation allocation;
  allocation.layers = r.layers;
  allocation.recent_tokens = options.recent_tokens;
  allocation.calibration_json = cal.dump();
  const std::string out =
      c.output.empty() ? hack::model_artifact_path(c.model, hack::kHackAllocationFile).string() : c.output;
  hack::save_hack_allocation(out, allocation);
  const bool met = c.max_kl <= 0 || r.final_score.mean_kl <= c.max_kl;
  std::printf("%s: %d of %d layers raised to %s, %.1f %% of bf16 bytes, decode-path KL %.5f, top-1 %.4f, ppl %+.2f %%%s\n",
              out.c_str(), r.upgraded, cfg.num_layers, c.upgrade.c_str(), 100 * r.bytes_fraction,
              r.final_score.mean_kl, r.final_score.top1, 100 * (std::exp(r.final_score.nll - ref_nll) - 1),
              met ? "" : " (the KL target is not met within the byte budget)");
  return met ? 0 : 3;
}

// The flags give floats; the artifact records r and the KL target as the decimals the user
// typed (0.1, not 0.100000001490116).
double typed_value(float f) { return std::stod(fmt::format("{}", f)); }

int run_fdc(const CalibrateConfig& c, const hack::FlagSet& flags) {
  const bool fixed_rate = flags.was_set("fdc-rate");
  HACK_CHECK(fixed_rate != (c.max_kl > 0), "--fdc needs exactly one of --fdc-rate (a removal rate) and --max-kl (a "
             "KL target to search the rate for)");
  HACK_CHECK(!fixed_rate || (c.fdc_rate >= 0 && c.fdc_rate < 1), "--fdc-rate must be in [0, 1), got {}", c.fdc_rate);
  HACK_CHECK(c.calib_source == "random" || c.calib_source == "text", "--calib-source must be random or text, got {}",
             c.calib_source);
  HACK_CHECK(c.calib_source == "random" || !c.text.empty(), "--calib-source text needs --text");
  HACK_CHECK(c.max_kl <= 0 || !c.text.empty(), "--max-kl needs --text: the KL target is measured on real text");
  const double max_kl = typed_value(c.max_kl);
  const auto t0 = std::chrono::steady_clock::now();
  const hack::Model model = hack::Model::load(c.model);
  const hack::ModelConfig& cfg = model.config;
  hack::ThreadPool pool(c.threads);

  // Decode-path windows: the start of --text, or random ids (a weaker yardstick, labelled so).
  const size_t per_window = static_cast<size_t>(c.prefill_tokens + c.decode_tokens);
  std::vector<std::vector<int>> windows;
  std::vector<int> calib_text;
  if (!c.text.empty()) {
    const hack::Tokenizer tokenizer = hack::Tokenizer::load(c.model);
    const std::vector<int> ids = tokenizer.encode(hack::read_file(c.text, "calibration text"), false);
    const int bos = cfg.bos_token_id >= 0 ? cfg.bos_token_id : tokenizer.bos_id();
    const size_t used = text_windows(ids, bos, c.windows, per_window, c.text, windows);
    if (c.calib_source == "text") calib_text.assign(ids.begin() + static_cast<std::ptrdiff_t>(used), ids.end());
  } else {
    windows = hack::fdc_calibration_sequences(cfg, c.windows * static_cast<int>(per_window), static_cast<int>(per_window),
                                              static_cast<uint64_t>(c.seed) + 1);
  }
  const std::string window_source = c.text.empty() ? "random ids" : c.text;
  if (c.calib_tokens < 8192)
    std::fprintf(stderr, "hack-calibrate: warning: %d calibration tokens; the FDC paper finds R stable from 8192\n",
                 c.calib_tokens);
  const std::vector<std::vector<int>> sequences = hack::fdc_calibration_sequences(
      cfg, c.calib_tokens, c.calib_seq_len, static_cast<uint64_t>(c.seed), calib_text);

  hack::FdcCalibrationOptions calibration;
  calibration.v_method = c.v_method;
  calibration.prefill_chunk_tokens = c.prefill_chunk;
  calibration.removal_rate = fixed_rate ? typed_value(c.fdc_rate) : 0.0;
  std::fprintf(stderr, "hack-calibrate: %s, FDC bases from %d %s tokens (sequences of ≤ %d), V by %s\n", c.model.c_str(),
               c.calib_tokens, c.calib_source.c_str(), c.calib_seq_len, c.v_method.c_str());
  hack::FdcArtifact artifact = hack::calibrate_fdc(model, pool, sequences, calibration);
  const double calib_s = seconds_since(t0);

  // FDC alone over an fp32 cache unless --kv says otherwise (--kv hack: FDC + HACK).
  hack::KvFlags kv = c.kv;
  if (!flags.was_set("kv")) kv.kv = "fp";
  if (!flags.was_set("kv-dtype")) kv.kv_dtype = "f32";
  const hack::KvCacheOptions options = hack::kv_options_from(kv, c.model, cfg.num_layers);
  std::fprintf(stderr, "hack-calibrate: bases in %.1f s; scoring on %d windows × (%d prefill + %d decode) tokens of %s; %s\n",
               calib_s, c.windows, c.prefill_tokens, c.decode_tokens, window_source.c_str(),
               hack::describe(options).c_str());
  const hack::DecodePathReference reference(model, pool, windows, c.prefill_tokens, c.prefill_chunk);
  hack::DecodePathScore score;
  int measurements = 1;
  if (fixed_rate) {
    score = hack::score_fdc(reference, model, artifact, options);
  } else {
    hack::FdcRateSearch search;
    search.max_kl = max_kl;
    const hack::FdcRateResult r = hack::search_fdc_rate(reference, model, artifact, options, search,
                                                        [](const std::string& line) {
                                                          std::fprintf(stderr, "  %s\n", line.c_str());
                                                        });
    artifact = hack::fdc_artifact_at_rate(std::move(artifact), r.removal_rate);
    score = r.score;
    measurements = r.measurements;
  }

  const double ref_nll = reference.reference_nll();
  nlohmann::ordered_json cal = nlohmann::ordered_json::parse(artifact.calibration_json);
  cal["tool"] = "hack-calibrate --fdc";
  cal["source"] = c.calib_source;
  if (c.calib_source == "random") cal["seed"] = c.seed;
  if (!c.text.empty()) cal["text"] = c.text;
  cal["seq_len"] = c.calib_seq_len;
  cal["score_windows"] = {{"source", window_source}, {"windows", c.windows}, {"prefill_tokens", c.prefill_tokens},
                          {"decode_tokens", c.decode_tokens}, {"options", hack::describe(options)}};
  if (!fixed_rate) cal["max_kl"] = max_kl;
  cal["score"] = score_json(score, ref_nll);
  cal["measurements"] = measurements;
  cal["calibration_seconds"] = calib_s;
  cal["seconds"] = seconds_since(t0);
  artifact.calibration_json = cal.dump();
  const std::string out = c.output.empty() ? hack::model_artifact_path(c.model, "fdc.safetensors").string() : c.output;
  hack::save_fdc_artifact(artifact, out);

  int dims = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    std::string qk, v;
    for (int h = 0; h < cfg.num_kv_heads; ++h) {
      qk += fmt::format(" {:3}", artifact.rank(l, h).d_qk);
      v += fmt::format(" {:3}", artifact.rank(l, h).d_v);
      dims += artifact.rank(l, h).d_qk + artifact.rank(l, h).d_v;
    }
    std::printf("layer %2d  d_qk%s   d_v%s\n", l, qk.c_str(), v.c_str());
  }
  const int full = 2 * cfg.num_layers * cfg.kv_dim();
  const bool met = fixed_rate || score.mean_kl <= max_kl;
  std::printf("%s: r %.4g, KV dims per token %d of %d (%.1f %%), decode-path KL %.5f, top-1 %.4f, ppl %+.2f %% (%s, %s); "
              "%.1f s (bases %.1f s)%s\n",
              out.c_str(), artifact.removal_rate, dims, full, 100.0 * dims / full, score.mean_kl, score.top1,
              100 * (std::exp(score.nll - ref_nll) - 1), window_source.c_str(), hack::describe(options).c_str(),
              seconds_since(t0), calib_s, met ? "" : " (the KL target is not met even at r = 0)");
  return met ? 0 : 3;
}

int run(int argc, char** argv) {
  CalibrateConfig c;
  c.kv.hack_allocation = "none";  // the allocation is what --hack computes
  hack::FlagSet flags("hack-calibrate",
                      "Offline calibration of KV compression. --hack: per-layer HACK bits within a byte budget and "
                      "an accuracy target, measured on the decode path against the fp32 cache; writes hack_kv.json "
                      "beside the model. --fdc: the FDC artifact (post-RoPE Q/K bases and low-rank V per KV head) "
                      "from calibration tokens, at --fdc-rate or at the largest rate within --max-kl; writes "
                      "fdc.safetensors beside the model. --fdc scores FDC alone over an fp32 cache unless --kv is "
                      "given (--kv hack: FDC + HACK).",
                      "HACK_CALIBRATE");
  flags.add_string("model", &c.model, "Hugging Face model directory, or a llama/qwen2/qwen3 GGUF file (read natively; "
                   "the outputs then go beside it as FILE.gguf.hack_kv.json, FILE.gguf.fdc.safetensors)");
  flags.add_bool("hack", &c.hack, "calibrate HACK bit widths per layer");
  flags.add_bool("fdc", &c.fdc, "calibrate FDC (dimensionality compression) ranks per KV head");
  flags.add_string("text", &c.text, "calibration text (keep it apart from any text you test on); the decode-path "
                   "windows are its start; --fdc without it scores on random ids");
  flags.add_int("windows", &c.windows, "calibration windows");
  flags.add_int("prefill-tokens", &c.prefill_tokens, "tokens prefilled per window (then quantized)");
  flags.add_int("decode-tokens", &c.decode_tokens, "tokens then fed one at a time and scored, per window");
  flags.add_int("prefill-chunk", &c.prefill_chunk, "prefill chunk tokens");
  flags.add_string("base", &c.base, "--hack: bits of every layer to start from, kKvV");
  flags.add_string("upgrade", &c.upgrade, "--hack: bits a layer is raised to, kKvV");
  flags.add_float("max-bytes-pct", &c.max_bytes_pct, "--hack: budget: closed-page KV bytes as % of bf16");
  flags.add_float("max-kl", &c.max_kl, "accuracy target: mean decode-path KL; 0 = none (--hack: most accurate within "
                  "the budget; --fdc: give --fdc-rate)");
  flags.add_int("calib-tokens", &c.calib_tokens, "--fdc: calibration tokens the bases are computed from");
  flags.add_int("calib-seq-len", &c.calib_seq_len, "--fdc: tokens per calibration sequence (the positions covered)");
  flags.add_string("calib-source", &c.calib_source, "--fdc: calibration tokens: random (ids from --seed, the FDC "
                   "paper's method) or text (--text after the scoring windows)");
  flags.add_int64("seed", &c.seed, "--fdc: seed of the random calibration ids");
  flags.add_string("v-method", &c.v_method, "--fdc: V basis: weights (SVD of W_V) or whitened (principal directions "
                   "of the V outputs)");
  flags.add_float("fdc-rate", &c.fdc_rate, "--fdc: singular-value removal rate r in [0, 1) (instead of --max-kl)");
  flags.add_string("output", &c.output, "where to write; default MODEL/hack_kv.json (--hack), MODEL/fdc.safetensors "
                   "(--fdc)");
  flags.add_int("threads", &c.threads, "compute threads; 0 = all cores");
  hack::add_kv_flags(flags, c.kv);
  if (!flags.parse(argc, argv)) return 0;
  hack::setup_logging("warn");
  HACK_CHECK(c.hack != c.fdc, "give one of --hack and --fdc");
  HACK_CHECK(!c.model.empty(), "--model is required");
  c.model = hack::resolve_model_path(c.model).string();  // a directory or a GGUF file
  HACK_CHECK(c.windows > 0 && c.prefill_tokens > 0 && c.decode_tokens > 0, "--windows, --prefill-tokens and "
             "--decode-tokens must be positive");
  HACK_CHECK(c.max_kl >= 0, "--max-kl must not be negative");
  return c.hack ? run_hack(c) : run_fdc(c, flags);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-calibrate: %s\n", e.what());
    return 1;
  }
}
