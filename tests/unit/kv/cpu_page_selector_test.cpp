// MPCache page selection (backend/cpu_page_selector.h, kernels/cpu/page_bound.h): the Quest score is
// a true upper bound of q·k over a page (exact and quantized K), every ISA scores with the same
// bits, ratio 1 attends exactly as no selection, a planted key's page is selected, a shared
// selection equals the per-layer one when adjacent layers agree, the budget is kept, bad
// options are refused, a decode step with selection allocates nothing, and selections do not
// depend on the thread count.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/page_bound.h"
#include "hack/kv/kv_flags.h"
#include "hack/backend/cpu_page_selector.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"
#include "support/alloc_counter.h"

using namespace hack;
using hack::test::KvStream;

namespace {

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (const CpuIsa i : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16})
    if (cpu_supports(i)) out.push_back(i);
  return out;
}

KvCacheOptions hack_options(int block, PageSelectOptions select = {}) {
  KvCacheOptions o;
  o.block_tokens = block;
  o.k_bits = o.v_bits = 2;
  o.select = select;
  return o;
}

ThreadPool& serial() {
  static ThreadPool pool(1);
  return pool;
}

// Runs layer `layer` of one decode step whose plan is `plan` and returns the output.
std::vector<float> run_layer(const CpuPagedKvCache& cache, const AttentionPlan& plan, int layer, const std::vector<float>& q) {
  ThreadPool pool(2);
  AttentionWorkspace ws;
  std::vector<float> out(q.size());
  cache.run(plan, layer, q.data(), q.size(), out.data(), out.size(), 0.125f, pool, ws);
  return out;
}

}  // namespace

