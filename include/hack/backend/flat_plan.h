/// @file flat_plan.h
/// @brief Host side of a device attention runner (DESIGN.md §2, "a storage + attention runner
/// per device"): an AttentionPlan (kv/attention_plan.h) flattened into the arrays of
/// kernels/device_plan.h, every segment resolved to a page of a paged device pool, and the
/// PlanPolicy a device plans with. No CUDA here: the CUDA runner (backend/cuda_plan_runner.h)
/// uploads what this builds, and the unit tests check it without a GPU.
///
/// The pool layout resolved against is CudaPagedKvCache's (backend/cuda_paged_kv_cache.h):
/// bf16 pages of Π rows per sequence page table; token p at row kv_row(p) = p without sinks,
/// else p for p < S and p + Π − S after (page 0 holds the S sinks, block b fills page 1 + b);
/// with --kv hack, closed block b is HACK page hack_table[b].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hack/kernels/device_plan.h"
#include "hack/kv/attention_plan.h"

namespace hack {

/// The geometry of a paged device pool that segments resolve against.
struct DevicePoolLayout {
  int page_tokens = 0;  ///< Π: rows of a bf16 page, tokens of a HACK page
  int sinks = 0;        ///< S: sink tokens in bf16 page 0 (hack mode; 0 in fp mode)
  bool hack = false;    ///< closed segments are HACK pages (else bf16 pages of the fp cache)
};

/// Row of token `pos` in a sequence's bf16 rows (cuda::kv_row of kernels/cuda/ops.h, which a
/// CPU build cannot include; gpu tests check that the two agree).
inline int device_pool_row(const DevicePoolLayout& pool, int pos) {
  return pool.sinks > 0 && pos >= pool.sinks ? pos + pool.page_tokens - pool.sinks : pos;
}

/// The page tables of one item's sequence.
struct DeviceItemPages {
  std::span<const int> exact;  ///< bf16 page ids in row order (CudaPagedKvCache::page_table)
  std::span<const int> hack;   ///< HACK page ids in block order (hack_page_table; empty in fp mode)
};

/// Where `segment` of a sequence with `closed_pages` closed blocks lives:
///   sinks      → bf16 page exact[0], row 0;
///   closed i   → hack mode: HACK page hack[i]; fp mode: the bf16 page holding token first_token;
///   pending i  → the bf16 page of block closed_pages + i;
///   open       → the bf16 page of the block holding first_token.
/// Exact segments resolve through device_pool_row(first_token) and must lie in one page.
/// Throws hack::Error when a table is too short or the segment does not match the layout.
DevicePlanSegment resolve_plan_segment(const PlanSegment& segment, int closed_pages, const DevicePoolLayout& pool,
                                       const DeviceItemPages& pages);

/// The flat arrays of a plan (kernels/device_plan.h), in host memory.
struct FlatPlan {
  std::vector<DevicePlanTask> tasks;        ///< [tasks], plan order
  std::vector<DevicePlanSegment> segments;  ///< [Σ items' segments], item by item, position order
  std::vector<int32_t> selected;            ///< the plan's `selected` (indices within an item)
  std::vector<int32_t> order;               ///< [max(num_layers, 1)][tasks]: per layer the dispatch order
  std::vector<DevicePlanUnit> units;        ///< the units of ≥ 2 splits, in plan order
  int max_task_heads = 0;                   ///< most KV heads of one task
  int max_unit_heads = 0;                   ///< most KV heads of one unit of splits
  uint64_t state_floats = 0;                ///< AttentionPlan::state_floats
  int state_v_dim = 0;                      ///< AttentionPlan::state_v_dim
  void clear();
};

/// Flattens `plan` for a device pool: pages[i] are the tables of item i's sequence. Reuses
/// out's capacity (nothing allocates once the longest step has been seen). Throws
/// hack::Error naming the item and segment that do not resolve.
void flatten_plan(const AttentionPlan& plan, const DevicePoolLayout& pool, std::span<const DeviceItemPages> pages,
                  FlatPlan& out);

/// The PlanPolicy a GPU with `sm_count` multiprocessors plans with:
///   - split_segments = 16 pages per split-K task (1024 tokens at Π = 64), a fixed count, as
///     the CPU's 32: a sequence's result then depends only on its own KV (batch-invariant, and
///     the CPU runner given the same plan computes the same bits). Half the CPU's unit because
///     a GPU has 10× the workers: a 4K-token decode at batch 1 is 4 splits × KV heads CTAs.
///   - workers = 8 × sm_count: the plan kernel runs a 128-thread CTA per (task, KV head), and
///     8 such CTAs per SM is the occupancy aimed at; with fewer all-head decode tasks than
///     that the plan cuts decode items per KV head (which the kernel runs the same way, a CTA
///     per head) and orders tasks longest first.
///   - row_block = 16 query tokens per prefill task, balance on (equal-cost causal row blocks).
/// Untuned: chosen on paper, not yet measured on a GPU (bench/RESULTS.md has no entry).
PlanPolicy device_plan_policy(int sm_count);

}  // namespace hack
