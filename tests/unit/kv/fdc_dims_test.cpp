// Per-head dims (FDC, model/fdc.h) in CpuPagedKvCache: a head stores and attends to the first
// k_dim / v_dim entries of its head_dim slot, in fp pages and HACK pages alike; whatever
// lies beyond them is ignored, outputs beyond v_dim are 0, and pages, exports and forks
// carry only the stored dims. The reference is attention in double on the truncated rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/hack_page.h"
#include "hack/kv/kv_stream.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::KvStream;

namespace {

constexpr int kLayers = 2, kHeads = 3, kGroup = 2, kDim = 64;

// Ranks as FDC gives them: multiples of 16, differing per head and layer.
KvShape compressed_shape() {
  KvShape s{kLayers, kHeads, kDim, kGroup, {}, {}};
  s.k_dims = {16, 64, 32, 48, 16, 32};
  s.v_dims = {32, 48, 64, 16, 64, 16};
  return s;
}

KvCacheOptions options(KvMode mode, DType dtype = DType::f32, HackAttention attention = HackAttention::homomorphic) {
  KvCacheOptions o;
  o.mode = mode;
  o.fp_dtype = dtype;
  o.block_tokens = 16;
  o.sinks = 4;
  o.k_bits = o.v_bits = 4;
  o.attention = attention;
  return o;
}

// A stream whose entries beyond each head's dims are large garbage: the cache must ignore them.
KvStream stream_with_garbage(const KvShape& shape, int layer, int tokens, uint32_t seed) {
  KvStream s(tokens, shape.num_kv_heads, shape.group_size, shape.head_dim, seed);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < shape.num_kv_heads; ++h)
      for (int c = 0; c < shape.head_dim; ++c) {
        const size_t at = (static_cast<size_t>(t) * shape.num_kv_heads + h) * shape.head_dim + c;
        if (c >= shape.k_dim(layer, h)) s.k[at] = 1e3f;
        if (c >= shape.v_dim(layer, h)) s.v[at] = -1e3f;
      }
  return s;
}

// Runs a step's plan in one layer for one sequence of `n` new tokens at `pos`; out: [n][row].
std::vector<float> run_step(CpuPagedKvCache& kv, int layer, const KvStream& s, int pos, int n, ThreadPool& pool) {
  AttentionPlan plan;
  const std::vector<PlanItem> items{PlanItem{1, pos, n, 0}};
  kv.plan(items, PlanPolicy{}, plan);
  for (int l = 0; l < kLayers; ++l) kv.append(l, 1, pos, n, s.k_at(pos), s.v_at(pos));
  const size_t row = s.per_token() * static_cast<size_t>(s.group);
  std::vector<float> out(static_cast<size_t>(n) * row, 7.0f);
  AttentionWorkspace ws;
  kv.run(plan, layer, s.q_at(pos), row, out.data(), row, 0.125f, pool, ws);
  return out;
}

// Checks out (rows of n tokens at pos) against double attention over K/V given per (head, t, c).
template <class KFn, class VFn>
void check_rows(const KvShape& shape, int layer, const KvStream& s, int pos, int n, const std::vector<float>& out,
                KFn k, VFn v, double tol) {
  const size_t row = s.per_token() * static_cast<size_t>(s.group);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < kHeads; ++h) {
      const int kd = shape.k_dim(layer, h), vd = shape.v_dim(layer, h);
      for (int g = 0; g < kGroup; ++g) {
        const size_t slot = (static_cast<size_t>(h) * kGroup + g) * kDim;
        std::vector<double> ref(static_cast<size_t>(kDim), 0.0);
        // Scores over the first kd channels, values over the first vd.
        const float* q = s.q_at(pos + t) + slot;
        std::vector<double> w(static_cast<size_t>(pos + t + 1));
        double mx = -1e300, denom = 0;
        for (int j = 0; j <= pos + t; ++j) {
          double dot = 0;
          for (int c = 0; c < kd; ++c) dot += static_cast<double>(q[c]) * 0.125 * k(h, j, c);
          mx = std::max(mx, w[static_cast<size_t>(j)] = dot);
        }
        for (double& x : w) denom += (x = std::exp(x - mx));
        for (int c = 0; c < vd; ++c) {
          for (int j = 0; j <= pos + t; ++j) ref[static_cast<size_t>(c)] += w[static_cast<size_t>(j)] * v(h, j, c);
          ref[static_cast<size_t>(c)] /= denom;
        }
        const float* got = out.data() + static_cast<size_t>(t) * row + slot;
        for (int c = 0; c < kDim; ++c) {
          INFO("layer " << layer << " token " << pos + t << " head " << h << " g " << g << " channel " << c);
          if (c >= vd) REQUIRE(got[c] == 0.0f);
          else REQUIRE(std::fabs(got[c] - ref[static_cast<size_t>(c)]) <= tol * (1 + std::fabs(ref[static_cast<size_t>(c)])));
        }
      }
    }
}

}  // namespace

