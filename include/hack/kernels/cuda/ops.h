/// @file kernels/cuda/ops.h
/// @brief The CUDA kernels of the fp transformer path (kernels/cuda/ops*.cu), each the twin
/// of a CPU kernel in kernels/cpu/ops.h. Activations are fp32 except where a GEMM reads them
/// (bf16); weights and KV are bf16. Every launcher is asynchronous on `stream`.
/// Only compiled with HACK_HAVE_CUDA.
#pragma once

#include <algorithm>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace hack::cuda {

using bf16 = __nv_bfloat16;

/// Throws hack::Error naming the CUDA error, expression, file and line. Defined in a .cpp:
/// fmt (hack::fail) does not compile under nvcc, so .cu files check through this.
[[noreturn]] void cuda_fail(cudaError_t status, const char* expr, const char* file, int line);

/// HACK_CUDA_CHECK for .cu files.
#define HACK_CUDA_CU_CHECK(expr)                                                             \
  do {                                                                                      \
    const cudaError_t hack_cuda_cu_status_ = (expr);                                        \
    if (hack_cuda_cu_status_ != cudaSuccess)                                                \
      ::hack::cuda::cuda_fail(hack_cuda_cu_status_, #expr, __FILE__, __LINE__);             \
  } while (0)

/// Lets `kernel` launch with `bytes` of dynamic shared memory: above the 48 KiB default it
/// opts in (cudaFuncSetAttribute, only when `bytes` exceeds what the kernel already allows on
/// this device); beyond the device's opt-in limit (queried once per device) it throws naming
/// `what`. Cheap enough to call before each launch that may need it.
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* what);
/// The current device's opt-in limit of dynamic shared memory per block, in bytes.
size_t max_dynamic_smem();

/// y[rows][out] = x[rows][in] · w^T with cuBLAS (cublasGemmEx, bf16 in, fp32 compute and
/// out) on the handle's stream; w is a HF weight [out][in] bf16. Throws on a cuBLAS error.
/// (src/backend/cuda/cuda_gemm.cpp)
void gemm_bf16(cublasHandle_t handle, const bf16* w, int out, int in, const bf16* x, int rows, float* y);

/// out[t] = float(table[tokens[t]]); table [vocab][hidden] bf16, out [n_tokens][hidden].
/// Token ids are validated on the host before they get here.
void embedding_gather(const bf16* table, const int* tokens, int n_tokens, int hidden, float* out,
                      cudaStream_t stream);

/// out[r] = x[src_row(r)] / rms(x[src_row(r)]) * weight for r < rows, where
/// src_row(r) = row_index ? row_index[r] : r. x [*][n] fp32, out [rows][n] bf16 (GEMM input).
void rmsnorm_to_bf16(const float* x, const int* row_index, const float* weight, bf16* out, int rows, int n, float eps,
                     cudaStream_t stream);
/// In place over `rows` rows of n floats (the per-head q/k norm of Qwen3: rows = tokens·heads).
void rmsnorm_inplace(float* x, const float* weight, int rows, int n, float eps, cudaStream_t stream);

/// Rotates x [n_tokens][n_heads][head_dim] in place (rotate_half pairs (i, i + head_dim/2));
/// token t at positions[t]; inv_freq [head_dim/2] from rope_inv_freq (model/rope.h; scaling applied).
void rope_inplace(float* x, const int* positions, const float* inv_freq, int n_tokens, int n_heads, int head_dim,
                  cudaStream_t stream);

/// FDC's post-RoPE projection, in place, as cpu::fdc_project: x [rows][n_heads][head_dim],
/// proj [kv_heads][head_dim][head_dim], d_qk [kv_heads] (device memory); head_dim ≤ 512.
void fdc_project(float* x, int rows, int n_heads, int heads_per_kv, int head_dim, const float* proj, const int* d_qk,
                 cudaStream_t stream);

/// x[r][c] += bias[c], rows × n.
void add_bias(float* x, const float* bias, int rows, int n, cudaStream_t stream);
/// x[r][c] += y[r][c] (+ bias[c] when bias is not null): the residual add, rows × n.
void add_residual(float* x, const float* y, const float* bias, int rows, int n, cudaStream_t stream);
/// out = bf16(silu(gate) · up), n elements (the GEMM input of the down projection).
void swiglu_to_bf16(const float* gate, const float* up, bf16* out, long long n, cudaStream_t stream);

/// One layer of the paged device KV pool:
///   layer [pages][2 (K, V)][kv_heads][page_tokens][head_dim] bf16.
/// Token p of a sequence lives at row r = kv_row(p) of the sequence's rows: page
/// page_table[r / page_tokens], row r % page_tokens. Without sinks r = p. With S sinks (the
/// HACK cache, --kv hack) page 0 holds the sinks in rows [0, S) and block b of Π tokens,
/// [S + b·Π, S + (b + 1)·Π), fills page 1 + b whole, so a block is one page the quantizer
/// reads with plain strides: r = p for p < S, else p + Π − S.
struct PagedKvLayer {
  bf16* data = nullptr;
  int page_tokens = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int sinks = 0;  ///< S; 0 = tokens fill pages from row 0 (the fp cache)
};

