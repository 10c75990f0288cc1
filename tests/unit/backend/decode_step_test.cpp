// A decode step through the CPU backend — plan, appends, attention in every layer, GEMMs,
// logits — allocates nothing once the batch shape has been seen, in any thread of the pool,
// except when the page pools take a new slab from the system (one ~4 MiB allocation per
// ~4 MiB of KV, counted apart).
#include <catch2/catch.hpp>

#include <vector>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/model/weights.h"
#include "support/alloc_counter.h"
#include "support/synthetic_model.h"

using namespace hack;

TEST_CASE("a decode step of the CPU backend allocates nothing, in any thread", "[backend][engine]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 11);
  ThreadPool pool(3);
  for (KvMode mode : {KvMode::hack, KvMode::fp}) {
    KvCacheOptions o;
    o.mode = mode;
    o.block_tokens = 16;
    CpuEngine cpu = make_cpu_engine(model, pool, o, EngineOptions{64});
    Engine& engine = *cpu.engine;
    const std::vector<int> seqs = {0, 1};
    std::vector<float> logits;
    for (int s : seqs) {
      engine.add_sequence(s, 400);
      engine.prefill(s, test::random_prompt(s == 0 ? 30 : 200, cfg.vocab_size, 5 + s), logits);
    }
    std::vector<int> next = {3, 4};
    for (int i = 0; i < 3; ++i) engine.decode(seqs, next, logits);  // sizes buffers, plan and workspace
    long allocations = 0;
    int steady_steps = 0;
    for (int i = 0; i < 60; ++i) {  // crosses block boundaries in both sequences
      const size_t pooled = cpu.kv->stats().bytes_pooled;
      const long before = test::process_allocations();
      engine.decode(seqs, next, logits);
      const long made = test::process_allocations() - before;
      if (cpu.kv->stats().bytes_pooled == pooled) {
        allocations += made;
        ++steady_steps;
      }
      next = {(next[0] * 7 + 1) % cfg.vocab_size, (next[1] * 5 + 2) % cfg.vocab_size};
    }
    INFO("kv " << kv_mode_name(mode));
    REQUIRE(steady_steps >= 55);
    REQUIRE(allocations == 0);
  }
}
