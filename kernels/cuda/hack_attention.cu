// CUDA twin of the HACK decode attention of CpuPagedKvCache::attend (kernels/cpu/
// hack_attention_scalar.cpp is the reference): one warp per (split, KV head, sequence)
// walks sinks → its range of HACK pages → open block with an online softmax over the
// group's query rows, writes a partial state, and a combine kernel merges the splits in
// order (attention_rows_merge) and normalizes (attention_rows_finish). A CTA holds 4
// consecutive splits of one (sequence, KV head), sharing q; many small splits keep every
// SM busy with independent warps, which is what a bandwidth-bound decode step needs.
//
// Per quantized page, as on the CPU:
//   1. q·k_scale quantized to u8 per K partition (σ_q, μ_q); mterm = q·k_min
//   2. score = Σ_p σ_q,p·(q'·k')_p + μ_q,p·Σk'_p, then + mterm   (__dp4a u8×u8 for q'·k')
//   3. online softmax step over the Π scores
//   4. per V partition: p·v_scale quantized to u8 (σ_p, μ_p); p_min = p·v_min
//      out = σ_p·(p'·v') + μ_p·Σv' + p_min; acc = acc·α + out   (__dp4a for p'·v')
// The page layout (kv/hack_page.h) puts all of a token's K codes of a 16-channel chunk in
// one 32-bit word, and all of a channel's V codes of a (32/b)-token chunk in one word, so
// each lane reads whole words (coalesced across lanes) and unpacks 4 codes per __dp4a.
// Every float operation is the CPU's, in the CPU's order: reductions that the CPU folds
// over 16 lanes (q·k_min, Σp, p·v_min, exact-block dots) use 16 lanes of a warp, lane j
// taking elements j, j+16, ... and a shuffle fold 8+8, 4+4, 2+2, 1+1; min/max reductions
// are order-free; integer dots are exact in any order. hack_quant_math.h supplies the
// shared pieces (u8 codes, exp).
#include <cstdint>

#include "hack/kernels/cuda/hack.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cuda {

namespace {

using quant::add_f32;
using quant::bf16_bits_to_f32;
using quant::fma_f32;
using quant::mul_f32;
using quant::sub_f32;

constexpr int kWarps = 4;  // splits per CTA (one warp each) of the same (sequence, KV head)
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxRows = 16;  // query rows of one KV head
constexpr int kRowGroup = 4;  // rows whose integer dots one lane carries at once (registers); the code below spells 4 out
constexpr int kMaxDim = 128;  // a lane holds 4 channels of a row in the Q' step
constexpr int kMaxBlock = 256;
constexpr int kCombineThreads = 128;
constexpr float kNegInf = -__builtin_huge_valf();

size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// Shared memory of the split kernel: the CTA's q·scale [G][D] f32, then one region per warp
// (offsets in bytes from the region's start, each 16-byte aligned):
//   qbytes  [G4/4][D/4][4][4] u8  Q' codes of the current page, rows padded to G4 (a
//                           multiple of kRowGroup) with zeros: the u32 word of (row r,
//                           channels c..c+3), the operand of __dp4a against a K code
//                           word, sits beside those of the other rows of its group, so
//                           one 16-byte load gives a row group's four words
//   (rows ≥ G stay zero: their dots are computed, never used, and need no branch)
//   q_sigma [G][kp] f32, q_mu [G][kp] f32   per (row, K partition)
//   rows    [8][16] f32     max, sum, alpha, mterm, σ_p, μ_p, p_min per row
//   s       [G][Π] f32      scores, then exp(score − max)
//   pbytes  [G4/4][Π/4][4][4] u8  P' codes of one V partition, the same arrangement over
//                           tokens (word of row r packs tokens t..t+3)
//   acc     [G][D] f32      running Σ exp(score − max)·v
//   stage   [2][stage_bytes]  double buffer the warp's cp.async copies land in: a page's
//                           head section (the next page streams in while this one is
//                           worked on), or chunks of an exact block's bf16 K and V rows
struct WarpLayout {
  size_t qbytes, q_sigma, q_mu, rows, s, pbytes, acc, stage, stage_bytes, bytes;
};

__host__ __device__ size_t align16(size_t n) { return (n + 15) / 16 * 16; }

constexpr int kExactChunk = 16;  // exact-block tokens staged at once (at least)

__host__ __device__ WarpLayout warp_layout(const HackPageGeometry& geo, int G) {
  const int D = geo.head_dim, T = geo.block_tokens, k_parts = geo.head_dim / geo.k_group;
  WarpLayout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t o = at;
    at += align16(bytes);
    return o;
  };
  const size_t g = static_cast<size_t>(G), d = static_cast<size_t>(D), t = static_cast<size_t>(T);
  const size_t g4 = (g + kRowGroup - 1) / kRowGroup * kRowGroup;
  l.qbytes = take(g4 * d);
  l.q_sigma = take(g * static_cast<size_t>(k_parts) * 4);
  l.q_mu = take(g * static_cast<size_t>(k_parts) * 4);
  l.rows = take(8 * kMaxRows * 4);
  l.s = take(g * t * 4);
  l.pbytes = take(g4 * t);
  l.acc = take(g * d * 4);
  const size_t exact = static_cast<size_t>(kExactChunk) * (d * 2 + 16);  // padded rows (exact_row_bytes)
  l.stage_bytes = align16(geo.fields_end > exact ? geo.fields_end : exact);
  l.stage = take(2 * l.stage_bytes);
  l.bytes = at;
  return l;
}

