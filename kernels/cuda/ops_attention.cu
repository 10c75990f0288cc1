// Attention over the paged bf16 device KV pool (kernels/cuda twins of the CPU
// CpuPagedKvCache::attend / run): decode with split pages (flash-decoding) and
// flash-style tiled causal prefill. Both keep an online softmax in fp32:
//   m' = max(m, max_j s_j),  l' = l·e^(m−m') + Σ_j e^(s_j−m'),  acc' = acc·e^(m−m') + Σ_j e^(s_j−m') v_j
// and divide by l at the end.
#include <cmath>

#include "hack/kernels/cuda/ops.h"

namespace hack::cuda {

namespace {

constexpr int kAttentionThreads = 128;
constexpr int kWarps = kAttentionThreads / 32;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Start of head `kv_head` of K (which = 0) or V (which = 1) in page `page`:
// [page_tokens][head_dim] bf16.
__device__ const bf16* page_head(const PagedKvLayer& kv, int page, int which, int kv_head) {
  const long long head_elems = static_cast<long long>(kv.page_tokens) * kv.head_dim;
  return kv.data + ((static_cast<long long>(page) * 2 + which) * kv.kv_heads + kv_head) * head_elems;
}

// Block (split, kv_head, seq). Shared memory:
//   q   [group][head_dim]   the group's query heads
//   acc [group][head_dim]   unnormalised output
//   s   [group][page_tokens] scores, then probabilities, of the current page
//   m, l, corr [group]
__global__ void decode_attention_kernel(DecodeAttentionArgs a) {
  extern __shared__ float smem[];
  const int G = a.group_size, hd = a.kv.head_dim, P = a.kv.page_tokens;
  float* q_s = smem;
  float* acc = q_s + G * hd;
  float* s = acc + G * hd;
  float* m = s + G * P;
  float* l = m + G;
  float* corr = l + G;

  const int split = static_cast<int>(blockIdx.x), kv_head = static_cast<int>(blockIdx.y);
  const int seq = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int len = a.kv_lengths[seq];
  const int n_pages = (len + P - 1) / P;
  const int p0 = split * a.pages_per_split;
  const int p1 = min(n_pages, p0 + a.pages_per_split);
  const int q_heads = a.kv.kv_heads * G;
  const float* q = a.q + static_cast<long long>(a.rows[seq]) * a.q_row_stride + kv_head * G * hd;
  for (int e = tid; e < G * hd; e += blockDim.x) {
    q_s[e] = q[e];
    acc[e] = 0.0f;
  }
  for (int g = tid; g < G; g += blockDim.x) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  __syncthreads();

  const int* table = a.page_tables + a.page_table_offsets[seq];
  for (int p = p0; p < p1; ++p) {
    const int page = table[p];
    const int n_tok = min(P, len - p * P);
    const bf16* k = page_head(a.kv, page, 0, kv_head);
    const bf16* v = page_head(a.kv, page, 1, kv_head);
    // Scores: a warp per token, lanes over channels.
    for (int t = warp; t < n_tok; t += kWarps) {
      const bf16* kt = k + static_cast<long long>(t) * hd;
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
        for (int d = lane; d < hd; d += 32) dot += q_s[g * hd + d] * __bfloat162float(kt[d]);
        dot = warp_sum(dot);
        if (lane == 0) s[g * P + t] = dot * a.scale;
      }
    }
    __syncthreads();
    // Online-softmax statistics: a warp per query head.
    for (int g = warp; g < G; g += kWarps) {
      float mx = -INFINITY;
      for (int t = lane; t < n_tok; t += 32) mx = fmaxf(mx, s[g * P + t]);
      mx = warp_max(mx);
      const float m_new = fmaxf(m[g], mx);  // finite: the page holds at least one token
      float sum = 0.0f;
      for (int t = lane; t < n_tok; t += 32) {
        const float e = expf(s[g * P + t] - m_new);
        s[g * P + t] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float c = expf(m[g] - m_new);  // 0 on the first page (m = −inf)
        l[g] = l[g] * c + sum;
        m[g] = m_new;
        corr[g] = c;
      }
    }
    __syncthreads();
    // acc[g][d] = acc·corr + Σ_t p[g][t] · V[t][d]; threads over (g, d), coalesced over d.
    for (int e = tid; e < G * hd; e += blockDim.x) {
      const int g = e / hd, d = e % hd;
      float sum = acc[e] * corr[g];
      const float* pg = s + g * P;
      for (int t = 0; t < n_tok; ++t) sum += pg[t] * __bfloat162float(v[static_cast<long long>(t) * hd + d]);
      acc[e] = sum;
    }
    __syncthreads();
  }

