// CUDA twin of the HACK decode attention of PagedKvCache::attend (kernels/cpu/
// hack_attention_scalar.cpp is the reference): one CTA per (split, KV head, sequence)
// walks sinks → its range of HACK pages → open block with an online softmax over the
// group's query rows, writes a partial state, and a combine kernel merges the splits in
// order (attention_rows_merge) and normalizes (attention_rows_finish).
//
// Per quantized page, as on the CPU:
//   1. q·k_scale quantized to u8 per K partition (σ_q, μ_q); mterm = q·k_min
//   2. score = Σ_p σ_q,p·(q'·k')_p + μ_q,p·Σk'_p, then + mterm   (WMMA u8×u8→s32 for q'·k')
//   3. online softmax step over the Π scores
//   4. per V partition: p·v_scale quantized to u8 (σ_p, μ_p); p_min = p·v_min
//      out = σ_p·(p'·v') + μ_p·Σv' + p_min; acc = acc·α + out   (WMMA for p'·v')
// Every float operation is the CPU's, in the CPU's order: reductions that the CPU folds
// over 16 lanes (q·k_min, Σp, p·v_min, exact-block dots) use 16 lanes of a warp, lane j
// taking elements j, j+16, ... and a shuffle fold 8+8, 4+4, 2+2, 1+1; min/max reductions
// are order-free. hack_quant_math.h supplies the shared pieces (u8 codes, exp).
#include <mma.h>

#include <cstdint>

#include "hack/kernels/cuda/hack.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cuda {

namespace {

using namespace nvcuda;
using quant::add_f32;
using quant::bf16_bits_to_f32;
using quant::fma_f32;
using quant::mul_f32;
using quant::sub_f32;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxRows = 16;     // query rows of one KV head = the WMMA M dimension
constexpr int kTileBytes = 256;  // one 16×16 u8 WMMA operand tile, stored contiguously
constexpr int kMaxDim = 256;
constexpr int kMaxBlock = 256;
constexpr float kNegInf = -__builtin_huge_valf();

size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// Shared memory of the split kernel, offsets in bytes (each region 128-byte aligned, so
// every 256-byte u8 tile and 1 KiB int tile meets WMMA's 256-bit pointer alignment).
//   qs        [G][D] f32      q·scale
//   acc       [G][D] f32      running Σ exp(score − max)·v
//   s         [G][Π] f32      scores, then exp(score − max)
//   rows      [8][16] f32     per row: max, sum, alpha, mterm, σ_p, μ_p, p_min
//   q_meta    [2][16][kp] f32 per (row, K partition): σ_q, μ_q
//   q_tiles   [D/16][16 r][16 c] u8         Q' (WMMA A, row-major, rows ≥ G zero)
//   p_tiles   [Π/16][16 r][16 t] u8         P' of one V partition (WMMA A)
//   codes     K: [Π/16][D/16][16 t][16 c]   (WMMA B col-major: B(c, t) at t·16 + c)
//             V: [D/16][Π/16][16 c][16 t]   (WMMA B col-major: B(t, c) at c·16 + t)
//   dots      [max(Π, D)/16][16 r][16] s32  WMMA results, row-major tiles
struct SmemLayout {
  size_t qs, acc, s, rows, q_meta, q_tiles, p_tiles, codes, dots, bytes;
};

__host__ __device__ SmemLayout smem_layout(int G, int D, int T, int k_parts) {
  SmemLayout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t o = at;
    at += (bytes + 127) / 128 * 128;
    return o;
  };
  const size_t g = static_cast<size_t>(G), d = static_cast<size_t>(D), t = static_cast<size_t>(T);
  l.qs = take(g * d * 4);
  l.acc = take(g * d * 4);
  l.s = take(g * t * 4);
  l.rows = take(8 * kMaxRows * 4);
  l.q_meta = take(2 * kMaxRows * static_cast<size_t>(k_parts) * 4);
  l.q_tiles = take(kMaxRows * d);
  l.p_tiles = take(kMaxRows * t);
  l.codes = take(t * d);
  l.dots = take(kMaxRows * (t > d ? t : d) * 4);
  l.bytes = at;
  return l;
}

struct Smem {
  float* qs;
  float* acc;
  float* s;
  float* row_max;
  float* row_sum;
  float* row_alpha;
  float* row_mterm;
  float* p_sigma;
  float* p_mu;
  float* p_min;
  float* q_sigma;  // [16][kp]
  float* q_mu;     // [16][kp]
  uint8_t* q_tiles;
  uint8_t* p_tiles;
  uint8_t* codes;
  int32_t* dots;
};

