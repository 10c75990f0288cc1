// CUDA twin of CpuPagedKvCache::run (src/backend/cpu/cpu_paged_kv_cache.cpp) over a flattened AttentionPlan
// (kernels/device_plan.h): the task kernel is run_task + attend_segments + finish_rows, the
// combine kernel merge_splits. The per-block math is kernels/cpu/hack_attention_scalar.cpp's
// (hack_block_scalar, exact_block_scalar), op for op:
//   exact block: s_t = canonical_dot(q, k_t); softmax step; acc = acc·α, then acc += s_t·v_t
//   HACK page:   1. x = q·k_scale, u8 codes per K partition (σ_q, μ_q); mterm = q·k_min
//                2. s_t = Σ_p fma(μ_q, Σk', fma(σ_q, q'·k', ·)) + mterm   (__dp4a for q'·k')
//                3. softmax step over the block (masked tokens 0)
//                4. per V partition: x = p·v_scale → u8 codes (σ_p, μ_p); p_min = p·v_min
//                5. acc = fma(acc, α, σ_p·(p'·v') + μ_p·Σv' + p_min)   (__dp4a for p'·v')
// A warp owns one query row at a time and walks the task's segments in order, so the
// sequential chains (the acc fma chain over tokens, the 16 canonical partials) run in the
// CPU's order; only order-free reductions (min, max, integer dots) are spread over lanes.
// The page format is read through hack_quant_math.h's k_code_pos / v_code_pos (the one
// definition the CPU kernels and the quantizer share): four channels of a token (K) or four
// tokens of a channel (V) share one code word, which __dp4a takes against four u8 codes.
#include <cstdint>

#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/cuda/plan_attention.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cuda {

namespace {

using quant::add_f32;
using quant::bf16_bits_to_f32;
using quant::fma_f32;
using quant::max_f32;
using quant::min_f32;
using quant::mul_f32;
using quant::sub_f32;

constexpr int kWarps = 4;  // query rows in flight per CTA, one per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxDim = 256;
constexpr int kMaxPage = 512;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kPosInf = __builtin_huge_valf();

__host__ __device__ size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// One warp's shared scratch for the row it works on (byte offsets 16-aligned):
struct RowScratch {
  float* q;          // [D] q·scale of the row
  float* x;          // [max(D, Π)] q folded with the K scales, then p folded with the V scales
  float* s;          // [Π] scores, then exp(score − max)
  float* acc;        // [D] running Σ exp(score − max)·v
  float* q_sigma;    // [D/16] per K partition (at most D/16 of them)
  float* q_mu;       // [D/16]
  uint8_t* q_codes;  // [D] u8 codes of x, one K partition after another
  uint8_t* p_codes;  // [Π] u8 codes of one V partition's x
};

__host__ __device__ size_t warp_scratch_bytes(int D, int P) {
  const size_t d = static_cast<size_t>(D), p = static_cast<size_t>(P), x = d > p ? d : p;
  return align16(d * 4) + align16(x * 4) + align16(p * 4) + align16(d * 4) + 2 * align16(d / 16 * 4) + align16(d) +
         align16(p);
}

__device__ RowScratch carve(unsigned char* base, int D, int P) {
  const size_t d = static_cast<size_t>(D), p = static_cast<size_t>(P), x = d > p ? d : p;
  RowScratch w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    unsigned char* r = base + at;
    at += align16(bytes);
    return r;
  };
  w.q = reinterpret_cast<float*>(take(d * 4));
  w.x = reinterpret_cast<float*>(take(x * 4));
  w.s = reinterpret_cast<float*>(take(p * 4));
  w.acc = reinterpret_cast<float*>(take(d * 4));
  w.q_sigma = reinterpret_cast<float*>(take(d / 16 * 4));
  w.q_mu = reinterpret_cast<float*>(take(d / 16 * 4));
  w.q_codes = take(d);
  w.p_codes = take(p);
  return w;
}

// ---- warp reductions ----------------------------------------------------------------------

