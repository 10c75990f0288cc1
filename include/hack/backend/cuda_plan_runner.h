/// @file cuda_plan_runner.h
/// @brief The CUDA runner of the device-neutral AttentionPlan (kv/attention_plan.h): the
/// device twin of CpuPagedKvCache::run, over a CudaPagedKvCache (DESIGN.md §2: one plan, a
/// storage + attention runner per device). Plan on the host once per step
/// (PagedKv::plan: the block manager builds the same plan for either storage), upload() it, then run() it in
/// every layer. Only compiled with HACK_HAVE_CUDA.
///
/// upload flattens the plan (backend/flat_plan.h): every segment resolved to a page id and
/// row of the cache's pools through the sequences' page tables (reserved when a sequence is
/// added, so the same before and after the step's appends), tasks with their items' fields
/// folded in, per-layer dispatch orders and the units of splits, then one asynchronous copy to
/// the device. run turns page ids into the layer's addresses (page id · the layer's page
/// stride, in the kernel) and launches kernels/cuda/plan_attention.h: a CTA per (task, KV
/// head) into per-task softmax states, then a combine kernel over the units of splits.
///
/// Supported: --kv fp (bf16 pages) and --kv hack (sinks, HACK pages of 2/4/8 bits, pending and
/// open bf16 blocks; per-layer bit allocations), selections (MPCache), any split policy.
/// Refused with hack::Error: FDC per-head dims (the device cache does not store them; the
/// kernels assume k_dim = v_dim = head_dim).
///
/// Device buffers grow on the first upload of a larger plan and are reused after (no
/// allocation on a decode step once the longest step has been seen). upload and run must use
/// one stream (or streams ordered with each other): the device arrays and softmax states are
/// rewritten by the next upload / run in stream order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "hack/backend/cuda_paged_kv_cache.h"
#include "hack/backend/flat_plan.h"
#include "hack/core/tensor.h"
#include "hack/kv/attention_plan.h"

namespace hack {

/// The PlanPolicy for CUDA device `device`: device_plan_policy (backend/flat_plan.h) of its
/// multiprocessor count — split_segments 16 (fixed: batch-invariant), workers 8 × SMs.
PlanPolicy cuda_plan_policy(int device);

class CudaPlanRunner {
 public:
  CudaPlanRunner() = default;
  CudaPlanRunner(const CudaPlanRunner&) = delete;
  CudaPlanRunner& operator=(const CudaPlanRunner&) = delete;

  /// Flattens `plan` against `cache` (which must outlive the runs of this plan) and copies it
  /// to the device on `stream`; the host arrays may change as soon as this returns. Throws
  /// hack::Error when the plan does not fit the cache (heads, group, layers, a sequence it
  /// does not hold, a segment that does not resolve) or has FDC per-head dims.
  void upload(const AttentionPlan& plan, const CudaPagedKvCache& cache, cudaStream_t stream = nullptr);

  /// Runs the uploaded plan in `layer`, as CpuPagedKvCache::run: for every item, out rows =
  /// causal attention of its q rows over its segments (or selection). q, out: device
  /// [rows][num_kv_heads · group · head_dim] f32 with row strides q_stride / out_stride
  /// floats; q is multiplied by `scale` here. Asynchronous on `stream`. Throws hack::Error
  /// when the layer does not hold what the plan expects (each sequence's length, and with
  /// --kv hack its closed blocks: the caller closes them, CudaPagedKvCache::close_blocks).
  void run(int layer, const float* q, size_t q_stride, float* out, size_t out_stride, float scale,
           cudaStream_t stream = nullptr) const;

  /// The host image of the uploaded plan (tests, diagnostics).
  const FlatPlan& flat() const { return flat_; }

 private:
  // What run() checks per item in the layer it runs.
  struct ItemCheck {
    int seq_id = 0;
    int length = 0;        // tokens after the step's appends
    int closed_pages = 0;  // HACK pages the layer must hold (hack mode)
  };

  const CudaPagedKvCache* cache_ = nullptr;
  int group_size_ = 1;
  FlatPlan flat_;
  std::vector<DeviceItemPages> pages_;  // upload's scratch: the items' page tables
  std::vector<ItemCheck> checks_;       // [items]
  std::vector<std::byte> staging_;      // host image of device_, copied once per upload
  // Byte offsets in device_ of the flat arrays (each 256-byte aligned).
  size_t tasks_at_ = 0, segments_at_ = 0, selected_at_ = 0, order_at_ = 0, units_at_ = 0;
  Buffer device_;  // device: tasks [T] DevicePlanTask | segments [S] DevicePlanSegment |
                   // selected [n] i32 | order [max(layers, 1)][T] i32 | units [U] DevicePlanUnit
  Buffer state_;   // device: [state_floats] f32, the tasks' softmax states (DevicePlanTask::state)
};

}  // namespace hack
