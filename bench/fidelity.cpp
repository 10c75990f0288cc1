// bench/kv_quality: what KV compression costs in model quality (DESIGN.md §7). Runs
// held-out text through the model token by token (every step attends over the stored,
// possibly quantized, past, exactly as decode does) once with the fp32 reference cache and
// once per compressed configuration, and reports next-token KL(p_fp ‖ p_kv), top-1
// agreement and perplexity.
//   kv_quality --model DIR --text FILE [--windows 4] [--window-tokens 512] [--bits 2,4,8]
//              [--blocks 32,64,128] [--roundings nearest,stochastic] [--sinks 4] [--json]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/core/flags.h"
#include "hack/kv/fp_kv_cache.h"
#include "hack/kv/paged_kv_cache.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

// log-softmax of one row, in place.
void log_softmax(std::vector<float>& row) {
  float m = row[0];
  for (float v : row) m = std::max(m, v);
  double s = 0;
  for (float v : row) s += std::exp(static_cast<double>(v - m));
  const float lse = m + static_cast<float>(std::log(s));
  for (float& v : row) v -= lse;
}

// Log-probabilities of every position's next-token distribution, [n][vocab].
std::vector<std::vector<float>> run_window(hack::Backend& backend, hack::KvCache& kv, const std::vector<int>& ids) {
  hack::Engine engine(backend, kv);
  engine.add_sequence(0, static_cast<int>(ids.size()) + 1);
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  const size_t vocab = static_cast<size_t>(backend.config().vocab_size);
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    if (t == 0) {
      engine.prefill(0, std::span<const int>(&ids[0], 1), logits);
    } else {
      const int seq = 0;
      engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&ids[t], 1), logits);
    }
    std::vector<float> row(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(vocab));
    log_softmax(row);
    out.push_back(std::move(row));
  }
  engine.remove_sequence(0);
  return out;
}

// One configuration of --configs: "k2v2 block=64 recent=64 kg=64 vg=32 sinks=4 deq qprefill"
// (space or ',' separated; unnamed fields keep the defaults of the other flags).
hack::KvCacheOptions parse_config(const std::string& spec, hack::KvCacheOptions o) {
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
    else hack::fail("--configs: unknown field '{}' in '{}'", item, spec);
  }
  return o;
}