TEST_CASE("per-head dims: fp pages attend over each head's first k_dim / v_dim entries only", "[kv][fdc]") {
  const KvShape shape = compressed_shape();
  ThreadPool pool(2);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO("fp pages " << dtype_name(dtype));
    auto kv = make_paged_kv_cache(shape, options(KvMode::fp, dtype));
    const KvStream s = stream_with_garbage(shape, 1, 45, 11);
    kv->add_sequence(1, 64);
    auto round = [&](float x) { return dtype == DType::bf16 ? test::bf16_round(x) : x; };
    auto k = [&](int h, int t, int c) { return static_cast<double>(round(s.k_val(t, h, c))); };
    auto v = [&](int h, int t, int c) { return static_cast<double>(round(s.v_val(t, h, c))); };
    int pos = 0;
    for (const int n : {21, 1, 17, 1, 5}) {  // a prefill chunk, decode steps, a chunk crossing pages
      const std::vector<float> out = run_step(*kv, 1, s, pos, n, pool);
      check_rows(shape, 1, s, pos, n, out, k, v, 2e-4);
      pos += n;
    }
    // Reading back: stored dims as written (rounded), 0 beyond.
    std::vector<float> kr(s.per_token() * 3), vr(kr.size());
    kv->read_exact_tokens(1, 1, 40, 3, kr.data(), vr.data());
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < kHeads; ++h)
        for (int c = 0; c < kDim; ++c) {
          const size_t at = (static_cast<size_t>(t) * kHeads + h) * kDim + c;
          REQUIRE(kr[at] == (c < shape.k_dim(1, h) ? static_cast<float>(k(h, 40 + t, c)) : 0.0f));
          REQUIRE(vr[at] == (c < shape.v_dim(1, h) ? static_cast<float>(v(h, 40 + t, c)) : 0.0f));
        }
  }
}

TEST_CASE("per-head dims shrink the bytes of fp and HACK pages", "[kv][fdc]") {
  const KvShape shape = compressed_shape();
  KvShape full = shape;
  full.k_dims.clear();
  full.v_dims.clear();
  int stored = 0;
  for (size_t i = 0; i < shape.k_dims.size(); ++i) stored += shape.k_dims[i] + shape.v_dims[i];
  const double fraction = static_cast<double>(stored) / (2.0 * kLayers * kHeads * kDim);
  REQUIRE(kv_bytes_per_token(shape, options(KvMode::fp, DType::bf16)) ==
          Approx(fraction * kv_bytes_per_token(full, options(KvMode::fp, DType::bf16))));
  REQUIRE(bf16_kv_bytes_per_token(shape) == bf16_kv_bytes_per_token(full));
  const double hack_full = kv_bytes_per_token(full, options(KvMode::hack));
  const double hack_fdc = kv_bytes_per_token(shape, options(KvMode::hack));
  REQUIRE(hack_fdc < 0.75 * hack_full);
  REQUIRE(hack_fdc > 0.45 * hack_full);  // the codes shrink with the dims; headers and scales less so
}

