// bench/recompute_itl: what a long recompute costs the streams a decode node is running
// (issue 35: p99 inter-token latency of 8 streams while a 2K-token recompute is admitted ≤ 2×
// their median).
//   recompute_itl --model DIR [--streams 8] [--long-prompt 2048] [--chunks 0,16] [--budget adaptive|fixed]
// The decode scheduler's engine thread runs one forward per step; a running stream's
// inter-token gap is the time of the steps between its tokens. This drives the same Engine
// calls the scheduler makes (DecodeScheduler::step): `streams` sequences decode one token per
// step while a `long-prompt`-token sequence is recomputed, either all at once before the next
// step (chunk 0: Engine::prefill, the old admit_one) or in pieces of at most `chunk` tokens inside
// the steps (Engine::step with a PrefillPiece), sized by RecomputeBudget as the scheduler sizes
// them (--budget adaptive) or all `chunk` tokens (--budget fixed). Reported: the streams' gap without a recompute
// (median of plain decode steps), and over the recompute the median, p99 and max gap and the
// time until the recompute is done.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "hack/backend/cpu_engine.h"
#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/decode/recompute_budget.h"
#include "hack/kv/kv_flags.h"
#include "hack/model/weights.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, chunks_flag = "0,16", budget = "fixed";
  int streams = 8, long_prompt = 2048, threads = 0, plain_steps = 16;
  hack::FlagSet flags("recompute_itl", "Running streams' inter-token gaps while a long sequence is recomputed.",
                      "HACK_RECOMPUTE_ITL");
  flags.add_string("model", &model_dir, "Hugging Face model directory");
  flags.add_int("streams", &streams, "sequences decoding meanwhile");
  flags.add_int("long-prompt", &long_prompt, "tokens of the sequence being recomputed");
  flags.add_string("chunks", &chunks_flag, "recompute chunk sizes to compare (0 = all at once, the old behaviour)");
  flags.add_int("threads", &threads, "compute threads; 0 = all cores");
  flags.add_int("plain-steps", &plain_steps, "decode steps without a recompute, for the baseline gap");
  hack::KvFlags kv_flags;  // the nodes' KV flags and defaults: the model's hack_kv.json, else K4/V4
  hack::add_kv_flags(flags, kv_flags);
  flags.add_string("budget", &budget,
                   "adaptive (pieces of at most `chunk` tokens, sized by RecomputeBudget as the decode scheduler "
                   "does) or fixed (every piece `chunk` tokens)");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(!model_dir.empty(), "--model is required");
    const hack::Model model = hack::Model::load(model_dir);
    hack::ThreadPool pool(threads);
    const int vocab = model.config.vocab_size;
    std::printf("model %s, %d threads, kernels %s; %d streams, recompute of %d tokens\n", model_dir.c_str(),
                pool.size(), hack::cpu_isa_name(hack::cpu_isa()), streams, long_prompt);
    // What hack-decode builds from the same flags: with the defaults, the model's calibrated
    // allocation (hack_kv.json, with its recent window) or K4/V4.
    const hack::KvCacheOptions ko = hack::kv_options_from(kv_flags, model_dir, model.config.num_layers);
    std::printf("kv %s: %s\n", kv_flags.kv.c_str(), hack::describe(ko).c_str());
    std::vector<int> longp;
    for (int i = 0; i < long_prompt; ++i) longp.push_back((i * 131 + 17) % vocab);
    for (const int chunk : hack::parse_int_list(chunks_flag, "chunks")) {
      hack::CpuEngine e = hack::make_cpu_engine(model, pool, ko);
      std::vector<int> ids, tokens;
      std::vector<float> logits;
      for (int s = 1; s <= streams; ++s) {
        std::vector<int> prompt;
        for (int i = 0; i < 32; ++i) prompt.push_back((s * 7919 + i * 31) % vocab);
        e.engine->add_sequence(s, 32 + 4096);
        e.engine->prefill(s, prompt, logits);
        ids.push_back(s);
        tokens.push_back(s % vocab);
      }
      HACK_CHECK(budget == "adaptive" || budget == "fixed", "--budget must be adaptive or fixed, got '{}'", budget);
      hack::server::RecomputeBudget pieces(std::max(chunk, 1));
      std::vector<double> plain;
      for (int i = 0; i < plain_steps; ++i) {
        const auto t0 = Clock::now();
        e.engine->step(ids, tokens, nullptr, logits);
        plain.push_back(ms_since(t0));
        pieces.record(plain.back() / 1000, 0, streams);
      }
      const int long_seq = streams + 1;
      e.engine->add_sequence(long_seq, long_prompt + 64);
      std::vector<double> gaps;  // the streams' gaps from the recompute's start to its end
      const auto t_start = Clock::now();
      if (chunk == 0) {
        // admit_one ran it before the next step: that step's gap holds both.
        const auto t0 = Clock::now();
        e.engine->prefill(long_seq, longp, logits);
        e.engine->step(ids, tokens, nullptr, logits);
        gaps.push_back(ms_since(t0));
      } else {
        for (size_t done = 0; done < longp.size();) {
          const int want = budget == "adaptive" ? pieces.next_piece(streams) : chunk;
          const size_t n = std::min(longp.size() - done, static_cast<size_t>(want));
          const hack::Engine::PrefillPiece piece{long_seq, std::span<const int>(longp).subspan(done, n), done == 0,
                                                 done + n == longp.size()};
          const auto t0 = Clock::now();
          e.engine->step(ids, tokens, &piece, logits);
          gaps.push_back(ms_since(t0));
          pieces.record(gaps.back() / 1000, static_cast<int>(n), streams);
          done += n;
        }
      }
      const double total = ms_since(t_start);
      const double median = quantile(plain, 0.5);
      const auto worst = std::max_element(gaps.begin(), gaps.end());
      const double gap_median = quantile(gaps, 0.5), gap_p99 = quantile(gaps, 0.99);
      std::printf("%s chunk %4d: plain step %.1f ms | over the recompute (%zu steps, %.2f s): gap median %.1f, p99 %.1f, "
                  "max %.1f ms (step %td); p99 / gap median %.2f, p99 / plain median %.2f\n",
                  chunk == 0 ? "all at once" : budget.c_str(), chunk, median, gaps.size(), total / 1000, gap_median,
                  gap_p99, *worst, worst - gaps.begin() + 1, gap_p99 / gap_median, gap_p99 / median);
      // The five largest gaps and their steps: a spike at the last step is the bracket's close.
      std::vector<size_t> order(gaps.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      const size_t top = std::min<size_t>(5, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                        [&](size_t a, size_t b) { return gaps[a] > gaps[b]; });
      std::printf("  largest gaps:");
      for (size_t i = 0; i < top; ++i) std::printf(" %.1f ms (step %zu)", gaps[order[i]], order[i] + 1);
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recompute_itl: %s\n", e.what());
    return 1;
  }
  return 0;
}