  // Partial state per (seq, query head, split): acc[head_dim], m, l. An empty split
  // (a sequence shorter than the longest) leaves m = −inf, l = 0, acc = 0.
  const int n_splits = static_cast<int>(gridDim.x);
  for (int e = tid; e < G * (hd + 2); e += blockDim.x) {
    const int g = e / (hd + 2), i = e % (hd + 2);
    const int head = kv_head * G + g;
    float* dst = a.partial + ((static_cast<long long>(seq) * q_heads + head) * n_splits + split) * (hd + 2);
    dst[i] = i < hd ? acc[g * hd + i] : (i == hd ? m[g] : l[g]);
  }
}

// The fast decode kernel, for group ≤ 16 and head_dim a multiple of 32 up to 128 (the
// kernel above serves the rest). Block (split, kv_head, seq) of kDecodeWarps warps; warp w
// takes pages p0 + w, p0 + w + kDecodeWarps, … of the split, 32 tokens at a time, with its
// own online softmax:
//   scores: lane j computes the G dot products of token t0 + j (its K row read with 16-byte
//           loads, q broadcast from shared memory);
//   softmax: per row a warp max and a warp sum over the 32 scores;
//   P·V:    lane l owns channels [l·C, l·C + C), C = head_dim / 32, and adds p[g][j]
//           (shuffled from lane j) · V[t0 + j] for each token, V rows read coalesced.
// The warps' states are then merged in warp order through shared memory into the split's
// partial state, the same one decode_merge_kernel reads.
constexpr int kDecodeWarps = 4;

template <int C>
__device__ void load_bf16(const bf16* p, float (&out)[C]) {
  const auto* u = reinterpret_cast<const uint16_t*>(p);
  if constexpr (C == 4) {
    const uint2 w = *reinterpret_cast<const uint2*>(u);
    out[0] = __uint_as_float(w.x << 16);
    out[1] = __uint_as_float(w.x & 0xffff0000u);
    out[2] = __uint_as_float(w.y << 16);
    out[3] = __uint_as_float(w.y & 0xffff0000u);
  } else if constexpr (C == 2) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(u);
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  } else {
#pragma unroll
    for (int c = 0; c < C; ++c) out[c] = __uint_as_float(static_cast<uint32_t>(u[c]) << 16);
  }
}