TEST_CASE("per-head dims in HACK pages: quantized blocks hold each head at its dims", "[kv][fdc]") {
  const KvShape shape = compressed_shape();
  ThreadPool pool(2);
  auto deq = make_paged_kv_cache(shape, options(KvMode::hack, DType::bf16, HackAttention::dequantized));
  auto hom = make_paged_kv_cache(shape, options(KvMode::hack));
  const KvStream s = stream_with_garbage(shape, 0, 60, 5);
  deq->add_sequence(1, 64);
  hom->add_sequence(1, 64);
  int pos = 0;
  for (const int n : {30, 1, 1, 20, 1, 1, 1}) {
    const std::vector<float> a = run_step(*deq, 0, s, pos, n, pool);
    const std::vector<float> b = run_step(*hom, 0, s, pos, n, pool);
    pos += n;
    // Dequantize-then-attend on the stored codes, in double: the cache's pages and exact tokens.
    const int pages = deq->hack_page_count(1, 0);
    std::vector<std::vector<float>> kq(kHeads), vq(kHeads);
    for (int p = 0; p < pages; ++p) {
      const std::span<const std::byte> page = deq->hack_page(1, 0, p);
      const HackPageLayout layout = HackPageLayout::from_page(page.data(), page.size());
      for (int h = 0; h < kHeads; ++h) {
        REQUIRE(layout.head(h).k_dim == shape.k_dim(0, h));
        REQUIRE(layout.head(h).v_dim == shape.v_dim(0, h));
        std::vector<float> kb(16 * static_cast<size_t>(layout.head(h).k_dim)), vb(16 * static_cast<size_t>(layout.head(h).v_dim));
        dequantize_k_block(layout, h, page.data(), kb.data());
        dequantize_v_block(layout, h, page.data(), vb.data());
        kq[h].insert(kq[h].end(), kb.begin(), kb.end());
        vq[h].insert(vq[h].end(), vb.begin(), vb.end());
      }
    }
    const int q0 = 4, q1 = 4 + 16 * pages;  // quantized tokens [q0, q1): after the sinks
    auto k = [&](int h, int t, int c) {
      if (t >= q0 && t < q1) return static_cast<double>(kq[h][static_cast<size_t>(t - q0) * shape.k_dim(0, h) + c]);
      return static_cast<double>(test::bf16_round(s.k_val(t, h, c)));
    };
    auto v = [&](int h, int t, int c) {
      if (t >= q0 && t < q1) return static_cast<double>(vq[h][static_cast<size_t>(t - q0) * shape.v_dim(0, h) + c]);
      return static_cast<double>(test::bf16_round(s.v_val(t, h, c)));
    };
    check_rows(shape, 0, s, pos - n, n, a, k, v, 2e-4);
    // Homomorphic attention (INT8 Q and P against the codes) stays close to it: with these
    // peaked scores full-dim heads differ by up to ~0.08 too; a wrong channel or head is O(1).
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    INFO("step ending at " << pos << ": homomorphic vs dequantized max |diff| " << worst);
    REQUIRE(worst < 0.15);
  }
  REQUIRE(hom->hack_page_count(1, 0) == 3);
}

