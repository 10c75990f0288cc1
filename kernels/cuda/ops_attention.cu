// Attention over the paged bf16 device KV pool (kernels/cuda twins of the CPU
// PagedKvCache::attend / run): decode with split pages (flash-decoding) and
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
  const int hd = a.kv.head_dim, P = a.kv.page_tokens;
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
    for (int e = tid; e < Bk * hd; e += blockDim.x) {
      const int j = e / hd, d = e % hd;
      float kv_k = 0.0f, kv_v = 0.0f;
      if (j < nk) {
        const int row = kv_row(k0 + j, P, a.kv.sinks);
        const int page = table[row / P];
        const long long off = static_cast<long long>(row % P) * hd + d;
        kv_k = __bfloat162float(page_head(a.kv, page, 0, kv_head)[off]);
        kv_v = __bfloat162float(page_head(a.kv, page, 1, kv_head)[off]);
      }
      k_s[j * qs + d] = kv_k;
      v_s[j * hd + d] = kv_v;
    }
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
  allow_dynamic_smem(reinterpret_cast<const void*>(&decode_attention_kernel), smem, "decode attention");
  const dim3 grid(static_cast<unsigned>(args.n_splits), static_cast<unsigned>(args.kv.kv_heads),
                  static_cast<unsigned>(args.n_seqs));
  decode_attention_kernel<<<grid, kAttentionThreads, smem, stream>>>(args);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
  const dim3 merge_grid(static_cast<unsigned>(args.n_seqs), static_cast<unsigned>(args.kv.kv_heads * args.group_size));
  const int merge_threads = args.kv.head_dim >= 128 ? 128 : (args.kv.head_dim >= 64 ? 64 : 32);
  decode_merge_kernel<<<merge_grid, merge_threads, 0, stream>>>(args, args.n_splits);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream) {
  if (args.n_chunks == 0 || args.max_tokens == 0) return;
  const size_t smem = prefill_attention_smem_bytes(args.kv.head_dim);
  allow_dynamic_smem(reinterpret_cast<const void*>(&prefill_attention_kernel), smem, "prefill attention");
  const dim3 grid(static_cast<unsigned>((args.max_tokens + kPrefillQueryTile - 1) / kPrefillQueryTile),
                  static_cast<unsigned>(args.q_heads), static_cast<unsigned>(args.n_chunks));
  prefill_attention_kernel<<<grid, kAttentionThreads, smem, stream>>>(args);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
