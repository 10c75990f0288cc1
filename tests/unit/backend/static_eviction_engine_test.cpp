// Static eviction through the engine (kv/static_eviction.h, EngineOptions::keep): γ = 1 is
// no eviction bit for bit; with γ < 1 the KV holds the budget, the kept tokens are the
// prompt's own rows (their RoPE untouched, in order, sinks and the recent window among
// them), new tokens take positions after the whole prompt (checked on layer 0, whose K
// depends only on the token and its position), and the disaggregated path — export after
// the last chunk, import, adopt at the prompt's length — equals one engine bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_stream.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"

using namespace hack;

namespace {

constexpr int kChunk = 64, kSteps = 8;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int argmax(const std::vector<float>& logits, size_t vocab) {
  return static_cast<int>(std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(vocab)) -
                          logits.begin());
}

KvCacheOptions cache_options(KvMode mode) { return test::synthetic_kv_options(mode, 16); }

struct Run {
  std::unique_ptr<CpuPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::vector<std::vector<float>> logits;  // prefill's last row, then each decode step
};

// Prefill `prompt` into sequence 1, then kSteps greedy decode steps.
Run run(const Model& model, ThreadPool& pool, const KvCacheOptions& o, const KeepOptions& keep,
        const std::vector<int>& prompt, bool decode = true) {
  Run r;
  r.kv = std::make_unique<CpuPagedKvCache>(kv_shape(model.config), o);
  r.backend = make_cpu_backend(model, pool, *r.kv);
  r.engine = std::make_unique<Engine>(*r.backend, EngineOptions{kChunk, keep}, &pool);
  r.engine->add_sequence(1, static_cast<int>(prompt.size()) + kSteps);
  std::vector<float> logits;
  r.engine->prefill(1, prompt, logits);
  r.logits.push_back(logits);
  const size_t vocab = static_cast<size_t>(model.config.vocab_size);
  for (int i = 0; decode && i < kSteps; ++i) {
    const int id = 1, token = argmax(logits, vocab);
    r.engine->decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), logits);
    r.logits.push_back(logits);
  }
  return r;
}

std::vector<float> rows(const CpuPagedKvCache& kv, int layer, int first, int n, bool keys) {
  const KvShape& s = kv.shape();
  std::vector<float> k(static_cast<size_t>(n) * s.num_kv_heads * s.head_dim), v(k.size());
  kv.read_exact_tokens(1, layer, first, n, k.data(), v.data());
  return keys ? k : v;
}

}  // namespace

TEST_CASE("static eviction: ratio 1 equals no eviction bit for bit", "[backend][engine][evict]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 31);
  ThreadPool pool(2);
  const std::vector<int> prompt = test::random_prompt(200, cfg.vocab_size, 4);
  KeepOptions keep;
  keep.ratio = 1;
  for (const KvMode mode : {KvMode::hack, KvMode::fp}) {
    INFO(kv_mode_name(mode));
    const Run plain = run(model, pool, cache_options(mode), {}, prompt);
    const Run kept = run(model, pool, cache_options(mode), keep, prompt);
    REQUIRE(kept.kv->length(1, 0) == 200 + kSteps);
    for (size_t i = 0; i < plain.logits.size(); ++i) REQUIRE(same_bits(plain.logits[i], kept.logits[i]));
  }
}