// Order-free extremes over the warp (the CPU scans in order; only a ±0 tie could differ).
__device__ float warp_min(float x) {
  for (int w = 16; w >= 1; w /= 2) x = min_f32(x, __shfl_xor_sync(0xffffffffu, x, w));
  return x;
}

__device__ float warp_max(float x) {
  for (int w = 16; w >= 1; w /= 2) x = max_f32(x, __shfl_xor_sync(0xffffffffu, x, w));
  return x;
}

// The CPU's fold16 of partials part_j held by lane j of each half-warp: 8+8, 4+4, 2+2, 1+1;
// the total is returned to every lane.
__device__ float fold16_broadcast(float part) {
  for (int w = 8; w >= 1; w /= 2) part = add_f32(part, __shfl_down_sync(0xffffffffu, part, w, 16));
  return __shfl_sync(0xffffffffu, part, 0);
}

// canonical_dot(a, bf16 b, n): partial j = fma chain over i ≡ j (mod 16) in order, then fold16.
__device__ float warp_dot16(const float* a, const uint16_t* b, int n) {
  const int j = threadIdx.x % 16;
  float part = 0.0f;
  for (int i = j; i < n; i += 16) part = fma_f32(a[i], bf16_bits_to_f32(b[i]), part);
  return fold16_broadcast(part);
}

// canonical_sum(a, n).
__device__ float warp_sum16(const float* a, int n) {
  const int j = threadIdx.x % 16;
  float part = 0.0f;
  for (int i = j; i < n; i += 16) part = add_f32(part, a[i]);
  return fold16_broadcast(part);
}

// ---- one row over one segment -------------------------------------------------------------

// softmax_step of the CPU scalar kernels: scores in s[0, visible), exp(score − m_new) left
// there and zeros in [visible, padded); returns α and updates the row's max and sum.
__device__ float softmax_step(const RowScratch& w, int visible, int padded, float& max, float& sum) {
  const int lane = threadIdx.x % 32;
  float block_max = kNegInf;
  for (int t = lane; t < visible; t += 32) block_max = max_f32(block_max, w.s[t]);
  block_max = warp_max(block_max);
  const float m_new = max_f32(max, block_max);
  const float alpha = quant::exp_f32(sub_f32(max, m_new));
  __syncwarp();
  for (int t = lane; t < padded; t += 32) w.s[t] = t < visible ? quant::exp_f32(sub_f32(w.s[t], m_new)) : 0.0f;
  __syncwarp();
  const float total = warp_sum16(w.s, padded);
  sum = fma_f32(sum, alpha, total);
  max = m_new;
  return alpha;
}