template <int GMAX, int C>
__global__ void __launch_bounds__(kDecodeWarps * 32) decode_attention_warps_kernel(DecodeAttentionArgs a) {
  constexpr int D = 32 * C;
  extern __shared__ __align__(16) float smem[];
  const int G = a.group_size, P = a.kv.page_tokens;
  float* q_s = smem;                                  // [G][D]
  float* acc_s = q_s + GMAX * D;                      // [warps][G][D]
  float* m_s = acc_s + kDecodeWarps * GMAX * D;       // [warps][G]
  float* l_s = m_s + kDecodeWarps * GMAX;             // [warps][G]

  const int split = static_cast<int>(blockIdx.x), kv_head = static_cast<int>(blockIdx.y);
  const int seq = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int len = a.kv_lengths[seq];
  const int n_pages = (len + P - 1) / P;
  const int p0 = split * a.pages_per_split;
  const int p1 = min(n_pages, p0 + a.pages_per_split);
  const int q_heads = a.kv.kv_heads * G;
  const float* q = a.q + static_cast<long long>(a.rows[seq]) * a.q_row_stride + kv_head * G * D;
  for (int e = tid; e < G * D; e += blockDim.x) q_s[e] = q[e];
  __syncthreads();

  float m[GMAX], l[GMAX], acc[GMAX][C];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[g][c] = 0.0f;
  }
  const int* table = a.page_tables + a.page_table_offsets[seq];
  for (int p = p0 + warp; p < p1; p += kDecodeWarps) {
    const int page = table[p];
    const int n_tok = min(P, len - p * P);
    const bf16* k = page_head(a.kv, page, 0, kv_head);
    const bf16* v = page_head(a.kv, page, 1, kv_head);
    for (int t0 = 0; t0 < n_tok; t0 += 32) {
      const int t = t0 + lane;
      const bool valid = t < n_tok;
      float s[GMAX];
#pragma unroll
      for (int g = 0; g < GMAX; ++g) s[g] = 0.0f;
      if (valid) {
        const uint4* row = reinterpret_cast<const uint4*>(k + static_cast<long long>(t) * D);
#pragma unroll
        for (int w = 0; w < D / 8; ++w) {
          const uint4 kw = row[w];
          const float kf[8] = {__uint_as_float(kw.x << 16), __uint_as_float(kw.x & 0xffff0000u),
                               __uint_as_float(kw.y << 16), __uint_as_float(kw.y & 0xffff0000u),
                               __uint_as_float(kw.z << 16), __uint_as_float(kw.z & 0xffff0000u),
                               __uint_as_float(kw.w << 16), __uint_as_float(kw.w & 0xffff0000u)};
#pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            if (g < G) {
              const float4 qa = *reinterpret_cast<const float4*>(q_s + g * D + w * 8);
              const float4 qb = *reinterpret_cast<const float4*>(q_s + g * D + w * 8 + 4);
              s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                      qb.z * kf[6] + qb.w * kf[7];
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        if (g < G) {
          const float sc = valid ? s[g] * a.scale : -INFINITY;
          const float m_new = fmaxf(m[g], warp_max(sc));  // finite: lane 0's token is valid
          const float corr = expf(m[g] - m_new);          // 0 on the warp's first chunk
          const float e = valid ? expf(sc - m_new) : 0.0f;
          s[g] = e;
          l[g] = l[g] * corr + warp_sum(e);
          m[g] = m_new;
#pragma unroll
          for (int c = 0; c < C; ++c) acc[g][c] *= corr;
        }
      }
      // V rows 8 at a time, all 8 loads issued before their FMAs (one load in flight at a
      // time left the warp waiting on memory latency row by row). Rows past the page's
      // tokens are not loaded; their p is 0 (invalid lanes).
      const int nv = min(32, n_tok - t0);
      const bf16* vrow = v + static_cast<long long>(t0) * D + lane * C;
      for (int j0 = 0; j0 < nv; j0 += 8) {
        float vf[8][C];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (j0 + u < nv) {
            load_bf16<C>(vrow + static_cast<long long>(j0 + u) * D, vf[u]);
          } else {
#pragma unroll
            for (int c = 0; c < C; ++c) vf[u][c] = 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
#pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            if (g < G) {
              const float pj = __shfl_sync(0xffffffffu, s[g], j0 + u);
#pragma unroll
              for (int c = 0; c < C; ++c) acc[g][c] += pj * vf[u][c];
            }
          }
        }
      }
    }
  }

  // Merge the warps' states in warp order.
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g < G) {
#pragma unroll
      for (int c = 0; c < C; ++c) acc_s[(warp * GMAX + g) * D + lane * C + c] = acc[g][c];
      if (lane == 0) {
        m_s[warp * GMAX + g] = m[g];
        l_s[warp * GMAX + g] = l[g];
      }
    }
  }
  __syncthreads();
  const int n_splits = static_cast<int>(gridDim.x);
  for (int e = tid; e < G * (D + 2); e += blockDim.x) {
    const int g = e / (D + 2), i = e % (D + 2);
    float mx = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, m_s[w * GMAX + g]);
    float sum = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float mw = m_s[w * GMAX + g];
        if (mw == -INFINITY) continue;
        const float f = expf(mw - mx);
        sum += f * (i < D ? acc_s[(w * GMAX + g) * D + i] : l_s[w * GMAX + g]);
      }
    }
    const int head = kv_head * G + g;
    float* dst = a.partial + ((static_cast<long long>(seq) * q_heads + head) * n_splits + split) * (D + 2);
    dst[i] = i == D ? mx : sum;  // acc[0 .. D), m, l
  }
}

