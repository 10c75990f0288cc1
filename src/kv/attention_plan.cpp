#include "hack/kv/attention_plan.h"

#include <algorithm>

#include "hack/core/error.h"

namespace hack {

namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

void AttentionPlan::clear() {
  items.clear();
  segment_offsets.assign(1, 0);
  segments.clear();
  selection_offsets.clear();
  selected.clear();
  tasks.clear();
  state_floats = 0;
  state_v_dim = 0;
  max_task_rows = 0;
}

std::span<const int> AttentionPlan::selection_of(int item, int head) const {
  if (selection_offsets.empty()) return {};
  const size_t at = static_cast<size_t>(item) * static_cast<size_t>(num_kv_heads) + static_cast<size_t>(head);
  return {selected.data() + selection_offsets[at], selected.data() + selection_offsets[at + 1]};
}


size_t plan_head_state_floats(int rows, int v_dim) {
  const size_t r = static_cast<size_t>(rows);
  return align16(3 * r) + align16(r * static_cast<size_t>(v_dim));
}

void select_segments(AttentionPlan& plan, int item, int head, std::span<const int> chosen) {
  const size_t H = static_cast<size_t>(plan.num_kv_heads);
  HACK_CHECK(item >= 0 && static_cast<size_t>(item) < plan.items.size() && head >= 0 && head < plan.num_kv_heads,
             "attention plan: no item {} / KV head {}", item, head);
  const int n = plan.segment_offsets[static_cast<size_t>(item) + 1] - plan.segment_offsets[static_cast<size_t>(item)];
  for (size_t i = 0; i < chosen.size(); ++i)
    HACK_CHECK(chosen[i] >= 0 && chosen[i] < n && (i == 0 || chosen[i - 1] < chosen[i]),
               "attention plan: item {} head {}: selection must be ascending segment indices below {}", item, head, n);
  if (plan.selection_offsets.empty()) plan.selection_offsets.assign(plan.items.size() * H + 1, 0);
  const size_t at = static_cast<size_t>(item) * H + static_cast<size_t>(head);
  const int begin = plan.selection_offsets[at], end = plan.selection_offsets[at + 1];
  plan.selected.erase(plan.selected.begin() + begin, plan.selected.begin() + end);
  plan.selected.insert(plan.selected.begin() + begin, chosen.begin(), chosen.end());
  const int delta = static_cast<int>(chosen.size()) - (end - begin);
  for (size_t i = at + 1; i < plan.selection_offsets.size(); ++i) plan.selection_offsets[i] += delta;
}

void build_plan_tasks(AttentionPlan& plan, const PlanPolicy& policy) {
  HACK_CHECK(policy.row_block > 0 && policy.split_segments > 0, "attention plan: row_block and split_segments must be positive");
  const int H = plan.num_kv_heads, G = plan.group_size;
  const int v_dim = plan.v_dims.empty() ? 0 : *std::max_element(plan.v_dims.begin(), plan.v_dims.end());
  plan.tasks.clear();
  plan.state_floats = 0;
  plan.state_v_dim = v_dim;
  plan.max_task_rows = 0;
  auto add = [&](int item, int h0, int h1, int r0, int nr, int s0, int s1) {
    PlanTask t{item, h0, h1, r0, nr, s0, s1, plan.state_floats};
    plan.state_floats += static_cast<size_t>(h1 - h0) * plan_head_state_floats(nr * G, v_dim);
    plan.max_task_rows = std::max(plan.max_task_rows, nr * G * (h1 - h0));
    plan.tasks.push_back(t);
  };
  // Split-K of one (item, rows, heads) unit over n segments, in segment order.
  auto add_split = [&](int item, int h0, int h1, int r0, int nr, int n) {
    if (n == 0) {
      add(item, h0, h1, r0, nr, 0, 0);
      return;
    }
    for (int s = 0; s < n; s += policy.split_segments) add(item, h0, h1, r0, nr, s, std::min(n, s + policy.split_segments));
  };
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& it = plan.items[i];
    const int item = static_cast<int>(i);
    const int n_segments = plan.segment_offsets[i + 1] - plan.segment_offsets[i];
    bool selected = false;
    for (int h = 0; h < H && !plan.selection_offsets.empty(); ++h) selected |= !plan.selection_of(item, h).empty();
    if (it.n_tokens == 1 && !selected) {
      add_split(item, 0, H, 0, 1, n_segments);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      const std::span<const int> sel = plan.selection_of(item, h);
      const int n = sel.empty() ? n_segments : static_cast<int>(sel.size());
      if (it.n_tokens == 1) {
        add_split(item, h, h + 1, 0, 1, n);
        continue;
      }
      for (int r0 = 0; r0 < it.n_tokens; r0 += policy.row_block)
        add(item, h, h + 1, r0, std::min(policy.row_block, it.n_tokens - r0), 0, n);
    }
  }
}

}  // namespace hack