__host__ __device__ size_t split_smem_bytes(const HackPageGeometry& geo, int G) {
  return align16(static_cast<size_t>(G) * geo.head_dim * 4) + kWarps * warp_layout(geo, G).bytes;
}

// One warp's scratch (see WarpLayout) and the CTA's q·scale.
struct Warp {
  const float* qs;
  uint8_t* qbytes;
  float* q_sigma;
  float* q_mu;
  float* row_max;
  float* row_sum;
  float* row_alpha;
  float* row_mterm;
  float* p_sigma;
  float* p_mu;
  float* p_min;
  float* s;
  uint8_t* pbytes;
  float* acc;
  uint8_t* stage;  ///< two buffers of stage_bytes
  size_t stage_bytes;
  __device__ uint8_t* buffer(int i) const { return stage + static_cast<size_t>(i) * stage_bytes; }
};

// Σ over the 16 lanes of a half-warp in the CPU's fold order (lane j ends with
// part_j + part_{j+8} + ... as fold16 does); the result is in lane 0 of the half.
// Every lane of the warp must call it.
__device__ float fold16(float part) {
  for (int w = 8; w >= 1; w /= 2) part = add_f32(part, __shfl_down_sync(0xffffffffu, part, w, 16));
  return part;
}

__device__ uint32_t load_sum(const uint8_t* sums, int bytes, size_t i) {
  return bytes == 1 ? sums[i] : reinterpret_cast<const uint16_t*>(sums)[i];
}

__device__ uint32_t load_word(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The warp copies [src, src + bytes) (16-byte aligned, a multiple of 16) into shared memory
// at dst with cp.async, as one commit group per lane.
__device__ void stage_async(uint8_t* dst, const uint8_t* src, size_t bytes) {
  for (size_t o = static_cast<size_t>(threadIdx.x % 32) * 16; o < bytes; o += 32 * 16) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + o));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + o));
  }
  asm volatile("cp.async.commit_group;");
}

// Waits until at most `pending` of this lane's commit groups are in flight, then makes
// every lane's landed bytes visible to the warp.
template <int pending>
__device__ void stage_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(pending));
  __syncwarp();
}

// Extremes and the fold-order sum over the 8 lanes of a row's lane group (width 8).
__device__ float group8_min(float x) {
  for (int w = 4; w >= 1; w /= 2) x = quant::min_f32(x, __shfl_xor_sync(0xffffffffu, x, w, 8));
  return x;
}

__device__ float group8_max(float x) {
  for (int w = 4; w >= 1; w /= 2) x = quant::max_f32(x, __shfl_xor_sync(0xffffffffu, x, w, 8));
  return x;
}

// The CPU's 16-lane fold (fold16) of partials part_j, j = 0..15, held two to a lane: lane u
// of a row's 8-lane group holds part_u (lo) and part_{u+8} (hi). The w = 8 step is the
// lane's own sum; 4, 2, 1 shuffle down within the group; the total lands in lane u = 0.
__device__ float fold16_pairs(float lo, float hi) {
  float part = add_f32(lo, hi);
  for (int w = 4; w >= 1; w /= 2) part = add_f32(part, __shfl_down_sync(0xffffffffu, part, w, 8));
  return part;
}

// Online-softmax step of rows [0, G) over n scores s[r][0..n) (row stride T): leaves
// exp(score − m_new) in s, updates max and sum, records alpha. Four rows at a time, a row
// to each 8-lane group; lane u of the group takes tokens u + 16i (its part_u of the CPU's
// fold order) and u + 8 + 16i (part_{u+8}).
__device__ void softmax_step(const Warp& w, int G, int T, int n) {
  const int lane = threadIdx.x % 32, u = lane % 8;
  for (int r0 = 0; r0 < G; r0 += 4) {
    const int r = r0 + lane / 8;
    const bool live = r < G;
    // A group past the last row touches no memory; it only keeps the shuffles full.
    float* s = w.s + static_cast<size_t>(live ? r : 0) * T;
    const int valid = live ? n : 0;
    float block_max = kNegInf;
    for (int t = u; t < valid; t += 8) block_max = quant::max_f32(block_max, s[t]);
    block_max = group8_max(block_max);
    const float m_old = live ? w.row_max[r] : 0.0f;
    const float m_new = quant::max_f32(m_old, block_max);
    const float alpha = quant::exp_f32(sub_f32(m_old, m_new));
    float lo = 0.0f, hi = 0.0f;
    for (int t0 = 0; t0 < valid; t0 += 16) {
      if (t0 + u < valid) {
        const float e = quant::exp_f32(sub_f32(s[t0 + u], m_new));
        s[t0 + u] = e;
        lo = add_f32(lo, e);
      }
      if (t0 + u + 8 < valid) {
        const float e = quant::exp_f32(sub_f32(s[t0 + u + 8], m_new));
        s[t0 + u + 8] = e;
        hi = add_f32(hi, e);
      }
    }
    const float total = fold16_pairs(lo, hi);
    __syncwarp();  // every lane has read row_max before lane 0 of the group replaces it
    if (live && u == 0) {
      w.row_sum[r] = fma_f32(w.row_sum[r], alpha, total);
      w.row_max[r] = m_new;
      w.row_alpha[r] = alpha;
    }
  }
  __syncwarp();
}

