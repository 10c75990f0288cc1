// One plan, two runners: an AttentionPlan made by the CPU cache (CpuPagedKvCache::plan) runs on
// the CPU (CpuPagedKvCache::run) and on the device (CudaPlanRunner over a CudaPagedKvCache that
// holds the same tokens), and the outputs agree — decode batches with split-K units, prefill
// chunks over closed, pending and open blocks, selections — for --kv hack (2/4/8-bit pages,
// with and without sinks, a per-layer bit allocation) and --kv fp.
//
// Tolerance |gpu − cpu| ≤ 1e-6 + 1e-5·|cpu|: the device kernels follow the CPU scalar
// reference op for op (canonical 16-lane dots and sums, explicit fma, hack_quant_math.h's exp
// and u8 codes; integer dots are exact in any order), so outputs are expected bit-identical
// (the count is printed); the only order the device changes is that of min/max reductions,
// which can differ in the sign of a zero extreme. The slack is the one hack_cuda_test allows
// for the same kernels' arithmetic; a wrong page, row, split merge or causal bound moves an
// output by O(1).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "gpu/require_close.h"
#include "hack/backend/cuda_paged_kv_cache.h"
#include "hack/backend/cuda_plan_runner.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "unit/kv/kv_test_util.h"

using namespace hack;

namespace {

struct Config {
  const char* name;
  bool hack;
  int k_bits, v_bits;
  int sinks;
  int page;
  int dim;
  int group;
  int k_group, v_group;
  std::vector<HackLayerBits> layer_bits;  // empty = k_bits / v_bits everywhere
};

std::vector<Config> configs() {
  return {
      {"hack k2v2 sinks 4", true, 2, 2, 4, 32, 64, 2, 32, 32, {}},
      {"hack k4v4 sinks 4", true, 4, 4, 4, 32, 128, 4, 64, 32, {}},
      {"hack k2v2 no sinks", true, 2, 2, 0, 16, 64, 3, 64, 16, {}},
      {"hack per-layer k2v4 / k8v2", true, 2, 2, 4, 16, 64, 2, 32, 16, {{2, 4}, {8, 2}}},
      {"fp bf16", false, 0, 0, 0, 16, 64, 2, 64, 64, {}},
  };
}

// The same tokens in a CPU cache and a device cache of the same shape and options.
struct Pair {
  KvShape shape;
  std::unique_ptr<CpuPagedKvCache> cpu;
  std::unique_ptr<CudaPagedKvCache> gpu;
  uint32_t seed;
  bool hack;

