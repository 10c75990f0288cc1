// Engine::prefill_batch: several short prompts in one forward give each prompt the logits and
// KV one prefill() per prompt gives, within rounding (the batch's GEMMs have other shapes), in
// fp and HACK caches, for fresh sequences and ones that continue a restored prefix; decode
// continues from a batched prefill; and a batch that breaks the rules is refused before
// anything runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/paged_kv_cache.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"
#include "support/test_support.h"

using namespace hack;

namespace {

constexpr int kChunk = 128;

KvCacheOptions cache_options(KvMode mode) { return test::synthetic_kv_options(mode, 16); }

// max |a − b| over max |a|: what the batch's other summation order moves.
double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("a batched prefill step gives each prompt one prefill's logits and KV, within rounding",
          "[backend][engine]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(2);
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  // Fresh prompts of mixed lengths (under a block, over several), and one that continues a
  // prefix already in its sequence (as a prefix-cache hit restores it).
  const std::vector<std::vector<int>> prompts = {test::random_prompt(5, cfg.vocab_size, 1),
                                                 test::random_prompt(40, cfg.vocab_size, 2),
                                                 test::random_prompt(1, cfg.vocab_size, 3),
                                                 test::random_prompt(70, cfg.vocab_size, 4)};
  constexpr int kPrefix = 37;  // of prompt 3, run before the batch
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    CpuEngine single = make_cpu_engine(model, pool, cache_options(mode), EngineOptions{kChunk});
    CpuEngine batched = make_cpu_engine(model, pool, cache_options(mode), EngineOptions{kChunk});
    std::vector<std::vector<float>> expected(prompts.size());
    std::vector<Engine::PrefillItem> items;
    std::vector<float> ignored;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int seq = static_cast<int>(i) + 1;
      const std::span<const int> p(prompts[i]);
      single.engine->add_sequence(seq, 200);
      single.engine->prefill(seq, p, expected[i]);
      batched.engine->add_sequence(seq, 200);
      std::span<const int> rest = p;
      if (i == 3) {
        // Inside the prefill bracket, as a restore leaves it: the prefix stays exact.
        const Engine::PrefillPiece piece{seq, p.first(kPrefix), /*first=*/true, /*last=*/false};
        batched.engine->step({}, {}, &piece, ignored);
        rest = p.subspan(kPrefix);
      }
      items.push_back(Engine::PrefillItem{seq, rest});
    }
    std::vector<int> layers_seen;
    std::vector<float> logits;
    batched.engine->prefill_batch(items, logits, [&](int layer) {
      // Every prompt's KV of the layer is there when it is reported.
      for (size_t i = 0; i < prompts.size(); ++i)
        CHECK(batched.kv->length(static_cast<int>(i) + 1, layer) == static_cast<int>(prompts[i].size()));
      layers_seen.push_back(layer);
    });
    CHECK(layers_seen.size() == static_cast<size_t>(cfg.num_layers));
    REQUIRE(logits.size() == prompts.size() * vocab);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("prompt " << i << " of " << prompts[i].size() << " tokens");
      const int seq = static_cast<int>(i) + 1;
      const std::span<const float> row = std::span<const float>(logits).subspan(i * vocab, vocab);
      CHECK(relative_error(expected[i], row) < 1e-4);
      CHECK(batched.engine->position(seq) == static_cast<int>(prompts[i].size()));
      CHECK_FALSE(batched.kv->blocks().prefilling(seq));
      const int n = static_cast<int>(prompts[i].size());
      for (int l = 0; l < cfg.num_layers; ++l) {
        // The bracket closed what a single prefill closes: the same blocks in every layer.
        const int closed = batched.kv->blocks().closed_blocks(seq, l);
        CHECK(closed == single.kv->blocks().closed_blocks(seq, l));
        // The tokens still exact (fp: all; HACK: the sinks and the tokens after the closed
        // blocks) are the single prefill's within rounding.
        const KvCacheOptions& o = batched.kv->options();
        const int sinks = mode == KvMode::hack ? std::min(o.sinks, n) : n;
        const int after = mode == KvMode::hack ? std::min(n, o.sinks + closed * o.block_tokens) : n;
        for (auto [from, count] : {std::pair{0, sinks}, std::pair{after, n - after}}) {
          if (count == 0) continue;
          std::vector<float> ka(static_cast<size_t>(count) * static_cast<size_t>(cfg.kv_dim())), kb(ka.size());
          std::vector<float> va(ka.size()), vb(ka.size());
          single.kv->read_exact_tokens(seq, l, from, count, ka.data(), va.data());
          batched.kv->read_exact_tokens(seq, l, from, count, kb.data(), vb.data());
          CHECK(relative_error(ka, kb) < 1e-4);
          CHECK(relative_error(va, vb) < 1e-4);
        }
      }
    }
    // Decode goes on from the batched prefill as from single ones.
    std::vector<int> seqs, next;
    for (size_t i = 0; i < prompts.size(); ++i) {
      seqs.push_back(static_cast<int>(i) + 1);
      next.push_back(static_cast<int>((i * 17 + 3) % vocab));
    }
    std::vector<float> a, b;
    single.engine->decode(seqs, next, a);
    batched.engine->decode(seqs, next, b);
    CHECK(relative_error(a, b) < 1e-4);
  }
}

TEST_CASE("a batched prefill step that breaks the rules is refused before it runs", "[backend][engine]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(1);
  CpuEngine e = make_cpu_engine(model, pool, cache_options(KvMode::hack), EngineOptions{kChunk});
  const std::vector<int> a = test::random_prompt(100, cfg.vocab_size, 1), b = test::random_prompt(40, cfg.vocab_size, 2);
  e.engine->add_sequence(1, 200);
  e.engine->add_sequence(2, 200);
  std::vector<float> logits;
  const auto refused = [&](std::vector<Engine::PrefillItem> items, const char* why) {
    CHECK_THROWS_WITH(e.engine->prefill_batch(items, logits), Catch::Contains(why));
    // Nothing ran: both sequences are still empty and may prefill.
    CHECK(e.kv->length(1, 0) == 0);
    CHECK(e.kv->length(2, 0) == 0);
    CHECK(e.engine->position(1) == 0);
  };
  refused({}, "no prompts");
  refused({{1, a}, {2, b}}, "more than one chunk of 128");
  refused({{1, b}, {1, b}}, "appears twice");
  refused({{1, b}, {2, {}}}, "empty prompt");
  refused({{1, b}, {9, b}}, "unknown sequence 9");
  e.engine->prefill_batch(std::vector<Engine::PrefillItem>{{1, a}, {2, std::span<const int>(b).first(28)}}, logits);
  CHECK(logits.size() == 2 * static_cast<size_t>(cfg.vocab_size));
  CHECK(e.engine->position(2) == 28);
}