// exact_block_scalar over bf16 rows k[t·D], v[t·D], t < visible.
__device__ void exact_segment(const RowScratch& w, int D, const uint16_t* k, const uint16_t* v, int visible,
                              float& max, float& sum) {
  const int lane = threadIdx.x % 32;
  for (int t = lane; t < visible; t += 32) {
    const uint16_t* kt = k + static_cast<size_t>(t) * D;
    float part[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) part[j] = 0.0f;
    for (int c0 = 0; c0 < D; c0 += 16) {
#pragma unroll
      for (int j = 0; j < 16; ++j) part[j] = fma_f32(w.q[c0 + j], bf16_bits_to_f32(kt[c0 + j]), part[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) part[j] = add_f32(part[j], part[j + 8]);  // fold16: 8, 4, 2, 1
#pragma unroll
    for (int j = 0; j < 4; ++j) part[j] = add_f32(part[j], part[j + 4]);
    part[0] = add_f32(part[0], part[2]);
    part[1] = add_f32(part[1], part[3]);
    w.s[t] = add_f32(part[0], part[1]);
  }
  __syncwarp();
  const float alpha = softmax_step(w, visible, visible, max, sum);
  for (int c = lane; c < D; c += 32) {
    float a = mul_f32(w.acc[c], alpha);
    for (int t = 0; t < visible; ++t) a = fma_f32(w.s[t], bf16_bits_to_f32(v[static_cast<size_t>(t) * D + c]), a);
    w.acc[c] = a;
  }
  __syncwarp();
}

__device__ uint32_t load_sum(const uint8_t* sums, int bytes, size_t i) {
  return bytes == 1 ? sums[i] : reinterpret_cast<const uint16_t*>(sums)[i];
}

__device__ uint32_t load_word(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ uint32_t code_mask(int bits) { return bits == 2 ? 0x03030303u : (bits == 4 ? 0x0f0f0f0fu : 0xffffffffu); }

// hack_block_scalar over one KV head's section of a HACK page (`head` = its first byte), the
// first `visible` tokens visible.
__device__ void hack_segment(const RowScratch& w, const HackPageGeometry& g, const uint8_t* head, int visible,
                             float& max, float& sum) {
  const int lane = threadIdx.x % 32;
  const int D = g.head_dim, T = g.block_tokens, kg = g.k_group, vg = g.v_group;
  const int kp = D / kg, vp = D / vg;
  const uint16_t* k_min = reinterpret_cast<const uint16_t*>(head + g.k_min);
  const uint16_t* k_scale = reinterpret_cast<const uint16_t*>(head + g.k_scale);
  const uint16_t* v_min = reinterpret_cast<const uint16_t*>(head + g.v_min);
  const uint16_t* v_scale = reinterpret_cast<const uint16_t*>(head + g.v_scale);
  const uint8_t* k_codes = head + g.k_codes;
  const uint8_t* v_codes = head + g.v_codes;
  const uint8_t* k_sums = head + g.k_sums;
  const uint8_t* v_sums = head + g.v_sums;

  // 1. Q': fold the K scales in, u8 codes per K partition; mterm = q·k_min.
  for (int c = lane; c < D; c += 32) w.x[c] = mul_f32(w.q[c], bf16_bits_to_f32(k_scale[c]));
  __syncwarp();
  for (int p = 0; p < kp; ++p) {
    float lo = kPosInf, hi = kNegInf;
    for (int c = p * kg + lane; c < (p + 1) * kg; c += 32) {
      lo = min_f32(lo, w.x[c]);
      hi = max_f32(hi, w.x[c]);
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
    for (int c = p * kg + lane; c < (p + 1) * kg; c += 32) w.q_codes[c] = quant::u8_code(w.x[c], lo, inv);
    if (lane == 0) {
      w.q_sigma[p] = sigma;
      w.q_mu[p] = lo;
    }
  }
  const float mterm = warp_dot16(w.q, k_min, D);
  __syncwarp();

  // 2. Scores, a lane per token: per K partition the u8 dot over code words, then the CPU's
  //    two fmas; + mterm.
  const uint32_t k_mask = code_mask(g.k_bits);
  for (int t = lane; t < visible; t += 32) {
    float acc = 0.0f;
    for (int p = 0; p < kp; ++p) {
      uint32_t dot = 0;
      for (int c = p * kg; c < (p + 1) * kg; c += 4) {
        const quant::CodePos pos = quant::k_code_pos(g.k_bits, D, t, c);  // channels c..c+3: one word's bytes
        dot = __dp4a((load_word(k_codes + pos.byte) >> pos.shift) & k_mask, load_word(w.q_codes + c), dot);
      }
      const float ksum = static_cast<float>(load_sum(k_sums, g.k_sum_bytes, static_cast<size_t>(p) * T + t));
      acc = fma_f32(w.q_sigma[p], static_cast<float>(static_cast<int32_t>(dot)), acc);
      acc = fma_f32(w.q_mu[p], ksum, acc);
    }
    w.s[t] = add_f32(acc, mterm);
  }
  __syncwarp();

  // 3. Online softmax over the block (tokens past `visible` weigh 0).
  const float alpha = softmax_step(w, visible, T, max, sum);

  // 4–5. Per V partition: P' codes over the block's tokens, then a lane per channel.
  const uint32_t v_mask = code_mask(g.v_bits);
  for (int p = 0; p < vp; ++p) {
    const uint16_t* vs = v_scale + static_cast<size_t>(p) * T;
    const uint16_t* vm = v_min + static_cast<size_t>(p) * T;
    for (int t = lane; t < T; t += 32) w.x[t] = mul_f32(w.s[t], bf16_bits_to_f32(vs[t]));
    __syncwarp();
    float lo = kPosInf, hi = kNegInf;
    for (int t = lane; t < T; t += 32) {
      lo = min_f32(lo, w.x[t]);
      hi = max_f32(hi, w.x[t]);
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
    for (int t = lane; t < T; t += 32) w.p_codes[t] = quant::u8_code(w.x[t], lo, inv);
    const float p_min = warp_dot16(w.s, vm, T);
    __syncwarp();
    for (int c = p * vg + lane; c < (p + 1) * vg; c += 32) {
      uint32_t dot = 0;
      for (int t = 0; t < T; t += 4) {
        const quant::CodePos pos = quant::v_code_pos(g.v_bits, T, t, c);  // tokens t..t+3: one word's bytes
        dot = __dp4a((load_word(v_codes + pos.byte) >> pos.shift) & v_mask, load_word(w.p_codes + t), dot);
      }
      const float vsum = static_cast<float>(load_sum(v_sums, g.v_sum_bytes, static_cast<size_t>(c)));
      float x = mul_f32(sigma, static_cast<float>(static_cast<int32_t>(dot)));
      x = fma_f32(lo, vsum, x);
      x = add_f32(x, p_min);
      w.acc[c] = fma_f32(w.acc[c], alpha, x);
    }
    __syncwarp();
  }
}

// ---- kernels ------------------------------------------------------------------------------

// CTA (slot, head offset): task order[slot], KV head head_begin + blockIdx.y; warp w takes the
// task's query rows w, w + 4, ... (row r = token r / G, query head r % G of the group).
__global__ void __launch_bounds__(kThreads)
    plan_task_kernel(PlanLayerPools pools, PlanAttentionArgs a, unsigned warp_bytes) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int task = a.order != nullptr ? a.order[blockIdx.x] : static_cast<int>(blockIdx.x);
  const DevicePlanTask t = a.tasks[task];
  const int head = t.head_begin + static_cast<int>(blockIdx.y);
  if (head >= t.head_end) return;  // no CTA-wide barrier follows
  const int G = a.group_size, D = pools.head_dim, P = pools.page_tokens, H = pools.kv_heads;
  const int R = t.n_rows * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RowScratch w = carve(smem + static_cast<size_t>(warp) * warp_bytes, D, P);
  const HackPageGeometry& geo = pools.geometry;
  float* state = a.state + t.state +
                 static_cast<uint64_t>(head - t.head_begin) * device_plan_head_state_floats(R, a.state_v_dim);
  for (int r = warp; r < R; r += kWarps) {
    const int token = r / G, g = r % G;
    const int pos = t.start_pos + token;
    const size_t slot = (static_cast<size_t>(head) * G + static_cast<size_t>(g)) * static_cast<size_t>(D);
    const float* q = a.q + static_cast<size_t>(t.q_row + token) * a.q_stride + slot;
    for (int c = lane; c < D; c += 32) {
      w.q[c] = mul_f32(q[c], a.scale);
      w.acc[c] = 0.0f;
    }
    __syncwarp();
    float max = kNegInf, sum = 0.0f;
    for (int i = t.seg_begin; i < t.seg_end; ++i) {
      const int index = t.seg_base + (t.selection >= 0 ? a.selected[t.selection + i] : i);
      const DevicePlanSegment seg = a.segments[index];
      int visible = pos + 1 - seg.first_token;
      visible = visible < seg.tokens ? visible : seg.tokens;
      if (visible <= 0) continue;  // the segment lies after this row's position
      if (seg.kind == DevicePageKind::hack) {
        const uint8_t* section = pools.hack + static_cast<size_t>(seg.page) * pools.hack_page_stride + geo.head0 +
                                 static_cast<size_t>(head) * geo.head_bytes;
        hack_segment(w, geo, section, visible, max, sum);
      } else {
        const uint16_t* page = pools.exact + static_cast<size_t>(seg.page) * pools.exact_page_elems;
        const uint16_t* k = page + (static_cast<size_t>(head) * P + static_cast<size_t>(seg.row)) * D;
        const uint16_t* v = page + (static_cast<size_t>(H + head) * P + static_cast<size_t>(seg.row)) * D;
        exact_segment(w, D, k, v, visible, max, sum);
      }
    }
    if (t.alone != 0) {  // attention_rows_finish
      float* out = a.out + static_cast<size_t>(t.q_row + token) * a.out_stride + slot;
      const float inv = sum > 0.0f ? quant::div_f32(1.0f, sum) : 0.0f;
      for (int c = lane; c < D; c += 32) out[c] = mul_f32(w.acc[c], inv);
    } else {  // the split's state, as task_rows lays it out
      if (lane == 0) {
        state[r] = max;
        state[R + r] = sum;
      }
      float* acc = state + align16(3 * static_cast<size_t>(R)) + static_cast<size_t>(r) * D;
      for (int c = lane; c < D; c += 32) acc[c] = w.acc[c];
    }
    __syncwarp();
  }
}

// CTA (unit, head offset): merges the unit's splits in order (attention_rows_merge) and writes
// rows = acc / sum (attention_rows_finish); a warp per query row, a lane per 32nd channel.
__global__ void __launch_bounds__(kThreads) plan_combine_kernel(PlanLayerPools pools, PlanAttentionArgs a) {
  constexpr int kPerLane = kMaxDim / 32;
  const DevicePlanUnit u = a.units[blockIdx.x];
  const DevicePlanTask t0 = a.tasks[u.first_task];
  const int head = t0.head_begin + static_cast<int>(blockIdx.y);
  if (head >= t0.head_end) return;
  const int G = a.group_size, D = pools.head_dim, R = t0.n_rows * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t head_floats = device_plan_head_state_floats(R, a.state_v_dim);
  const size_t acc0 = align16(3 * static_cast<size_t>(R));
  auto state_of = [&](int k) {
    const DevicePlanTask& t = a.tasks[u.first_task + k];
    return a.state + t.state + static_cast<uint64_t>(head - t.head_begin) * head_floats;
  };
  for (int r = warp; r < R; r += kWarps) {
    const float* s0 = state_of(0);
    float m = s0[r], l = s0[R + r];
    float acc[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = lane + 32 * j;
      acc[j] = c < D ? s0[acc0 + static_cast<size_t>(r) * D + c] : 0.0f;
    }
    for (int k = 1; k < u.n_tasks; ++k) {
      const float* sk = state_of(k);
      const float sm = sk[r], sl = sk[R + r];
      if (sl == 0.0f && sm == kNegInf) continue;  // the split saw no token of this row
      const float mm = max_f32(m, sm);
      const float a_dst = quant::exp_f32(sub_f32(m, mm)), a_src = quant::exp_f32(sub_f32(sm, mm));
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int c = lane + 32 * j;
        if (c < D) acc[j] = fma_f32(acc[j], a_dst, mul_f32(sk[acc0 + static_cast<size_t>(r) * D + c], a_src));
      }
      l = fma_f32(l, a_dst, mul_f32(sl, a_src));
      m = mm;
    }
    const float inv = l > 0.0f ? quant::div_f32(1.0f, l) : 0.0f;
    float* out = a.out + static_cast<size_t>(t0.q_row + r / G) * a.out_stride +
                 (static_cast<size_t>(head) * G + static_cast<size_t>(r % G)) * D;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c < D) out[c] = mul_f32(acc[j], inv);
    }
  }
}

#define HACK_PLAN_ARG_CHECK(cond, what)                                                        \
  do {                                                                                         \
    if (!(cond)) cuda_fail(cudaErrorInvalidValue, "plan_attention: " what, __FILE__, __LINE__); \
  } while (0)

}  // namespace

