/// @file kernels/cuda/plan_attention.h
/// @brief The CUDA runner's kernels of the device-neutral AttentionPlan (kv/attention_plan.h),
/// the twin of CpuPagedKvCache::run on the CPU: for each task of the plan (kernels/device_plan.h,
/// flattened by backend/flat_plan.h), causal attention of its query rows over its segments
/// with an online softmax — exact bf16 segments (sinks, pending and open blocks, fp pages)
/// and HACK pages (homomorphic: Q'·K' and P'·V' on the codes with __dp4a, as
/// kernels/cpu/hack_attention_scalar.cpp) — then a combine kernel merging the splits of a
/// unit in segment order (attention_rows_merge) and writing rows = acc / sum.
///
/// Correctness first: a 128-thread CTA per (task, KV head), a warp per query row walking
/// the task's segments in order. Every float operation is the CPU scalar reference's, in its
/// order (16-lane canonical dots and sums folded 8+8, 4+4, 2+2, 1+1; explicit fma; the exp
/// polynomial and u8 codes of hack_quant_math.h), so a run gives the CPU runner's bits for the
/// same plan up to the sign of a zero extreme (min/max reductions run in a different order).
/// Only compiled with HACK_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hack/kernels/device_plan.h"
#include "hack/kernels/hack_page_geometry.h"

namespace hack::cuda {

/// One layer of the paged pools a plan's segments resolve into.
struct PlanLayerPools {
  /// bf16 pages of the layer: page i at exact + i·exact_page_elems, [K|V][kv_heads][Π][head_dim].
  const uint16_t* exact = nullptr;
  size_t exact_page_elems = 0;
  /// HACK pages of the layer (hack mode, else null): page i at hack + i·hack_page_stride bytes,
  /// laid out as `geometry` says (kv/hack_page.h).
  const uint8_t* hack = nullptr;
  size_t hack_page_stride = 0;
  HackPageGeometry geometry;
  int page_tokens = 0;  ///< Π
  int kv_heads = 0;
  int head_dim = 0;     ///< K and V dims of every head (per-head FDC dims are refused)
};

/// One layer's run of an uploaded plan. Device pointers except where noted.
struct PlanAttentionArgs {
  const DevicePlanTask* tasks = nullptr;        ///< [n_tasks]
  int n_tasks = 0;
  int max_task_heads = 0;                       ///< grid.y of the task kernel
  const DevicePlanSegment* segments = nullptr;  ///< [Σ items' segments]
  const int32_t* selected = nullptr;            ///< the plan's selections (may be null without one)
  const int32_t* order = nullptr;               ///< [n_tasks] this layer's dispatch order
  const DevicePlanUnit* units = nullptr;        ///< [n_units] units of ≥ 2 splits
  int n_units = 0;
  int max_unit_heads = 0;                       ///< grid.y of the combine kernel
  int group_size = 1;                           ///< query heads per KV head
  float scale = 1.0f;                           ///< softmax scale, multiplied into q first (as the CPU)
  /// q: [rows][kv_heads · group · head_dim] f32, row stride q_stride floats; out likewise
  /// with out_stride (only the rows of the plan's items are written).
  const float* q = nullptr;
  size_t q_stride = 0;
  float* out = nullptr;
  size_t out_stride = 0;
  float* state = nullptr;  ///< [state_floats] the tasks' softmax states (DevicePlanTask::state)
  int state_v_dim = 0;     ///< AttentionPlan::state_v_dim (the states' layout)
};

/// Runs the task kernel (grid n_tasks × max_task_heads) and, when the plan has units of
/// splits, the combine kernel (grid n_units × max_unit_heads), asynchronously on `stream`.
/// Launch and argument errors throw hack::Error (through cuda_fail). Limits: head_dim a
/// multiple of 16 up to 256, Π a multiple of 4 up to 512, group size ≤ 64 (a task's rows are
/// n_rows · group).
void plan_attention(const PlanLayerPools& pools, const PlanAttentionArgs& args, cudaStream_t stream);

}  // namespace hack::cuda
