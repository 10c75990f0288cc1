// The attention plan of a step (kv/attention_plan.h) and CpuPagedKvCache::plan / run: the plan
// predicts what every layer holds after the step's appends, run equals the per-head
// reference attend for prefill chunks and decode tokens mixed in one batch, its results do
// not depend on the thread count or on the rest of the batch, a selection attends to
// exactly the selected segments, misuse is reported, and a decode step allocates nothing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/attention_plan.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"
#include "support/alloc_counter.h"

using namespace hack;
using hack::test::KvStream;

namespace {

KvCacheOptions options_for(KvMode mode, int block, int recent = 0) {
  KvCacheOptions o;
  o.mode = mode;
  o.block_tokens = block;
  o.fp_dtype = DType::f32;
  o.k_bits = o.v_bits = 2;
  o.recent_tokens = recent;
  return o;
}

// One sequence of the step: `before` tokens stored already, then a chunk of `n`.
struct Chunk {
  int before = 0;
  int n = 1;
};

// A batch of chunks over one cache; every sequence has its own stream.
struct Step {
  const KvShape shape;
  std::vector<Chunk> chunks;
  std::vector<KvStream> streams;
  std::vector<PlanItem> items;
  int rows = 0;

  Step(const KvShape& s, std::vector<Chunk> c) : shape(s), chunks(std::move(c)) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& ch = chunks[i];
      // Seeded by the chunk's shape, so a chunk has the same data in any batch.
      streams.emplace_back(ch.before + ch.n, s.num_kv_heads, s.group_size, s.head_dim,
                           static_cast<uint32_t>(300 + 7 * ch.before + ch.n));
      items.push_back(PlanItem{static_cast<int>(i), ch.before, ch.n, rows});
      rows += ch.n;
    }
  }
  size_t row_floats() const { return static_cast<size_t>(shape.num_kv_heads * shape.group_size * shape.head_dim); }

  // Opens every sequence and stores what precedes the step (in two appends, so HACK
  // blocks close as in serving).
  void fill(CpuPagedKvCache& cache) const {
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int seq = static_cast<int>(i), before = chunks[i].before;
      cache.add_sequence(seq, before + chunks[i].n);
      const int first = before / 2;
      for (int l = 0; l < shape.num_layers; ++l) {
        if (first > 0) cache.append(l, seq, 0, first, streams[i].k_at(0), streams[i].v_at(0));
        if (before > first) cache.append(l, seq, first, before - first, streams[i].k_at(first), streams[i].v_at(first));
      }
    }
  }
  void append_layer(CpuPagedKvCache& cache, int layer) const {
    for (size_t i = 0; i < chunks.size(); ++i)
      cache.append(layer, static_cast<int>(i), chunks[i].before, chunks[i].n, streams[i].k_at(chunks[i].before),
                   streams[i].v_at(chunks[i].before));
  }
  // The batch's query rows: [rows][H·G·d].
  std::vector<float> q() const {
    std::vector<float> out;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const float* from = streams[i].q_at(chunks[i].before);
      out.insert(out.end(), from, from + static_cast<size_t>(chunks[i].n) * row_floats());
    }
    return out;
  }
};

// Output of every layer, [layer][rows][H·G·d], by plan + run.
std::vector<float> run_planned(const Step& step, const KvCacheOptions& o, int threads, AttentionPlan* plan_out = nullptr) {
  CpuPagedKvCache cache(step.shape, o);
  step.fill(cache);
  ThreadPool pool(threads);
  AttentionPlan plan;
  cache.plan(step.items, PlanPolicy{}, plan);
  AttentionWorkspace ws;
  const std::vector<float> q = step.q();
  const size_t layer_floats = static_cast<size_t>(step.rows) * step.row_floats();
  std::vector<float> out(static_cast<size_t>(step.shape.num_layers) * layer_floats);
  for (int l = 0; l < step.shape.num_layers; ++l) {
    step.append_layer(cache, l);
    cache.run(plan, l, q.data(), step.row_floats(), out.data() + static_cast<size_t>(l) * layer_floats,
              step.row_floats(), 0.125f, pool, ws);
  }
  if (plan_out) *plan_out = plan;
  return out;
}

