// The host side of a device attention runner (backend/flat_plan.h), without a GPU: segments
// of real plans (CpuPagedKvCache::plan) resolve to the page and row every one of their tokens
// occupies in the device pool layout, worked out token by token here (row of token p, then
// page table entry row / Π) rather than segment by segment as resolve_plan_segment does;
// tasks carry their items' fields, selections and split units as CpuPagedKvCache::run reads them.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "hack/backend/flat_plan.h"
#include "hack/core/error.h"
#include "hack/backend/cpu_paged_kv_cache.h"

using namespace hack;

namespace {

constexpr int kPage = 16, kSinks = 4, kHeads = 2, kDim = 32;

// Distinct, shuffled-looking page ids, so a wrong index shows as a wrong id.
std::vector<int> table(int n, int base) {
  std::vector<int> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + (i * 7) % n * 3 + i % 2;
  return t;
}

// Row of token p in the device pool, from its definition (CudaPagedKvCache: sinks in page 0's
// first S rows, block b of Π tokens after them in page 1 + b; no sinks: row p).
int row_of(int p, int sinks) {
  if (sinks == 0 || p < sinks) return p;
  return (1 + (p - sinks) / kPage) * kPage + (p - sinks) % kPage;
}

struct Fixture {
  KvShape shape;
  KvCacheOptions options;
  std::unique_ptr<CpuPagedKvCache> cache;
  Fixture(KvMode mode, int sinks) {
    shape.num_layers = 2;
    shape.num_kv_heads = kHeads;
    shape.head_dim = kDim;
    shape.group_size = 2;
    options.mode = mode;
    options.block_tokens = kPage;
    options.sinks = sinks;
    options.k_group = options.v_group = kDim;
    cache = std::make_unique<CpuPagedKvCache>(shape, options);
  }
  void add(int seq, int tokens, int max_tokens) {
    cache->add_sequence(seq, max_tokens);
    std::vector<float> kv(static_cast<size_t>(tokens) * kHeads * kDim, 0.5f);
    for (int l = 0; l < shape.num_layers; ++l) cache->append(l, seq, 0, tokens, kv.data(), kv.data());
  }
};

// Every token of every segment lies where its resolution says.
void check_resolution(const AttentionPlan& plan, const FlatPlan& flat, const DevicePoolLayout& pool,
                      const std::vector<std::vector<int>>& exact, const std::vector<std::vector<int>>& hack) {
  REQUIRE(flat.segments.size() == plan.segments.size());
  for (size_t i = 0; i < plan.items.size(); ++i)
    for (int s = plan.segment_offsets[i]; s < plan.segment_offsets[i + 1]; ++s) {
      const PlanSegment& ps = plan.segments[static_cast<size_t>(s)];
      const DevicePlanSegment& d = flat.segments[static_cast<size_t>(s)];
      INFO("item " << i << " segment " << s << " first " << ps.first_token << " tokens " << ps.tokens);
      REQUIRE(d.first_token == ps.first_token);
      REQUIRE(d.tokens == ps.tokens);
      if (pool.hack && ps.slot == SegmentSlot::closed) {
        REQUIRE(d.kind == DevicePageKind::hack);
        const int block = (ps.first_token - pool.sinks) / kPage;
        REQUIRE(d.page == hack[i][static_cast<size_t>(block)]);
        REQUIRE(d.row == 0);
        continue;
      }
      REQUIRE(d.kind == DevicePageKind::exact);
      for (int p = ps.first_token; p < ps.first_token + ps.tokens; ++p) {
        const int row = row_of(p, pool.sinks);
        REQUIRE(exact[i][static_cast<size_t>(row / kPage)] == d.page);
        REQUIRE(row % kPage == d.row + (p - ps.first_token));
      }
    }
}

bool same_unit(const PlanTask& a, const PlanTask& b) {
  return a.item == b.item && a.head_begin == b.head_begin && a.row_begin == b.row_begin;
}

void check_tasks(const AttentionPlan& plan, const FlatPlan& flat) {
  REQUIRE(flat.tasks.size() == plan.tasks.size());
  size_t in_units = 0;
  for (const DevicePlanUnit& u : flat.units) {
    REQUIRE(u.n_tasks >= 2);
    in_units += static_cast<size_t>(u.n_tasks);
    for (int k = 1; k < u.n_tasks; ++k)
      REQUIRE(same_unit(plan.tasks[static_cast<size_t>(u.first_task)], plan.tasks[static_cast<size_t>(u.first_task + k)]));
  }
  size_t alone = 0;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const PlanTask& t = plan.tasks[i];
    const PlanItem& it = plan.items[static_cast<size_t>(t.item)];
    const DevicePlanTask& d = flat.tasks[i];
    REQUIRE(d.start_pos == it.start_pos + t.row_begin);
    REQUIRE(d.q_row == it.row + t.row_begin);
    REQUIRE(d.n_rows == t.n_rows);
    REQUIRE(d.head_begin == t.head_begin);
    REQUIRE(d.head_end == t.head_end);
    REQUIRE(d.seg_begin == t.seg_begin);
    REQUIRE(d.seg_end == t.seg_end);
    REQUIRE(d.seg_base == plan.segment_offsets[static_cast<size_t>(t.item)]);
    REQUIRE(d.state == t.state);
    const std::span<const int> sel = plan.selection_of(t.item, t.head_begin);
    if (t.head_end - t.head_begin == 1 && !sel.empty()) {
      REQUIRE(d.selection >= 0);
      for (int s = t.seg_begin; s < t.seg_end; ++s)
        REQUIRE(flat.selected[static_cast<size_t>(d.selection + s)] == sel[static_cast<size_t>(s)]);
    } else {
      REQUIRE(d.selection == -1);
    }
    const bool lone = (i == 0 || !same_unit(plan.tasks[i - 1], t)) &&
                      (i + 1 == plan.tasks.size() || !same_unit(t, plan.tasks[i + 1]));
    REQUIRE(d.alone == (lone ? 1 : 0));
    alone += lone ? 1 : 0;
  }
  REQUIRE(alone + in_units == plan.tasks.size());
  REQUIRE(flat.order == std::vector<int32_t>(plan.order.begin(), plan.order.end()));
  REQUIRE(flat.state_floats == plan.state_floats);
}

}  // namespace

