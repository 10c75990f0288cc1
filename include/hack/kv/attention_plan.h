/// @file attention_plan.h
/// @brief The attention plan of one forward step (FlashInfer's plan/run split): built once
/// per step by the KV cache for the step's batch, before any layer runs, and run by every
/// layer. Device-neutral: it names tokens, page-table slots and work ranges, never host or
/// device addresses, so the same plan drives the CPU kernels and can be copied to a device.
///
/// For each batch item (one sequence's chunk of new tokens) the plan lists the segments its
/// attention reads once the step's K/V are appended — the same in every layer — as a CSR:
/// segments[segment_offsets[i] .. segment_offsets[i + 1]) in position order. A segment is a
/// run of tokens held in one page-table slot (the sinks, the i-th closed page, the i-th
/// pending exact block, the open block); the cache resolves the slot to its page per layer.
/// Per-head dims leave room for FDC's per-head ranks; the per (item, KV head) selection
/// leaves room for MPCache (attend only to some segments); tasks split the work over
/// threads (or CTAs): rows of long chunks, and split-K over segments for decode queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace hack {

/// One chunk of the step: query rows [row, row + n_tokens) of the batch's Q and output, for
/// tokens at positions [start_pos, start_pos + n_tokens) of sequence seq_id.
struct PlanItem {
  int seq_id = 0;
  int start_pos = 0;
  int n_tokens = 0;
  int row = 0;
  int closed_pages = 0;  ///< closed (quantized or fp) pages the sequence holds after the step
};

/// Which page-table slot of a (sequence, layer) holds a segment.
enum class SegmentSlot : uint8_t {
  sinks,    ///< the leading tokens kept exact (HACK mode)
  closed,   ///< closed page `index`: a HACK page (hack mode) or an fp page (fp mode)
  pending,  ///< full exact block `index`, not quantized yet (HACK mode)
  open,     ///< the exact block being filled (HACK mode)
};

struct PlanSegment {
  int first_token = 0;
  int tokens = 0;
  SegmentSlot slot = SegmentSlot::closed;
  int index = 0;
};

/// One unit of work: query rows [row_begin, row_begin + n_rows) of an item (relative to
/// its first row), KV heads [head_begin, head_end), and segments [seg_begin, seg_end) of
/// the item's list — or, when the item has a selection, of its selection list (then the
/// task covers one head). Tasks that differ only in their segment range (a split) are
/// consecutive, in segment order, and are merged in that order. `state` is the offset in
/// floats of the task's softmax state in the run's workspace.
struct PlanTask {
  int item = 0;
  int head_begin = 0, head_end = 0;
  int row_begin = 0, n_rows = 0;
  int seg_begin = 0, seg_end = 0;
  size_t state = 0;
  /// Query rows × tokens they see, summed over the task's rows and its heads' query groups:
  /// a layer's cost of the task is this × (k_dim + v_dim + 1) of its heads there.
  double work = 0;
};

/// How tasks are cut (chosen by the backend; see build_plan_tasks).
struct PlanPolicy {
  /// Query rows per task of a multi-token chunk (each such task covers one KV head).
  int row_block = 16;
  /// Split-K unit of a single-token (decode) item: at most this many segments per task.
  /// A fixed count — not one derived from the batch or the thread count — makes a
  /// sequence's result depend only on its own KV (batch-invariant and the same for any
  /// number of threads), which is what lets a cluster equal hack-run bit for bit. 32 pages
  /// (2048 tokens at Π = 64): measured against 16 and 64 on attention_bench (RESULTS.md).
  int split_segments = 32;
  /// Balance heads of unequal cost (FDC) and causal rows (DESIGN.md §3.2): row blocks of a
  /// multi-token item sized so each costs the same (row_block is then the average), decode
  /// items cut per KV head when head dims differ, and every layer's tasks dispatched longest
  /// first (AttentionPlan::order). Off: fixed row blocks, plan order. Results are the same
  /// bits either way (rows and heads are independent; splits merge in segment order).
  bool balance = true;
  /// Workers (threads, or CTAs) the plan will run on; 0 = unknown. Decode items are cut per
  /// KV head only if their all-head tasks are fewer than this: with enough tasks per-head
  /// ones measured up to 16 % slower on 2 CPU threads (a page is then read head by head),
  /// with too few (a short context at batch 1, or 132 SMs) they keep every worker busy.
  int workers = 0;
};

struct AttentionPlan {
  int num_kv_heads = 0;
  int group_size = 1;  ///< query heads per KV head
  std::vector<PlanItem> items;
  std::vector<int> segment_offsets;  ///< [items + 1]
  std::vector<PlanSegment> segments;
  /// Per layer and KV head: K·Q dims and V dims the kernels see ([layer · H + head]).
  std::vector<int> k_dims, v_dims;
  /// Optional selection: empty, or [items · H + 1] offsets into `selected`; an (item, head)
  /// with an empty range attends to all its segments. Entries are segment indices within
  /// the item, ascending.
  std::vector<int> selection_offsets;
  std::vector<int> selected;
  std::vector<PlanTask> tasks;
  size_t state_floats = 0;  ///< softmax state of all tasks
  int state_v_dim = 0;      ///< V width each head's state is laid out for (the widest V)
  int max_task_rows = 0;    ///< most query rows (n_rows · group · heads) of one task
  int num_layers = 0;       ///< layers of k_dims / v_dims
  /// Per layer, the order tasks are handed to workers: [layer · tasks.size() + i]; with
  /// balancing longest first by the layer's cost (workers taking the next task when free
  /// then assign longest-first to the least-loaded worker), else plan order.
  std::vector<int> order;

  void clear();
  std::span<const PlanSegment> segments_of(int item) const {
    return {segments.data() + segment_offsets[static_cast<size_t>(item)],
            segments.data() + segment_offsets[static_cast<size_t>(item) + 1]};
  }
  /// Selected segment indices of (item, head); empty = all.
  std::span<const int> selection_of(int item, int head) const;
};

/// Cuts the plan's items into tasks (replacing tasks, state_floats, state_v_dim, max_task_rows):
/// a multi-token item into row blocks × KV heads; a single-token item into splits of
/// policy.split_segments segments, each over all KV heads; an item with a selection into
/// one task per head (split the same way). Per head a task's state is, for each of its
/// rows·group query rows, max, sum, visible count and a v_dim accumulator
/// (plan_task_state_floats).
void build_plan_tasks(AttentionPlan& plan, const PlanPolicy& policy);

/// Cost of `task` in `layer`: work × Σ over its heads of (k_dim + v_dim + 1).
double plan_task_cost(const AttentionPlan& plan, const PlanTask& task, int layer);

/// Load balance of a layer's tasks handed out in `plan.order` to `workers` workers that each
/// take the next task when free: the busiest worker's cost over the mean (1 = perfect).
double plan_imbalance(const AttentionPlan& plan, int layer, int workers);

/// Softmax state floats of `rows` query rows of one head with value width v_dim.
size_t plan_head_state_floats(int rows, int v_dim);

/// to = from, keeping to's buffers and reserving them to from's capacities first, so copying
/// a step's plan (to select in it) allocates nothing once to has seen the longest context.
void copy_plan(const AttentionPlan& from, AttentionPlan& to);

/// Sets the selection of (item, head) to `segments` (indices within the item, ascending,
/// each < the item's segment count). Call build_plan_tasks afterwards.
void select_segments(AttentionPlan& plan, int item, int head, std::span<const int> segments);

}  // namespace hack