TEST_CASE("the quest score bounds q·k over a page, exact and quantized, and a group envelope bounds its pages",
          "[kv][select]") {
  const uint32_t seed = 1234;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int bits : {2, 4, 8})
    for (const int dim : {16, 64, 80}) {
      HackPageParams params;
      params.k_bits = params.v_bits = bits;
      params.block_tokens = 32;
      params.heads = {{dim, dim}};
      params.k_group = 16;
      params.v_group = 16;
      const HackPageLayout layout(params);
      const int T = params.block_tokens, pages_n = 5, G = 3;
      std::vector<std::vector<std::byte>> pages(pages_n, std::vector<std::byte>(layout.page_bytes()));
      std::vector<std::vector<float>> exact(pages_n);
      for (int p = 0; p < pages_n; ++p) {
        std::vector<uint16_t> k(static_cast<size_t>(T * dim)), v(k.size());
        exact[static_cast<size_t>(p)].resize(k.size());
        for (int c = 0; c < dim; ++c) {
          const float bias = 2.0f * normal(rng), gain = c % 7 == 3 ? 5.0f : 1.0f;
          for (int t = 0; t < T; ++t) {
            const size_t at = static_cast<size_t>(t * dim + c);
            k[at] = f32_to_bf16(bias + gain * normal(rng));
            v[at] = f32_to_bf16(normal(rng));
            exact[static_cast<size_t>(p)][at] = bf16_to_f32(k[at]);
          }
        }
        layout.write_header(pages[static_cast<size_t>(p)].data(), 0, 4 + p * T, Rounding::nearest);
        quantize_k_block(layout, 0, k.data(), static_cast<size_t>(dim), RoundingSpec{}, pages[static_cast<size_t>(p)].data());
        quantize_v_block(layout, 0, v.data(), static_cast<size_t>(dim), RoundingSpec{}, pages[static_cast<size_t>(p)].data());
      }
      std::vector<const std::byte*> ptrs;
      for (auto& p : pages) ptrs.push_back(p.data());
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> q(static_cast<size_t>(G * dim));
        for (float& x : q) x = 3.0f * normal(rng);
        cpu::PageBoundArgs a;
        a.pages = ptrs.data();
        a.n_pages = pages_n;
        a.k_min_offset = layout.head(0).k_min;
        a.k_scale_offset = layout.head(0).k_scale;
        a.k_dim = dim;
        a.levels = static_cast<float>((1 << bits) - 1);
        std::vector<float> qpos(static_cast<size_t>(dim)), qneg(static_cast<size_t>(dim));
        a.qpos = qpos.data();
        a.qneg = qneg.data();
        std::vector<float> deq(static_cast<size_t>(T * dim));
        for (int g = 0; g < G; ++g) {
          const float* qr = q.data() + g * dim;
          cpu::quest_split(qr, 1, dim, qpos.data(), qneg.data());
          std::vector<float> bound(pages_n), envelope(2);
          cpu::page_bound_kernel(cpu_isa())(a, bound.data());
          a.span = 3;  // boxes {0, 1, 2} and {3, 4}
          cpu::page_bound_kernel(cpu_isa())(a, envelope.data());
          a.span = 1;
          for (int p = 0; p < pages_n; ++p) {
            dequantize_k_block(layout, 0, pages[static_cast<size_t>(p)].data(), deq.data());
            double slack = 0;  // float rounding of the bound's terms
            for (int c = 0; c < dim; ++c) slack += std::fabs(qr[c]) * 1e-5 * (1 + std::fabs(deq[static_cast<size_t>(c)]));
            for (int t = 0; t < T; ++t)
              for (const std::vector<float>* keys : {&exact[static_cast<size_t>(p)], &deq}) {
                // 2-bit nearest rounding clips K's range (hack_quantize_k), so the bound holds
                // for what attention reads (the codes) but not for outliers of the exact K.
                if (keys != &deq && bits == 2) continue;
                double dot = 0;
                for (int c = 0; c < dim; ++c) dot += static_cast<double>(qr[c]) * (*keys)[static_cast<size_t>(t * dim + c)];
                INFO("bits " << bits << " dim " << dim << " page " << p << " token " << t);
                REQUIRE(dot <= bound[static_cast<size_t>(p)] + slack);
              }
            REQUIRE(envelope[static_cast<size_t>(p / 3)] >= bound[static_cast<size_t>(p)] - 1e-4f * std::fabs(bound[static_cast<size_t>(p)]));
          }
        }
        // Every ISA gives the same bits, quest (all rows) and mpcache, pages and boxes.
        std::vector<float> qsum(static_cast<size_t>(dim), 0.0f);
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < dim; ++c) qsum[static_cast<size_t>(c)] += q[static_cast<size_t>(g * dim + c)];
        cpu::quest_split(q.data(), G, dim, qpos.data(), qneg.data());
        a.qsum = qsum.data();
        for (const bool linear : {false, true})
          for (const int span : {1, 2}) {
            a.linear = linear;
            a.span = span;
            std::vector<float> want(pages_n, -1.0f);
            cpu::detail::page_bound_scalar(a, want.data());
            for (const CpuIsa isa : supported_isas()) {
              std::vector<float> got(pages_n, -1.0f);
              cpu::page_bound_kernel(isa)(a, got.data());
              INFO("isa " << cpu_isa_name(isa) << " linear " << linear << " span " << span);
              REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
            }
            if (linear && span == 1) {  // mpcache against a double reference
              for (int p = 0; p < pages_n; ++p) {
                const auto* mn = reinterpret_cast<const uint16_t*>(ptrs[static_cast<size_t>(p)] + a.k_min_offset);
                const auto* sc = reinterpret_cast<const uint16_t*>(ptrs[static_cast<size_t>(p)] + a.k_scale_offset);
                double ref = 0, mag = 0;
                for (int c = 0; c < dim; ++c) {
                  const double lo = bf16_to_f32(mn[c]), hi = lo + static_cast<double>(bf16_to_f32(sc[c])) * a.levels;
                  ref += qsum[static_cast<size_t>(c)] * (0.6 * hi + 0.4 * lo);
                  mag += std::fabs(qsum[static_cast<size_t>(c)]) * (std::fabs(hi) + std::fabs(lo));
                }
                REQUIRE(std::fabs(want[static_cast<size_t>(p)] - ref) <= 1e-5 * mag);
              }
            }
            if (!linear && span == 1) {  // quest over the whole group: Σ_r Σ_c max(q·hi, q·lo) in double
              for (int p = 0; p < pages_n; ++p) {
                const auto* mn = reinterpret_cast<const uint16_t*>(ptrs[static_cast<size_t>(p)] + a.k_min_offset);
                const auto* sc = reinterpret_cast<const uint16_t*>(ptrs[static_cast<size_t>(p)] + a.k_scale_offset);
                double ref = 0, mag = 0;
                for (int g = 0; g < G; ++g)
                  for (int c = 0; c < dim; ++c) {
                    const double lo = bf16_to_f32(mn[c]), hi = lo + static_cast<double>(bf16_to_f32(sc[c])) * a.levels;
                    const double x = q[static_cast<size_t>(g * dim + c)];
                    ref += std::max(x * hi, x * lo);
                    mag += std::fabs(x) * (std::fabs(hi) + std::fabs(lo));
                  }
                REQUIRE(std::fabs(want[static_cast<size_t>(p)] - ref) <= 1e-5 * mag);
              }
            }
          }
      }
    }
}