void plan_attention(const PlanLayerPools& p, const PlanAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tasks == 0) return;
  // hack/core/error.h (fmt) does not compile under nvcc: argument errors go through cuda_fail.
  HACK_PLAN_ARG_CHECK(p.head_dim >= 16 && p.head_dim % 16 == 0 && p.head_dim <= kMaxDim,
                      "head_dim must be a multiple of 16 in [16, 256]");
  HACK_PLAN_ARG_CHECK(p.page_tokens >= 4 && p.page_tokens % 4 == 0 && p.page_tokens <= kMaxPage,
                      "page tokens must be a multiple of 4 in [4, 512]");
  HACK_PLAN_ARG_CHECK(p.kv_heads > 0 && p.exact != nullptr && p.exact_page_elems > 0, "no bf16 pool");
  HACK_PLAN_ARG_CHECK(a.group_size >= 1 && a.max_task_heads >= 1 && a.max_task_heads <= 65535 &&
                          a.max_unit_heads <= 65535,
                      "group size and heads per task must be positive (at most 65535 heads)");
  HACK_PLAN_ARG_CHECK(a.state_v_dim == p.head_dim, "the plan's state width must be head_dim (per-head FDC dims are refused)");
  HACK_PLAN_ARG_CHECK(a.tasks != nullptr && a.segments != nullptr && a.q != nullptr && a.out != nullptr &&
                          (a.n_units == 0 || (a.units != nullptr && a.state != nullptr)),
                      "null tasks, segments, q, out, units or state");
  if (p.hack != nullptr) {
    const HackPageGeometry& g = p.geometry;
    HACK_PLAN_ARG_CHECK(g.head_dim == p.head_dim && g.block_tokens == p.page_tokens && g.num_heads == p.kv_heads,
                        "HACK geometry disagrees with the pool (head_dim, block tokens, KV heads)");
    HACK_PLAN_ARG_CHECK((g.k_bits == 2 || g.k_bits == 4 || g.k_bits == 8) && (g.v_bits == 2 || g.v_bits == 4 || g.v_bits == 8),
                        "K and V bits must be 2, 4 or 8");
    HACK_PLAN_ARG_CHECK(g.k_group >= 16 && g.k_group % 16 == 0 && g.head_dim % g.k_group == 0 && g.v_group >= 16 &&
                            g.v_group % 16 == 0 && g.head_dim % g.v_group == 0,
                        "K/V partitions must be multiples of 16 dividing head_dim");
    HACK_PLAN_ARG_CHECK(g.block_tokens % 16 == 0, "HACK pages hold a multiple of 16 tokens");
    HACK_PLAN_ARG_CHECK(g.head0 % 4 == 0 && g.head_bytes % 4 == 0 && g.k_codes % 4 == 0 && g.v_codes % 4 == 0 &&
                            p.hack_page_stride % 4 == 0,
                        "HACK code words must be 4-byte aligned");
  }
  const size_t warp_bytes = warp_scratch_bytes(p.head_dim, p.page_tokens);
  const size_t smem = kWarps * warp_bytes;
  allow_dynamic_smem(reinterpret_cast<const void*>(&plan_task_kernel), smem, "plan attention (this head_dim and page size)");
  const dim3 grid(static_cast<unsigned>(a.n_tasks), static_cast<unsigned>(a.max_task_heads));
  plan_task_kernel<<<grid, kThreads, smem, stream>>>(p, a, static_cast<unsigned>(warp_bytes));
  HACK_CUDA_CU_CHECK(cudaGetLastError());
  if (a.n_units > 0) {
    const dim3 combine(static_cast<unsigned>(a.n_units), static_cast<unsigned>(a.max_unit_heads));
    plan_combine_kernel<<<combine, kThreads, 0, stream>>>(p, a);
    HACK_CUDA_CU_CHECK(cudaGetLastError());
  }
}

}  // namespace hack::cuda