// Σ over the 16 lanes of a half-warp in the CPU's fold order (lane j ends with
// part_j + part_{j+8} + ... as fold16 does); the result is in lane 0 of the half.
// Every lane of the warp must call it.
__device__ float fold16(float part) {
  for (int w = 8; w >= 1; w /= 2) part = add_f32(part, __shfl_down_sync(0xffffffffu, part, w, 16));
  return part;
}

__device__ float warp_min(float x) {
  for (int w = 16; w >= 1; w /= 2) x = quant::min_f32(x, __shfl_xor_sync(0xffffffffu, x, w));
  return x;
}

__device__ float warp_max(float x) {
  for (int w = 16; w >= 1; w /= 2) x = quant::max_f32(x, __shfl_xor_sync(0xffffffffu, x, w));
  return x;
}

__device__ uint32_t load_sum(const uint8_t* sums, int bytes, size_t i) {
  return bytes == 1 ? sums[i] : reinterpret_cast<const uint16_t*>(sums)[i];
}

// Online-softmax step of rows [0, G) over n scores s[r][0..n) (row stride T): leaves
// exp(score − m_new) in s, updates max and sum, records alpha. One warp per row.
__device__ void softmax_step(const Smem& sm, int G, int T, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < G; r += kWarps) {
    float* s = sm.s + static_cast<size_t>(r) * T;
    float block_max = kNegInf;
    for (int t = lane; t < n; t += 32) block_max = quant::max_f32(block_max, s[t]);
    block_max = warp_max(block_max);
    const float m_old = sm.row_max[r];
    const float m_new = quant::max_f32(m_old, block_max);
    const float alpha = quant::exp_f32(sub_f32(m_old, m_new));
    for (int t = lane; t < n; t += 32) s[t] = quant::exp_f32(sub_f32(s[t], m_new));
    __syncwarp();
    float part = 0.0f;
    for (int t = lane % 16; t < n; t += 16) part = add_f32(part, s[t]);
    const float total = fold16(part);
    if (lane == 0) {
      sm.row_sum[r] = fma_f32(sm.row_sum[r], alpha, total);
      sm.row_max[r] = m_new;
      sm.row_alpha[r] = alpha;
    }
  }
}

// An exact bf16 block of n ≤ Π tokens (sinks or the open block): k, v [n][D] rows.
// CPU: exact_block_scalar.
__device__ void exact_block(const Smem& sm, int G, int D, int T, const uint16_t* k, const uint16_t* v, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, lane16 = lane % 16;
  // Scores: one half-warp per (row, token), a canonical dot over D.
  const int total = G * n;
  for (int w0 = 2 * warp; w0 < total; w0 += 2 * kWarps) {
    const int w = w0 + half;
    float part = 0.0f;
    if (w < total) {
      const int r = w / n, t = w % n;
      const float* q = sm.qs + static_cast<size_t>(r) * D;
      const uint16_t* kt = k + static_cast<size_t>(t) * D;
      for (int c = lane16; c < D; c += 16) part = fma_f32(q[c], bf16_bits_to_f32(kt[c]), part);
    }
    const float dot = fold16(part);
    if (w < total && lane16 == 0) sm.s[static_cast<size_t>(w / n) * T + w % n] = dot;
  }
  __syncthreads();
  softmax_step(sm, G, T, n);
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int r = i / D, c = i % D;
    const float* p = sm.s + static_cast<size_t>(r) * T;
    float a = mul_f32(sm.acc[i], sm.row_alpha[r]);
    for (int t = 0; t < n; ++t) a = fma_f32(p[t], bf16_bits_to_f32(v[static_cast<size_t>(t) * D + c]), a);
    sm.acc[i] = a;
  }
  __syncthreads();
}

