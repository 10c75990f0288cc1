// The per-layer bit search of hack-calibrate --hack, on a small synthetic model: it stays
// within the byte budget, ranks layers by the KL they save, raises the fewest layers that
// meet a KL target, and its scores are the decode path's against the fp32 cache.
#include <catch2/catch.hpp>

#include "hack/calibrate/hack_bits.h"
#include "hack/core/thread_pool.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"

using namespace hack;

TEST_CASE("the HACK bit search raises the layers that matter within the budget", "[calibrate]") {
  ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(2);
  std::vector<std::vector<int>> windows = {test::random_prompt(80, cfg.vocab_size, 1),
                                           test::random_prompt(80, cfg.vocab_size, 2)};
  const DecodePathReference reference(model, pool, windows, 64, 32);
  const KvShape shape = kv_shape(cfg);
  KvCacheOptions options;
  options.block_tokens = 16;

  // The fp32 cache scores as the reference itself; 8-bit is closer than 2-bit.
  KvCacheOptions fp;
  fp.mode = KvMode::fp;
  fp.fp_dtype = DType::f32;
  REQUIRE(reference.score(fp).mean_kl == Approx(0).margin(1e-9));
  REQUIRE(reference.score(fp).top1 == 1.0);
  KvCacheOptions k8 = options, k2 = options;
  k8.k_bits = k8.v_bits = 8;
  const double kl8 = reference.score(k8).mean_kl, kl2 = reference.score(k2).mean_kl;
  REQUIRE(kl2 > 0);
  REQUIRE(kl8 < kl2);

  std::vector<std::string> lines;
  auto log = [&](const std::string& s) { lines.push_back(s); };
  HackBitsSearch search;
  search.base = {2, 2};
  search.upgrade = {8, 8};
  const double bf16 = bf16_kv_bytes_per_token(shape);
  KvCacheOptions all_up = options;
  all_up.k_bits = all_up.v_bits = 8;
  KvCacheOptions one_up = options;
  one_up.layer_bits.assign(3, {2, 2});
  one_up.layer_bits[0] = {8, 8};
  // A budget that admits exactly one raised layer.
  search.max_bytes_fraction = (kv_bytes_per_token(shape, one_up) + 1) / bf16;
  const HackBitsResult r = search_hack_bits(reference, shape, options, search, log);
  REQUIRE(r.upgraded == 1);
  REQUIRE(r.bytes_fraction <= search.max_bytes_fraction);
  REQUIRE(r.layers[static_cast<size_t>(r.ranking[0])] == HackLayerBits{8, 8});
  for (size_t i = 1; i < r.ranking.size(); ++i)
    REQUIRE(r.layer_gain_kl[static_cast<size_t>(r.ranking[i - 1])] >= r.layer_gain_kl[static_cast<size_t>(r.ranking[i])]);
  REQUIRE(r.base_score.mean_kl == Approx(kl2));
  REQUIRE(r.final_score.mean_kl < r.base_score.mean_kl);
  REQUIRE(lines.size() == static_cast<size_t>(r.measurements));

  SECTION("a KL target the base already meets raises nothing") {
    search.max_bytes_fraction = kv_bytes_per_token(shape, all_up) / bf16;
    search.max_kl = kl2 * 2;
    REQUIRE(search_hack_bits(reference, shape, options, search, log).upgraded == 0);
  }
  SECTION("a KL target between base and all-raised raises some but not all") {
    search.max_bytes_fraction = kv_bytes_per_token(shape, all_up) / bf16 + 1e-9;
    search.max_kl = (kl2 + kl8) / 2;
    const HackBitsResult t = search_hack_bits(reference, shape, options, search, log);
    REQUIRE(t.final_score.mean_kl <= search.max_kl);
    REQUIRE(t.upgraded >= 1);
  }
  SECTION("a base over the budget is refused") {
    search.max_bytes_fraction = 0.01;
    REQUIRE_THROWS_WITH(search_hack_bits(reference, shape, options, search, log), Catch::Contains("budget"));
  }
}