TEST_CASE("device plan: segments resolve to the pages their tokens occupy", "[backend][device_plan]") {
  for (const auto& [mode, sinks] : {std::pair{KvMode::hack, kSinks}, std::pair{KvMode::hack, 0}, std::pair{KvMode::fp, 0}}) {
    INFO("mode " << (mode == KvMode::hack ? "hack" : "fp") << " sinks " << sinks);
    Fixture f(mode, sinks);
    // Contexts: one sink token, Π−1 / Π / Π+1 past the sinks, several blocks, a long one.
    const std::vector<int> lengths = {1, sinks + kPage - 1, sinks + kPage, sinks + kPage + 1, sinks + 5 * kPage + 3,
                                      sinks + 12 * kPage};
    const int max_tokens = 20 * kPage;
    std::vector<PlanItem> items;
    for (size_t i = 0; i < lengths.size(); ++i) {
      f.add(static_cast<int>(i), lengths[i], max_tokens);
      items.push_back({static_cast<int>(i), lengths[i], 1, static_cast<int>(i), 0});
    }
    // A prefill chunk after some context (pending blocks fill during its append) and a fresh one.
    f.add(10, sinks + 2 * kPage + 5, max_tokens);
    items.push_back({10, sinks + 2 * kPage + 5, 3 * kPage + 2, 10, 0});
    f.cache->add_sequence(11, max_tokens);
    items.push_back({11, 0, 2 * kPage + 7, 10 + 3 * kPage + 2, 0});
    PlanPolicy policy;
    policy.split_segments = 2;
    AttentionPlan plan;
    f.cache->plan(items, policy, plan);
    bool pending = false, closed = false, open = false;
    for (const PlanSegment& s : plan.segments) {
      pending |= s.slot == SegmentSlot::pending;
      closed |= s.slot == SegmentSlot::closed;
      open |= s.slot == SegmentSlot::open;
    }
    REQUIRE(closed);
    if (mode == KvMode::hack) REQUIRE((pending && open));

    const DevicePoolLayout pool{kPage, mode == KvMode::hack ? sinks : 0, mode == KvMode::hack};
    std::vector<std::vector<int>> exact, hack;
    std::vector<DeviceItemPages> pages;
    for (size_t i = 0; i < items.size(); ++i) {
      exact.push_back(table(max_tokens / kPage + 2, 1000 * static_cast<int>(i + 1)));
      hack.push_back(mode == KvMode::hack ? table(max_tokens / kPage, 500 + 1000 * static_cast<int>(i + 1))
                                          : std::vector<int>{});
    }
    for (size_t i = 0; i < items.size(); ++i) pages.push_back({exact[i], hack[i]});
    FlatPlan flat;
    flatten_plan(plan, pool, pages, flat);
    check_resolution(plan, flat, pool, exact, hack);
    check_tasks(plan, flat);
    REQUIRE_FALSE(flat.units.empty());  // split_segments 2 splits the long decodes

    // A selection: per-head tasks read their head's list.
    AttentionPlan selected;
    copy_plan(plan, selected);
    const int item = 5;  // the longest decode
    const int n = selected.segment_offsets[item + 1] - selected.segment_offsets[item];
    const std::vector<int> chosen = {0, 2, 3, n - 1};
    select_segments(selected, item, 1, chosen);
    build_plan_tasks(selected, policy);
    flatten_plan(selected, pool, pages, flat);
    check_tasks(selected, flat);
    bool saw = false;
    for (const DevicePlanTask& t : flat.tasks) saw |= t.selection >= 0;
    REQUIRE(saw);
  }
}

