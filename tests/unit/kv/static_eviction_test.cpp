// MPCache static eviction (kv/static_eviction.h): the kept set (sinks, recent window, the
// best-scored tokens within the budget), the attention scores against a double-precision
// reference and with a planted key, and CpuPagedKvCache::keep_tokens (keeping everything
// changes no bit; a subset is gathered in order and quantized afterwards like any prefill).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstring>
#include <random>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/kv/static_eviction.h"

using namespace hack;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The definition, in double: Σ over rows and query heads of softmax_j≤pos(q·k_j / √d).
std::vector<double> reference_scores(const std::vector<float>& q, int rows, int first_pos, const std::vector<float>& k,
                                     int n_keys, int heads, int kv_heads, int hd) {
  std::vector<double> s(static_cast<size_t>(n_keys), 0.0);
  const int group = heads / kv_heads;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const int visible = first_pos + r + 1;
      std::vector<double> logit(static_cast<size_t>(visible));
      double m = -1e300;
      for (int j = 0; j < visible; ++j) {
        double dot = 0;
        for (int c = 0; c < hd; ++c)
          dot += static_cast<double>(q[(static_cast<size_t>(r) * heads + h) * hd + c]) *
                 k[(static_cast<size_t>(j) * kv_heads + h / group) * hd + c];
        logit[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
        m = std::max(m, logit[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& x : logit) sum += (x = std::exp(x - m));
      for (int j = 0; j < visible; ++j) s[static_cast<size_t>(j)] += logit[static_cast<size_t>(j)] / sum;
    }
  }
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("static eviction keeps the sinks, the recent window and the best-scored tokens", "[kv][evict]") {
  KeepOptions o;
  o.sinks = 4;
  o.recent = 8;
  o.ratio = 0.25f;
  std::vector<float> scores(100, 0.0f);
  for (int i = 0; i < 100; ++i) scores[static_cast<size_t>(i)] = static_cast<float>(i % 7);  // ties everywhere
  scores[50] = 100;  // planted
  scores[2] = 0;     // a sink scoring nothing is kept anyway
  const std::vector<int> kept = select_kept_tokens(scores, o);
  REQUIRE(static_cast<int>(kept.size()) == o.budget(100));
  REQUIRE(kept.size() == 25);
  REQUIRE(std::is_sorted(kept.begin(), kept.end()));
  for (int i : {0, 1, 2, 3, 50, 92, 99}) CHECK(std::find(kept.begin(), kept.end(), i) != kept.end());
  // The rest (25 − 4 − 8 = 13): the planted one, then score 6 (i % 7 == 6) from the earliest.
  std::vector<int> top;
  for (int i : kept)
    if (i >= 4 && i < 92 && i != 50) top.push_back(i);
  REQUIRE(top.size() == 12);
  for (size_t t = 0; t < top.size(); ++t) CHECK(top[t] == 6 + 7 * static_cast<int>(t));

  SECTION("a budget below sinks + recent keeps just them") {
    o.ratio = 0.01f;
    CHECK(select_kept_tokens(scores, o).size() == 12);
  }
  SECTION("ratio 1, a token budget above the prompt, or off keeps everything") {
    o.ratio = 1;
    CHECK(select_kept_tokens(scores, o).size() == 100);
    o.ratio = 0;
    o.tokens = 500;
    CHECK(o.budget(100) == 100);
    o.tokens = 0;
    CHECK(!o.enabled());
    CHECK(o.budget(100) == 100);
  }
  SECTION("short prompts: sinks and window overlap") {
    const std::vector<float> few(6, 1.0f);
    o.ratio = 0.5f;
    CHECK(select_kept_tokens(few, o).size() == 6);
  }
  SECTION("bad options are refused naming the flag") {
    KeepOptions bad;
    bad.ratio = 1.5f;
    REQUIRE_THROWS_WITH(validate(bad), Catch::Contains("--kv-keep-ratio"));
    bad.ratio = 0.5f;
    bad.tokens = 10;
    REQUIRE_THROWS_WITH(validate(bad), Catch::Contains("not both"));
    bad.tokens = 0;
    bad.window = 0;
    REQUIRE_THROWS_WITH(validate(bad), Catch::Contains("--kv-keep-window"));
    REQUIRE_THROWS_WITH(parse_keep_scope("head"), Catch::Contains("--kv-keep-scope"));
  }
}

TEST_CASE("attention scores match the double-precision definition, whatever the pool", "[kv][evict]") {
  const int heads = 6, kv_heads = 2, hd = 32;
  for (const int n_keys : {1, 17, 40, 129}) {
    const int rows = std::min(n_keys, 21), first_pos = n_keys - rows;
    const uint32_t seed = 100 + static_cast<uint32_t>(n_keys);
    INFO("n_keys " << n_keys << ", seed " << seed);
    const std::vector<float> q = random_floats(static_cast<size_t>(rows) * heads * hd, seed, 0.5f);
    const std::vector<float> k = random_floats(static_cast<size_t>(n_keys) * kv_heads * hd, seed + 1, 0.5f);
    const std::vector<double> ref = reference_scores(q, rows, first_pos, k, n_keys, heads, kv_heads, hd);
    std::vector<float> serial(static_cast<size_t>(n_keys), 0.0f), pooled = serial;
    accumulate_attention_scores(q.data(), rows, first_pos, k.data(), n_keys, heads, kv_heads, hd, serial, nullptr);
    ThreadPool pool(3);
    accumulate_attention_scores(q.data(), rows, first_pos, k.data(), n_keys, heads, kv_heads, hd, pooled, &pool);
    REQUIRE(same_bits(serial, pooled));
    double total = 0;
    for (int j = 0; j < n_keys; ++j) {
      // f32 sums of ≤ rows·heads probabilities, each within a few ulp: 1e-5 relative is ample.
      CHECK(std::abs(serial[static_cast<size_t>(j)] - ref[static_cast<size_t>(j)]) <=
            1e-6 + 1e-5 * ref[static_cast<size_t>(j)]);
      total += serial[static_cast<size_t>(j)];
    }
    CHECK(total == Approx(static_cast<double>(rows) * heads).epsilon(1e-5));  // each (row, head) adds mass 1
  }
}

TEST_CASE("a planted key the later queries attend to is kept", "[kv][evict]") {
  const int heads = 4, kv_heads = 2, hd = 32, n = 300;
  const uint32_t seed = 9;
  INFO("seed " << seed);
  std::vector<float> k = random_floats(static_cast<size_t>(n) * kv_heads * hd, seed, 0.3f);
  std::vector<float> planted = random_floats(hd, seed + 1);
  const int at = 123;
  for (int c = 0; c < hd; ++c) k[(static_cast<size_t>(at) * kv_heads + 1) * hd + c] = planted[static_cast<size_t>(c)];
  KeepOptions o;
  o.ratio = 0.05f;  // 15 tokens: 4 sinks, 8 recent, 3 by score
  o.sinks = 4;
  o.recent = 8;
  const int from = o.window_start(n);
  REQUIRE(from == 240);
  const int rows = n - from;
  std::vector<float> q = random_floats(static_cast<size_t>(rows) * heads * hd, seed + 2, 0.3f);
  for (int r = 0; r < rows; ++r)  // query heads 2 and 3 (KV head 1) look for the planted key
    for (int h = 2; h < 4; ++h)
      for (int c = 0; c < hd; ++c) q[(static_cast<size_t>(r) * heads + h) * hd + c] += 2.0f * planted[static_cast<size_t>(c)];
  std::vector<float> scores(n, 0.0f);
  accumulate_attention_scores(q.data(), rows, from, k.data(), n, heads, kv_heads, hd, scores, nullptr);
  const std::vector<int> kept = select_kept_tokens(scores, o);
  CHECK(kept.size() == 15);
  CHECK(std::find(kept.begin(), kept.end(), at) != kept.end());
}

TEST_CASE("CpuPagedKvCache::keep_tokens gathers the kept tokens in order, inside the prefill", "[kv][evict]") {
  const KvShape shape{3, 2, 32, 2, {}, {}};
  const size_t token_floats = 2 * 32;
  for (const KvMode mode : {KvMode::hack, KvMode::fp}) {
    KvCacheOptions o;
    o.mode = mode;
    o.block_tokens = 16;
    o.sinks = 4;
    o.fp_dtype = DType::f32;
    const int n = 90;
    const uint32_t seed = 5;
    INFO(kv_mode_name(mode) << ", seed " << seed);
    const std::vector<float> k = random_floats(static_cast<size_t>(n) * token_floats, seed),
                             v = random_floats(k.size(), seed + 1);
    CpuPagedKvCache plain(shape, o), all(shape, o), some(shape, o);
    for (CpuPagedKvCache* c : {&plain, &all, &some}) {
      c->add_sequence(1, n + 10);
      c->begin_prefill(1);
      for (int l = 0; l < shape.num_layers; ++l) c->append(l, 1, 0, n, k.data(), v.data());
    }
    std::vector<int> every(n);
    std::iota(every.begin(), every.end(), 0);
    const std::vector<int> subset = {0, 1, 2, 3, 7, 30, 31, 55, 70, 80, 85, 86, 87, 88, 89, 64};
    std::vector<int> sorted_subset = subset;
    std::sort(sorted_subset.begin(), sorted_subset.end());
    for (int l = 0; l < shape.num_layers; ++l) {
      all.keep_tokens(1, l, every);
      some.keep_tokens(1, l, sorted_subset);
    }
    const int m = static_cast<int>(sorted_subset.size());
    for (int l = 0; l < shape.num_layers; ++l) {
      REQUIRE(all.length(1, l) == n);
      REQUIRE(some.length(1, l) == m);
      std::vector<float> ka(k.size()), va(k.size()), kb(k.size()), vb(k.size());
      plain.read_exact_tokens(1, l, 0, n, ka.data(), va.data());
      all.read_exact_tokens(1, l, 0, n, kb.data(), vb.data());
      REQUIRE((same_bits(ka, kb) && same_bits(va, vb)));
      std::vector<float> ks(static_cast<size_t>(m) * token_floats), vs(ks.size());
      some.read_exact_tokens(1, l, 0, m, ks.data(), vs.data());
      for (int i = 0; i < m; ++i)
        REQUIRE(std::memcmp(&ks[static_cast<size_t>(i) * token_floats],
                            &ka[static_cast<size_t>(sorted_subset[static_cast<size_t>(i)]) * token_floats],
                            token_floats * sizeof(float)) == 0);
    }
    REQUIRE_THROWS_WITH(some.keep_tokens(1, 0, {3, 2}), Catch::Contains("out of order"));
    REQUIRE_THROWS_WITH(some.keep_tokens(1, 0, {0, n}), Catch::Contains("not among"));
    for (CpuPagedKvCache* c : {&plain, &all, &some}) c->end_prefill(1);
    if (mode == KvMode::hack) {  // keeping everything quantizes to the very same pages
      for (int l = 0; l < shape.num_layers; ++l) {
        REQUIRE(all.hack_page_count(1, l) == plain.hack_page_count(1, l));
        for (int p = 0; p < plain.hack_page_count(1, l); ++p) {
          const auto a = plain.hack_page(1, l, p), b = all.hack_page(1, l, p);
          REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
        }
      }
      CHECK(some.stats().bytes_used < plain.stats().bytes_used);
      // Once quantized, nothing can be evicted any more.
      REQUIRE_THROWS_WITH(plain.keep_tokens(1, 0, every), Catch::Contains("only inside its prefill"));
    }
  }
}