  Pair(const Config& c, uint32_t seed_) : seed(seed_), hack(c.hack) {
    shape.num_layers = 2;
    shape.num_kv_heads = 2;
    shape.head_dim = c.dim;
    shape.group_size = c.group;
    KvCacheOptions o;
    if (c.hack) {
      o.mode = KvMode::hack;
      o.k_bits = c.k_bits;
      o.v_bits = c.v_bits;
      o.sinks = c.sinks;
      o.k_group = c.k_group;
      o.v_group = c.v_group;
      o.layer_bits = c.layer_bits;
    } else {
      o.mode = KvMode::fp;
      o.fp_dtype = DType::bf16;
    }
    o.block_tokens = c.page;
    cpu = std::make_unique<CpuPagedKvCache>(shape, o);
    CudaKvOptions g;
    g.page_tokens = c.page;
    g.num_pages = 512;
    if (c.hack) g.hack = o;
    gpu = std::make_unique<CudaPagedKvCache>(shape, g);
  }
  int sinks() const { return gpu->sinks(); }
  int page() const { return gpu->page_tokens(); }
  void add(int seq, int max_tokens) {
    cpu->add_sequence(seq, max_tokens);
    gpu->add_sequence(seq, max_tokens);
  }
  // n tokens at the sequence's length, every layer, the same K/V (host f32) to both.
  void append(int seq, int n) {
    const int start = cpu->length(seq, 0);
    for (int l = 0; l < shape.num_layers; ++l) {
      const test::KvStream st(n, shape.num_kv_heads, 1, shape.head_dim,
                              seed ^ static_cast<uint32_t>(seq * 7919 + l * 104729 + start * 31 + 1));
      cpu->append(l, seq, start, n, st.k.data(), st.v.data());
      gpu->append(l, seq, start, n, st.k.data(), st.v.data());
    }
  }
  // Both storages closed the same blocks at the same appends (each closes inside its own
  // append, by the block manager's rule): the closed count every plan item expects, in every
  // layer of both.
  void check_closed_as_planned(const AttentionPlan& plan) const {
    if (!hack) return;
    for (const PlanItem& it : plan.items)
      for (int l = 0; l < shape.num_layers; ++l) {
        INFO("sequence " << it.seq_id << " layer " << l);
        CHECK(gpu->blocks().closed_blocks(it.seq_id, l) == cpu->blocks().closed_blocks(it.seq_id, l));
        CHECK(gpu->blocks().closed_blocks(it.seq_id, l) == it.closed_pages);
      }
  }
};

// Runs `plan` (the step's appends done) in every layer on both runners and compares. One
// runner may serve several plans in turn (its device buffers are reused).
void run_both(Pair& p, CudaPlanRunner& runner, const AttentionPlan& plan, const std::string& what, uint32_t seed,
              bool expect_splits) {
  int rows = 0;
  for (const PlanItem& it : plan.items) rows = std::max(rows, it.row + it.n_tokens);
  const size_t width = static_cast<size_t>(p.shape.num_kv_heads) * static_cast<size_t>(p.shape.group_size) *
                       static_cast<size_t>(p.shape.head_dim);
  const size_t n = static_cast<size_t>(rows) * width;
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.shape.head_dim));
  ThreadPool pool(2);
  AttentionWorkspace ws;
  runner.upload(plan, *p.gpu);
  if (expect_splits) REQUIRE_FALSE(runner.flat().units.empty());
  std::mt19937 rng(seed);
  for (int layer = 0; layer < p.shape.num_layers; ++layer) {
    const std::vector<float> q = test::random_floats(rng, n, -3.0f, 3.0f);
    std::vector<float> cpu_out(n, 0.0f);
    p.cpu->run(plan, layer, q.data(), width, cpu_out.data(), width, scale, pool, ws);
    const Buffer dq = test::to_device(q);
    const Buffer dout = test::to_device(std::vector<float>(n, 0.0f));
    runner.run(layer, test::dptr<float>(dq), width, test::dptr<float>(dout), width, scale);
    const std::vector<float> gpu_out = test::to_host<float>(dout, n);
    test::require_close(gpu_out, cpu_out, what + " layer " + std::to_string(layer), true);
  }
}

// (a) a decode batch with split-K units, and (c) selections on the same step.
void decode_case(const Config& c, uint32_t seed) {
  Pair p(c, seed);
  const int S = p.sinks(), P = p.page();
  // A lone token, Π−1 / Π / Π+1 past the sinks, several blocks and an open one, a long one.
  const std::vector<int> lengths = {1, S + P - 1, S + P, S + P + 1, S + 3 * P + 7, S + 9 * P + 5};
  std::vector<PlanItem> items;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int seq = static_cast<int>(i);
    p.add(seq, lengths[i] + 8);
    p.append(seq, lengths[i]);
    items.push_back({seq, lengths[i], 1, seq, 0});
  }
  PlanPolicy policy;
  policy.split_segments = 2;
  AttentionPlan plan, device_policy_plan;
  p.cpu->plan(items, policy, plan);
  {  // The device cache's block manager plans the same step from its own state.
    AttentionPlan own;
    p.gpu->plan(items, policy, own);
    REQUIRE(own.segment_offsets == plan.segment_offsets);
    REQUIRE(own.items.size() == plan.items.size());
    for (size_t i = 0; i < own.items.size(); ++i) REQUIRE(own.items[i].closed_pages == plan.items[i].closed_pages);
    for (size_t i = 0; i < own.segments.size(); ++i) {
      REQUIRE(own.segments[i].first_token == plan.segments[i].first_token);
      REQUIRE(own.segments[i].slot == plan.segments[i].slot);
      REQUIRE(own.segments[i].index == plan.segments[i].index);
    }
    REQUIRE(own.tasks.size() == plan.tasks.size());
  }
  // The device's own policy: with 8 × SMs workers these decodes are cut per KV head.
  const PlanPolicy device_policy = cuda_plan_policy(0);
  int sm_count = 0;
  REQUIRE(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  REQUIRE(device_policy.workers == 8 * sm_count);
  p.cpu->plan(items, device_policy, device_policy_plan);
  for (const PlanItem& it : items) p.append(it.seq_id, 1);
  p.check_closed_as_planned(plan);
  CudaPlanRunner runner;
  run_both(p, runner, plan, std::string(c.name) + " decode", seed + 1, true);
  run_both(p, runner, device_policy_plan, std::string(c.name) + " decode, device policy", seed + 4, false);

  // Per-head selections of two items (MPCache): the tasks of those heads read their lists.
  AttentionPlan selected;
  copy_plan(plan, selected);
  const int n4 = plan.segment_offsets[5] - plan.segment_offsets[4];
  const int n5 = plan.segment_offsets[6] - plan.segment_offsets[5];
  const std::vector<int> sel4 = {0, 2, n4 - 1};
  const std::vector<int> sel5 = {1, 3, 4, n5 - 2, n5 - 1};
  select_segments(selected, 4, 0, sel4);
  select_segments(selected, 5, 1, sel5);
  build_plan_tasks(selected, policy);
  run_both(p, runner, selected, std::string(c.name) + " selection", seed + 2, false);
}