namespace {

// One sequence of `tokens` tokens stored in `layers` layers (layer l's K/V from `stream_of(l)`),
// then one decode token appended; returns the plan of that step.
struct DecodeFixture {
  KvShape shape;
  CpuPagedKvCache cache;
  AttentionPlan plan;
  std::vector<float> q;
  int tokens;
  DecodeFixture(const KvShape& s, const KvCacheOptions& o, int tokens_, const std::vector<const KvStream*>& streams)
      : shape(s), cache(s, o), tokens(tokens_) {
    cache.add_sequence(0, tokens + 8);
    for (int l = 0; l < s.num_layers; ++l) cache.append(l, 0, 0, tokens, streams[static_cast<size_t>(l)]->k_at(0), streams[static_cast<size_t>(l)]->v_at(0));
    const PlanItem item{0, tokens, 1, 0};
    cache.plan(std::span(&item, 1), PlanPolicy{}, plan);
    for (int l = 0; l < s.num_layers; ++l)
      cache.append(l, 0, tokens, 1, streams[static_cast<size_t>(l)]->k_at(tokens), streams[static_cast<size_t>(l)]->v_at(tokens));
    const KvStream& first = *streams.front();
    q.assign(first.q_at(tokens), first.q_at(tokens) + static_cast<size_t>(s.num_kv_heads * s.group_size * s.head_dim));
  }
};

}  // namespace

TEST_CASE("selection with ratio 1 attends exactly as no selection", "[kv][select]") {
  const KvShape shape{1, 2, 64, 3};
  const KvStream data(1200, 2, 3, 64, 21);
  for (const PageScore score : {PageScore::quest, PageScore::mpcache}) {
    PageSelectOptions so;
    so.ratio = 1.0;
    so.score = score;
    so.dense_layers = 0;
    DecodeFixture f(shape, hack_options(16, so), 1100, {&data});
    AttentionPlan selected = f.plan;
    CpuPageSelector selector(so);
    selector.select(f.cache, selected, PlanPolicy{}, 0, f.q.data(), f.q.size(), serial());
    REQUIRE(!selected.selection_of(0, 0).empty());  // the selection path really ran
    REQUIRE(selected.selection_of(0, 1).size() == f.plan.segments_of(0).size());
    REQUIRE(selected.tasks.size() != f.plan.tasks.size());  // per-head tasks
    const std::vector<float> a = run_layer(f.cache, f.plan, 0, f.q), b = run_layer(f.cache, selected, 0, f.q);
    REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    REQUIRE(selector.stats().selected_tokens == selector.stats().context_tokens);
  }
}