// An exact bf16 block of n ≤ Π tokens (sinks or the open block): k, v [n][D] rows in
// global memory, staged a chunk of tokens at a time through `buf` (the warp's staging
// buffer not holding a prefetched page), each row padded by 16 bytes so that lanes reading
// different rows hit different banks. CPU: exact_block_scalar. Scores: a lane per (row,
// token) runs the CPU's canonical dot itself (16 partials, c ≡ j mod 16, then its fold
// tree); the acc chain over tokens runs across chunks in token order.
__device__ int exact_row_bytes(int D) { return D * 2 + 16; }

__device__ void stage_rows(uint8_t* buf, const uint16_t* src, int m, int D) {
  const int row = D * 2, chunks = m * row / 16;
  for (int i = threadIdx.x % 32; i < chunks; i += 32) {
    const int t = i * 16 / row, o = i * 16 - t * row;
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(buf + t * exact_row_bytes(D) + o));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d),
                 "l"(reinterpret_cast<const uint8_t*>(src) + static_cast<size_t>(i) * 16));
  }
  asm volatile("cp.async.commit_group;");
}

__device__ void exact_block(const Warp& w, int G, int D, int T, const uint16_t* k, const uint16_t* v, int n,
                            uint8_t* buf) {
  const int lane = threadIdx.x % 32;
  const int chunk = static_cast<int>(w.stage_bytes / static_cast<size_t>(exact_row_bytes(D)));
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int m = n - t0 < chunk ? n - t0 : chunk;
    __syncwarp();
    stage_rows(buf, k + static_cast<size_t>(t0) * D, m, D);
    stage_wait<0>();
    for (int r = 0; r < G; ++r)
      for (int t = lane; t < m; t += 32) {
        const float* q = w.qs + static_cast<size_t>(r) * D;
        const uint16_t* kt = reinterpret_cast<const uint16_t*>(buf + t * exact_row_bytes(D));
        float part[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) part[j] = 0.0f;
        for (int c0 = 0; c0 < D; c0 += 16) {
#pragma unroll
          for (int j = 0; j < 16; ++j) part[j] = fma_f32(q[c0 + j], bf16_bits_to_f32(kt[c0 + j]), part[j]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) part[j] = add_f32(part[j], part[j + 8]);  // the fold tree: 8, 4, 2, 1
#pragma unroll
        for (int j = 0; j < 4; ++j) part[j] = add_f32(part[j], part[j + 4]);
        part[0] = add_f32(part[0], part[2]);
        part[1] = add_f32(part[1], part[3]);
        w.s[static_cast<size_t>(r) * T + t0 + t] = add_f32(part[0], part[1]);
      }
  }
  __syncwarp();
  softmax_step(w, G, T, n);
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int m = n - t0 < chunk ? n - t0 : chunk;
    __syncwarp();
    stage_rows(buf, v + static_cast<size_t>(t0) * D, m, D);
    stage_wait<0>();
    for (int r = 0; r < G; ++r) {
      const float* p = w.s + static_cast<size_t>(r) * T + t0;
      for (int c = 2 * lane; c < D; c += 64) {  // two channels a lane, one 32-bit load a token
        float* acc = w.acc + static_cast<size_t>(r) * D + c;
        float a0 = acc[0], a1 = acc[1];
        if (t0 == 0) {
          a0 = mul_f32(a0, w.row_alpha[r]);
          a1 = mul_f32(a1, w.row_alpha[r]);
        }
        for (int t = 0; t < m; ++t) {
          const uint32_t pair = *reinterpret_cast<const uint32_t*>(buf + t * exact_row_bytes(D) + c * 2);
          a0 = fma_f32(p[t], bf16_bits_to_f32(static_cast<uint16_t>(pair & 0xffffu)), a0);
          a1 = fma_f32(p[t], bf16_bits_to_f32(static_cast<uint16_t>(pair >> 16)), a1);
        }
        acc[0] = a0;
        acc[1] = a1;
      }
    }
  }
  __syncwarp();
}

// Byte of (row r, element i) in a row-group-interleaved code array of n elements a row.
__device__ int grouped_byte(int r, int i, int n) {
  return (((r / kRowGroup) * (n / 4) + i / 4) * kRowGroup + r % kRowGroup) * 4 + i % 4;
}

// `bits`-bit codes of one 32-bit code word, sub-group `sub`, as four u8 lanes.
__device__ uint32_t code_lanes(uint32_t word, int bits, int sub) {
  const uint32_t mask = bits == 2 ? 0x03030303u : (bits == 4 ? 0x0f0f0f0fu : 0xffffffffu);
  return (word >> (bits * sub)) & mask;
}