// One quantized page: `head` is the start of this KV head's section. CPU: hack_block_scalar.
__device__ void hack_block(const Smem& sm, const HackPageGeometry& g, int G, const uint8_t* head) {
  const int D = g.head_dim, T = g.block_tokens, k_bits = g.k_bits, v_bits = g.v_bits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, lane16 = lane % 16;
  const int kp = D / g.k_group;
  const uint16_t* k_min = reinterpret_cast<const uint16_t*>(head + g.k_min);
  const uint16_t* k_scale = reinterpret_cast<const uint16_t*>(head + g.k_scale);
  const uint8_t* k_codes = head + g.k_codes;
  const uint8_t* v_codes = head + g.v_codes;

  // 1. Q': per (row, K partition), q·k_scale quantized to u8. One warp per pair.
  for (int w = warp; w < G * kp; w += kWarps) {
    const int r = w / kp, p = w % kp, c0 = p * g.k_group;
    const float* q = sm.qs + static_cast<size_t>(r) * D;
    float lo = mul_f32(q[c0], bf16_bits_to_f32(k_scale[c0])), hi = lo;
    for (int c = c0 + lane; c < c0 + g.k_group; c += 32) {
      const float x = mul_f32(q[c], bf16_bits_to_f32(k_scale[c]));
      lo = quant::min_f32(lo, x);
      hi = quant::max_f32(hi, x);
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
    for (int c = c0 + lane; c < c0 + g.k_group; c += 32)
      sm.q_tiles[(c / 16) * kTileBytes + r * 16 + c % 16] =
          quant::u8_code(mul_f32(q[c], bf16_bits_to_f32(k_scale[c])), lo, inv);
    if (lane == 0) {
      sm.q_sigma[r * kp + p] = sigma;
      sm.q_mu[r * kp + p] = lo;
    }
  }
  // mterm = q·k_min, canonical order. One warp per row (both halves compute the same).
  for (int r = warp; r < G; r += kWarps) {
    const float* q = sm.qs + static_cast<size_t>(r) * D;
    float part = 0.0f;
    for (int c = lane16; c < D; c += 16) part = fma_f32(q[c], bf16_bits_to_f32(k_min[c]), part);
    const float mterm = fold16(part);
    if (lane == 0) sm.row_mterm[r] = mterm;
  }
  // K codes → B tiles; scores start at 0.
  for (int i = threadIdx.x; i < T * D; i += kThreads) {
    const int t = i / D, c = i % D;
    const int code = quant::code_at(k_codes, quant::k_code_pos(k_bits, D, t, c), k_bits);
    sm.codes[((t / 16) * (D / 16) + c / 16) * kTileBytes + (t % 16) * 16 + c % 16] = static_cast<uint8_t>(code);
  }
  for (int i = threadIdx.x; i < G * T; i += kThreads) sm.s[i] = 0.0f;
  __syncthreads();

  // 2. Scores, K partition by partition (the CPU's fma order over partitions).
  for (int p = 0; p < kp; ++p) {
    const int kc0 = p * g.k_group / 16, kc1 = (p + 1) * g.k_group / 16;
    for (int tt = warp; tt < T / 16; tt += kWarps) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, int> acc;
      wmma::fill_fragment(acc, 0);
      for (int kc = kc0; kc < kc1; ++kc) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, unsigned char, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, unsigned char, wmma::col_major> b;
        wmma::load_matrix_sync(a, sm.q_tiles + kc * kTileBytes, 16);
        wmma::load_matrix_sync(b, sm.codes + (tt * (D / 16) + kc) * kTileBytes, 16);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sm.dots + tt * 256, acc, 16, wmma::mem_row_major);
    }
    __syncthreads();
    const uint8_t* k_sums = head + g.k_sums;
    for (int i = threadIdx.x; i < G * T; i += kThreads) {
      const int r = i / T, t = i % T;
      const float dot = static_cast<float>(sm.dots[(t / 16) * 256 + r * 16 + t % 16]);
      const float ksum = static_cast<float>(load_sum(k_sums, g.k_sum_bytes, static_cast<size_t>(p) * T + t));
      float a = sm.s[i];
      a = fma_f32(sm.q_sigma[r * kp + p], dot, a);
      a = fma_f32(sm.q_mu[r * kp + p], ksum, a);
      if (p == kp - 1) a = add_f32(a, sm.row_mterm[r]);
      sm.s[i] = a;
    }
    __syncthreads();
  }

  // 3. Online softmax over the whole block (a closed page is visible to a decode query).
  softmax_step(sm, G, T, T);
  // V codes → B tiles (the K tiles are no longer read).
  for (int i = threadIdx.x; i < T * D; i += kThreads) {
    const int c = i / T, t = i % T;
    const int code = quant::code_at(v_codes, quant::v_code_pos(v_bits, T, t, c), v_bits);
    sm.codes[((c / 16) * (T / 16) + t / 16) * kTileBytes + (c % 16) * 16 + t % 16] = static_cast<uint8_t>(code);
  }
  __syncthreads();

  // 4. P·V, V partition by partition.
  const uint8_t* v_sums = head + g.v_sums;
  for (int p = 0; p < D / g.v_group; ++p) {
    const uint16_t* vs = reinterpret_cast<const uint16_t*>(head + g.v_scale) + static_cast<size_t>(p) * T;
    const uint16_t* vm = reinterpret_cast<const uint16_t*>(head + g.v_min) + static_cast<size_t>(p) * T;
    for (int r = warp; r < G; r += kWarps) {
      const float* s = sm.s + static_cast<size_t>(r) * T;
      float lo = mul_f32(s[0], bf16_bits_to_f32(vs[0])), hi = lo;
      for (int t = lane; t < T; t += 32) {
        const float x = mul_f32(s[t], bf16_bits_to_f32(vs[t]));
        lo = quant::min_f32(lo, x);
        hi = quant::max_f32(hi, x);
      }
      lo = warp_min(lo);
      hi = warp_max(hi);
      const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
      for (int t = lane; t < T; t += 32)
        sm.p_tiles[(t / 16) * kTileBytes + r * 16 + t % 16] =
            quant::u8_code(mul_f32(s[t], bf16_bits_to_f32(vs[t])), lo, inv);
      float part = 0.0f;
      for (int t = lane16; t < T; t += 16) part = fma_f32(s[t], bf16_bits_to_f32(vm[t]), part);
      const float p_min = fold16(part);
      if (lane == 0) {
        sm.p_sigma[r] = sigma;
        sm.p_mu[r] = lo;
        sm.p_min[r] = p_min;
      }
    }
    __syncthreads();
    const int ct0 = p * g.v_group / 16, n_ct = g.v_group / 16;
    for (int i = warp; i < n_ct; i += kWarps) {
      const int ct = ct0 + i;
      wmma::fragment<wmma::accumulator, 16, 16, 16, int> acc;
      wmma::fill_fragment(acc, 0);
      for (int tt = 0; tt < T / 16; ++tt) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, unsigned char, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, unsigned char, wmma::col_major> b;
        wmma::load_matrix_sync(a, sm.p_tiles + tt * kTileBytes, 16);
        wmma::load_matrix_sync(b, sm.codes + (ct * (T / 16) + tt) * kTileBytes, 16);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sm.dots + ct * 256, acc, 16, wmma::mem_row_major);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * g.v_group; i += kThreads) {
      const int r = i / g.v_group, c = p * g.v_group + i % g.v_group;
      const float dot = static_cast<float>(sm.dots[(c / 16) * 256 + r * 16 + c % 16]);
      const float vsum = static_cast<float>(load_sum(v_sums, g.v_sum_bytes, static_cast<size_t>(c)));
      float x = mul_f32(sm.p_sigma[r], dot);
      x = fma_f32(sm.p_mu[r], vsum, x);
      x = add_f32(x, sm.p_min[r]);
      float* a = sm.acc + static_cast<size_t>(r) * D + c;
      *a = fma_f32(*a, sm.row_alpha[r], x);
    }
    __syncthreads();
  }
}

