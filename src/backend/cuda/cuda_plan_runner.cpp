#include "hack/backend/cuda_plan_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "hack/backend/cuda_check.h"
#include "hack/core/error.h"
#include "hack/kernels/cuda/plan_attention.h"

namespace hack {

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

template <class T>
size_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

}  // namespace

PlanPolicy cuda_plan_policy(int device) {
  int sm_count = 0;
  HACK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  return device_plan_policy(sm_count);
}

void CudaPlanRunner::upload(const AttentionPlan& plan, const CudaPagedKvCache& cache, cudaStream_t stream) {
  const KvShape& shape = cache.shape();
  HACK_CHECK(plan.num_kv_heads == shape.num_kv_heads && plan.group_size == shape.group_size,
             "CUDA plan runner: a plan for {} KV heads × {} does not fit the cache's {} × {}", plan.num_kv_heads,
             plan.group_size, shape.num_kv_heads, shape.group_size);
  HACK_CHECK(plan.num_layers == 0 || plan.num_layers == shape.num_layers,
             "CUDA plan runner: a plan for {} layers, the cache holds {}", plan.num_layers, shape.num_layers);
  // FDC per-head dims: the device pool stores head_dim for every head and the kernels read
  // k_dim = v_dim = head_dim; a plan carrying smaller dims is refused rather than misread.
  bool uniform = !shape.compressed();
  for (size_t i = 0; i < plan.k_dims.size() && uniform; ++i)
    uniform = plan.k_dims[i] == shape.head_dim && plan.v_dims[i] == shape.head_dim;
  HACK_CHECK(uniform, "CUDA plan runner: FDC per-head dims are not supported on the device (every head's K and V "
                      "dims must equal head_dim {})", shape.head_dim);
  HACK_CHECK(plan.tasks.empty() || plan.state_v_dim == shape.head_dim,
             "CUDA plan runner: the plan's softmax states are {} wide, head_dim is {}", plan.state_v_dim,
             shape.head_dim);

  const DevicePoolLayout pool{cache.page_tokens(), cache.sinks(), cache.is_hack()};
  pages_.clear();
  checks_.clear();
  for (const PlanItem& it : plan.items) {
    HACK_CHECK(cache.has_sequence(it.seq_id), "CUDA plan runner: the cache holds no sequence {}", it.seq_id);
    DeviceItemPages p;
    p.exact = cache.page_table(it.seq_id);
    if (cache.is_hack()) p.hack = cache.hack_page_table(it.seq_id);
    pages_.push_back(p);
    checks_.push_back({it.seq_id, it.start_pos + it.n_tokens, it.closed_pages});
  }
  flatten_plan(plan, pool, pages_, flat_);
  cache_ = &cache;
  group_size_ = plan.group_size;

  // One host image, one copy. From pageable memory cudaMemcpyAsync has consumed the source
  // when it returns (staged or synchronous), so staging_ may be rewritten by the next upload;
  // the device side is ordered on `stream` after the previous step's kernels.
  tasks_at_ = 0;
  segments_at_ = align256(tasks_at_ + bytes_of(flat_.tasks));
  selected_at_ = align256(segments_at_ + bytes_of(flat_.segments));
  order_at_ = align256(selected_at_ + bytes_of(flat_.selected));
  units_at_ = align256(order_at_ + bytes_of(flat_.order));
  const size_t total = align256(units_at_ + bytes_of(flat_.units));
  if (staging_.size() < total) staging_.resize(total);
  auto put = [&](size_t at, const auto& v) {
    if (!v.empty()) std::memcpy(staging_.data() + at, v.data(), bytes_of(v));
  };
  put(tasks_at_, flat_.tasks);
  put(segments_at_, flat_.segments);
  put(selected_at_, flat_.selected);
  put(order_at_, flat_.order);
  put(units_at_, flat_.units);
  const int device = cache.device();
  if (device_.bytes() < total) device_ = Buffer::allocate(MemoryKind::device, std::max(total, size_t{65536}), device);
  const size_t state_bytes = static_cast<size_t>(flat_.state_floats) * sizeof(float);
  if (state_.bytes() < state_bytes) state_ = Buffer::allocate(MemoryKind::device, state_bytes, device);
  if (total > 0)
    HACK_CUDA_CHECK(cudaMemcpyAsync(device_.data(), staging_.data(), total, cudaMemcpyHostToDevice, stream));
}

void CudaPlanRunner::run(int layer, const float* q, size_t q_stride, float* out, size_t out_stride, float scale,
                         cudaStream_t stream) const {
  HACK_CHECK(cache_ != nullptr, "CUDA plan runner: run before upload");
  const CudaPagedKvCache& cache = *cache_;
  const KvShape& shape = cache.shape();
  HACK_CHECK(layer >= 0 && layer < shape.num_layers, "CUDA plan runner: layer {} out of range", layer);
  if (flat_.tasks.empty()) return;
  // The plan was made before the step's appends; check this layer now holds what it says.
  for (const ItemCheck& c : checks_) {
    const int length = cache.length(c.seq_id, layer);
    const int closed = cache.is_hack() ? cache.hack_page_count(c.seq_id, layer) : c.closed_pages;
    HACK_CHECK(length == c.length && closed == c.closed_pages,
               "sequence {} layer {}: holds {} tokens in {} closed blocks on the device, the step's plan expects {} "
               "in {}",
               c.seq_id, layer, length, closed, c.length, c.closed_pages);
  }
  cuda::PlanLayerPools pools;
  pools.exact = cache.exact_page(layer, 0);
  pools.exact_page_elems = cache.page_bytes() / sizeof(uint16_t);
  pools.page_tokens = cache.page_tokens();
  pools.kv_heads = shape.num_kv_heads;
  pools.head_dim = shape.head_dim;
  if (cache.is_hack()) {
    const auto* first = static_cast<const uint8_t*>(cache.hack_page(layer, 0));
    pools.hack = first;
    pools.hack_page_stride =
        cache.num_pages() > 1 ? static_cast<size_t>(static_cast<const uint8_t*>(cache.hack_page(layer, 1)) - first) : 0;
    pools.geometry = cache.hack_geometry(layer);
  }
  const auto* base = static_cast<const std::byte*>(device_.data());
  const size_t T = flat_.tasks.size();
  cuda::PlanAttentionArgs a;
  a.tasks = reinterpret_cast<const DevicePlanTask*>(base + tasks_at_);
  a.n_tasks = static_cast<int>(T);
  a.max_task_heads = flat_.max_task_heads;
  a.segments = reinterpret_cast<const DevicePlanSegment*>(base + segments_at_);
  a.selected = flat_.selected.empty() ? nullptr : reinterpret_cast<const int32_t*>(base + selected_at_);
  const size_t order_layer = flat_.order.size() >= (static_cast<size_t>(layer) + 1) * T ? static_cast<size_t>(layer) : 0;
  a.order = reinterpret_cast<const int32_t*>(base + order_at_) + order_layer * T;
  a.units = flat_.units.empty() ? nullptr : reinterpret_cast<const DevicePlanUnit*>(base + units_at_);
  a.n_units = static_cast<int>(flat_.units.size());
  a.max_unit_heads = flat_.max_unit_heads;
  a.group_size = group_size_;
  a.scale = scale;
  a.q = q;
  a.q_stride = q_stride;
  a.out = out;
  a.out_stride = out_stride;
  a.state = static_cast<float*>(state_.data());
  a.state_v_dim = flat_.state_v_dim;
  cuda::plan_attention(pools, a, stream);
}

}  // namespace hack