// The u8 dots of two code columns a and b (K: two tokens; V: two channels) with a row group's
// four interleaved operand words (Q' or P'), over code words [w0, w1): word wi of a column
// sits at column + wi·64 and its 32/bits codes, four at a time (sub-group sub), meet operand
// word wi·(32/bits)/4 + sub of each row.
__device__ __forceinline__ void dot_code_words(const uint8_t* a, const uint8_t* b, int w0, int w1, int bits,
                                               const uint4* operands, uint32_t (&da)[kRowGroup],
                                               uint32_t (&db)[kRowGroup]) {
  const int subs = 32 / bits / 4;
  for (int wi = w0; wi < w1; ++wi) {
    const uint32_t word_a = load_word(a + static_cast<size_t>(wi) * quant::kChunkBytes);
    const uint32_t word_b = load_word(b + static_cast<size_t>(wi) * quant::kChunkBytes);
#pragma unroll
    for (int sub = 0; sub < subs; ++sub) {
      const uint32_t codes_a = code_lanes(word_a, bits, sub), codes_b = code_lanes(word_b, bits, sub);
      const uint4 o = operands[wi * subs + sub];
      da[0] = __dp4a(codes_a, o.x, da[0]);
      db[0] = __dp4a(codes_b, o.x, db[0]);
      da[1] = __dp4a(codes_a, o.y, da[1]);
      db[1] = __dp4a(codes_b, o.y, db[1]);
      da[2] = __dp4a(codes_a, o.z, da[2]);
      db[2] = __dp4a(codes_b, o.z, db[2]);
      da[3] = __dp4a(codes_a, o.w, da[3]);
      db[3] = __dp4a(codes_b, o.w, db[3]);
    }
  }
}

