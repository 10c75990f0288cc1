/// @file cpu_page_selector.h
/// @brief The CPU's MPCache dynamic (query-aware) page selection in decode (DESIGN.md §3.4): each
/// decode query attends to the sinks, the exact blocks (pending and open), the newest
/// closed page and the closed pages that score best against the query for its budget.
///
/// A closed HACK page's score is one small dot of the query group with the page's per-channel
/// K range (kernels/cpu/page_bound.h): Quest's exact upper bound of q·k or MPCache's
/// linearization; the scores of a KV head's query group are summed, so one selection serves
/// the KV head. Coarse to fine: consecutive pages form groups scored on their range envelope,
/// the best `coarse_ratio` of the groups (at least as many as the budget needs) survive, and
/// the budget's best pages among them are kept. The first `dense_layers` layers attend to
/// everything; after them a selection is made every `share_layers` layers from that layer's
/// q and pages and reused by the layers up to the next. Prefill chunks never select.
/// What --kv-select-* chooses (PageSelectOptions) is device-neutral: kv/kv_options.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hack/kv/attention_plan.h"
#include "hack/kv/kv_options.h"

namespace hack {

class CpuPagedKvCache;
class ThreadPool;

/// Makes the selections of one backend (its scratch is reused, so a decode step allocates
/// nothing once warm). Called from the engine thread only; select spreads its (item, KV head)
/// selections over a pool, each worker with its own scratch, and its result does not depend
/// on the pool's size.
class CpuPageSelector {
 public:
  explicit CpuPageSelector(const PageSelectOptions& options);

  bool active() const { return options_.enabled(); }
  /// Whether layer l attends to everything (l < dense_layers).
  bool dense(int layer) const { return layer < options_.dense_layers; }
  /// Whether layer l makes a new selection (else it reuses the last one).
  bool selects_in(int layer) const {
    return !dense(layer) && (layer - options_.dense_layers) % options_.share_layers == 0;
  }

  /// Sets, in `plan`, the selection of every single-token item for this layer's q (rows of
  /// the step's q at plan.items[i].row, q_stride apart; head h's query group at
  /// h · group · head_dim, the first k_dim entries of each head_dim slot) and pages, leaving
  /// multi-token items unselected, and rebuilds the tasks with `policy`. The (item, head)
  /// selections run in parallel on `pool`; the plan and stats are the same for any pool size.
  void select(const CpuPagedKvCache& kv, AttentionPlan& plan, const PlanPolicy& policy, int layer, const float* q,
              size_t q_stride, ThreadPool& pool);

  /// Measures (into stats) how much of what layer `layer` would select by itself the plan's
  /// current (shared) selection holds. Leaves the plan as it is. Slow; for the bench.
  void measure_sharing(const CpuPagedKvCache& kv, const AttentionPlan& plan, int layer, const float* q, size_t q_stride);

  const PageSelectStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  const PageSelectOptions& options() const { return options_; }

 private:
  // One worker's scratch (grown once to the longest context, so steps allocate nothing).
  struct Scratch {
    std::vector<const std::byte*> pages;  // [closed pages] of the item's layer
    std::vector<float> q;                 // [group][k_dim] the query group's rows
    std::vector<float> qsum;              // [k_dim] Σ of the rows
    std::vector<float> qpos, qneg;        // [k_dim] Σ of the rows' positive / negative parts (quest)
    std::vector<float> scores;            // [candidate pages]
    std::vector<float> group_scores;      // [groups]
    std::vector<int> order;               // pages being ranked
    std::vector<int> groups;              // groups being ranked
    std::vector<uint8_t> keep;            // [candidate pages] chosen by the fine level
    std::vector<int> chosen;              // segment indices of one (item, head)
    std::vector<float> dequant;           // oracle: [Π][k_dim] one page's K
    void reserve(size_t pages_n, size_t q_floats, size_t head_dim);
  };

  // Chooses the closed-page segments of (item, head) into s.chosen (segment indices,
  // ascending, with the always-kept ones); returns the tokens attended. Touches only s.
  int choose(const CpuPagedKvCache& kv, const AttentionPlan& plan, int item, int head, int layer, const float* q,
             size_t q_stride, Scratch& s) const;
  void score_oracle(const CpuPagedKvCache& kv, int layer, int head, int n, Scratch& s) const;
  void score_random(int seq_id, int pos, int layer, int head, int n, Scratch& s) const;

  PageSelectOptions options_;
  PageSelectStats stats_;
  std::vector<Scratch> scratch_;         // [pool threads]
  std::vector<int> cell_begin_;          // [cells + 1] each (item, head)'s slot in cell_chosen_
  std::vector<int> cell_count_;          // [cells] segments it chose
  std::vector<int> cell_tokens_;         // [cells] tokens it attends
  std::vector<int> cell_chosen_;         // the cells' chosen segments, slot by slot
  std::vector<uint8_t> shared_;          // measure_sharing: [segments] of the shared selection
};

}  // namespace hack