// Stages keys [k0, k0 + tile) of one KV head of a prefill chunk into shared memory as fp32:
// K rows k_stride floats apart, V rows hd apart, zeros for keys nk and past. Inlined, so a
// kernel whose hd is a constant divides by a constant.
__device__ __forceinline__ void stage_kv_tile(const PrefillAttentionArgs& a, const int* table, int kv_head, int k0,
                                              int nk, int tile, int hd, int threads, float* k_s, int k_stride,
                                              float* v_s) {
  const int P = a.kv.page_tokens;
  for (int e = static_cast<int>(threadIdx.x); e < tile * hd; e += threads) {
    const int j = e / hd, d = e % hd;
    float kk = 0.0f, vv = 0.0f;
    if (j < nk) {
      const int row = kv_row(k0 + j, P, a.kv.sinks);
      const int page = table[row / P];
      const long long off = static_cast<long long>(row % P) * hd + d;
      kk = __bfloat162float(page_head(a.kv, page, 0, kv_head)[off]);
      vv = __bfloat162float(page_head(a.kv, page, 1, kv_head)[off]);
    }
    k_s[j * k_stride + d] = kk;
    v_s[j * hd + d] = vv;
  }
}

// The tiled prefill kernel, for head_dim = 16·CPT (CPT channels a thread in P·V): block
// (query tile of kTileQ, head, chunk) of 256 threads as 16 rows-groups (ty) × 16 columns
// (tx). Each key tile of kTileK keys:
//   scores: thread (ty, tx) computes rows 4ty .. 4ty + 3 against keys tx and tx + 16, float4
//           loads of q and k from shared memory (row strides padded by 4 floats: a half-warp's
//           16 key rows then fall on distinct bank groups);
//   softmax: row max and sum over the 16 threads of a row group (shuffles within 16 lanes);
//   P·V:    P written to shared memory as [key][row], and thread (ty, tx) adds, for its 4 rows,
//           channels tx, tx + 16, … of Σ_j p[row][j] · V[j].
// fp32 throughout, the same math as prefill_attention_kernel with 16× more work per shared
// memory load; the generic kernel serves head dims it has no instance for, and devices whose
// shared memory is too small for the tiles.
constexpr int kTileQ = 64, kTileK = 32, kTileThreads = 256;

size_t tiled_prefill_smem_bytes(int hd) {
  const size_t h = static_cast<size_t>(hd);
  return sizeof(float) * (kTileQ * (h + 4) + kTileK * (h + 4) + kTileK * h + kTileK * (kTileQ + 4));
}

template <int CPT>
__global__ void __launch_bounds__(kTileThreads) prefill_attention_tiled_kernel(PrefillAttentionArgs a) {
  constexpr int HD = 16 * CPT, QS = HD + 4, PS = kTileQ + 4;
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;               // [kTileQ][QS]
  float* k_s = q_s + kTileQ * QS;  // [kTileK][QS]
  float* v_s = k_s + kTileK * QS;  // [kTileK][HD]
  float* p_s = v_s + kTileK * HD;  // [kTileK][PS]: p[row][key] stored by key

  const int chunk = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int kv_head = head / a.group_size;
  const int n = a.n_tokens[chunk];
  const int q0 = static_cast<int>(blockIdx.x) * kTileQ;
  if (q0 >= n) return;  // whole block: no __syncthreads has run yet
  const int nq = min(kTileQ, n - q0);
  const int pos0 = a.start_pos[chunk] + q0;
  const int kv_end = pos0 + nq;
  const long long row0 = a.first_rows[chunk] + q0;
  const int* table = a.page_tables + a.page_table_offsets[chunk];
  const int tid = static_cast<int>(threadIdx.x), ty = tid / 16, tx = tid % 16;

  for (int e = tid; e < kTileQ * HD; e += kTileThreads) {
    const int r = e / HD, d = e % HD;
    q_s[r * QS + d] = r < nq ? a.q[(row0 + r) * a.q_row_stride + head * HD + d] : 0.0f;
  }
  float m[4], l[4], o[4][CPT];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; ++c) o[i][c] = 0.0f;
  }

  for (int k0 = 0; k0 < kv_end; k0 += kTileK) {
    const int nk = min(kTileK, kv_end - k0);
    __syncthreads();  // q_s written (first tile); k_s, v_s and p_s free (later tiles)
    stage_kv_tile(a, table, kv_head, k0, nk, kTileK, HD, kTileThreads, k_s, QS, v_s);
    __syncthreads();

    // Scores of rows 4ty + i against keys tx and tx + 16.
    float sc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i][0] = sc[i][1] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
      const float4 k_a = *reinterpret_cast<const float4*>(k_s + tx * QS + d);
      const float4 k_b = *reinterpret_cast<const float4*>(k_s + (tx + 16) * QS + d);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 qv = *reinterpret_cast<const float4*>(q_s + (4 * ty + i) * QS + d);
        sc[i][0] += qv.x * k_a.x + qv.y * k_a.y + qv.z * k_a.z + qv.w * k_a.w;
        sc[i][1] += qv.x * k_b.x + qv.y * k_b.y + qv.z * k_b.z + qv.w * k_b.w;
      }
    }
    float corr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * ty + i, qpos = pos0 + r;
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int j = tx + 16 * k;
        const bool visible = r < nq && j < nk && k0 + j <= qpos;
        sc[i][k] = visible ? sc[i][k] * a.scale : -INFINITY;
        mx = fmaxf(mx, sc[i][k]);
      }
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);
      float sum = 0.0f;
      if (m_new == -INFINITY) {  // padding row, or nothing visible yet: contributes nothing
        corr[i] = 1.0f;
        sc[i][0] = sc[i][1] = 0.0f;
      } else {
        corr[i] = expf(m[i] - m_new);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          sc[i][k] = expf(sc[i][k] - m_new);  // masked: e^(−inf) = 0
          sum += sc[i][k];
        }
        m[i] = m_new;
      }
      for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l[i] = l[i] * corr[i] + sum;
      p_s[tx * PS + 4 * ty + i] = sc[i][0];
      p_s[(tx + 16) * PS + 4 * ty + i] = sc[i][1];
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < CPT; ++c) o[i][c] *= corr[i];
    for (int j = 0; j < nk; ++j) {
      const float4 pv = *reinterpret_cast<const float4*>(p_s + j * PS + 4 * ty);
      const float pr[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const float vv = v_s[j * HD + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i][c] += pr[i] * vv;
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 4 * ty + i;
    if (r >= nq) continue;
#pragma unroll
    for (int c = 0; c < CPT; ++c)
      a.out[(row0 + r) * a.q_row_stride + head * HD + tx + 16 * c] = __float2bfloat16_rn(o[i][c] / l[i]);
  }
}

