// Element-wise and row-wise CUDA kernels of the fp path: the twins of kernels/cpu/ops.cpp.
// All reductions accumulate in fp32; transcendental functions are the precise ones (no
// fast-math), so per-element results match the CPU to a few ulp.
#include "hack/kernels/cuda/ops.h"

namespace hack::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads of a row-wise kernel (one block per row)
constexpr int kElemThreads = 256;

__device__ float block_sum(float v, float* shared /* [32] */) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int n_warps = static_cast<int>(blockDim.x + 31) / 32;
  v = lane < n_warps ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // shared may be reused by the caller
  return v;
}

unsigned grid_for(long long n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__global__ void embedding_gather_kernel(const bf16* table, const int* tokens, int hidden, float* out) {
  const int t = static_cast<int>(blockIdx.x);
  const bf16* row = table + static_cast<long long>(tokens[t]) * hidden;
  float* dst = out + static_cast<long long>(t) * hidden;
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += static_cast<int>(blockDim.x))
    dst[i] = __bfloat162float(row[i]);
}

template <class Out>
__device__ Out to_out(float v);
template <>
__device__ float to_out<float>(float v) { return v; }
template <>
__device__ bf16 to_out<bf16>(float v) { return __float2bfloat16_rn(v); }

// One block per row: sum of squares in fp32 (block tree), then x · inv · w.
template <class Out>
__global__ void rmsnorm_kernel(const float* x, const int* row_index, const float* weight, Out* out, int n, float eps) {
  __shared__ float shared[32];
  const int r = static_cast<int>(blockIdx.x);
  const int src = row_index ? row_index[r] : r;
  const float* xr = x + static_cast<long long>(src) * n;
  Out* yr = out + static_cast<long long>(r) * n;
  float ss = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) ss += xr[i] * xr[i];
  ss = block_sum(ss, shared);
  const float inv = rsqrtf(ss / static_cast<float>(n) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
    yr[i] = to_out<Out>(xr[i] * inv * weight[i]);
}

// One block per token; threads over (head, pair). Angles as HF: fp32 position · inv_freq.
__global__ void rope_kernel(float* x, const int* positions, const float* inv_freq, int n_heads, int head_dim) {
  const int t = static_cast<int>(blockIdx.x);
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  float* xt = x + static_cast<long long>(t) * n_heads * head_dim;
  for (int j = static_cast<int>(threadIdx.x); j < n_heads * half; j += static_cast<int>(blockDim.x)) {
    const int h = j / half, i = j % half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    float* v = xt + h * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

// One block per (row, head): the slot is read into shared memory, then each thread writes
// output dims j, j + blockDim, ... (fp32 sums in i order, as the CPU twin).
__global__ void fdc_project_kernel(float* x, int n_heads, int heads_per_kv, int head_dim, const float* proj,
                                   const int* d_qk) {
  __shared__ float in[512];
  const int h = static_cast<int>(blockIdx.y);
  float* slot = x + (static_cast<long long>(blockIdx.x) * n_heads + h) * head_dim;
  for (int i = static_cast<int>(threadIdx.x); i < head_dim; i += static_cast<int>(blockDim.x)) in[i] = slot[i];
  __syncthreads();
  const int kv_head = h / heads_per_kv;
  const int d = d_qk[kv_head];
  const float* p = proj + static_cast<long long>(kv_head) * head_dim * head_dim;
  for (int j = static_cast<int>(threadIdx.x); j < head_dim; j += static_cast<int>(blockDim.x)) {
    float acc = 0.0f;
    if (j < d)
      for (int i = 0; i < head_dim; ++i) acc = fmaf(in[i], p[i * head_dim + j], acc);
    slot[j] = acc;
  }
}

__global__ void add_bias_kernel(float* x, const float* bias, long long total, int n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) x[i] += bias[i % n];
}

__global__ void add_residual_kernel(float* x, const float* y, const float* bias, long long total, int n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  float v = y[i];
  if (bias) v += bias[i % n];
  x[i] += v;
}

__global__ void swiglu_kernel(const float* gate, const float* up, bf16* out, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * up[i]);
}

// One block per token; threads over (K|V, head, channel).
// One block per row: dst[i] = src[rows[i]].
__global__ void gather_rows_kernel(const float* src, const int* rows, int width, float* dst) {
  const int i = static_cast<int>(blockIdx.x);
  const float* from = src + static_cast<long long>(rows[i]) * width;
  float* to = dst + static_cast<long long>(i) * width;
  for (int c = static_cast<int>(threadIdx.x); c < width; c += static_cast<int>(blockDim.x)) to[c] = from[c];
}