// (b) multi-token prefill chunks: over a context (closed blocks, then the chunk's own pending
// and open blocks), a fresh prompt, and a decode token in the same step.
void prefill_case(const Config& c, uint32_t seed) {
  Pair p(c, seed);
  const int S = p.sinks(), P = p.page();
  const int max_tokens = 12 * P;
  p.add(0, max_tokens);
  p.append(0, S + 2 * P + 3);
  p.add(1, max_tokens);
  p.add(2, max_tokens);
  p.append(2, S + 4 * P + 1);
  const int chunk0 = 3 * P + 5, chunk1 = S + 2 * P + 3;
  const std::vector<PlanItem> items = {{0, S + 2 * P + 3, chunk0, 0, 0},
                                       {1, 0, chunk1, chunk0, 0},
                                       {2, S + 4 * P + 1, 1, chunk0 + chunk1, 0}};
  PlanPolicy policy;
  policy.split_segments = 2;
  AttentionPlan plan;
  p.cpu->plan(items, policy, plan);
  for (const PlanItem& it : items) p.append(it.seq_id, it.n_tokens);
  p.check_closed_as_planned(plan);
  CudaPlanRunner runner;
  run_both(p, runner, plan, std::string(c.name) + " prefill", seed + 3, true);
}

}  // namespace

TEST_CASE("the CUDA plan runner matches the CPU runner on the same plan", "[gpu][plan]") {
  const uint32_t seed = 20261128;
  for (const Config& c : configs()) {
    INFO(c.name << " seed " << seed);
    decode_case(c, seed);
    prefill_case(c, seed + 100);
  }
}

TEST_CASE("device plan rows are the device cache's kv_row", "[gpu][plan]") {
  for (int P : {16, 64})
    for (int S : {0, 4, 16})
      for (int pos = 0; pos < 5 * P; ++pos)
        REQUIRE(device_pool_row(DevicePoolLayout{P, S, S > 0}, pos) == cuda::kv_row(pos, P, S));
}

TEST_CASE("the CUDA plan runner refuses FDC per-head dims by name", "[gpu][plan]") {
  KvShape shape;
  shape.num_layers = 1;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.group_size = 2;
  shape.k_dims = {32, 64};
  shape.v_dims = {64, 48};
  KvCacheOptions o;
  o.mode = KvMode::fp;
  o.block_tokens = 16;
  CpuPagedKvCache cpu(shape, o);
  CudaKvOptions g;
  g.page_tokens = 16;
  g.num_pages = 8;
  CudaPagedKvCache gpu(shape, g);
  cpu.add_sequence(0, 32);
  gpu.add_sequence(0, 32);
  AttentionPlan plan;
  const std::vector<PlanItem> items = {{0, 0, 4, 0, 0}};
  cpu.plan(items, PlanPolicy{}, plan);
  CudaPlanRunner runner;
  REQUIRE_THROWS_WITH(runner.upload(plan, gpu), Catch::Contains("FDC per-head dims"));
}