// The tiled prefill kernel for a head_dim, or null where there is no instance.
void (*tiled_prefill_kernel(int head_dim))(PrefillAttentionArgs) {
  switch (head_dim) {
    case 32: return &prefill_attention_tiled_kernel<2>;
    case 64: return &prefill_attention_tiled_kernel<4>;
    case 96: return &prefill_attention_tiled_kernel<6>;
    case 128: return &prefill_attention_tiled_kernel<8>;
    case 256: return &prefill_attention_tiled_kernel<16>;
    default: return nullptr;
  }
}

// Which kernel serves a shape: the warp kernel's group bound (0 = the generic kernel).
int warps_kernel_gmax(int group_size, int head_dim) {
  if (head_dim % 32 != 0 || head_dim > 128 || group_size > 16) return 0;
  return group_size <= 4 ? 4 : (group_size <= 8 ? 8 : 16);
}

size_t warps_kernel_smem_bytes(int gmax, int head_dim) {
  return sizeof(float) * (static_cast<size_t>(gmax) * head_dim * (1 + kDecodeWarps) + 2 * kDecodeWarps * gmax);
}

template <int GMAX>
void launch_warps_kernel(const DecodeAttentionArgs& args, dim3 grid, size_t smem, cudaStream_t stream) {
  void (*kernel)(DecodeAttentionArgs) = nullptr;
  switch (args.kv.head_dim / 32) {
    case 1: kernel = &decode_attention_warps_kernel<GMAX, 1>; break;
    case 2: kernel = &decode_attention_warps_kernel<GMAX, 2>; break;
    case 3: kernel = &decode_attention_warps_kernel<GMAX, 3>; break;
    default: kernel = &decode_attention_warps_kernel<GMAX, 4>; break;
  }
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, "decode attention");
  kernel<<<grid, kDecodeWarps * 32, smem, stream>>>(args);
}

// Block (seq, query head): merges the splits' partial states and writes bf16.
__global__ void decode_merge_kernel(DecodeAttentionArgs a, int n_splits) {
  const int seq = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y);
  const int hd = a.kv.head_dim;
  const int q_heads = a.kv.kv_heads * a.group_size;
  const float* part = a.partial + (static_cast<long long>(seq) * q_heads + head) * n_splits * (hd + 2);
  float m_max = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) m_max = fmaxf(m_max, part[sp * (hd + 2) + hd]);
  float l_sum = 0.0f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float ms = part[sp * (hd + 2) + hd];
    if (ms != -INFINITY) l_sum += part[sp * (hd + 2) + hd + 1] * expf(ms - m_max);
  }
  const float inv_l = 1.0f / l_sum;
  bf16* out = a.out + static_cast<long long>(a.rows[seq]) * a.q_row_stride + head * hd;
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += static_cast<int>(blockDim.x)) {
    float sum = 0.0f;
    for (int sp = 0; sp < n_splits; ++sp) {
      const float ms = part[sp * (hd + 2) + hd];
      if (ms != -INFINITY) sum += part[sp * (hd + 2) + d] * expf(ms - m_max);
    }
    out[d] = __float2bfloat16_rn(sum * inv_l);
  }
}

