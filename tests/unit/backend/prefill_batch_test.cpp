// Engine::prefill_batch: several short prompts in one forward give each prompt the logits and
// KV one prefill() per prompt gives, within rounding (the batch's GEMMs have other shapes), in
// fp and HACK caches, for fresh sequences and ones that continue a restored prefix; decode
// continues from a batched prefill; and a batch that breaks the rules is refused before
// anything runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"
#include "support/test_support.h"

using namespace hack;

namespace {

constexpr int kChunk = 128;

// What fp32 rounding alone moves, relative to the largest value: the batch's GEMMs have M = the
// batch's rows instead of one prompt's, so BLAS picks other kernels and blockings and sums the
// same products in another order (each output moves by a few ulps of its partial sums). With
// fp KV (f32 pages, nothing rounded to a coarser format) the logits, K and V moved at most
// 6.6e-7 under every OpenBLAS core type and ISA tier (issue 50, bench/RESULTS.md): 1e-4 is
// ~150x that.
constexpr double kRounding = 1e-4;

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

// One bf16 ulp at |x| (the spacing of bf16 values in x's binade).
double bf16_ulp(float x) {
  const uint32_t exponent = (std::bit_cast<uint32_t>(x) >> 23) & 0xffu;
  return std::ldexp(1.0, static_cast<int>(exponent) - 127 - 7);
}

// Elements of two bf16-stored copies farther apart than one bf16 ulp (of the larger) plus
// `slack` (relative to the largest value): a value that rounding puts on the other side of a
// bf16 rounding boundary is stored one ulp away, never more.
size_t beyond_one_ulp(std::span<const float> a, std::span<const float> b, double slack) {
  double scale = 0;
  for (float x : a) scale = std::max(scale, std::fabs(double(x)));
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float big = std::fabs(a[i]) > std::fabs(b[i]) ? a[i] : b[i];
    if (std::fabs(double(a[i]) - double(b[i])) > bf16_ulp(big) + slack * scale) ++n;
  }
  return n;
}

// One prompt's results from an engine: logits, and per layer the K and V of the tokens its
// cache still holds exactly in both modes (the sinks and the tokens after the HACK-closed
// blocks), [token][kv_dim] each.
struct PromptResult {
  std::vector<float> logits;
  std::vector<std::vector<float>> k, v;  // [layer]
};

}  // namespace

