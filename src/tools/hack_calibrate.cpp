// hack-calibrate: offline calibration of a model's KV compression. `--hack` chooses HACK
// code bits per layer under a byte budget and an accuracy target (calibrate/hack_bits.h)
// and writes them beside the model as hack_kv.json, which hack-run and the nodes apply
// (`--hack-allocation auto`).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hack/backend/backend.h"
#include "hack/calibrate/hack_bits.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/core/read_file.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/hack_allocation.h"
#include "hack/kv/kv_flags.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

struct CalibrateConfig {
  std::string model;
  bool hack = false;
  std::string text;              // calibration text (never the test text)
  int windows = 2;
  int prefill_tokens = 512;
  int decode_tokens = 128;
  int prefill_chunk = 512;
  std::string base = "k2v2";
  std::string upgrade = "k4v2";
  float max_bytes_pct = 20.0f;
  float max_kl = 0.0f;
  std::string output;            // default: <model>/hack_kv.json
  int threads = 0;
  hack::KvFlags kv;
};

hack::HackLayerBits parse_bits(const std::string& s, const char* flag) {
  int k = 0, v = 0;
  HACK_CHECK(std::sscanf(s.c_str(), "k%dv%d", &k, &v) == 2, "--{} must look like k4v2, got '{}'", flag, s);
  for (const int bits : {k, v})
    HACK_CHECK(hack::is_hack_bits(bits), "--{}: bit widths are 2, 4 or 8, got '{}'", flag, s);
  return {k, v};
}

int run(int argc, char** argv) {
  CalibrateConfig c;
  c.kv.hack_allocation = "none";  // the allocation is what we compute
  hack::FlagSet flags("hack-calibrate",
                      "Offline calibration of KV compression. --hack: per-layer HACK bits within a byte budget and "
                      "an accuracy target, measured on the decode path against the fp32 cache; writes hack_kv.json "
                      "beside the model.",
                      "HACK_CALIBRATE");
  flags.add_string("model", &c.model, "Hugging Face model directory");
  flags.add_bool("hack", &c.hack, "calibrate HACK bit widths per layer");
  flags.add_string("text", &c.text, "calibration text (keep it apart from any text you test on)");
  flags.add_int("windows", &c.windows, "calibration windows");
  flags.add_int("prefill-tokens", &c.prefill_tokens, "tokens prefilled per window (then quantized)");
  flags.add_int("decode-tokens", &c.decode_tokens, "tokens then fed one at a time and scored, per window");
  flags.add_int("prefill-chunk", &c.prefill_chunk, "prefill chunk tokens");
  flags.add_string("base", &c.base, "bits of every layer to start from, kKvV");
  flags.add_string("upgrade", &c.upgrade, "bits a layer is raised to, kKvV");
  flags.add_float("max-bytes-pct", &c.max_bytes_pct, "budget: closed-page KV bytes as % of bf16");
  flags.add_float("max-kl", &c.max_kl, "accuracy target: mean decode-path KL; 0 = most accurate within the budget");
  flags.add_string("output", &c.output, "where to write the allocation; default MODEL/hack_kv.json");
  flags.add_int("threads", &c.threads, "compute threads; 0 = all cores");
  hack::add_kv_flags(flags, c.kv);
  if (!flags.parse(argc, argv)) return 0;
  hack::setup_logging("warn");
  HACK_CHECK(c.hack, "nothing to calibrate: give --hack");
  HACK_CHECK(!c.model.empty() && !c.text.empty(), "--model and --text are required");
  HACK_CHECK(c.windows > 0 && c.prefill_tokens > 0 && c.decode_tokens > 0, "--windows, --prefill-tokens and "
             "--decode-tokens must be positive");
  hack::HackBitsSearch search;
  search.base = parse_bits(c.base, "base");
  search.upgrade = parse_bits(c.upgrade, "upgrade");
  HACK_CHECK(c.max_bytes_pct > 0 && c.max_kl >= 0, "--max-bytes-pct must be positive and --max-kl not negative");
  search.max_bytes_fraction = c.max_bytes_pct / 100.0;
  search.max_kl = c.max_kl;
  const auto t0 = std::chrono::steady_clock::now();
  const hack::Model model = hack::Model::load(c.model);
  const hack::Tokenizer tokenizer = hack::Tokenizer::load(c.model);
  const std::vector<int> ids = tokenizer.encode(hack::read_file(c.text, "calibration text"), false);
  const size_t per_window = static_cast<size_t>(c.prefill_tokens + c.decode_tokens);
  std::vector<std::vector<int>> windows;
  const int bos = model.config.bos_token_id >= 0 ? model.config.bos_token_id : tokenizer.bos_id();
  for (size_t w = 0; static_cast<int>(w) < c.windows; ++w) {
    const size_t begin = w * (per_window - 1);
    HACK_CHECK(begin + per_window - 1 <= ids.size(), "{}: {} tokens, {} windows of {} need more", c.text, ids.size(),
               c.windows, per_window);
    std::vector<int> win;
    if (bos >= 0) win.push_back(bos);
    win.insert(win.end(), ids.begin() + static_cast<std::ptrdiff_t>(begin),
               ids.begin() + static_cast<std::ptrdiff_t>(begin + per_window - (bos >= 0 ? 1 : 0)));
    windows.push_back(std::move(win));
  }
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
  const double ref_ppl = std::exp(reference.reference_nll());
  auto score_json = [&](const hack::DecodePathScore& s) {
    return nlohmann::ordered_json{{"mean_kl", s.mean_kl},
                                  {"top1", s.top1},
                                  {"ppl_delta_pct", 100 * (std::exp(s.nll) / ref_ppl - 1)}};
  };
  cal["base_score"] = score_json(r.base_score);
  cal["score"] = score_json(r.final_score);
  cal["bytes_pct_of_bf16"] = 100 * r.bytes_fraction;
  cal["measurements"] = r.measurements;
  cal["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  hack::HackAllocation allocation;
  allocation.layers = r.layers;
  allocation.recent_tokens = options.recent_tokens;
  allocation.calibration_json = cal.dump();
  const std::string out = c.output.empty() ? c.model + "/" + hack::kHackAllocationFile : c.output;
  hack::save_hack_allocation(out, allocation);
  const bool met = c.max_kl <= 0 || r.final_score.mean_kl <= c.max_kl;
  std::printf("%s: %d of %d layers raised to %s, %.1f %% of bf16 bytes, decode-path KL %.5f, top-1 %.4f, ppl %+.2f %%%s\n",
              out.c_str(), r.upgraded, cfg.num_layers, c.upgrade.c_str(), 100 * r.bytes_fraction,
              r.final_score.mean_kl, r.final_score.top1, 100 * (std::exp(r.final_score.nll) / ref_ppl - 1),
              met ? "" : " (the KL target is not met within the byte budget)");
  return met ? 0 : 3;
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