// One quantized page: `head` is the start of this KV head's section. CPU: hack_block_scalar.
// The integer dots (Q'·K' per K partition, P'·V' per channel) are __dp4a over u8 lanes:
// exact, so any order gives the CPU's integers; every float step is the CPU's, in order.
// KB / VB: the code bits when known at compile time (loops over a word's codes unroll),
// 0 = read them from the geometry.
template <int KB, int VB>
__device__ void hack_block(const Warp& w, const HackPageGeometry& g, int G, const uint8_t* head) {
  const int D = g.head_dim, T = g.block_tokens;
  const int k_bits = KB != 0 ? KB : g.k_bits, v_bits = VB != 0 ? VB : g.v_bits;
  const int lane = threadIdx.x % 32, half = lane / 16, lane16 = lane % 16;
  const int kp = D / g.k_group;
  const uint16_t* k_min = reinterpret_cast<const uint16_t*>(head + g.k_min);
  const uint16_t* k_scale = reinterpret_cast<const uint16_t*>(head + g.k_scale);
  const uint8_t* k_codes = head + g.k_codes;
  const uint8_t* v_codes = head + g.v_codes;
  const uint8_t* k_sums = head + g.k_sums;
  const uint8_t* v_sums = head + g.v_sums;

  // 1. Q': lane l takes channels 4l..4l+3 of each row (D ≤ 128), x = q·k_scale; the
  //    extremes of a K partition over its k_group/4 lanes (xor shuffles within the group),
  //    the four codes packed into one word; mterm = q·k_min in the canonical order (one
  //    half-warp per row).
  {
    const int c = 4 * lane, group = g.k_group / 4;  // lanes of one partition (a power of two)
    const bool have = c < D;
    const int p = have ? c / g.k_group : 0;
    float scale[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) scale[i] = have ? bf16_bits_to_f32(k_scale[c + i]) : 0.0f;
    for (int r = 0; r < G; ++r) {
      const float4 q4 = have ? *reinterpret_cast<const float4*>(w.qs + static_cast<size_t>(r) * D + c)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float x[4] = {mul_f32(q4.x, scale[0]), mul_f32(q4.y, scale[1]), mul_f32(q4.z, scale[2]),
                          mul_f32(q4.w, scale[3])};
      float lo = quant::min_f32(quant::min_f32(x[0], x[1]), quant::min_f32(x[2], x[3]));
      float hi = quant::max_f32(quant::max_f32(x[0], x[1]), quant::max_f32(x[2], x[3]));
      for (int width = group / 2; width >= 1; width /= 2) {
        lo = quant::min_f32(lo, __shfl_xor_sync(0xffffffffu, lo, width));
        hi = quant::max_f32(hi, __shfl_xor_sync(0xffffffffu, hi, width));
      }
      const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
      if (have) {
        const uint32_t word = static_cast<uint32_t>(quant::u8_code(x[0], lo, inv)) |
                              static_cast<uint32_t>(quant::u8_code(x[1], lo, inv)) << 8 |
                              static_cast<uint32_t>(quant::u8_code(x[2], lo, inv)) << 16 |
                              static_cast<uint32_t>(quant::u8_code(x[3], lo, inv)) << 24;
        *reinterpret_cast<uint32_t*>(w.qbytes + grouped_byte(r, c, D)) = word;
        if (c % g.k_group == 0) {
          w.q_sigma[r * kp + p] = sigma;
          w.q_mu[r * kp + p] = lo;
        }
      }
    }
  }
  for (int r0 = 0; r0 < G; r0 += 2) {
    const int r = r0 + half;
    float part = 0.0f;
    if (r < G) {
      const float* q = w.qs + static_cast<size_t>(r) * D;
      for (int c = lane16; c < D; c += 16) part = fma_f32(q[c], bf16_bits_to_f32(k_min[c]), part);
    }
    const float mterm = fold16(part);
    if (r < G && lane16 == 0) w.row_mterm[r] = mterm;
  }
  __syncwarp();

  // 2. Scores: a lane per token (two tokens, t and t + 32, sharing each Q' word read);
  //    per K partition the u8 dots of kRowGroup rows at once, then the CPU's fma order
  //    over partitions.
  const int cpc = 32 / k_bits;  // channels per K code word
  const int words = D / cpc;    // K code words per token
  const int words_per_part = g.k_group / cpc;
  const uint4* qwords = reinterpret_cast<const uint4*>(w.qbytes);
  for (int t0 = 0; t0 < T; t0 += 64) {
    const int ta = t0 + lane, tb = ta + 32;
    const bool has_b = tb < T;
    if (ta >= T) break;  // T is a multiple of 16: only the lanes past it leave
    const uint8_t* ka = k_codes + static_cast<size_t>(ta / 16) * words * quant::kChunkBytes + 4 * (ta % 16);
    const uint8_t* kb = k_codes + static_cast<size_t>((has_b ? tb : ta) / 16) * words * quant::kChunkBytes +
                        4 * ((has_b ? tb : ta) % 16);
    for (int r0 = 0; r0 < G; r0 += kRowGroup) {
      float sa[kRowGroup], sb[kRowGroup];
#pragma unroll
      for (int j = 0; j < kRowGroup; ++j) sa[j] = sb[j] = 0.0f;
      for (int p = 0; p < kp; ++p) {
        uint32_t da[kRowGroup] = {}, db[kRowGroup] = {};
        dot_code_words(ka, kb, p * words_per_part, (p + 1) * words_per_part, k_bits,
                       qwords + (r0 / kRowGroup) * (D / 4), da, db);
        const float ksum_a = static_cast<float>(load_sum(k_sums, g.k_sum_bytes, static_cast<size_t>(p) * T + ta));
        const float ksum_b =
            static_cast<float>(load_sum(k_sums, g.k_sum_bytes, static_cast<size_t>(p) * T + (has_b ? tb : ta)));
#pragma unroll
        for (int j = 0; j < kRowGroup; ++j) {
          if (r0 + j >= G) continue;
          const float sigma = w.q_sigma[(r0 + j) * kp + p], mu = w.q_mu[(r0 + j) * kp + p];
          sa[j] = fma_f32(mu, ksum_a, fma_f32(sigma, static_cast<float>(da[j]), sa[j]));
          sb[j] = fma_f32(mu, ksum_b, fma_f32(sigma, static_cast<float>(db[j]), sb[j]));
        }
      }
#pragma unroll
      for (int j = 0; j < kRowGroup; ++j) {
        if (r0 + j >= G) continue;
        float* row = w.s + static_cast<size_t>(r0 + j) * T;
        row[ta] = add_f32(sa[j], w.row_mterm[r0 + j]);
        if (has_b) row[tb] = add_f32(sb[j], w.row_mterm[r0 + j]);
      }
    }
  }
  __syncwarp();

  // 3. Online softmax over the whole block (a closed page is visible to a decode query).
  softmax_step(w, G, T, T);

  // 4. P·V, V partition by partition.
  const int tpc = 32 / v_bits;  // tokens per V code word
  const int token_words = T / tpc;
  const uint4* pwords = reinterpret_cast<const uint4*>(w.pbytes);
  for (int p = 0; p < D / g.v_group; ++p) {
    const uint16_t* vs = reinterpret_cast<const uint16_t*>(head + g.v_scale) + static_cast<size_t>(p) * T;
    const uint16_t* vm = reinterpret_cast<const uint16_t*>(head + g.v_min) + static_cast<size_t>(p) * T;
    // P' of this partition: four rows at a time, a row to each 8-lane group, lane u taking
    // tokens u + 16i and u + 8 + 16i (the CPU's fold partials u and u + 8 for p_min).
    for (int r0 = 0; r0 < G; r0 += 4) {
      const int r = r0 + lane / 8, u = lane % 8;
      const bool live = r < G;
      const float* e = w.s + static_cast<size_t>(live ? r : 0) * T;
      float lo = live ? mul_f32(e[u], bf16_bits_to_f32(vs[u])) : 0.0f, hi = lo;
      float pm_lo = 0.0f, pm_hi = 0.0f;
      for (int t0 = 0; t0 < (live ? T : 0); t0 += 16) {
        const float xa = mul_f32(e[t0 + u], bf16_bits_to_f32(vs[t0 + u]));
        const float xb = mul_f32(e[t0 + u + 8], bf16_bits_to_f32(vs[t0 + u + 8]));
        lo = quant::min_f32(lo, quant::min_f32(xa, xb));
        hi = quant::max_f32(hi, quant::max_f32(xa, xb));
        pm_lo = fma_f32(e[t0 + u], bf16_bits_to_f32(vm[t0 + u]), pm_lo);
        pm_hi = fma_f32(e[t0 + u + 8], bf16_bits_to_f32(vm[t0 + u + 8]), pm_hi);
      }
      lo = group8_min(lo);
      hi = group8_max(hi);
      const float sigma = quant::u8_sigma(lo, hi), inv = quant::u8_inverse(sigma);
      const float p_min = fold16_pairs(pm_lo, pm_hi);
      if (live) {
        for (int t0 = 0; t0 < T; t0 += 16) {
          w.pbytes[grouped_byte(r, t0 + u, T)] = quant::u8_code(mul_f32(e[t0 + u], bf16_bits_to_f32(vs[t0 + u])), lo, inv);
          w.pbytes[grouped_byte(r, t0 + u + 8, T)] =
              quant::u8_code(mul_f32(e[t0 + u + 8], bf16_bits_to_f32(vs[t0 + u + 8])), lo, inv);
        }
        if (u == 0) {
          w.p_sigma[r] = sigma;
          w.p_mu[r] = lo;
          w.p_min[r] = p_min;
        }
      }
    }
    __syncwarp();
    // A lane per channel of the partition (two, c and c + 32, sharing each P' word read);
    // the u8 dots of kRowGroup rows at once.
    for (int c0 = p * g.v_group; c0 < (p + 1) * g.v_group; c0 += 64) {
      const int ca = c0 + lane, cb = ca + 32;
      const bool has_b = cb < (p + 1) * g.v_group;
      if (ca >= (p + 1) * g.v_group) break;  // v_group is a multiple of 16
      const int cbb = has_b ? cb : ca;
      const uint8_t* va = v_codes + static_cast<size_t>(ca / 16) * token_words * quant::kChunkBytes + 4 * (ca % 16);
      const uint8_t* vb = v_codes + static_cast<size_t>(cbb / 16) * token_words * quant::kChunkBytes + 4 * (cbb % 16);
      const float vsum_a = static_cast<float>(load_sum(v_sums, g.v_sum_bytes, static_cast<size_t>(ca)));
      const float vsum_b = static_cast<float>(load_sum(v_sums, g.v_sum_bytes, static_cast<size_t>(cbb)));
      for (int r0 = 0; r0 < G; r0 += kRowGroup) {
        uint32_t da[kRowGroup] = {}, db[kRowGroup] = {};
        dot_code_words(va, vb, 0, token_words, v_bits, pwords + (r0 / kRowGroup) * (T / 4), da, db);
#pragma unroll
        for (int j = 0; j < kRowGroup; ++j) {
          if (r0 + j >= G) continue;
          const int r = r0 + j;
          float xa = mul_f32(w.p_sigma[r], static_cast<float>(da[j]));
          xa = fma_f32(w.p_mu[r], vsum_a, xa);
          xa = add_f32(xa, w.p_min[r]);
          float* acc = w.acc + static_cast<size_t>(r) * D;
          acc[ca] = fma_f32(acc[ca], w.row_alpha[r], xa);
          if (has_b) {
            float xb = mul_f32(w.p_sigma[r], static_cast<float>(db[j]));
            xb = fma_f32(w.p_mu[r], vsum_b, xb);
            xb = add_f32(xb, w.p_min[r]);
            acc[cb] = fma_f32(acc[cb], w.row_alpha[r], xb);
          }
        }
      }
    }
    __syncwarp();
  }
}

