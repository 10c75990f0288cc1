#include "hack/backend/flat_plan.h"

#include <algorithm>

#include "hack/core/error.h"

namespace hack {

namespace {

const char* slot_name(SegmentSlot s) {
  switch (s) {
    case SegmentSlot::sinks: return "sinks";
    case SegmentSlot::closed: return "closed";
    case SegmentSlot::pending: return "pending";
    case SegmentSlot::open: return "open";
  }
  return "?";
}

// Tasks that differ only in their segment range (the splits of one unit); CpuPagedKvCache::run
// merges them in plan order by the same rule.
bool same_unit(const PlanTask& a, const PlanTask& b) {
  return a.item == b.item && a.head_begin == b.head_begin && a.row_begin == b.row_begin;
}

}  // namespace

DevicePlanSegment resolve_plan_segment(const PlanSegment& s, int closed_pages, const DevicePoolLayout& pool,
                                       const DeviceItemPages& pages) {
  const int P = pool.page_tokens, S = pool.sinks;
  HACK_CHECK(P > 0 && S >= 0 && S <= P, "device plan: pool of {}-token pages with {} sinks", P, S);
  HACK_CHECK(s.tokens > 0 && s.first_token >= 0, "device plan: {} segment {} holds {} tokens at {}", slot_name(s.slot),
             s.index, s.tokens, s.first_token);
  DevicePlanSegment out;
  out.first_token = s.first_token;
  out.tokens = s.tokens;
  if (s.slot == SegmentSlot::closed && pool.hack) {
    HACK_CHECK(s.index >= 0 && s.index < closed_pages && static_cast<size_t>(s.index) < pages.hack.size(),
               "device plan: closed segment {} but the sequence has {} closed blocks and {} HACK pages", s.index,
               closed_pages, pages.hack.size());
    HACK_CHECK(s.first_token == S + s.index * P && s.tokens == P,
               "device plan: closed segment {} covers [{}, +{}), block {} is [{}, +{})", s.index, s.first_token,
               s.tokens, s.index, S + s.index * P, P);
    out.kind = DevicePageKind::hack;
    out.page = pages.hack[static_cast<size_t>(s.index)];
    out.row = 0;
    return out;
  }
  HACK_CHECK(s.slot != SegmentSlot::sinks || (S > 0 && s.first_token == 0 && s.tokens <= S),
             "device plan: sinks segment [{}, +{}) but the pool keeps {} sinks", s.first_token, s.tokens, S);
  const int row = device_pool_row(pool, s.first_token);
  const int page_index = row / P;
  if (s.slot == SegmentSlot::pending) {
    const int block_page = (S > 0 ? 1 : 0) + closed_pages + s.index;
    HACK_CHECK(page_index == block_page, "device plan: pending segment {} at token {} sits in page {}, block {} in {}",
               s.index, s.first_token, page_index, closed_pages + s.index, block_page);
  }
  HACK_CHECK(row % P + s.tokens <= P, "device plan: {} segment [{}, +{}) crosses a page boundary (rows {} of {})",
             slot_name(s.slot), s.first_token, s.tokens, row, P);
  HACK_CHECK(static_cast<size_t>(page_index) < pages.exact.size(),
             "device plan: {} segment at token {} needs page {} of a {}-page table", slot_name(s.slot), s.first_token,
             page_index, pages.exact.size());
  out.kind = DevicePageKind::exact;
  out.page = pages.exact[static_cast<size_t>(page_index)];
  out.row = row % P;
  return out;
}

void FlatPlan::clear() {
  tasks.clear();
  segments.clear();
  selected.clear();
  order.clear();
  units.clear();
  max_task_heads = 0;
  max_unit_heads = 0;
  state_floats = 0;
  state_v_dim = 0;
}

void flatten_plan(const AttentionPlan& plan, const DevicePoolLayout& pool, std::span<const DeviceItemPages> pages,
                  FlatPlan& out) {
  HACK_CHECK(pages.size() == plan.items.size(), "device plan: page tables for {} items, the plan has {}", pages.size(),
             plan.items.size());
  out.clear();
  out.state_floats = plan.state_floats;
  out.state_v_dim = plan.state_v_dim;
  out.segments.resize(plan.segments.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& it = plan.items[i];
    for (int s = plan.segment_offsets[i]; s < plan.segment_offsets[i + 1]; ++s) {
      try {
        out.segments[static_cast<size_t>(s)] =
            resolve_plan_segment(plan.segments[static_cast<size_t>(s)], it.closed_pages, pool, pages[i]);
      } catch (const Error& e) {
        fail("sequence {} (plan item {}), segment {}: {}", it.seq_id, i, s - plan.segment_offsets[i], e.what());
      }
    }
  }
  out.selected.assign(plan.selected.begin(), plan.selected.end());
  const size_t T = plan.tasks.size();
  out.tasks.resize(T);
  for (size_t i = 0; i < T; ++i) {
    const PlanTask& t = plan.tasks[i];
    const PlanItem& it = plan.items[static_cast<size_t>(t.item)];
    DevicePlanTask& d = out.tasks[i];
    d.start_pos = it.start_pos + t.row_begin;
    d.q_row = it.row + t.row_begin;
    d.n_rows = t.n_rows;
    d.head_begin = t.head_begin;
    d.head_end = t.head_end;
    d.seg_begin = t.seg_begin;
    d.seg_end = t.seg_end;
    d.seg_base = plan.segment_offsets[static_cast<size_t>(t.item)];
    // As CpuPagedKvCache::run_task: a one-head task reads its head's selection when there is one.
    d.selection = -1;
    if (t.head_end - t.head_begin == 1 && !plan.selection_of(t.item, t.head_begin).empty())
      d.selection = plan.selection_offsets[static_cast<size_t>(t.item) * static_cast<size_t>(plan.num_kv_heads) +
                                           static_cast<size_t>(t.head_begin)];
    const bool first = i == 0 || !same_unit(plan.tasks[i - 1], t);
    const bool last = i + 1 == T || !same_unit(t, plan.tasks[i + 1]);
    d.alone = first && last ? 1 : 0;
    d.state = t.state;
    out.max_task_heads = std::max(out.max_task_heads, t.head_end - t.head_begin);
    if (first && !last) out.units.push_back({static_cast<int32_t>(i), 0});
    if (!d.alone) {
      ++out.units.back().n_tasks;
      out.max_unit_heads = std::max(out.max_unit_heads, t.head_end - t.head_begin);
    }
  }
  const size_t layers = static_cast<size_t>(std::max(plan.num_layers, 1));
  if (plan.order.size() == layers * T) {
    out.order.assign(plan.order.begin(), plan.order.end());
  } else {
    out.order.resize(layers * T);
    for (size_t l = 0; l < layers; ++l)
      for (size_t i = 0; i < T; ++i) out.order[l * T + i] = static_cast<int32_t>(i);
  }
}

PlanPolicy device_plan_policy(int sm_count) {
  HACK_CHECK(sm_count > 0, "device plan policy: {} multiprocessors", sm_count);
  PlanPolicy p;
  p.row_block = 16;
  p.split_segments = 16;
  p.balance = true;
  p.workers = 8 * sm_count;
  return p;
}

}  // namespace hack