TEST_CASE("static eviction: kept tokens are the prompt's rows, new tokens follow the whole prompt",
          "[backend][engine][evict]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 32);
  ThreadPool pool(2);
  const int n = 300;
  const std::vector<int> prompt = test::random_prompt(n, cfg.vocab_size, 8);
  const size_t token_floats = static_cast<size_t>(cfg.num_kv_heads) * static_cast<size_t>(cfg.head_dim);
  for (const KeepScope scope : {KeepScope::layer, KeepScope::model}) {
    KeepOptions keep;
    keep.ratio = 0.2f;  // 60 tokens: 4 sinks, 16 recent, 40 by score
    keep.recent = 16;
    keep.sinks = 4;
    keep.scope = scope;
    INFO("scope " << keep_scope_name(scope));
    // Exact caches (fp f32) so the plain run's rows are the ones the eviction chose among.
    Run plain = run(model, pool, cache_options(KvMode::fp), {}, prompt, false);
    Run ev = run(model, pool, cache_options(KvMode::fp), keep, prompt, false);
    REQUIRE(ev.engine->position(1) == n);
    std::vector<std::vector<int>> kept_at(static_cast<size_t>(cfg.num_layers));
    for (int l = 0; l < cfg.num_layers; ++l) {
      INFO("layer " << l);
      REQUIRE(ev.kv->length(1, l) == 60);
      const std::vector<float> all = rows(*plain.kv, l, 0, n, true), kept = rows(*ev.kv, l, 0, 60, true);
      // Each kept row is a prompt row, in order (a row matched once, by its bits).
      int from = 0;
      for (int i = 0; i < 60; ++i) {
        int j = from;
        while (j < n && std::memcmp(&kept[static_cast<size_t>(i) * token_floats], &all[static_cast<size_t>(j) * token_floats],
                                    token_floats * sizeof(float)) != 0)
          ++j;
        REQUIRE(j < n);
        kept_at[static_cast<size_t>(l)].push_back(j);
        from = j + 1;
      }
      const std::vector<int>& at = kept_at[static_cast<size_t>(l)];
      for (int i = 0; i < 4; ++i) CHECK(at[static_cast<size_t>(i)] == i);
      for (int i = 0; i < 16; ++i) CHECK(at[static_cast<size_t>(60 - 16 + i)] == n - 16 + i);
    }
    if (scope == KeepScope::model) {
      for (int l = 1; l < cfg.num_layers; ++l) CHECK(kept_at[static_cast<size_t>(l)] == kept_at[0]);
    }
    // The prefill's logits are the plain ones (eviction only changes what later tokens see).
    REQUIRE(same_bits(plain.logits[0], ev.logits[0]));

    // One decode step: the new token's layer-0 K (RoPE at position n) is the plain run's at n.
    Run& e = ev;
    Run& p = plain;
    const int id = 1, token = 77;
    std::vector<float> la, lb;
    p.engine->decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), la);
    e.engine->decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), lb);
    REQUIRE(e.engine->position(1) == n + 1);
    REQUIRE(e.kv->length(1, 0) == 61);
    CHECK(rows(*e.kv, 0, 60, 1, true) == rows(*p.kv, 0, n, 1, true));
    CHECK(rows(*e.kv, 0, 60, 1, true) != rows(*p.kv, 0, 60, 1, true));  // position 60 would differ
    CHECK(!same_bits(la, lb));  // and the pruned context does change the step
  }
}

TEST_CASE("static eviction: prefill node → decode node equals one engine bit for bit", "[backend][engine][evict]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 33);
  ThreadPool pool(2);
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  KeepOptions keep;
  keep.ratio = 0.3f;
  keep.recent = 8;
  keep.sinks = 4;
  for (const KvMode mode : {KvMode::hack, KvMode::fp}) {
    for (const int n : {37, 150, 333}) {
      INFO(kv_mode_name(mode) << ", prompt " << n);
      const KvCacheOptions o = cache_options(mode);
      const std::vector<int> prompt = test::random_prompt(n, cfg.vocab_size, static_cast<uint32_t>(n));
      const Run ref = run(model, pool, o, keep, prompt);

      CpuPagedKvCache prefill_kv(kv_shape(cfg), o), decode_kv(kv_shape(cfg), o);
      const auto prefill_backend = make_cpu_backend(model, pool, prefill_kv);
      Engine prefill(*prefill_backend, EngineOptions{kChunk, keep}, &pool);
      REQUIRE(prefill.evicts(n));
      prefill.add_sequence(1, n);
      decode_kv.add_sequence(1, n + kSteps);
      KvExportCursor cursor;  // prompt_tokens 0: nothing streams before the prompt is pruned
      std::vector<float> first;
      int before = 0;
      prefill.prefill(
          1, prompt, first, false,
          [&](int layer, bool last_chunk) {
            if (!last_chunk) return;
            export_layer(prefill_kv, 1, layer, true, cursor, [&](KvMessageKind kind, std::span<const std::byte> m) {
              import_message(decode_kv, 1, layer, kind, m);
            });
          },
          [&](int layer) {
            CHECK(prefill_kv.length(1, layer) == n);  // the whole prompt, before it is pruned
            ++before;
          });
      CHECK(before == cfg.num_layers);
      REQUIRE(same_bits(first, ref.logits[0]));
      const auto decode_backend = make_cpu_backend(model, pool, decode_kv);
      Engine decode(*decode_backend, EngineOptions{kChunk}, &pool);  // no keep flags of its own
      decode.adopt_sequence(1, n);
      REQUIRE(decode.position(1) == n);
      REQUIRE(decode_kv.length(1, 0) == keep.budget(n));
      std::vector<float> logits = first;
      for (int i = 0; i < kSteps; ++i) {
        INFO("step " << i);
        const int id = 1, token = argmax(logits, vocab);
        decode.decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), logits);
        REQUIRE(same_bits(logits, ref.logits[static_cast<size_t>(i) + 1]));
      }
    }
  }
}

TEST_CASE("static eviction is refused where it cannot run", "[backend][engine][evict]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 34);
  ThreadPool pool(1);
  CpuPagedKvCache kv(kv_shape(cfg), cache_options(KvMode::hack));
  const auto backend = make_cpu_backend(model, pool, kv);
  KeepOptions keep;
  keep.ratio = 2;
  REQUIRE_THROWS_WITH(Engine(*backend, EngineOptions{kChunk, keep}), Catch::Contains("--kv-keep-ratio"));
}