// Partial states in the workspace: ml [batch][H][splits][G][2] (max, sum), then
// acc [batch][H][splits][G][D]. One warp per split; the CTA's warps are consecutive
// splits of one (sequence, KV head).
template <int KB, int VB>
__global__ void __launch_bounds__(kThreads)
    decode_split_kernel(HackPageGeometry g, HackDecodeBatch in, HackDecodePlan plan, float* part_ml, float* part_acc) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x * kWarps + warp, h = blockIdx.y, b = blockIdx.z;
  const int G = in.group_size, D = g.head_dim, T = g.block_tokens, H = g.num_heads;
  float* qs = reinterpret_cast<float*>(smem);
  const size_t q_row0 = (static_cast<size_t>(b) * H + static_cast<size_t>(h)) * static_cast<size_t>(G);
  for (int i = threadIdx.x; i < G * D; i += kThreads) qs[i] = mul_f32(in.q[q_row0 * D + static_cast<size_t>(i)], in.scale);
  __syncthreads();
  if (split >= plan.splits) return;  // no CTA-wide barrier follows

  const WarpLayout l = warp_layout(g, G);
  unsigned char* base = smem + align16(static_cast<size_t>(G) * D * 4) + static_cast<size_t>(warp) * l.bytes;
  float* rows = reinterpret_cast<float*>(base + l.rows);
  const Warp w{qs,
               base + l.qbytes,
               reinterpret_cast<float*>(base + l.q_sigma),
               reinterpret_cast<float*>(base + l.q_mu),
               rows,
               rows + kMaxRows,
               rows + 2 * kMaxRows,
               rows + 3 * kMaxRows,
               rows + 4 * kMaxRows,
               rows + 5 * kMaxRows,
               rows + 6 * kMaxRows,
               reinterpret_cast<float*>(base + l.s),
               base + l.pbytes,
               reinterpret_cast<float*>(base + l.acc),
               base + l.stage,
               l.stage_bytes};
  for (int i = lane; i < G * D; i += 32) w.acc[i] = 0.0f;
  const int G4 = (G + kRowGroup - 1) / kRowGroup * kRowGroup;
  for (int i = lane; i < G4 * D / 4; i += 32) reinterpret_cast<uint32_t*>(w.qbytes)[i] = 0;  // padding rows stay 0
  for (int i = lane; i < G4 * T / 4; i += 32) reinterpret_cast<uint32_t*>(w.pbytes)[i] = 0;
  if (lane < kMaxRows) {
    w.row_max[lane] = kNegInf;
    w.row_sum[lane] = 0.0f;
  }
  __syncwarp();

  const int num_pages = in.num_pages[b];
  const HackSplitRange range = hack_split_range(plan, split, num_pages);
  const size_t head_elems = static_cast<size_t>(h) * D;
  const uint8_t* const* table =
      reinterpret_cast<const uint8_t* const*>(in.page_table) + static_cast<size_t>(b) * in.max_pages;
  const size_t section = g.head0 + static_cast<size_t>(h) * g.head_bytes;
  const size_t section_bytes = align16(g.fields_end);
  // Pages stream through the two stage buffers: page i is in stage[i % 2] while page i + 1
  // lands in the other. The sinks use stage[1] while the first page lands in stage[0].
  if (range.page_begin < range.page_end) stage_async(w.buffer(0), table[range.page_begin] + section, section_bytes);
  if (range.sinks && in.sink_tokens[b] > 0) {
    const size_t S = static_cast<size_t>(in.sink_capacity);
    const uint16_t* kv = in.sink_kv[b];
    exact_block(w, G, D, T, kv + head_elems * S, kv + (static_cast<size_t>(H) * D + head_elems) * S,
                in.sink_tokens[b], w.buffer(1));
  }
  for (int page = range.page_begin; page < range.page_end; ++page) {
    const int i = page - range.page_begin;
    if (page + 1 < range.page_end) {
      stage_async(w.buffer((i + 1) % 2), table[page + 1] + section, section_bytes);
      stage_wait<1>();
    } else {
      stage_wait<0>();
    }
    hack_block<KB, VB>(w, g, G, w.buffer(i % 2));
    __syncwarp();  // every lane is done with stage[i % 2] before page i + 2 lands there
  }
  if (range.open && in.open_tokens[b] > 0) {
    const size_t TT = static_cast<size_t>(T);
    const uint16_t* kv = in.open_kv[b];
    exact_block(w, G, D, T, kv + head_elems * TT, kv + (static_cast<size_t>(H) * D + head_elems) * TT,
                in.open_tokens[b], w.buffer(0));
  }

  const size_t state = (q_row0 / static_cast<size_t>(G) * static_cast<size_t>(plan.splits) + static_cast<size_t>(split)) *
                       static_cast<size_t>(G);  // first row of this (sequence, head, split)
  for (int i = lane; i < G * D; i += 32) part_acc[state * D + static_cast<size_t>(i)] = w.acc[i];
  if (lane < G) {
    part_ml[(state + lane) * 2] = w.row_max[lane];
    part_ml[(state + lane) * 2 + 1] = w.row_sum[lane];
  }
}