TEST_CASE("a planted key page is selected, sinks, exact blocks and the newest page always are, and the budget holds",
          "[kv][select]") {
  const int dim = 64, T = 16, H = 2, G = 3, tokens = 2000;
  const KvShape shape{1, H, dim, G};
  KvStream data(tokens + 1, H, G, dim, 33);
  // Head 1's query group all point along one direction; token 1000's key in head 1 is a
  // large multiple of it, the rest of head 1's keys are small noise.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dir(dim);
  for (float& x : dir) x = normal(rng);
  const int planted = 1000;
  for (int t = 0; t <= tokens; ++t)
    for (int c = 0; c < dim; ++c) data.k[(static_cast<size_t>(t) * H + 1) * dim + static_cast<size_t>(c)] = t == planted ? 4.0f * dir[static_cast<size_t>(c)] : 0.3f * normal(rng);
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dim; ++c)
      data.q[(static_cast<size_t>(tokens) * H * G + static_cast<size_t>(G + g)) * dim + static_cast<size_t>(c)] = dir[static_cast<size_t>(c)] + 0.1f * normal(rng);
  for (const PageScore score : {PageScore::quest, PageScore::mpcache, PageScore::oracle})
    for (const int group : {1, 4}) {
      PageSelectOptions so;
      so.ratio = 0.05;
      so.score = score;
      so.group_pages = group;
      so.dense_layers = 0;
      DecodeFixture f(shape, hack_options(T, so), tokens, {&data});
      CpuPageSelector selector(so);
      AttentionPlan selected = f.plan;
      selector.select(f.cache, selected, PlanPolicy{}, 0, f.q.data(), f.q.size(), serial());
      const std::span<const PlanSegment> segs = selected.segments_of(0);
      INFO("score " << page_score_name(score) << " group " << group);
      for (int h = 0; h < H; ++h) {
        const std::span<const int> sel = selected.selection_of(0, h);
        int seen = 0;
        bool has_planted = false, has_sinks = false, has_open = false, has_newest = false;
        int last_closed = -1;
        for (int s = 0; s < static_cast<int>(segs.size()); ++s)
          if (segs[static_cast<size_t>(s)].slot == SegmentSlot::closed) last_closed = s;
        for (const int s : sel) {
          const PlanSegment& seg = segs[static_cast<size_t>(s)];
          seen += seg.tokens;
          has_planted |= seg.first_token <= planted && planted < seg.first_token + seg.tokens;
          has_sinks |= seg.slot == SegmentSlot::sinks;
          has_open |= seg.slot == SegmentSlot::open;
          has_newest |= s == last_closed;
        }
        REQUIRE((has_sinks && has_open && has_newest));
        if (h == 1) REQUIRE(has_planted);
        REQUIRE(seen <= std::ceil(0.05 * (tokens + 1)) + T);  // within a page of the budget
        REQUIRE(seen >= std::ceil(0.05 * (tokens + 1)) - T);
      }
      // Attention over the selection sees the planted token: head 1's output is close to its V.
      const std::vector<float> out = run_layer(f.cache, selected, 0, f.q);
      const std::vector<float> full = run_layer(f.cache, f.plan, 0, f.q);
      double err = 0, norm = 0;
      for (int i = G * dim; i < 2 * G * dim; ++i) {
        err += std::pow(out[static_cast<size_t>(i)] - full[static_cast<size_t>(i)], 2);
        norm += std::pow(full[static_cast<size_t>(i)], 2);
      }
      REQUIRE(err <= 0.01 * norm);
    }
}

