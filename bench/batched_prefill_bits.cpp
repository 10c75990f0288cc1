// Would batching short prompts into one prefill forward keep a prefill node's output exact?
// For groups of prompts, runs each prompt alone (Engine::prefill, as the prefill worker does)
// and all of them as SequenceChunks of one Backend::forward, then compares per prompt the
// last-token logits and the exported KV messages (kv_stream.h) byte for byte, and times both.
//
//   build/bin/batched_prefill_bits [model dir (models/hack-tiny)] [threads (1)]
//
// Prints, per KV mode and group: prompts whose logits / KV bytes differ, the largest logit
// difference relative to the row's largest |logit|, prompts whose greedy token differs, and the
// wall time of the prompts one at a time vs batched (the speedup batching would buy).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/kv/kv_stream.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "../tests/support/synthetic_model.h"  // test::random_prompt: the prompts the prefill tests use

using namespace hack;

namespace {

// Every KV message a prefill node would send for the sequence, concatenated.
std::vector<std::byte> exported(PagedKv& kv, int seq, int layers) {
  std::vector<std::byte> all;
  for (int l = 0; l < layers; ++l) {
    KvExportCursor cursor;
    export_layer(kv, seq, l, true, cursor,
                 [&](KvMessageKind, std::span<const std::byte> p) { all.insert(all.end(), p.begin(), p.end()); });
  }
  return all;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void run_group(const Model& model, ThreadPool& pool, KvMode mode, const std::vector<int>& lengths) {
  KvCacheOptions o;
  o.mode = mode;
  const int vocab = model.config.vocab_size, layers = model.config.num_layers;
  std::vector<std::vector<int>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(test::random_prompt(lengths[i], vocab, static_cast<uint32_t>(7 + i)));
  CpuEngine single = make_cpu_engine(model, pool, o, EngineOptions{});
  CpuEngine batched = make_cpu_engine(model, pool, o, EngineOptions{});
  // Warm both (first-touch of weights, workspaces).
  {
    std::vector<float> l;
    single.engine->add_sequence(999, 16);
    single.engine->prefill(999, std::span<const int>(prompts[0]).first(1), l);
    single.engine->remove_sequence(999);
  }
  std::vector<std::vector<float>> single_logits(prompts.size());
  const double t0 = now_s();
  for (size_t i = 0; i < prompts.size(); ++i) {
    single.engine->add_sequence(static_cast<int>(i) + 1, lengths[i]);
    single.engine->prefill(static_cast<int>(i) + 1, prompts[i], single_logits[i]);
  }
  const double t_single = now_s() - t0;
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int seq = static_cast<int>(i) + 1;
    batched.engine->add_sequence(seq, lengths[i]);
    batched.kv->begin_prefill(seq);
    chunks.push_back(SequenceChunk{seq, 0, prompts[i], false, 0});
  }
  std::vector<float> batch_logits;
  const double t1 = now_s();
  batched.backend->forward(chunks, batch_logits);
  for (size_t i = 0; i < prompts.size(); ++i) batched.kv->end_prefill(static_cast<int>(i) + 1);
  const double t_batched = now_s() - t1;
  int logits_differ = 0, kv_differ = 0, token_differ = 0;
  double max_rel = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const float* a = single_logits[i].data();
    const float* b = batch_logits.data() + i * static_cast<size_t>(vocab);
    if (std::memcmp(a, b, static_cast<size_t>(vocab) * sizeof(float)) != 0) ++logits_differ;
    float peak = 0, diff = 0;
    for (int v = 0; v < vocab; ++v) {
      peak = std::max(peak, std::fabs(a[v]));
      diff = std::max(diff, std::fabs(a[v] - b[v]));
    }
    max_rel = std::max(max_rel, static_cast<double>(diff / std::max(peak, 1e-30f)));
    if (std::max_element(a, a + vocab) - a != std::max_element(b, b + vocab) - b) ++token_differ;
    const int seq = static_cast<int>(i) + 1;
    if (exported(*single.kv, seq, layers) != exported(*batched.kv, seq, layers)) ++kv_differ;
  }
  std::printf("| %s | %zu × %d | %d | %d | %.1e | %d | %.1f | %.1f | %.2f× |\n", std::string(kv_mode_name(mode)).c_str(),
              lengths.size(), lengths[0], logits_differ, kv_differ, max_rel, token_differ, t_single * 1e3,
              t_batched * 1e3, t_single / t_batched);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "models/hack-tiny";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const Model model = Model::load(dir);
  ThreadPool pool(static_cast<size_t>(threads));
  std::printf("batched_prefill_bits: %s, %d thread(s), cpu isa %s\n", dir.c_str(), threads, cpu_isa_name(cpu_isa()));
  std::printf("| kv | prompts × tokens | logits differ | KV bytes differ | max |Δlogit|/max|logit| | greedy token differs | one at a time ms | batched ms | speedup |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    for (int len : {5, 9, 20, 64, 128}) run_group(model, pool, mode, std::vector<int>(16, len));
    run_group(model, pool, mode, std::vector<int>(4, 128));
  }
  return 0;
}