TEST_CASE("a batched prefill step gives each prompt one prefill's logits and KV, within rounding",
          "[backend][engine]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(2);
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  const size_t kv_dim = static_cast<size_t>(cfg.kv_dim());
  // Fresh prompts of mixed lengths (under a block, over several), and one that continues a
  // prefix already in its sequence (as a prefix-cache hit restores it).
  const std::vector<std::vector<int>> prompts = {test::random_prompt(5, cfg.vocab_size, 1),
                                                 test::random_prompt(40, cfg.vocab_size, 2),
                                                 test::random_prompt(1, cfg.vocab_size, 3),
                                                 test::random_prompt(70, cfg.vocab_size, 4)};
  constexpr int kPrefix = 37;  // of prompt 3, run before the batch
  // fp KV (f32 pages) from single prefills: every token's K and V, and the decode step's logits.
  // With HACK KV the exact tokens are stored in bf16, and a value that the batch's rounding
  // moves across a bf16 rounding boundary is stored one bf16 ulp (2^-8 of it) away — not a
  // rounding difference, and everything after it (later layers, logits) moves by what that
  // flip does. How far storing in bf16 moves the results at all (HACK single against fp
  // single: every stored value off by up to half an ulp) is the scale that the few flipped
  // values of the batch stay under; the bounds below are derived from it.
  std::vector<PromptResult> fp_single(prompts.size());
  std::vector<float> fp_decode;
  for (KvMode mode : {KvMode::fp, KvMode::hack}) {
    INFO("kv " << kv_mode_name(mode));
    const bool hack = mode == KvMode::hack;
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
      CHECK(batched.engine->position(seq) == static_cast<int>(prompts[i].size()));
      CHECK_FALSE(batched.kv->blocks().prefilling(seq));
      const int n = static_cast<int>(prompts[i].size());
      PromptResult a{expected[i], {}, {}}, b{{row.begin(), row.end()}, {}, {}};
      for (int l = 0; l < cfg.num_layers; ++l) {
        // The bracket closed what a single prefill closes: the same blocks in every layer.
        const int closed = batched.kv->blocks().closed_blocks(seq, l);
        CHECK(closed == single.kv->blocks().closed_blocks(seq, l));
        // The tokens still exact (fp: all; HACK: the sinks and the tokens after the closed
        // blocks), and the same tokens of the fp single prefill.
        const KvCacheOptions& o = batched.kv->options();
        const int sinks = hack ? std::min(o.sinks, n) : n;
        const int after = hack ? std::min(n, o.sinks + closed * o.block_tokens) : n;
        std::vector<float> fk, fv;
        for (PromptResult* r : {&a, &b}) r->k.emplace_back(), r->v.emplace_back();
        for (auto [from, count] : {std::pair{0, sinks}, std::pair{after, n - after}}) {
          if (count == 0) continue;
          const size_t size = static_cast<size_t>(count) * kv_dim;
          for (auto [engine, r] : {std::pair{&single, &a}, std::pair{&batched, &b}}) {
            std::vector<float> k(size), v(size);
            engine->kv->read_exact_tokens(seq, l, from, count, k.data(), v.data());
            r->k.back().insert(r->k.back().end(), k.begin(), k.end());
            r->v.back().insert(r->v.back().end(), v.begin(), v.end());
          }
          if (hack) {
            const auto& fp = fp_single[i];
            const auto first = static_cast<std::ptrdiff_t>(static_cast<size_t>(from) * kv_dim);
            const auto last = first + static_cast<std::ptrdiff_t>(size);
            fk.insert(fk.end(), fp.k[l].begin() + first, fp.k[l].begin() + last);
            fv.insert(fv.end(), fp.v[l].begin() + first, fp.v[l].begin() + last);
          }
        }
        INFO("layer " << l);
        if (!hack) {
          CHECK(relative_error(a.k[l], b.k[l]) < kRounding);
          CHECK(relative_error(a.v[l], b.v[l]) < kRounding);
        } else if (!a.k[l].empty()) {
          // Each stored value is the single prefill's within rounding, or one bf16 ulp away.
          CHECK(beyond_one_ulp(a.k[l], b.k[l], kRounding) == 0);
          CHECK(beyond_one_ulp(a.v[l], b.v[l], kRounding) == 0);
        }
      }
      if (!hack) {
        CHECK(relative_error(a.logits, b.logits) < kRounding);
        fp_single[i] = std::move(a);
      } else {
        // The batch's few flipped values move the logits less than storing every value in bf16.
        const double bf16_storage = relative_error(fp_single[i].logits, a.logits);
        const double batch = relative_error(a.logits, b.logits);
        CHECK(batch < std::max(kRounding, bf16_storage));
      }
    }
    // Decode goes on from the batched prefill as from single ones.
    std::vector<int> seqs, next;
    for (size_t i = 0; i < prompts.size(); ++i) {
      seqs.push_back(static_cast<int>(i) + 1);
      next.push_back(static_cast<int>((i * 17 + 3) % vocab));
    }
    std::vector<float> da, db;
    single.engine->decode(seqs, next, da);
    batched.engine->decode(seqs, next, db);
    if (!hack) {
      CHECK(relative_error(da, db) < kRounding);
      fp_decode = da;
    } else {
      // Decode attends to the closed blocks' HACK codes: a code the flips move is one step
      // away; quantizing every value moves the logits more (HACK single against fp single).
      const double quantization = relative_error(fp_decode, da);
      const double batch = relative_error(da, db);
      CHECK(batch < std::max(kRounding, quantization));
    }
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