// Partial states in the workspace: ml [batch][H][splits][G][2] (max, sum), then
// acc [batch][H][splits][G][D].
__global__ void __launch_bounds__(kThreads)
    decode_split_kernel(HackPageGeometry g, HackDecodeBatch in, HackDecodePlan plan, float* part_ml, float* part_acc) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int G = in.group_size, D = g.head_dim, T = g.block_tokens, H = g.num_heads;
  const int kp = D / g.k_group;
  const SmemLayout l = smem_layout(G, D, T, kp);
  float* rows = reinterpret_cast<float*>(smem + l.rows);
  float* q_meta = reinterpret_cast<float*>(smem + l.q_meta);
  const Smem sm{reinterpret_cast<float*>(smem + l.qs),
                reinterpret_cast<float*>(smem + l.acc),
                reinterpret_cast<float*>(smem + l.s),
                rows,
                rows + kMaxRows,
                rows + 2 * kMaxRows,
                rows + 3 * kMaxRows,
                rows + 4 * kMaxRows,
                rows + 5 * kMaxRows,
                rows + 6 * kMaxRows,
                q_meta,
                q_meta + kMaxRows * kp,
                smem + l.q_tiles,
                smem + l.p_tiles,
                smem + l.codes,
                reinterpret_cast<int32_t*>(smem + l.dots)};

  const size_t q_row0 = (static_cast<size_t>(b) * H + static_cast<size_t>(h)) * static_cast<size_t>(G);
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    sm.qs[i] = mul_f32(in.q[q_row0 * D + static_cast<size_t>(i)], in.scale);
    sm.acc[i] = 0.0f;
  }
  for (int i = threadIdx.x; i < kMaxRows * D; i += kThreads) sm.q_tiles[i] = 0;
  for (int i = threadIdx.x; i < kMaxRows * T; i += kThreads) sm.p_tiles[i] = 0;
  if (threadIdx.x < kMaxRows) {
    sm.row_max[threadIdx.x] = kNegInf;
    sm.row_sum[threadIdx.x] = 0.0f;
  }
  __syncthreads();

  const int num_pages = in.num_pages[b];
  const HackSplitRange range = hack_split_range(plan, split, num_pages);
  const size_t head_elems = static_cast<size_t>(h) * D;
  if (range.sinks && in.sink_tokens[b] > 0) {
    const size_t S = static_cast<size_t>(in.sink_capacity);
    const uint16_t* base = in.sink_kv[b];
    exact_block(sm, G, D, T, base + head_elems * S, base + (static_cast<size_t>(H) * D + head_elems) * S,
                in.sink_tokens[b]);
  }
  for (int page = range.page_begin; page < range.page_end; ++page) {
    const uint8_t* bytes =
        static_cast<const uint8_t*>(in.page_table[static_cast<size_t>(b) * in.max_pages + static_cast<size_t>(page)]);
    hack_block(sm, g, G, bytes + g.head0 + static_cast<size_t>(h) * g.head_bytes);
  }
  if (range.open && in.open_tokens[b] > 0) {
    const size_t TT = static_cast<size_t>(T);
    const uint16_t* base = in.open_kv[b];
    exact_block(sm, G, D, T, base + head_elems * TT, base + (static_cast<size_t>(H) * D + head_elems) * TT,
                in.open_tokens[b]);
  }

  const size_t state =
      (q_row0 / static_cast<size_t>(G) * static_cast<size_t>(plan.splits) + static_cast<size_t>(split)) *
      static_cast<size_t>(G);  // first row of this (sequence, head, split)
  for (int i = threadIdx.x; i < G * D; i += kThreads) part_acc[state * D + static_cast<size_t>(i)] = sm.acc[i];
  if (threadIdx.x < G) {
    part_ml[(state + threadIdx.x) * 2] = sm.row_max[threadIdx.x];
    part_ml[(state + threadIdx.x) * 2 + 1] = sm.row_sum[threadIdx.x];
  }
}

