/// @file page_selection.h
/// @brief MPCache dynamic (query-aware) page selection in decode (DESIGN.md §3.4): each
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hack/kv/attention_plan.h"

namespace hack {

class PagedKvCache;
class ThreadPool;

/// How pages are ranked. quest / mpcache are the product; streaming (the most recent pages),
/// random and oracle (true attention mass of the dequantized pages) are baselines at the same
/// budget, for the fidelity bench.
enum class PageScore : uint8_t { quest, mpcache, streaming, random, oracle };

PageScore parse_page_score(std::string_view name);  ///< throws hack::Error naming the choices
std::string_view page_score_name(PageScore score);

/// `--kv-select-*`. Off unless ratio or tokens is set.
struct PageSelectOptions {
  double ratio = 0;           ///< --kv-select-ratio: budget as a fraction of the context, (0, 1]
  int tokens = 0;             ///< --kv-select-tokens: budget in tokens (instead of a ratio)
  PageScore score = PageScore::quest;  ///< --kv-select-bound
  float alpha = 0.6f;         ///< --kv-select-alpha: MPCache's α
  int group_pages = 2;        ///< --kv-select-group: pages per coarse group; 1 = one level
  double coarse_ratio = 0.5;  ///< --kv-select-coarse: fraction of groups kept by the coarse level
  int dense_layers = 2;       ///< --kv-select-dense: leading layers that attend to everything
  int share_layers = 2;       ///< --kv-select-share: layers that share one selection
  uint64_t seed = 0;          ///< the random baseline's stream
  /// The floor (issue 33: a 20 % budget of a 1K prompt is three pages, too few to find a
  /// passkey): the budget is never below `min_tokens`, and a context shorter than
  /// `min_context` attends to every page. Defaults measured, see kv_flags.cpp.
  int min_tokens = 0;         ///< --kv-select-min-tokens
  int min_context = 0;        ///< --kv-select-min-context
  bool enabled() const { return ratio > 0 || tokens > 0; }
  bool operator==(const PageSelectOptions&) const = default;
};

/// Throws hack::Error naming the flag of the first bad value.
void validate(const PageSelectOptions& options);
/// " select=0.2 quest group=2 coarse=0.5 dense=2 share=2" (empty when off).
std::string describe(const PageSelectOptions& options);

/// What the selections of a run attended to (summed over decode items, KV heads and the
/// layers that selected).
struct PageSelectStats {
  double context_tokens = 0;   ///< tokens the queries could see
  double selected_tokens = 0;  ///< tokens they attended to
  /// With measure_sharing: for each layer that reused a selection, how many of the pages its
  /// own selection would have chosen the shared one holds (MPCache's commonality score).
  double shared_hits = 0, shared_pages = 0;
  int selections = 0;          ///< (layer, item, head) selections made
};

/// Makes the selections of one backend (its scratch is reused, so a decode step allocates
/// nothing once warm). Called from the engine thread only; select spreads its (item, KV head)
/// selections over a pool, each worker with its own scratch, and its result does not depend
/// on the pool's size.
class PageSelector {
 public:
  explicit PageSelector(const PageSelectOptions& options);

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
  void select(const PagedKvCache& kv, AttentionPlan& plan, const PlanPolicy& policy, int layer, const float* q,
              size_t q_stride, ThreadPool& pool);

  /// Measures (into stats) how much of what layer `layer` would select by itself the plan's
  /// current (shared) selection holds. Leaves the plan as it is. Slow; for the bench.
  void measure_sharing(const PagedKvCache& kv, const AttentionPlan& plan, int layer, const float* q, size_t q_stride);

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
  int choose(const PagedKvCache& kv, const AttentionPlan& plan, int item, int head, int layer, const float* q,
             size_t q_stride, Scratch& s) const;
  void score_oracle(const PagedKvCache& kv, int layer, int head, int n, Scratch& s) const;
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