// One block per row: dst[rows[i]] = bf16(src[i]).
__global__ void scatter_rows_to_bf16_kernel(const float* src, const int* rows, int width, bf16* dst) {
  const int i = static_cast<int>(blockIdx.x);
  const float* from = src + static_cast<long long>(i) * width;
  bf16* to = dst + static_cast<long long>(rows[i]) * width;
  for (int c = static_cast<int>(threadIdx.x); c < width; c += static_cast<int>(blockDim.x))
    to[c] = __float2bfloat16_rn(from[c]);
}

__global__ void kv_append_kernel(PagedKvLayer kv, const float* k, const float* v, const int* slots) {
  const int t = static_cast<int>(blockIdx.x);
  const int slot = slots[t];
  const long long page = slot / kv.page_tokens;
  const int row = slot % kv.page_tokens;
  const int per_token = kv.kv_heads * kv.head_dim;
  const long long head_stride = static_cast<long long>(kv.page_tokens) * kv.head_dim;
  bf16* k_page = kv.data + page * 2 * kv.kv_heads * head_stride;
  bf16* v_page = k_page + kv.kv_heads * head_stride;
  for (int j = static_cast<int>(threadIdx.x); j < 2 * per_token; j += static_cast<int>(blockDim.x)) {
    const bool is_v = j >= per_token;
    const int e = is_v ? j - per_token : j;
    const int h = e / kv.head_dim, d = e % kv.head_dim;
    const float value = (is_v ? v : k)[static_cast<long long>(t) * per_token + e];
    (is_v ? v_page : k_page)[h * head_stride + static_cast<long long>(row) * kv.head_dim + d] =
        __float2bfloat16_rn(value);
  }
}

}  // namespace

void embedding_gather(const bf16* table, const int* tokens, int n_tokens, int hidden, float* out,
                      cudaStream_t stream) {
  if (n_tokens == 0) return;
  embedding_gather_kernel<<<n_tokens, kRowThreads, 0, stream>>>(table, tokens, hidden, out);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void rmsnorm_to_bf16(const float* x, const int* row_index, const float* weight, bf16* out, int rows, int n, float eps,
                     cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<bf16><<<rows, kRowThreads, 0, stream>>>(x, row_index, weight, out, n, eps);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void rmsnorm_inplace(float* x, const float* weight, int rows, int n, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  // Rows are short (head_dim): fewer threads per block.
  const int threads = n <= 64 ? 32 : (n <= 128 ? 64 : 128);
  rmsnorm_kernel<float><<<rows, threads, 0, stream>>>(x, nullptr, weight, x, n, eps);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void rope_inplace(float* x, const int* positions, const float* inv_freq, int n_tokens, int n_heads, int head_dim,
                  cudaStream_t stream) {
  if (n_tokens == 0) return;
  rope_kernel<<<n_tokens, 128, 0, stream>>>(x, positions, inv_freq, n_heads, head_dim);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void fdc_project(float* x, int rows, int n_heads, int heads_per_kv, int head_dim, const float* proj, const int* d_qk,
                 cudaStream_t stream) {
  if (head_dim > 512) cuda_fail(cudaErrorInvalidValue, "fdc_project: head_dim above 512", __FILE__, __LINE__);
  if (rows == 0) return;
  fdc_project_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(n_heads)), 128, 0, stream>>>(
      x, n_heads, heads_per_kv, head_dim, proj, d_qk);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void add_bias(float* x, const float* bias, int rows, int n, cudaStream_t stream) {
  const long long total = static_cast<long long>(rows) * n;
  if (total == 0) return;
  add_bias_kernel<<<grid_for(total, kElemThreads), kElemThreads, 0, stream>>>(x, bias, total, n);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void add_residual(float* x, const float* y, const float* bias, int rows, int n, cudaStream_t stream) {
  const long long total = static_cast<long long>(rows) * n;
  if (total == 0) return;
  add_residual_kernel<<<grid_for(total, kElemThreads), kElemThreads, 0, stream>>>(x, y, bias, total, n);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void swiglu_to_bf16(const float* gate, const float* up, bf16* out, long long n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<grid_for(n, kElemThreads), kElemThreads, 0, stream>>>(gate, up, out, n);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void kv_append(PagedKvLayer kv, const float* k, const float* v, const int* slots, int n_tokens, cudaStream_t stream) {
  if (n_tokens == 0) return;
  kv_append_kernel<<<n_tokens, 128, 0, stream>>>(kv, k, v, slots);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void gather_rows(const float* src, const int* rows, int n, int width, float* dst, cudaStream_t stream) {
  if (n == 0) return;
  gather_rows_kernel<<<n, kElemThreads, 0, stream>>>(src, rows, width, dst);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

void scatter_rows_to_bf16(const float* src, const int* rows, int n, int width, bf16* dst, cudaStream_t stream) {
  if (n == 0) return;
  scatter_rows_to_bf16_kernel<<<n, kElemThreads, 0, stream>>>(src, rows, width, dst);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