TEST_CASE("per-head dims: exported messages rebuild the same cache, and forks share pages", "[kv][fdc]") {
  const KvShape shape = compressed_shape();
  ThreadPool pool(1);
  auto src = make_paged_kv_cache(shape, options(KvMode::hack));
  auto dst = make_paged_kv_cache(shape, options(KvMode::hack));
  const KvStream s = stream_with_garbage(shape, 0, 50, 8);
  src->add_sequence(1, 64);
  dst->add_sequence(1, 64);
  src->begin_prefill(1);
  for (int l = 0; l < kLayers; ++l) src->append(l, 1, 0, 50, s.k_at(0), s.v_at(0));
  src->end_prefill(1);
  KvExportCursor cursor;
  for (int l = 0; l < kLayers; ++l)
    export_layer(*src, 1, l, true, cursor, [&](KvMessageKind kind, std::span<const std::byte> payload) {
      import_message(*dst, 1, l, kind, payload);
    });
  for (int l = 0; l < kLayers; ++l) {
    REQUIRE(dst->hack_page_count(1, l) == src->hack_page_count(1, l));
    for (int p = 0; p < src->hack_page_count(1, l); ++p) {
      const auto a = src->hack_page(1, l, p), b = dst->hack_page(1, l, p);
      REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
  }
  // The next decode step attends identically on both sides, and on a fork of the source.
  src->fork_sequence(1, 2, 50, 64);
  std::vector<float> outs[3];
  int i = 0;
  for (CpuPagedKvCache* kv : {src.get(), dst.get(), src.get()}) {
    const int seq = i == 2 ? 2 : 1;
    AttentionPlan plan;
    kv->plan(std::vector<PlanItem>{PlanItem{seq, 50, 1, 0}}, PlanPolicy{}, plan);
    for (int l = 0; l < kLayers; ++l) kv->append(l, seq, 50, 1, s.k_at(49), s.v_at(49));
    outs[i].assign(s.per_token() * kGroup, 0.0f);
    AttentionWorkspace ws;
    kv->run(plan, 1, s.q_at(49), s.per_token() * kGroup, outs[i].data(), s.per_token() * kGroup, 0.125f, pool, ws);
    ++i;
  }
  REQUIRE(outs[0] == outs[1]);
  REQUIRE(outs[0] == outs[2]);
}

TEST_CASE("per-head dims are validated", "[kv][fdc]") {
  KvShape bad = compressed_shape();
  bad.k_dims[2] = 40;  // not a multiple of 16
  REQUIRE_THROWS_WITH(make_paged_kv_cache(bad, options(KvMode::fp)), Catch::Contains("multiple of 16"));
  bad = compressed_shape();
  bad.v_dims.pop_back();
  REQUIRE_THROWS_WITH(make_paged_kv_cache(bad, options(KvMode::hack)), Catch::Contains("per-head dims"));
  bad = compressed_shape();
  bad.k_dims[0] = 80;
  REQUIRE_THROWS_WITH(make_paged_kv_cache(bad, options(KvMode::hack)), Catch::Contains("head_dim"));
}

TEST_CASE("balanced plans give the same bits as unbalanced ones, with less imbalance", "[kv][fdc][plan]") {
  ThreadPool pool(3);
  for (const bool compressed : {false, true}) {
    KvShape shape = compressed_shape();
    if (!compressed) shape.k_dims = shape.v_dims = {};
    INFO((compressed ? "per-head dims" : "uniform dims"));
    for (const KvMode mode : {KvMode::fp, KvMode::hack}) {
      std::vector<float> outs[2];
      double imbalance[2] = {0, 0};
      for (const bool balance : {false, true}) {
        auto kv = make_paged_kv_cache(shape, options(mode));
        // Sequence 1: 150 tokens stored, a decode step; sequence 2: a fresh 200-token prefill chunk.
        const KvStream a = stream_with_garbage(shape, 1, 151, 21), b = stream_with_garbage(shape, 1, 200, 22);
        kv->add_sequence(1, 160);
        kv->add_sequence(2, 210);
        for (int l = 0; l < kLayers; ++l) kv->append(l, 1, 0, 150, a.k_at(0), a.v_at(0));
        AttentionPlan plan;
        const std::vector<PlanItem> items{PlanItem{1, 150, 1, 0}, PlanItem{2, 0, 200, 1}};
        kv->plan(items, PlanPolicy{.balance = balance}, plan);
        for (int l = 0; l < kLayers; ++l) {
          kv->append(l, 1, 150, 1, a.k_at(150), a.v_at(150));
          kv->append(l, 2, 0, 200, b.k_at(0), b.v_at(0));
        }
        const size_t row = a.per_token() * kGroup;
        std::vector<float> q(201 * row);
        std::copy(a.q_at(150), a.q_at(150) + row, q.begin());
        std::copy(b.q_at(0), b.q_at(0) + 200 * row, q.begin() + static_cast<std::ptrdiff_t>(row));
        outs[balance].assign(q.size(), 0.0f);
        AttentionWorkspace ws;
        kv->run(plan, 1, q.data(), row, outs[balance].data(), row, 0.125f, pool, ws);
        imbalance[balance] = plan_imbalance(plan, 1, 4);
      }
      INFO("mode " << kv_mode_name(mode) << ": imbalance on 4 workers " << imbalance[0] << " -> " << imbalance[1]);
      REQUIRE(outs[0] == outs[1]);
      REQUIRE(imbalance[1] < imbalance[0]);
      REQUIRE(imbalance[1] < 1.1);
    }
  }
}

TEST_CASE("balanced row blocks of a causal chunk cost the same", "[kv][fdc][plan]") {
  const KvShape shape = compressed_shape();
  auto kv = make_paged_kv_cache(shape, options(KvMode::fp));
  kv->add_sequence(1, 600);
  AttentionPlan plan;
  kv->plan(std::vector<PlanItem>{PlanItem{1, 0, 512, 0}}, PlanPolicy{.row_block = 16, .balance = true}, plan);
  double lo = 1e300, hi = 0;
  int rows = 0;
  for (const PlanTask& t : plan.tasks) {
    if (t.head_begin != 0) continue;
    rows += t.n_rows;
    lo = std::min(lo, t.work);
    hi = std::max(hi, t.work);
  }
  REQUIRE(rows == 512);
  INFO("row block work " << lo << " .. " << hi);
  REQUIRE(hi / lo < 1.3);  // fixed 16-row blocks: the last costs ~60x the first
}