TEST_CASE("the selection floor: a budget of at least min_tokens, everything below min_context", "[kv][select]") {
  const int T = 16, tokens = 600;
  const KvShape shape{1, 2, 64, 3};
  const KvStream data(tokens + 1, 2, 3, 64, 41);
  struct Case {
    int min_tokens, min_context;
    int want_at_least, want_at_most;  // tokens each head attends to
  };
  // 5 % of 601 tokens is 31: two pages beside the sinks, open block and newest page.
  for (const Case c : {Case{0, 0, 0, 31 + T}, Case{256, 0, 256 - T, 256 + T}, Case{0, 1024, tokens + 1, tokens + 1},
                       Case{256, 601, 256 - T, 256 + T}}) {
    PageSelectOptions so;
    so.ratio = 0.05;
    so.dense_layers = 0;
    so.min_tokens = c.min_tokens;
    so.min_context = c.min_context;
    INFO("min_tokens " << c.min_tokens << " min_context " << c.min_context);
    DecodeFixture f(shape, hack_options(T, so), tokens, {&data});
    CpuPageSelector selector(so);
    AttentionPlan selected = f.plan;
    selector.select(f.cache, selected, PlanPolicy{}, 0, f.q.data(), f.q.size(), serial());
    const std::span<const PlanSegment> segs = selected.segments_of(0);
    for (int h = 0; h < 2; ++h) {
      int seen = 0;
      for (const int s : selected.selection_of(0, h)) seen += segs[static_cast<size_t>(s)].tokens;
      REQUIRE(seen >= c.want_at_least);
      REQUIRE(seen <= c.want_at_most);
    }
  }
}

TEST_CASE("a shared selection equals the per-layer one when adjacent layers agree", "[kv][select]") {
  const KvShape shape{4, 2, 64, 3};
  const KvStream a(900, 2, 3, 64, 41), b(900, 2, 3, 64, 42);
  // Layers 2 and 3 hold the same K/V (and see the same q): sharing layer 2's selection in
  // layer 3 must equal selecting in layer 3.
  PageSelectOptions shared;
  shared.ratio = 0.2;
  shared.dense_layers = 2;
  shared.share_layers = 2;
  PageSelectOptions own = shared;
  own.share_layers = 1;
  DecodeFixture f(shape, hack_options(16, shared), 850, {&a, &b, &b, &b});
  CpuPageSelector s_shared(shared), s_own(own);
  REQUIRE((!s_shared.selects_in(1) && s_shared.selects_in(2) && !s_shared.selects_in(3) && s_shared.selects_in(4)));
  REQUIRE((s_own.selects_in(2) && s_own.selects_in(3)));
  AttentionPlan p_shared = f.plan, p_own = f.plan;
  s_shared.select(f.cache, p_shared, PlanPolicy{}, 2, f.q.data(), f.q.size(), serial());
  s_own.select(f.cache, p_own, PlanPolicy{}, 3, f.q.data(), f.q.size(), serial());
  REQUIRE(p_shared.selected == p_own.selected);
  REQUIRE(p_shared.selected.size() < f.plan.segments.size() * 2);  // something was left out
  const std::vector<float> x = run_layer(f.cache, p_shared, 3, f.q), y = run_layer(f.cache, p_own, 3, f.q);
  REQUIRE(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  // The sharing measurement sees full agreement here, and less against a different layer.
  s_shared.measure_sharing(f.cache, p_shared, 3, f.q.data(), f.q.size());
  REQUIRE(s_shared.stats().shared_pages > 0);
  REQUIRE(s_shared.stats().shared_hits == s_shared.stats().shared_pages);
  CpuPageSelector other(shared);
  other.measure_sharing(f.cache, p_shared, 0, f.q.data(), f.q.size());
  REQUIRE(other.stats().shared_hits < other.stats().shared_pages);
}

TEST_CASE("bad selection options are refused with the flag's name", "[kv][select]") {
  auto refuses = [](auto&& set, const char* text) {
    KvFlags f;
    f.kv_select_ratio = 0.2f;
    set(f);
    try {
      kv_options_from(f);
      FAIL("accepted");
    } catch (const Error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains(text));
    }
  };
  refuses([](KvFlags& f) { f.kv_select_ratio = 1.5f; }, "--kv-select-ratio");
  refuses([](KvFlags& f) { f.kv_select_tokens = 100; }, "not both");
  refuses([](KvFlags& f) { f.kv_select_bound = "oracle"; }, "--kv-select-bound");
  refuses([](KvFlags& f) { f.kv_select_bound = "nope"; }, "--kv-select-bound");
  refuses([](KvFlags& f) { f.kv_select_alpha = 2; }, "--kv-select-alpha");
  refuses([](KvFlags& f) { f.kv_select_group = 0; }, "--kv-select-group");
  refuses([](KvFlags& f) { f.kv_select_coarse = 0; }, "--kv-select-coarse");
  refuses([](KvFlags& f) { f.kv_select_share = 0; }, "--kv-select-share");
  refuses([](KvFlags& f) { f.kv_select_dense = -1; }, "--kv-select-dense");
  refuses([](KvFlags& f) { f.kv_select_min_tokens = -1; }, "--kv-select-min-tokens");
  refuses([](KvFlags& f) { f.kv_select_min_context = -1; }, "--kv-select-min-context");
  refuses([](KvFlags& f) { f.kv = "fp"; }, "--kv hack");
  KvFlags ok;
  ok.kv_select_ratio = 0.2f;
  ok.kv_select_bound = "mpcache";
  const KvCacheOptions o = kv_options_from(ok);
  REQUIRE(o.select.enabled());
  REQUIRE_THAT(describe(o), Catch::Contains("select=0.2 mpcache alpha=0.6 group=2 coarse=0.5 dense=2 share=2"));
  REQUIRE(describe(kv_options_from(KvFlags{})).find("select") == std::string::npos);
}

