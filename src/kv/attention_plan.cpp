#include "hack/kv/attention_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>

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
  order.clear();
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

void copy_plan(const AttentionPlan& from, AttentionPlan& to) {
  auto copy = [](const auto& a, auto& b) {
    b.reserve(a.capacity());
    b.assign(a.begin(), a.end());
  };
  to.num_kv_heads = from.num_kv_heads;
  to.group_size = from.group_size;
  copy(from.items, to.items);
  copy(from.segment_offsets, to.segment_offsets);
  copy(from.segments, to.segments);
  copy(from.k_dims, to.k_dims);
  copy(from.v_dims, to.v_dims);
  copy(from.selection_offsets, to.selection_offsets);
  copy(from.selected, to.selected);
  copy(from.tasks, to.tasks);
  copy(from.order, to.order);
  to.state_floats = from.state_floats;
  to.state_v_dim = from.state_v_dim;
  to.max_task_rows = from.max_task_rows;
  to.num_layers = from.num_layers;
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

namespace {

// Tokens of segments [s0, s1) of an item (or of its selection).
double segment_tokens(const AttentionPlan& plan, int item, std::span<const int> selection, int s0, int s1) {
  const std::span<const PlanSegment> segs = plan.segments_of(item);
  double n = 0;
  for (int s = s0; s < s1; ++s) n += segs[static_cast<size_t>(selection.empty() ? s : selection[static_cast<size_t>(s)])].tokens;
  return n;
}

// Row cuts of a causal chunk of n rows at start_pos into `blocks` blocks of equal cost (row r
// sees start_pos + r + 1 tokens): cuts[b] is block b's first row, cuts[blocks] = n.
void equal_cost_rows(int start_pos, int n, int blocks, std::vector<int>& cuts) {
  cuts.assign(1, 0);
  const double total = static_cast<double>(n) * start_pos + 0.5 * static_cast<double>(n) * (n + 1);
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    acc += start_pos + r + 1;
    const int b = static_cast<int>(cuts.size());
    if (b < blocks && acc >= total * b / blocks && r + 1 < n) cuts.push_back(r + 1);
  }
  cuts.push_back(n);
}

bool uniform_dims(const AttentionPlan& plan, int layer) {
  const size_t at = static_cast<size_t>(layer * plan.num_kv_heads);
  for (int h = 1; h < plan.num_kv_heads; ++h)
    if (plan.k_dims[at + static_cast<size_t>(h)] != plan.k_dims[at] || plan.v_dims[at + static_cast<size_t>(h)] != plan.v_dims[at])
      return false;
  return true;
}

// Cost weight of KV head h summed over the layers: Σ_l (k_dim + v_dim + 1).
double head_weight(const AttentionPlan& plan, int h) {
  double w = 0;
  for (int l = 0; l < plan.num_layers; ++l) {
    const size_t at = static_cast<size_t>(l * plan.num_kv_heads + h);
    w += plan.k_dims[at] + plan.v_dims[at] + 1;
  }
  return w;
}

// Whether two layers give every head the same dims (then their tasks cost alike).
bool same_dims(const AttentionPlan& plan, int a, int b) {
  const size_t H = static_cast<size_t>(plan.num_kv_heads);
  return std::equal(plan.k_dims.begin() + a * H, plan.k_dims.begin() + (a + 1) * H, plan.k_dims.begin() + b * H) &&
         std::equal(plan.v_dims.begin() + a * H, plan.v_dims.begin() + (a + 1) * H, plan.v_dims.begin() + b * H);
}

}  // namespace

double plan_task_cost(const AttentionPlan& plan, const PlanTask& task, int layer) {
  double dims = 0;
  for (int h = task.head_begin; h < task.head_end; ++h) {
    const size_t at = static_cast<size_t>(layer * plan.num_kv_heads + h);
    dims += plan.k_dims.empty() ? 1 : plan.k_dims[at] + plan.v_dims[at] + 1;
  }
  return task.work * dims;
}

double plan_imbalance(const AttentionPlan& plan, int layer, int workers) {
  if (plan.tasks.empty() || workers <= 0) return 1.0;
  // Min-heap of the workers' finishing times: each next task goes to the first one free.
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int w = 0; w < workers; ++w) free_at.push(0.0);
  double total = 0, busiest = 0;
  const size_t T = plan.tasks.size();
  for (size_t i = 0; i < T; ++i) {
    const size_t t = plan.order.empty() ? i : static_cast<size_t>(plan.order[static_cast<size_t>(layer) * T + i]);
    const double c = plan_task_cost(plan, plan.tasks[t], layer);
    total += c;
    const double done = free_at.top() + c;
    free_at.pop();
    free_at.push(done);
    busiest = std::max(busiest, done);
  }
  return total > 0 ? busiest / (total / workers) : 1.0;
}