// Merges the splits of one (sequence, KV head) in split order and normalizes: CPU
// attention_rows_merge then attention_rows_finish. The per-row factors of each merge
// (a_dst, a_src) depend only on the maxima, so they are computed once per row (running
// max, then the exps in parallel, then the sum chain), and then each thread runs the
// channels' fma chains. grid (channel blocks, H, batch).
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(int G, int D, int H, int splits, const float* part_ml, const float* part_acc, float* out) {
  extern __shared__ __align__(16) float cs[];
  const size_t n = static_cast<size_t>(splits) * G;
  float* m_prev = cs;         // [splits][G] max before merge s
  float* m_new = cs + n;      // max after merge s (−inf: skipped)
  float* f_dst = cs + 2 * n;  // a_dst; f_src < 0 marks a skipped split
  float* f_src = cs + 3 * n;
  float* ml_s = cs + 4 * n;   // [splits][G][2] the partial maxima and sums
  float* inv = cs + 6 * n;    // [G]
  const int h = blockIdx.y, b = blockIdx.z;
  const size_t first = (static_cast<size_t>(b) * H + static_cast<size_t>(h)) * static_cast<size_t>(splits);
  for (size_t i = threadIdx.x; i < 2 * n; i += kCombineThreads) ml_s[i] = part_ml[first * G * 2 + i];
  __syncthreads();
  auto ml = [&](int s, int r, int k) { return ml_s[(static_cast<size_t>(s) * G + static_cast<size_t>(r)) * 2 + k]; };
  if (threadIdx.x < G) {
    const int r = threadIdx.x;
    float m = ml(0, r, 0);
#pragma unroll 8
    for (int s = 1; s < splits; ++s) {
      const float sm = ml(s, r, 0), sl = ml(s, r, 1);
      const size_t i = static_cast<size_t>(s) * G + r;
      m_prev[i] = m;
      if (sl == 0.0f && sm == kNegInf) {
        m_new[i] = kNegInf;  // skipped
        continue;
      }
      m = quant::max_f32(m, sm);
      m_new[i] = m;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x + G; i < splits * G; i += kCombineThreads) {  // s ≥ 1
    const int s = i / G, r = i % G;
    const float sm = ml(s, r, 0), sl = ml(s, r, 1);
    if (sl == 0.0f && sm == kNegInf) {
      f_src[i] = -1.0f;
      continue;
    }
    f_dst[i] = quant::exp_f32(sub_f32(m_prev[i], m_new[i]));
    f_src[i] = quant::exp_f32(sub_f32(sm, m_new[i]));
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int r = threadIdx.x;
    float l = ml(0, r, 1);
#pragma unroll 8
    for (int s = 1; s < splits; ++s) {
      const size_t i = static_cast<size_t>(s) * G + r;
      if (f_src[i] < 0.0f) continue;
      l = fma_f32(l, f_dst[i], mul_f32(ml(s, r, 1), f_src[i]));
    }
    inv[r] = l > 0.0f ? quant::div_f32(1.0f, l) : 0.0f;
  }
  __syncthreads();
  const int i = blockIdx.x * kCombineThreads + threadIdx.x;
  if (i >= G * D) return;
  const int r = i / D, c = i % D;
  // The chain is sequential (split order); its loads are not: 16 are issued ahead of use.
  constexpr int kAhead = 16;
  float a = part_acc[(first * G + static_cast<size_t>(r)) * D + c];
  for (int s0 = 1; s0 < splits; s0 += kAhead) {
    float v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int s = s0 + k;
      v[k] = s < splits ? part_acc[((first + static_cast<size_t>(s)) * G + static_cast<size_t>(r)) * D + c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int s = s0 + k;
      const size_t f = static_cast<size_t>(s) * G + r;
      if (s < splits && f_src[f] >= 0.0f) a = fma_f32(a, f_dst[f], mul_f32(v[k], f_src[f]));
    }
  }
  out[((static_cast<size_t>(b) * H + static_cast<size_t>(h)) * G + static_cast<size_t>(r)) * D + c] = mul_f32(a, inv[r]);
}

size_t combine_smem_bytes(int G, int splits) {
  return (6 * static_cast<size_t>(splits) * G + static_cast<size_t>(G)) * sizeof(float);
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
                      "head_dim must be a multiple of 16 in [16, 128]");
  HACK_CUDA_ARG_CHECK(g.block_tokens >= 16 && g.block_tokens % 16 == 0 && g.block_tokens <= kMaxBlock,
                      "block tokens must be a multiple of 16 in [16, 256]");
  HACK_CUDA_ARG_CHECK(g.k_bits == 2 || g.k_bits == 4 || g.k_bits == 8, "K bits must be 2, 4 or 8");
  HACK_CUDA_ARG_CHECK(g.v_bits == 2 || g.v_bits == 4 || g.v_bits == 8, "V bits must be 2, 4 or 8");
  HACK_CUDA_ARG_CHECK(g.k_group >= 16 && g.k_group % 16 == 0 && g.head_dim % g.k_group == 0 && g.v_group >= 16 &&
                          g.v_group % 16 == 0 && g.head_dim % g.v_group == 0,
                      "K/V partitions must be multiples of 16 dividing head_dim");
  HACK_CUDA_ARG_CHECK((g.k_group & (g.k_group - 1)) == 0, "K partitions must be a power of two channels");
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

  HACK_CUDA_ARG_CHECK(g.head0 % 16 == 0 && g.head_bytes % 16 == 0, "head sections must be 16-byte aligned");
  const size_t split_smem = split_smem_bytes(g, in.group_size);
  // Equal K and V bits (the shipped configurations) get kernels with the bits built in.
  void (*split_kernel)(HackPageGeometry, HackDecodeBatch, HackDecodePlan, float*, float*) = &decode_split_kernel<0, 0>;
  if (g.k_bits == g.v_bits) {
    if (g.k_bits == 2) split_kernel = &decode_split_kernel<2, 2>;
    if (g.k_bits == 4) split_kernel = &decode_split_kernel<4, 4>;
    if (g.k_bits == 8) split_kernel = &decode_split_kernel<8, 8>;
  }
  allow_dynamic_smem(reinterpret_cast<const void*>(split_kernel), split_smem,
                     "hack_decode_attention (this head_dim, block size and group)");
  const size_t combine_smem = combine_smem_bytes(in.group_size, plan.splits);
  allow_dynamic_smem(reinterpret_cast<const void*>(&decode_combine_kernel), combine_smem,
                     "hack_decode_attention's combine (this many splits)");

  float* part_ml = static_cast<float*>(workspace);
  float* part_acc =
      reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                               align128(state_rows(g, in.batch, in.group_size, plan) * 2 * sizeof(float)));
  const dim3 grid(static_cast<unsigned>((plan.splits + kWarps - 1) / kWarps), static_cast<unsigned>(g.num_heads),
                  static_cast<unsigned>(in.batch));
  split_kernel<<<grid, kThreads, split_smem, stream>>>(g, in, plan, part_ml, part_acc);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
  const int rows = in.group_size * g.head_dim;
  const dim3 combine_grid(static_cast<unsigned>((rows + kCombineThreads - 1) / kCombineThreads),
                          static_cast<unsigned>(g.num_heads), static_cast<unsigned>(in.batch));
  decode_combine_kernel<<<combine_grid, kCombineThreads, combine_smem, stream>>>(
      in.group_size, g.head_dim, g.num_heads, plan.splits, part_ml, part_acc, in.out);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