// Block (query tile, query head, chunk). Shared memory (row strides padded by one float so
// the score loop, where neighbouring threads read neighbouring rows, is free of bank conflicts):
//   q   [Bq][head_dim + 1]   queries of the tile
//   k   [Bk][head_dim + 1]   key tile (fp32 from bf16)
//   v   [Bk][head_dim]       value tile
//   acc [Bq][head_dim]
//   s   [Bq][Bk]             scores, then probabilities
//   m, l, corr [Bq]
__global__ void prefill_attention_kernel(PrefillAttentionArgs a) {
  extern __shared__ float smem[];
  constexpr int Bq = kPrefillQueryTile, Bk = kPrefillKeyTile;
  const int hd = a.kv.head_dim;
  const int qs = hd + 1;
  float* q_s = smem;
  float* k_s = q_s + Bq * qs;
  float* v_s = k_s + Bk * qs;
  float* acc = v_s + Bk * hd;
  float* s = acc + Bq * hd;
  float* m = s + Bq * Bk;
  float* l = m + Bq;
  float* corr = l + Bq;

  const int chunk = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int kv_head = head / a.group_size;
  const int n = a.n_tokens[chunk];
  const int q0 = static_cast<int>(blockIdx.x) * Bq;
  if (q0 >= n) return;  // whole block: no __syncthreads has run yet
  const int nq = min(Bq, n - q0);
  const int pos0 = a.start_pos[chunk] + q0;  // position of the tile's first query
  const int kv_end = pos0 + nq;              // keys [0, kv_end) are visible to some row
  const long long row0 = a.first_rows[chunk] + q0;
  const int* table = a.page_tables + a.page_table_offsets[chunk];
  const int tid = static_cast<int>(threadIdx.x);

  for (int e = tid; e < Bq * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    q_s[r * qs + d] = r < nq ? a.q[(row0 + r) * a.q_row_stride + head * hd + d] : 0.0f;
    acc[e] = 0.0f;
  }
  for (int r = tid; r < Bq; r += blockDim.x) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  __syncthreads();

  for (int k0 = 0; k0 < kv_end; k0 += Bk) {
    const int nk = min(Bk, kv_end - k0);
    stage_kv_tile(a, table, kv_head, k0, nk, Bk, hd, static_cast<int>(blockDim.x), k_s, qs, v_s);
    __syncthreads();
    for (int e = tid; e < Bq * Bk; e += blockDim.x) {
      const int r = e / Bk, j = e % Bk;
      const bool visible = r < nq && j < nk && k0 + j <= pos0 + r;
      float dot = -INFINITY;
      if (visible) {
        dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += q_s[r * qs + d] * k_s[j * qs + d];
        dot *= a.scale;
      }
      s[e] = dot;
    }
    __syncthreads();
    for (int r = tid; r < Bq; r += blockDim.x) {
      float mx = -INFINITY;
      for (int j = 0; j < Bk; ++j) mx = fmaxf(mx, s[r * Bk + j]);
      const float m_new = fmaxf(m[r], mx);
      if (m_new == -INFINITY) {  // padding row, or nothing visible yet: contributes nothing
        for (int j = 0; j < Bk; ++j) s[r * Bk + j] = 0.0f;
        corr[r] = 1.0f;
        continue;
      }
      float sum = 0.0f;
      for (int j = 0; j < Bk; ++j) {
        const float e = expf(s[r * Bk + j] - m_new);  // masked: e^(−inf) = 0
        s[r * Bk + j] = e;
        sum += e;
      }
      const float c = expf(m[r] - m_new);
      l[r] = l[r] * c + sum;
      m[r] = m_new;
      corr[r] = c;
    }
    __syncthreads();
    for (int e = tid; e < Bq * hd; e += blockDim.x) {
      const int r = e / hd, d = e % hd;
      float sum = acc[e] * corr[r];
      for (int j = 0; j < nk; ++j) sum += s[r * Bk + j] * v_s[j * hd + d];
      acc[e] = sum;
    }
    __syncthreads();
  }

  for (int e = tid; e < nq * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    a.out[(row0 + r) * a.q_row_stride + head * hd + d] = __float2bfloat16_rn(acc[e] / l[r]);
  }
}


}  // namespace

