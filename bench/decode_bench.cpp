// bench/decode_bench: prefill and decode tokens/s of the CPU backend, and the weight
// streaming bandwidth decode achieves against the machine's measured read bandwidth.
//   decode_bench (--model DIR | --synthetic NAME) [--threads 1,2] [--prompt-tokens 128]
//                [--decode-tokens 32] [--batch 1] [--dtype bf16] [--kv fp --kv-dtype f32 | --kv hack ...] [--json]
//                [--matmul-precision fp32|bf16] [--weights-memory huge-pages|mmap]
// The engine, backend and paged cache are those hack-run and the nodes serve with (the
// attention plan per step); the cache defaults to fp32 pages, the other KV flags as hack-run's.
// Decode is memory-bound: time per step >= weight bytes / read bandwidth (DESIGN.md §6),
// so "achieved GB/s" = weight bytes per step / seconds per step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/membw.h"
#include "hack/kv/kv_flags.h"
#include "hack/model/weights.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, synthetic, dtype_name = "bf16";
  std::string threads_flag = "1,2";
  int prompt_tokens = 128, decode_tokens = 32, batch = 1;
  bool json = false;
  std::string matmul_precision = "fp32", weights_memory = "huge-pages";
  hack::FlagSet flags("decode_bench", "Prefill and decode tokens/s of the CPU backend, and weight GB/s vs membw.",
                      "HACK_DECODE_BENCH");
  flags.add_string("model", &model_dir, "model directory");
  flags.add_string("synthetic", &synthetic, "synthetic shape instead of --model (llama-1b, llama-8b, ...)");
  flags.add_string("threads", &threads_flag, "thread counts, comma-separated");
  flags.add_int("prompt-tokens", &prompt_tokens, "prefill length");
  flags.add_int("decode-tokens", &decode_tokens, "decode steps timed");
  flags.add_int("batch", &batch, "sequences decoded together");
  flags.add_string("dtype", &dtype_name, "synthetic weight type: bf16, f16 or f32");
  flags.add_bool("json", &json, "JSON lines output");
  flags.add_string("matmul-precision", &matmul_precision, "prefill GEMM arithmetic: fp32 or bf16 (as hack-run's flag)");
  flags.add_string("weights-memory", &weights_memory, "huge-pages or mmap (as hack-run's flag)");
  hack::KvFlags kv_flags;
  kv_flags.kv = "fp";
  kv_flags.kv_dtype = "f32";
  hack::add_kv_flags(flags, kv_flags);
  std::vector<int> threads_list;
  try {
    if (!flags.parse(argc, argv)) return 0;
    threads_list = hack::parse_int_list(threads_flag, "threads");
  } catch (const hack::Error& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 2;
  }
  try {
    HACK_CHECK(!model_dir.empty() || !synthetic.empty(), "give --model DIR or --synthetic NAME");
    const auto t_load = std::chrono::steady_clock::now();
    hack::Model model = model_dir.empty()
                            ? hack::Model::synthetic(hack::synthetic_model_config(synthetic), 42, hack::parse_dtype(dtype_name))
                            : hack::Model::load(model_dir);
    if (hack::Model::wants_huge_pages(weights_memory)) model.place_in_huge_pages();
    const hack::EngineOptions engine_options{.matmul_precision = hack::cpu::parse_matmul_precision(matmul_precision)};
    const double load_s = seconds_since(t_load);
    const std::string name = model_dir.empty() ? synthetic : model_dir;
    const hack::ModelConfig& cfg = model.config;
    const hack::KvCacheOptions kv_options = hack::kv_options_from(kv_flags, model_dir, cfg.num_layers);
    const double weight_gb = static_cast<double>(model.weight_bytes()) / 1e9;
    if (!json) {
      std::printf("model %s: %d layers, hidden %d, %lld params, %.3f GB weights (loaded in %.1f s)\n", name.c_str(),
                  cfg.num_layers, cfg.hidden_size, static_cast<long long>(cfg.parameter_count()), weight_gb, load_s);
      std::printf("cpu: %s\nisa: %s (HACK_CPU_ISA lowers it)\nkv: %s\n", hack::cpu_features().describe().c_str(),
                  hack::cpu_isa_name(hack::cpu_isa()), hack::describe(kv_options).c_str());
    }
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
    std::string json_out = "[";
    for (int threads : threads_list) {
      hack::ThreadPool pool(threads);
      const double membw = hack::measure_read_bandwidth_gbs(pool, size_t{1} << 30, 3);
      hack::CpuEngine cpu = hack::make_cpu_engine(model, pool, kv_options, engine_options);
      hack::Engine& engine = *cpu.engine;
      std::vector<int> seqs;
      for (int b = 0; b < batch; ++b) {
        engine.add_sequence(b, prompt_tokens + decode_tokens + 1);
        seqs.push_back(b);
      }
      std::vector<float> logits;
      std::vector<int> prompt(static_cast<size_t>(prompt_tokens));
      double prefill_s = 0;
      for (int b = 0; b < batch; ++b) {
        for (int& t : prompt) t = tok(rng);
        const auto t0 = std::chrono::steady_clock::now();
        engine.prefill(b, prompt, logits);
        prefill_s += seconds_since(t0);
      }
      std::vector<int> next(static_cast<size_t>(batch));
      for (int& t : next) t = tok(rng);
      engine.decode(seqs, next, logits);  // warm-up step
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 1; s < decode_tokens; ++s) engine.decode(seqs, next, logits);
      const double decode_s = seconds_since(t0);
      const int steps = decode_tokens - 1;
      const double step_s = decode_s / steps;
      const double prefill_tps = prompt_tokens * batch / prefill_s;
      const double decode_tps = batch / step_s;
      const double achieved = weight_gb / step_s;
      if (json) {
        char buf[640];
        std::snprintf(buf, sizeof buf,
                      "%s{\"model\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"batch\":%d,\"prompt_tokens\":%d,\"prefill_tok_s\":%.2f,"
                      "\"decode_tok_s\":%.3f,\"decode_step_ms\":%.3f,\"weight_gb\":%.4f,\"achieved_gbs\":%.2f,"
                      "\"membw_gbs\":%.2f,\"fraction_of_membw\":%.3f}",
                      json_out.size() > 1 ? "," : "", name.c_str(), hack::cpu_isa_name(hack::cpu_isa()), threads, batch, prompt_tokens, prefill_tps,
                      decode_tps, step_s * 1e3, weight_gb, achieved, membw, achieved / membw);
        json_out += buf;
      } else {
        std::printf(
            "threads %d batch %d: prefill %.1f tok/s (%d tokens) | decode %.2f tok/s, %.2f ms/step | weights %.2f GB/s "
            "= %.0f%% of measured read bandwidth %.2f GB/s\n",
            threads, batch, prefill_tps, prompt_tokens, decode_tps, step_s * 1e3, achieved, 100 * achieved / membw,
            membw);
      }
    }
    if (json) std::printf("%s]\n", json_out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