/// The row of token `pos` (see PagedKvLayer).
__host__ __device__ inline int kv_row(int pos, int page_tokens, int sinks) {
  return sinks > 0 && pos >= sinks ? pos + page_tokens - sinks : pos;
}

/// Writes K and V of n_tokens tokens ([n_tokens][kv_heads][head_dim] fp32, K already
/// rotated) as bf16 into their slots; slots[t] = page · page_tokens + row.
void kv_append(PagedKvLayer kv, const float* k, const float* v, const int* slots, int n_tokens, cudaStream_t stream);

/// dst[i] = src[rows[i]] for i < n: rows of `width` floats gathered into a dense block.
void gather_rows(const float* src, const int* rows, int n, int width, float* dst, cudaStream_t stream);
/// dst[rows[i]] = bf16(src[i]) for i < n: a dense block of f32 rows scattered as bf16 rows.
void scatter_rows_to_bf16(const float* src, const int* rows, int n, int width, bf16* dst, cudaStream_t stream);

/// Decode attention: one query token per sequence.
struct DecodeAttentionArgs {
  PagedKvLayer kv;
  const float* q = nullptr;       ///< [n_seqs] rows at q + row[i] · q_row_stride: [q_heads][head_dim]
  bf16* out = nullptr;            ///< same rows and layout as q, bf16 (the W_O GEMM input)
  int q_row_stride = 0;           ///< floats (and out elements) between token rows
  const int* rows = nullptr;      ///< [n_seqs] token row of each sequence's query
  const int* kv_lengths = nullptr;   ///< [n_seqs] tokens to attend (own token included)
  const int* page_tables = nullptr;  ///< concatenated page tables
  const int* page_table_offsets = nullptr;  ///< [n_seqs] start of each sequence's table
  int n_seqs = 0;
  int group_size = 1;             ///< query heads per KV head
  float scale = 1.0f;
  int pages_per_split = 1;        ///< each block covers this many pages of one sequence
  int n_splits = 1;               ///< blocks per (sequence, KV head); ≥ ceil(max pages / pages_per_split)
  float* partial = nullptr;       ///< workspace, decode_attention_workspace_floats(...) floats
};
/// Splits of decode attention for a batch: about 8 blocks of 4 warps per SM, whole pages per
/// split, at least 4 pages per split where the context has them (a warp per page), at most
/// max_splits. The backend and bench/cuda/attention_bench plan with it.
inline int decode_attention_splits(int sm_count, int n_seqs, int kv_heads, int max_pages, int max_splits) {
  const int units = n_seqs * kv_heads;
  const int most = std::max(1, std::min(max_splits, (max_pages + 3) / 4));
  return std::clamp((8 * sm_count + units - 1) / units, 1, most);
}

/// Floats of DecodeAttentionArgs::partial for n_seqs sequences and n_splits splits.
long long decode_attention_workspace_floats(int n_seqs, int q_heads, int n_splits, int head_dim);
/// Dynamic shared memory the decode kernel needs; the caller checks it against the device.
size_t decode_attention_smem_bytes(int group_size, int head_dim, int page_tokens);
/// Flash-decoding: each (split, KV head, sequence) block streams its pages with an online
/// softmax, all query heads of the group at once; a second kernel merges the splits.
void decode_attention(const DecodeAttentionArgs& args, cudaStream_t stream);

/// Prefill attention: a chunk of query tokens over the paged past plus itself, causal.
struct PrefillAttentionArgs {
  PagedKvLayer kv;
  const float* q = nullptr;       ///< token rows [*][q_heads][head_dim], row stride q_row_stride
  bf16* out = nullptr;            ///< same rows, bf16
  int q_row_stride = 0;
  const int* first_rows = nullptr;   ///< [n_chunks] token row of each chunk's first query
  const int* n_tokens = nullptr;     ///< [n_chunks] queries in the chunk
  const int* start_pos = nullptr;    ///< [n_chunks] position of the first query
  const int* page_tables = nullptr;
  const int* page_table_offsets = nullptr;  ///< [n_chunks]
  int n_chunks = 0;
  int max_tokens = 0;             ///< largest n_tokens (sizes the grid)
  int q_heads = 0;
  int group_size = 1;
  float scale = 1.0f;
};
/// Dynamic shared memory the prefill kernel needs.
size_t prefill_attention_smem_bytes(int head_dim);
/// Flash-style: each block takes kPrefillQueryTile queries of one head of one chunk and
/// walks key tiles from position 0 up to its last query, masked causally.
void prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream);

/// Query rows per prefill block and key tokens per tile.
inline constexpr int kPrefillQueryTile = 16;
inline constexpr int kPrefillKeyTile = 16;

}  // namespace hack::cuda