long long decode_attention_workspace_floats(int n_seqs, int q_heads, int n_splits, int head_dim) {
  return static_cast<long long>(n_seqs) * q_heads * n_splits * (head_dim + 2);
}

size_t decode_attention_smem_bytes(int group_size, int head_dim, int page_tokens) {
  const int gmax = warps_kernel_gmax(group_size, head_dim);
  if (gmax != 0) return warps_kernel_smem_bytes(gmax, head_dim);
  const size_t G = static_cast<size_t>(group_size);
  return sizeof(float) * (2 * G * static_cast<size_t>(head_dim) + G * static_cast<size_t>(page_tokens) + 3 * G);
}

size_t prefill_attention_smem_bytes(int head_dim) {
  const size_t hd = static_cast<size_t>(head_dim);
  constexpr size_t Bq = kPrefillQueryTile, Bk = kPrefillKeyTile;
  return sizeof(float) * ((Bq + Bk) * (hd + 1) + (Bk + Bq) * hd + Bq * Bk + 3 * Bq);
}

void decode_attention(const DecodeAttentionArgs& args, cudaStream_t stream) {
  if (args.n_seqs == 0) return;
  const size_t smem = decode_attention_smem_bytes(args.group_size, args.kv.head_dim, args.kv.page_tokens);
  const dim3 grid(static_cast<unsigned>(args.n_splits), static_cast<unsigned>(args.kv.kv_heads),
                  static_cast<unsigned>(args.n_seqs));
  switch (warps_kernel_gmax(args.group_size, args.kv.head_dim)) {
    case 4: launch_warps_kernel<4>(args, grid, smem, stream); break;
    case 8: launch_warps_kernel<8>(args, grid, smem, stream); break;
    case 16: launch_warps_kernel<16>(args, grid, smem, stream); break;
    default:
      allow_dynamic_smem(reinterpret_cast<const void*>(&decode_attention_kernel), smem, "decode attention");
      decode_attention_kernel<<<grid, kAttentionThreads, smem, stream>>>(args);
      break;
  }
  HACK_CUDA_CU_CHECK(cudaGetLastError());
  const dim3 merge_grid(static_cast<unsigned>(args.n_seqs), static_cast<unsigned>(args.kv.kv_heads * args.group_size));
  const int merge_threads = args.kv.head_dim >= 128 ? 128 : (args.kv.head_dim >= 64 ? 64 : 32);
  decode_merge_kernel<<<merge_grid, merge_threads, 0, stream>>>(args, args.n_splits);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream) {
  if (args.n_chunks == 0 || args.max_tokens == 0) return;
  void (*tiled)(PrefillAttentionArgs) = tiled_prefill_kernel(args.kv.head_dim);
  const size_t tiled_smem = tiled_prefill_smem_bytes(args.kv.head_dim);
  if (tiled != nullptr && tiled_smem <= max_dynamic_smem()) {
    allow_dynamic_smem(reinterpret_cast<const void*>(tiled), tiled_smem, "prefill attention");
    const dim3 grid(static_cast<unsigned>((args.max_tokens + kTileQ - 1) / kTileQ), static_cast<unsigned>(args.q_heads),
                    static_cast<unsigned>(args.n_chunks));
    tiled<<<grid, kTileThreads, tiled_smem, stream>>>(args);
    HACK_CUDA_CU_CHECK(cudaGetLastError());
    return;
  }
  const size_t smem = prefill_attention_smem_bytes(args.kv.head_dim);
  allow_dynamic_smem(reinterpret_cast<const void*>(&prefill_attention_kernel), smem, "prefill attention");
  const dim3 grid(static_cast<unsigned>((args.max_tokens + kPrefillQueryTile - 1) / kPrefillQueryTile),
                  static_cast<unsigned>(args.q_heads), static_cast<unsigned>(args.n_chunks));
  prefill_attention_kernel<<<grid, kAttentionThreads, smem, stream>>>(args);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