TEST_CASE("device plan: bad page tables and segments are refused by name", "[backend][device_plan]") {
  const DevicePoolLayout hack_pool{kPage, kSinks, true};
  const std::vector<int> exact = {7, 8}, hack = {3};
  const DeviceItemPages pages{exact, hack};
  // HACK page 1 of a one-entry table.
  REQUIRE_THROWS_WITH(resolve_plan_segment({kSinks + kPage, kPage, SegmentSlot::closed, 1}, 2, hack_pool, pages),
                      Catch::Contains("closed segment 1"));
  // The open block past the table's two pages.
  REQUIRE_THROWS_WITH(resolve_plan_segment({kSinks + 2 * kPage, 3, SegmentSlot::open, 0}, 2, hack_pool, pages),
                      Catch::Contains("page 3 of a 2-page table"));
  // A pending block that is not block closed_pages + index.
  REQUIRE_THROWS_WITH(resolve_plan_segment({kSinks, kPage, SegmentSlot::pending, 0}, 1, hack_pool, pages),
                      Catch::Contains("pending segment 0"));
  // A segment crossing a page boundary (fp pool, no sinks).
  const DevicePoolLayout fp_pool{kPage, 0, false};
  REQUIRE_THROWS_WITH(resolve_plan_segment({kPage - 2, 4, SegmentSlot::closed, 0}, 0, fp_pool, pages),
                      Catch::Contains("crosses a page boundary"));
  // The sinks go to page 0, row 0.
  const DevicePlanSegment s = resolve_plan_segment({0, kSinks, SegmentSlot::sinks, 0}, 0, hack_pool, pages);
  REQUIRE((s.kind == DevicePageKind::exact && s.page == 7 && s.row == 0));
}

TEST_CASE("device plan: state layout and the device policy", "[backend][device_plan]") {
  for (int rows : {1, 2, 5, 16, 33, 128})
    for (int v_dim : {16, 64, 128}) REQUIRE(device_plan_head_state_floats(rows, v_dim) == plan_head_state_floats(rows, v_dim));
  const PlanPolicy p = device_plan_policy(132);
  REQUIRE(p.workers == 8 * 132);
  REQUIRE(p.split_segments == 16);
  REQUIRE_THROWS(device_plan_policy(0));
}