// The same by the per-head reference attend.
std::vector<float> run_reference(const Step& step, const KvCacheOptions& o) {
  CpuPagedKvCache cache(step.shape, o);
  step.fill(cache);
  const std::vector<float> q = step.q();
  const size_t row = step.row_floats(), layer_floats = static_cast<size_t>(step.rows) * row;
  const size_t group_floats = static_cast<size_t>(step.shape.group_size * step.shape.head_dim);
  std::vector<float> out(static_cast<size_t>(step.shape.num_layers) * layer_floats);
  std::vector<float> scratch(cache.attend_scratch_floats(256));
  for (int l = 0; l < step.shape.num_layers; ++l) {
    step.append_layer(cache, l);
    for (size_t i = 0; i < step.chunks.size(); ++i) {
      const PlanItem& it = step.items[i];
      for (int h = 0; h < step.shape.num_kv_heads; ++h) {
        const size_t off = static_cast<size_t>(it.row) * row + static_cast<size_t>(h) * group_floats;
        cache.attend(l, it.seq_id, h, it.start_pos, it.n_tokens, q.data() + off, row,
                     out.data() + static_cast<size_t>(l) * layer_floats + off, row, 0.125f, scratch.data());
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a step's plan run in every layer equals per-head attend, for any thread count", "[kv][plan]") {
  const KvShape shape{2, 2, 64, 4};
  const int block = 32;
  // A prefill from scratch, decode tokens short and long (the 1200-token one splits: more
  // than 32 segments), a chunk continuing a stored prompt.
  const Step step(shape, {{0, 50}, {33, 1}, {1199, 1}, {100, 20}, {4 + 32 * 9 - 1, 1}});
  for (KvMode mode : {KvMode::hack, KvMode::fp})
    for (int recent : {0, 40}) {
      if (mode == KvMode::fp && recent > 0) continue;
      const KvCacheOptions o = options_for(mode, block, recent);
      INFO(describe(o));
      AttentionPlan plan;
      const std::vector<float> one = run_planned(step, o, 1, &plan);
      const std::vector<float> reference = run_reference(step, o);
      // Plans of a batch of 5: 4 of the items fit one task's 32 segments, the long decode
      // item is split, the prefill chunks are cut into 16-row blocks per head.
      REQUIRE(plan.items.size() == 5);
      REQUIRE(plan.items[2].closed_pages == (mode == KvMode::fp ? 38 : (1199 - recent - 4) / block));
      const size_t row = static_cast<size_t>(shape.num_kv_heads * shape.group_size * shape.head_dim);
      const size_t layer_floats = static_cast<size_t>(step.rows) * row;
      for (int l = 0; l < shape.num_layers; ++l)
        for (size_t i = 0; i < step.items.size(); ++i) {
          const PlanItem& it = step.items[i];
          const bool split = i == 2;
          for (size_t e = 0; e < static_cast<size_t>(it.n_tokens) * row; ++e) {
            const size_t at = static_cast<size_t>(l) * layer_floats + static_cast<size_t>(it.row) * row + e;
            INFO("layer " << l << " item " << i << " element " << e);
            // Unsplit work is the reference's computation, bit for bit; a split merges
            // partial softmax states (fp32 rounding).
            if (split) REQUIRE(std::fabs(one[at] - reference[at]) <= 1e-5 + 1e-5 * std::fabs(reference[at]));
            else REQUIRE(one[at] == reference[at]);
          }
        }
      for (int threads : {2, 5}) REQUIRE(run_planned(step, o, threads) == one);
    }
}

TEST_CASE("a sequence's attention does not depend on the rest of the batch", "[kv][plan]") {
  const KvShape shape{1, 2, 64, 2};
  const KvCacheOptions o = options_for(KvMode::hack, 16);
  const Step alone(shape, {{1000, 1}});
  const Step batched(shape, {{40, 1}, {1000, 1}, {10, 30}});
  const std::vector<float> a = run_planned(alone, o, 2);
  const std::vector<float> b = run_planned(batched, o, 2);
  const size_t row = alone.row_floats();
  REQUIRE(std::memcmp(a.data(), b.data() + static_cast<size_t>(batched.items[1].row) * row, row * sizeof(float)) == 0);
}

TEST_CASE("the plan lists each item's segments as every layer holds them after the step", "[kv][plan]") {
  const KvShape shape{3, 1, 16, 1};
  KvCacheOptions o = options_for(KvMode::hack, 16);
  o.sinks = 4;
  CpuPagedKvCache cache(shape, o);
  const KvStream data(200, 1, 1, 16, 3);
  cache.add_sequence(0, 200);
  for (int l = 0; l < 3; ++l) cache.append(l, 0, 0, 4 + 16 * 3, data.k_at(0), data.v_at(0));  // 3 blocks pending
  AttentionPlan plan;
  const std::vector<PlanItem> items{{0, 52, 20, 0}};
  cache.plan(items, PlanPolicy{}, plan);
  // The append closes the 3 pending blocks, then 20 tokens fill block 3 and start block 4.
  const std::vector<PlanSegment> expect = {{0, 4, SegmentSlot::sinks, 0},   {4, 16, SegmentSlot::closed, 0},
                                           {20, 16, SegmentSlot::closed, 1}, {36, 16, SegmentSlot::closed, 2},
                                           {52, 16, SegmentSlot::pending, 0}, {68, 4, SegmentSlot::open, 0}};
  const auto got = plan.segments_of(0);
  REQUIRE(got.size() == expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    INFO("segment " << i);
    CHECK(got[i].first_token == expect[i].first_token);
    CHECK(got[i].tokens == expect[i].tokens);
    CHECK(got[i].slot == expect[i].slot);
    CHECK(got[i].index == expect[i].index);
  }
  REQUIRE(plan.items[0].closed_pages == 3);
  // Two row blocks of 16 + 4 query rows, one KV head.
  REQUIRE(plan.tasks.size() == 2);
  for (int l = 0; l < 3; ++l) cache.append(l, 0, 52, 20, data.k_at(52), data.v_at(52));
  REQUIRE(cache.hack_page_count(0, 2) == 3);
  REQUIRE(cache.pending_block_count(0, 2) == 1);
}

TEST_CASE("a selection attends to exactly the selected segments", "[kv][plan]") {
  // fp32 pages of 16 tokens; sequence of 100 stored + 1 decode token = 7 segments.
  const KvShape shape{1, 2, 32, 2};
  const KvCacheOptions o = options_for(KvMode::fp, 16);
  const Step step(shape, {{100, 1}, {20, 3}});
  CpuPagedKvCache cache(shape, o);
  step.fill(cache);
  AttentionPlan plan;
  cache.plan(step.items, PlanPolicy{}, plan);
  REQUIRE(plan.segments_of(0).size() == 7);
  const std::vector<int> chosen = {0, 3, 6};
  select_segments(plan, 0, 1, chosen);  // head 1 of the decode item; head 0 keeps all
  build_plan_tasks(plan, PlanPolicy{});
  REQUIRE_THROWS_AS(select_segments(plan, 0, 0, std::vector<int>{2, 1}), Error);  // not ascending
  REQUIRE_THROWS_AS(select_segments(plan, 0, 0, std::vector<int>{7}), Error);     // no such segment
  REQUIRE_THROWS_AS(select_segments(plan, 5, 0, std::vector<int>{0}), Error);     // no such item
  step.append_layer(cache, 0);
  ThreadPool pool(2);
  AttentionWorkspace ws;
  const std::vector<float> q = step.q();
  std::vector<float> out(static_cast<size_t>(step.rows) * step.row_floats());
  cache.run(plan, 0, q.data(), step.row_floats(), out.data(), step.row_floats(), 0.125f, pool, ws);
  const std::vector<float> full = run_reference(step, o);
  const int G = shape.group_size, d = shape.head_dim;
  // Head 0 and the other item: as without a selection.
  for (int c = 0; c < G * d; ++c) REQUIRE(out[static_cast<size_t>(c)] == full[static_cast<size_t>(c)]);
  for (size_t c = step.row_floats(); c < out.size(); ++c) REQUIRE(out[c] == full[c]);
  // Head 1: softmax over tokens [0, 16) ∪ [48, 64) ∪ [96, 101) only, in double.
  const KvStream& s = step.streams[0];
  std::vector<int> tokens;
  for (int t = 0; t < 16; ++t) tokens.push_back(t);
  for (int t = 48; t < 64; ++t) tokens.push_back(t);
  for (int t = 96; t <= 100; ++t) tokens.push_back(t);
  for (int g = 0; g < G; ++g) {
    const float* qrow = s.q_at(100) + static_cast<size_t>((G + g) * d);
    std::vector<double> expect(static_cast<size_t>(d));
    test::reference_attention(
        qrow, 0.125f, static_cast<int>(tokens.size()) - 1, d,
        [&](int j, int c) { return static_cast<double>(s.k_val(tokens[static_cast<size_t>(j)], 1, c)); },
        [&](int j, int c) { return static_cast<double>(s.v_val(tokens[static_cast<size_t>(j)], 1, c)); },
        expect.data());
    for (int c = 0; c < d; ++c) {
      const float got = out[static_cast<size_t>((G + g) * d + c)];
      INFO("group " << g << " channel " << c);
      REQUIRE(std::fabs(got - expect[static_cast<size_t>(c)]) <= 1e-5 + 1e-5 * std::fabs(expect[static_cast<size_t>(c)]));
    }
  }
}

TEST_CASE("plan and run report misuse", "[kv][plan]") {
  const KvShape shape{2, 1, 16, 1};
  CpuPagedKvCache cache(shape, options_for(KvMode::hack, 16));
  const KvStream data(60, 1, 1, 16, 4);
  cache.add_sequence(0, 40);
  cache.append(0, 0, 0, 10, data.k_at(0), data.v_at(0));
  cache.append(1, 0, 0, 10, data.k_at(0), data.v_at(0));
  AttentionPlan plan;
  const std::vector<PlanItem> wrong_start{{0, 9, 1, 0}}, too_long{{0, 10, 31, 0}}, unknown{{4, 0, 1, 0}},
      twice{{0, 10, 1, 0}, {0, 10, 1, 1}}, empty{{0, 10, 0, 0}};
  REQUIRE_THROWS_AS(cache.plan(wrong_start, PlanPolicy{}, plan), Error);
  REQUIRE_THROWS_AS(cache.plan(too_long, PlanPolicy{}, plan), Error);
  REQUIRE_THROWS_AS(cache.plan(unknown, PlanPolicy{}, plan), Error);
  REQUIRE_THROWS_AS(cache.plan(twice, PlanPolicy{}, plan), Error);
  REQUIRE_THROWS_AS(cache.plan(empty, PlanPolicy{}, plan), Error);
  const std::vector<PlanItem> ok{{0, 10, 1, 0}};
  cache.plan(ok, PlanPolicy{}, plan);
  ThreadPool pool(1);
  AttentionWorkspace ws;
  std::vector<float> q(16), out(16);
  // Layer 0 has not stored the step's token yet: the plan does not fit it.
  REQUIRE_THROWS_AS(cache.run(plan, 0, q.data(), 16, out.data(), 16, 1.0f, pool, ws), Error);
  REQUIRE_THROWS_AS(cache.run(plan, 2, q.data(), 16, out.data(), 16, 1.0f, pool, ws), Error);
  cache.append(0, 0, 10, 1, data.k_at(10), data.v_at(10));
  cache.run(plan, 0, q.data(), 16, out.data(), 16, 1.0f, pool, ws);
  CpuPagedKvCache other(KvShape{2, 2, 16, 1}, options_for(KvMode::hack, 16));
  REQUIRE_THROWS_AS(other.run(plan, 0, q.data(), 16, out.data(), 16, 1.0f, pool, ws), Error);
  PlanPolicy bad;
  bad.split_segments = 0;
  REQUIRE_THROWS_AS(build_plan_tasks(plan, bad), Error);
}

TEST_CASE("a decode step allocates nothing, in any thread", "[kv][plan]") {
  const int dim = 128, group = 4, block = 16, H = 2;
  const KvShape shape{2, H, dim, group};
  CpuPagedKvCache cache(shape, options_for(KvMode::hack, block));
  const KvStream a(800, H, group, dim, 8), b(800, H, group, dim, 9);
  cache.add_sequence(0, 800);
  cache.add_sequence(1, 800);
  for (int l = 0; l < 2; ++l) {
    cache.append(l, 0, 0, 100, a.k_at(0), a.v_at(0));
    cache.append(l, 1, 0, 600, b.k_at(0), b.v_at(0));  // long enough to split (> 32 pages)
  }
  ThreadPool pool(3);
  AttentionPlan plan;
  AttentionWorkspace ws;
  std::vector<PlanItem> items(2);
  std::vector<float> q(2 * static_cast<size_t>(H * group * dim)), out(q.size());
  auto step = [&](int t) {
    items[0] = PlanItem{0, 100 + t, 1, 0};
    items[1] = PlanItem{1, 600 + t, 1, 1};
    cache.plan(items, PlanPolicy{}, plan);
    for (int l = 0; l < 2; ++l) {
      cache.append(l, 0, 100 + t, 1, a.k_at(100 + t), a.v_at(100 + t));
      cache.append(l, 1, 600 + t, 1, b.k_at(600 + t), b.v_at(600 + t));
      std::memcpy(q.data(), a.q_at(100 + t), q.size() / 2 * sizeof(float));
      std::memcpy(q.data() + q.size() / 2, b.q_at(600 + t), q.size() / 2 * sizeof(float));
      cache.run(plan, l, q.data(), q.size() / 2, out.data(), q.size() / 2, 0.1f, pool, ws);
    }
  };
  step(0);  // sizes the plan and the workspace, and takes the pools' first slabs
  step(1);
  long allocations = 0;
  for (int t = 2; t < 100; ++t) {  // crosses several block boundaries
    const long before = test::process_allocations();
    step(t);
    allocations += test::process_allocations() - before;
  }
  REQUIRE(allocations == 0);
  REQUIRE(plan.tasks.size() > 2);  // the long sequence was split: several threads worked
}