TEST_CASE("a decode step with page selection allocates nothing", "[kv][select]") {
  const int dim = 64, group = 3, block = 16, H = 2;
  const KvShape shape{3, H, dim, group};
  PageSelectOptions so;
  so.ratio = 0.2;
  so.dense_layers = 1;
  so.share_layers = 1;
  CpuPagedKvCache cache(shape, hack_options(block, so));
  const KvStream a(900, H, group, dim, 8), b(900, H, group, dim, 9);
  cache.add_sequence(0, 900);
  cache.add_sequence(1, 900);
  for (int l = 0; l < 3; ++l) {
    cache.append(l, 0, 0, 200, a.k_at(0), a.v_at(0));
    cache.append(l, 1, 0, 700, b.k_at(0), b.v_at(0));
  }
  ThreadPool pool(2);
  AttentionPlan plan, selected;
  AttentionWorkspace ws;
  CpuPageSelector selector(so);
  std::vector<PlanItem> items(2);
  std::vector<float> q(2 * static_cast<size_t>(H * group * dim)), out(q.size());
  auto step = [&](int t) {
    items[0] = PlanItem{0, 200 + t, 1, 0};
    items[1] = PlanItem{1, 700 + t, 1, 1};
    cache.plan(items, PlanPolicy{}, plan);
    for (int l = 0; l < 3; ++l) {
      cache.append(l, 0, 200 + t, 1, a.k_at(200 + t), a.v_at(200 + t));
      cache.append(l, 1, 700 + t, 1, b.k_at(700 + t), b.v_at(700 + t));
      std::memcpy(q.data(), a.q_at(200 + t), q.size() / 2 * sizeof(float));
      std::memcpy(q.data() + q.size() / 2, b.q_at(700 + t), q.size() / 2 * sizeof(float));
      const AttentionPlan* run = &plan;
      if (!selector.dense(l)) {
        copy_plan(plan, selected);
        selector.select(cache, selected, PlanPolicy{}, l, q.data(), q.size() / 2, pool);
        run = &selected;
      }
      cache.run(*run, l, q.data(), q.size() / 2, out.data(), q.size() / 2, 0.1f, pool, ws);
    }
  };
  step(0);
  step(1);
  long allocations = 0;
  for (int t = 2; t < 120; ++t) {  // crosses several block boundaries
    const long before = test::process_allocations();
    step(t);
    allocations += test::process_allocations() - before;
  }
  REQUIRE(allocations == 0);
  REQUIRE(selector.stats().selected_tokens < 0.5 * selector.stats().context_tokens);
}

