/// @file device_plan.h
/// @brief The flat form of an AttentionPlan (kv/attention_plan.h) a device runner uploads
/// once per step and its kernels read in every layer: plain structs with fixed-width fields,
/// no CUDA types, so the host flattening (backend/flat_plan.h) builds and tests them without
/// a GPU and the kernels (kernels/cuda/plan_attention.h) read the same bytes.
///
/// What an AttentionPlan says per item (start position, batch row, segment CSR) is folded
/// into each task, so a kernel reads one task, then its segments; a segment is already
/// resolved to a page id and row of the device pools, which a layer turns into an address
/// (page id · the layer's page stride), so the upload does not grow with the layer count.
#pragma once

#include <cstdint>

namespace hack {

/// Which pool a resolved segment's page belongs to.
enum class DevicePageKind : int32_t {
  exact = 0,  ///< bf16 page [K|V][kv_head][Π][head_dim] (sinks, pending and open blocks, fp pages)
  hack = 1,   ///< HACK page (kv/hack_page.h) of a closed block (hack mode)
};

/// One segment of an item: tokens [first_token, first_token + tokens) of its sequence, held
/// from row `row` of page `page` (exact: rows [row, row + tokens) ⊆ [0, Π); hack: row 0, a
/// whole block).
struct DevicePlanSegment {
  int32_t first_token = 0;
  int32_t tokens = 0;
  int32_t page = 0;
  int32_t row = 0;
  DevicePageKind kind = DevicePageKind::exact;
};

/// One PlanTask with its item's fields folded in.
struct DevicePlanTask {
  int32_t start_pos = 0;   ///< position of the task's first query token (item.start_pos + row_begin)
  int32_t q_row = 0;       ///< batch row of that token in q and out (item.row + row_begin)
  int32_t n_rows = 0;      ///< query tokens (each G query rows per KV head)
  int32_t head_begin = 0;  ///< KV heads [head_begin, head_end)
  int32_t head_end = 0;
  int32_t seg_begin = 0;   ///< segments [seg_begin, seg_end) of the item's list, or of its selection
  int32_t seg_end = 0;
  int32_t seg_base = 0;    ///< the item's first segment in DevicePlanSegment[]
  int32_t selection = -1;  ///< offset of the (item, head_begin) selection in selected[], or −1: none
  int32_t alone = 1;       ///< 1: the only task of its unit (writes out rows); 0: a split (combined)
  uint64_t state = 0;      ///< floats from the state base: the task's softmax states (PlanTask::state)
};

/// A unit of ≥ 2 splits: tasks [first_task, first_task + n_tasks), merged in that order.
struct DevicePlanUnit {
  int32_t first_task = 0;
  int32_t n_tasks = 0;
};

/// Softmax state floats of `rows` query rows of one head with value width v_dim: max [rows],
/// sum [rows], visible [rows] (CPU only), each region 16-float aligned, then acc
/// [rows][v_dim] (plan_head_state_floats in kv/attention_plan.h, the same formula).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint64_t device_plan_head_state_floats(int rows, int v_dim) {
  const uint64_t r = static_cast<uint64_t>(rows);
  return (3 * r + 15) / 16 * 16 + (r * static_cast<uint64_t>(v_dim) + 15) / 16 * 16;
}

}  // namespace hack