void build_plan_tasks(AttentionPlan& plan, const PlanPolicy& policy) {
  HACK_CHECK(policy.row_block > 0 && policy.split_segments > 0, "attention plan: row_block and split_segments must be positive");
  const int H = plan.num_kv_heads, G = plan.group_size;
  const int v_dim = plan.v_dims.empty() ? 0 : *std::max_element(plan.v_dims.begin(), plan.v_dims.end());
  plan.num_layers = H > 0 ? static_cast<int>(plan.k_dims.size()) / H : 0;
  bool unequal_heads = false;  // heads of unequal cost in some layer (FDC)
  for (int l = 0; l < plan.num_layers && policy.balance; ++l) unequal_heads |= !uniform_dims(plan, l);
  // Decode tasks per head only when all-head tasks would leave workers idle (a short context
  // at batch 1 is one task; on 132 SMs most batches are too few).
  int all_head_tasks = 0;
  for (size_t i = 0; i < plan.items.size(); ++i)
    if (plan.items[i].n_tokens == 1) {
      const int n = plan.segment_offsets[i + 1] - plan.segment_offsets[i];
      all_head_tasks += std::max(1, (n + policy.split_segments - 1) / policy.split_segments);
    }
  const bool per_head_decode = policy.balance && all_head_tasks < policy.workers;
  double mean_head_weight = 0;  // unequal heads: their row blocks in proportion to this
  for (int h = 0; h < H && unequal_heads; ++h) mean_head_weight += head_weight(plan, h) / H;
  plan.tasks.clear();
  plan.state_floats = 0;
  plan.state_v_dim = v_dim;
  plan.max_task_rows = 0;
  auto add = [&](int item, int h0, int h1, int r0, int nr, int s0, int s1, double work) {
    PlanTask t{item, h0, h1, r0, nr, s0, s1, plan.state_floats, work};
    plan.state_floats += static_cast<size_t>(h1 - h0) * plan_head_state_floats(nr * G, v_dim);
    plan.max_task_rows = std::max(plan.max_task_rows, nr * G * (h1 - h0));
    plan.tasks.push_back(t);
  };
  // Split-K of one single-token (item, heads) unit over n segments, in segment order.
  auto add_split = [&](int item, int h0, int h1, std::span<const int> sel, int n) {
    if (n == 0) {
      add(item, h0, h1, 0, 1, 0, 0, 0);
      return;
    }
    for (int s = 0; s < n; s += policy.split_segments) {
      const int e = std::min(n, s + policy.split_segments);
      add(item, h0, h1, 0, 1, s, e, G * segment_tokens(plan, item, sel, s, e));
    }
  };
  std::vector<int> cuts;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& it = plan.items[i];
    const int item = static_cast<int>(i);
    const int n_segments = plan.segment_offsets[i + 1] - plan.segment_offsets[i];
    bool selected = false;
    for (int h = 0; h < H && !plan.selection_offsets.empty(); ++h) selected |= !plan.selection_of(item, h).empty();
    if (it.n_tokens == 1 && !selected && !per_head_decode) {
      add_split(item, 0, H, {}, n_segments);
      continue;
    }
    const int blocks = (it.n_tokens + policy.row_block - 1) / policy.row_block;
    if (it.n_tokens == 1) {  // a decode item cut per head (selection, or unequal heads): no row cuts
      cuts.clear();
    } else if (policy.balance) {
      equal_cost_rows(it.start_pos, it.n_tokens, blocks, cuts);
    } else {
      cuts.clear();
      for (int r0 = 0; r0 < it.n_tokens; r0 += policy.row_block) cuts.push_back(r0);
      cuts.push_back(it.n_tokens);
    }
    for (int h = 0; h < H; ++h) {
      const std::span<const int> sel = plan.selection_of(item, h);
      const int n = sel.empty() ? n_segments : static_cast<int>(sel.size());
      if (it.n_tokens == 1) {
        add_split(item, h, h + 1, sel, n);
        continue;
      }
      // Heads of unequal dims (FDC) get row blocks in proportion to their cost (dims summed
      // over layers), so a task of any head costs about the same.
      if (unequal_heads) {
        const double share = head_weight(plan, h) / mean_head_weight;
        const int head_blocks = std::clamp(static_cast<int>(std::lround(blocks * share)), 1, it.n_tokens);
        equal_cost_rows(it.start_pos, it.n_tokens, head_blocks, cuts);
      }
      const double seen = sel.empty() ? 0 : segment_tokens(plan, item, sel, 0, n);  // a selection: what it reads
      for (size_t b = 0; b + 1 < cuts.size(); ++b) {
        const int r0 = cuts[b], nr = cuts[b + 1] - r0;
        const double causal = static_cast<double>(nr) * (it.start_pos + r0) + 0.5 * nr * (nr + 1);
        add(item, h, h + 1, r0, nr, 0, n, G * (sel.empty() ? causal : std::min(causal, nr * seen)));
      }
    }
  }
  // Per layer: tasks longest first, equal costs in plan order (std::sort: a decode step
  // allocates nothing). A layer with the previous one's dims has its order (every layer, without FDC).
  const size_t T = plan.tasks.size();
  plan.order.resize(static_cast<size_t>(std::max(plan.num_layers, 1)) * T);
  for (int l = 0; l < std::max(plan.num_layers, 1); ++l) {
    int* ord = plan.order.data() + static_cast<size_t>(l) * T;
    if (policy.balance && l > 0 && same_dims(plan, l, l - 1)) {
      std::copy(ord - T, ord, ord);
      continue;
    }
    std::iota(ord, ord + T, 0);
    if (!policy.balance || plan.num_layers == 0) continue;
    std::sort(ord, ord + T, [&](int a, int b) {
      const double ca = plan_task_cost(plan, plan.tasks[static_cast<size_t>(a)], l);
      const double cb = plan_task_cost(plan, plan.tasks[static_cast<size_t>(b)], l);
      return ca != cb ? ca > cb : a < b;
    });
  }
}

}  // namespace hack