struct Quality {
  double kl = 0, top1 = 0, nll = 0;
  size_t n = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, text_path, bits_list = "2,4,8", blocks_list = "32,64,128", roundings = "nearest,stochastic";
  int windows = 4, window_tokens = 512, sinks = 4, threads = 0;
  bool json = false;
  hack::FlagSet flags("kv_quality", "KV compression vs the fp32 cache: KL, top-1 agreement, perplexity.", "HACK_KVQ");
  flags.add_string("model", &model_dir, "model directory");
  flags.add_string("text", &text_path, "held-out text file");
  flags.add_int("windows", &windows, "number of windows scored");
  flags.add_int("window-tokens", &window_tokens, "tokens per window (bos included)");
  flags.add_string("bits", &bits_list, "HACK bit widths");
  flags.add_string("blocks", &blocks_list, "HACK block sizes Π");
  flags.add_string("roundings", &roundings, "nearest and/or stochastic");
  flags.add_int("sinks", &sinks, "bf16 sink tokens");
  flags.add_int("threads", &threads, "threads (0 = all)");
  flags.add_bool("json", &json, "JSON lines output");
  std::string configs;
  flags.add_string("configs", &configs, "';'-separated configurations (see parse_config) instead of the sweep");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(!model_dir.empty() && !text_path.empty(), "--model and --text are required");
    hack::Model model = hack::Model::load(model_dir);
    hack::Tokenizer tok = hack::Tokenizer::load(model_dir);
    const std::vector<int> all = tok.encode(hack::read_file(text_path, "text"), false);
    const hack::ModelConfig& cfg = model.config;
    std::vector<std::vector<int>> wins;
    for (int w = 0; w < windows; ++w) {
      const size_t begin = static_cast<size_t>(w) * static_cast<size_t>(window_tokens - 1);
      if (begin + static_cast<size_t>(window_tokens - 1) > all.size()) break;
      std::vector<int> ids{cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id()};
      ids.insert(ids.end(), all.begin() + static_cast<std::ptrdiff_t>(begin),
                 all.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<size_t>(window_tokens - 1)));
      wins.push_back(std::move(ids));
    }
    HACK_CHECK(!wins.empty(), "{} has fewer than {} tokens", text_path, window_tokens);
    hack::ThreadPool pool(threads);
    auto backend = hack::make_cpu_backend(model, pool);
    const hack::KvShape shape{cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.group_size()};

    std::vector<std::vector<std::vector<float>>> ref;
    double ref_nll = 0;
    size_t ref_n = 0;
    for (const auto& ids : wins) {
      hack::FpKvCache kv(shape);
      ref.push_back(run_window(*backend, kv, ids));
      for (size_t t = 0; t + 1 < ids.size(); ++t) {
        ref_nll -= ref.back()[t][static_cast<size_t>(ids[t + 1])];
        ++ref_n;
      }
    }
    const double ref_ppl = std::exp(ref_nll / static_cast<double>(ref_n));
    if (json) {
      std::printf("{\"mode\":\"fp32\",\"ppl\":%.4f,\"tokens\":%zu}\n", ref_ppl, ref_n);
    } else {
      std::printf("model %s, %zu windows × %d tokens (%zu scored)\n", model_dir.c_str(), wins.size(), window_tokens, ref_n);
      std::printf("%-60s %10s %10s %10s %10s %12s\n", "kv", "KL", "top-1", "ppl", "Δppl %", "bytes/token");
      std::printf("%-60s %10s %10s %10.4f %10s %12s\n", "fp32 (reference)", "0", "1", ref_ppl, "0", "-");
    }
    std::vector<hack::KvCacheOptions> sweep;
    if (!configs.empty()) {
      std::string spec;
      std::istringstream in(configs);
      while (std::getline(in, spec, ';')) {
        hack::KvCacheOptions opt;
        opt.sinks = sinks;
        opt.seed = 1;
        sweep.push_back(parse_config(spec, opt));
      }
    }
    for (const std::string& rounding : hack::split_list(roundings)) {
      for (const int b : hack::parse_int_list(bits_list, "bits")) {
        for (const int blk : hack::parse_int_list(blocks_list, "blocks")) {
          hack::KvCacheOptions opt;
          opt.mode = hack::KvMode::hack;
          opt.k_bits = opt.v_bits = b;
          opt.block_tokens = blk;
          opt.sinks = sinks;
          opt.rounding = rounding == "stochastic" ? hack::Rounding::stochastic : hack::Rounding::nearest;
          opt.seed = 1;
          if (configs.empty()) sweep.push_back(opt);
        }
      }
    }
    for (const hack::KvCacheOptions& opt : sweep) {
      {
        {
          const int b = opt.k_bits, blk = opt.block_tokens;
          const std::string rounding(hack::rounding_name(opt.rounding));
          Quality q;
          double bytes_per_token = 0;
          for (size_t w = 0; w < wins.size(); ++w) {
            auto kv = hack::make_paged_kv_cache(shape, opt);
            const auto got = run_window(*backend, *kv, wins[w]);
            bytes_per_token = kv->bytes_per_token();
            for (size_t t = 0; t < got.size(); ++t) {
              const auto& p = ref[w][t];
              const auto& r = got[t];
              double kl = 0;
              size_t a1 = 0, a2 = 0;
              for (size_t v = 0; v < p.size(); ++v) {
                kl += std::exp(static_cast<double>(p[v])) * (p[v] - r[v]);
                if (p[v] > p[a1]) a1 = v;
                if (r[v] > r[a2]) a2 = v;
              }
              q.kl += kl;
              q.top1 += a1 == a2;
              q.nll -= r[static_cast<size_t>(wins[w][t + 1])];
              ++q.n;
            }
          }
          const double ppl = std::exp(q.nll / static_cast<double>(q.n));
          const double n = static_cast<double>(q.n);
          const std::string name = hack::describe(opt);
          if (json) {
            std::printf("{\"mode\":\"hack\",\"bits\":%d,\"block\":%d,\"rounding\":\"%s\",\"kl\":%.6f,\"top1\":%.4f,"
                        "\"ppl\":%.4f,\"ppl_delta_pct\":%.3f,\"bytes_per_token\":%.1f}\n",
                        b, blk, rounding.c_str(), q.kl / n, q.top1 / n, ppl,
                        100 * (ppl / ref_ppl - 1), bytes_per_token);
          } else {
            std::printf("%-60s %10.5f %10.4f %10.4f %10.2f %12.1f\n", name.c_str(), q.kl / n, q.top1 / n, ppl,
                        100 * (ppl / ref_ppl - 1), bytes_per_token);
          }
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_quality: %s\n", e.what());
    return 1;
  }
  return 0;
}