// Merges the splits of one (sequence, KV head) in split order and normalizes: CPU
// attention_rows_merge then attention_rows_finish. One thread per (row, channel).
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(int G, int D, int H, int splits, const float* part_ml, const float* part_acc, float* out) {
  const int h = blockIdx.x, b = blockIdx.y;
  const size_t first = (static_cast<size_t>(b) * H + static_cast<size_t>(h)) * static_cast<size_t>(splits);
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int r = i / D, c = i % D;
    size_t row = first * G + static_cast<size_t>(r);  // split 0
    float m = part_ml[row * 2], l = part_ml[row * 2 + 1], a = part_acc[row * D + c];
    for (int s = 1; s < splits; ++s) {
      row = (first + static_cast<size_t>(s)) * G + static_cast<size_t>(r);
      const float sm = part_ml[row * 2], sl = part_ml[row * 2 + 1];
      if (sl == 0.0f && sm == kNegInf) continue;
      const float mm = quant::max_f32(m, sm);
      const float a_dst = quant::exp_f32(sub_f32(m, mm));
      const float a_src = quant::exp_f32(sub_f32(sm, mm));
      a = fma_f32(a, a_dst, mul_f32(part_acc[row * D + c], a_src));
      l = fma_f32(l, a_dst, mul_f32(sl, a_src));
      m = mm;
    }
    const float inv = l > 0.0f ? quant::div_f32(1.0f, l) : 0.0f;
    out[((static_cast<size_t>(b) * H + static_cast<size_t>(h)) * G + static_cast<size_t>(r)) * D + c] = mul_f32(a, inv);
  }
}

size_t state_rows(const HackPageGeometry& g, int batch, int group_size, const HackDecodePlan& plan) {
  return static_cast<size_t>(batch) * static_cast<size_t>(g.num_heads) * static_cast<size_t>(plan.splits) *
         static_cast<size_t>(group_size);
}