TEST_CASE("selections and their stats do not depend on the pool's thread count", "[kv][select]") {
  const int dim = 64, group = 3, block = 16, H = 2, layers = 2;
  const KvShape shape{layers, H, dim, group};
  const KvStream a(1300, H, group, dim, 51), b(1300, H, group, dim, 52), c(1300, H, group, dim, 53);
  for (const PageScore score : {PageScore::quest, PageScore::mpcache, PageScore::random, PageScore::streaming,
                                PageScore::oracle})
    for (const int group_pages : {1, 2}) {
      PageSelectOptions so;
      so.ratio = 0.15;
      so.score = score;
      so.group_pages = group_pages;
      so.dense_layers = 0;
      so.share_layers = 1;
      so.seed = 7;
      CpuPagedKvCache cache(shape, hack_options(block, so));
      // Two decode items and a prefill chunk (never selected) between them.
      cache.add_sequence(0, 1300);
      cache.add_sequence(1, 1300);
      cache.add_sequence(2, 1300);
      for (int l = 0; l < layers; ++l) {
        cache.append(l, 0, 0, 1200, a.k_at(0), a.v_at(0));
        cache.append(l, 1, 0, 300, b.k_at(0), b.v_at(0));
        cache.append(l, 2, 0, 900, c.k_at(0), c.v_at(0));
      }
      const std::vector<PlanItem> items{{0, 1200, 1, 0}, {1, 300, 4, 1}, {2, 900, 1, 5}};
      AttentionPlan plan;
      cache.plan(items, PlanPolicy{}, plan);
      for (int l = 0; l < layers; ++l) {
        cache.append(l, 0, 1200, 1, a.k_at(1200), a.v_at(1200));
        cache.append(l, 1, 300, 4, b.k_at(300), b.v_at(300));
        cache.append(l, 2, 900, 1, c.k_at(900), c.v_at(900));
      }
      const size_t row = static_cast<size_t>(H * group * dim);
      std::vector<float> q(6 * row);
      std::memcpy(q.data(), a.q_at(1200), row * sizeof(float));
      std::memcpy(q.data() + row, b.q_at(300), 4 * row * sizeof(float));
      std::memcpy(q.data() + 5 * row, c.q_at(900), row * sizeof(float));
      std::vector<AttentionPlan> got;
      std::vector<PageSelectStats> stats;
      for (const int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        CpuPageSelector selector(so);
        for (int l = 0; l < layers; ++l) {
          AttentionPlan selected;
          copy_plan(plan, selected);
          selector.select(cache, selected, PlanPolicy{.workers = threads}, l, q.data(), row, pool);
          if (threads == 1 && l == 0) {
            REQUIRE(selected.selection_of(1, 0).empty());  // the prefill chunk is not selected
            REQUIRE(selected.selection_of(0, 1).size() < selected.segments_of(0).size());
            REQUIRE(selected.selection_of(2, 0).size() < selected.segments_of(2).size());
          }
          got.push_back(std::move(selected));
        }
        stats.push_back(selector.stats());
      }
      INFO("score " << page_score_name(score) << " group " << group_pages);
      for (size_t t = 1; t < stats.size(); ++t) {
        for (int l = 0; l < layers; ++l) {
          const AttentionPlan& x = got[static_cast<size_t>(l)];
          const AttentionPlan& y = got[t * layers + static_cast<size_t>(l)];
          REQUIRE(x.selected == y.selected);
          REQUIRE(x.selection_offsets == y.selection_offsets);
        }
        REQUIRE(stats[t].context_tokens == stats[0].context_tokens);
        REQUIRE(stats[t].selected_tokens == stats[0].selected_tokens);
        REQUIRE(stats[t].selections == stats[0].selections);
      }
      REQUIRE(stats[0].selections == 2 * H * layers);
    }
}