#define HACK_CUDA_ARG_CHECK(cond, what)                                                                \
  do {                                                                                                 \
    if (!(cond)) cuda_fail(cudaErrorInvalidValue, "hack_decode_attention: " what, __FILE__, __LINE__); \
  } while (0)

}  // namespace

size_t hack_decode_workspace_bytes(const HackPageGeometry& g, int batch, int group_size, const HackDecodePlan& plan) {
  const size_t rows = state_rows(g, batch, group_size, plan);
  return align128(rows * 2 * sizeof(float)) + rows * static_cast<size_t>(g.head_dim) * sizeof(float);
}

void hack_decode_attention(const HackPageGeometry& g, const HackDecodeBatch& in, const HackDecodePlan& plan,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (in.batch <= 0) return;
  // hack/core/error.h (fmt) does not compile under nvcc: argument errors go through
  // cuda_fail as "invalid argument in hack_decode_attention: <what>".
  HACK_CUDA_ARG_CHECK(g.head_dim >= 16 && g.head_dim % 16 == 0 && g.head_dim <= kMaxDim,
                      "head_dim must be a multiple of 16 in [16, 256]");
  HACK_CUDA_ARG_CHECK(g.block_tokens >= 16 && g.block_tokens % 16 == 0 && g.block_tokens <= kMaxBlock,
                      "block tokens must be a multiple of 16 in [16, 256]");
  HACK_CUDA_ARG_CHECK(g.k_bits == 2 || g.k_bits == 4 || g.k_bits == 8, "K bits must be 2, 4 or 8");
  HACK_CUDA_ARG_CHECK(g.v_bits == 2 || g.v_bits == 4 || g.v_bits == 8, "V bits must be 2, 4 or 8");
  HACK_CUDA_ARG_CHECK(g.k_group >= 16 && g.k_group % 16 == 0 && g.head_dim % g.k_group == 0 && g.v_group >= 16 &&
                          g.v_group % 16 == 0 && g.head_dim % g.v_group == 0,
                      "K/V partitions must be multiples of 16 dividing head_dim");
  HACK_CUDA_ARG_CHECK(g.num_heads > 0 && g.num_heads <= 65535 && in.batch <= 65535,
                      "KV heads and batch must be in [1, 65535]");
  HACK_CUDA_ARG_CHECK(in.group_size >= 1 && in.group_size <= kMaxRows, "group size must be in [1, 16]");
  HACK_CUDA_ARG_CHECK(in.sink_capacity >= 0 && in.sink_capacity <= g.block_tokens,
                      "sinks must be at most the block size");
  HACK_CUDA_ARG_CHECK(plan.splits >= 1 && plan.pages_per_split >= 1, "plan needs splits ≥ 1 and pages_per_split ≥ 1");
  HACK_CUDA_ARG_CHECK(in.q != nullptr && in.out != nullptr && in.num_pages != nullptr && in.sink_tokens != nullptr &&
                          in.open_tokens != nullptr && (in.max_pages == 0 || in.page_table != nullptr) &&
                          in.sink_kv != nullptr && in.open_kv != nullptr,
                      "null q, out, page table or per-sequence array");
  HACK_CUDA_ARG_CHECK(
      workspace != nullptr && workspace_bytes >= hack_decode_workspace_bytes(g, in.batch, in.group_size, plan),
      "workspace smaller than hack_decode_workspace_bytes");

  const SmemLayout l = smem_layout(in.group_size, g.head_dim, g.block_tokens, g.head_dim / g.k_group);
  allow_dynamic_smem(reinterpret_cast<const void*>(&decode_split_kernel), l.bytes,
                     "hack_decode_attention (this head_dim and block size)");

  float* part_ml = static_cast<float*>(workspace);
  float* part_acc =
      reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                               align128(state_rows(g, in.batch, in.group_size, plan) * 2 * sizeof(float)));
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(g.num_heads),
                  static_cast<unsigned>(in.batch));
  decode_split_kernel<<<grid, kThreads, l.bytes, stream>>>(g, in, plan, part_ml, part_acc);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
  const dim3 combine_grid(static_cast<unsigned>(g.num_heads), static_cast<unsigned>(in.batch));
  decode_combine_kernel<<<combine_grid, kThreads, 0, stream>>>(in.group_size, g.head_dim, g.num_heads, plan.splits,
                                                               part_ml, part_acc, in.out);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
