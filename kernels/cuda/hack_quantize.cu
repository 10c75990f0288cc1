// CUDA twin of quantize_k_block / quantize_v_block (src/kv/hack_page.cpp): closing blocks
// of one layer → HACK page bytes. One CTA per (KV head, block) writes that head's section
// (and the CTA of head 0 the header), so every byte of a page is written exactly once.
// The arithmetic is hack_quant_math.h, shared with the CPU, so both roundings give the
// CPU quantizer's bytes (stochastic: the same counter-based stream per element).
#include "hack/kernels/cuda/hack.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cuda {

namespace {

constexpr int kQuantizeThreads = 256;

// Element (t, c) of head h in one block's K or V, as a bf16 value in f32.
struct BlockSource {
  const void* base;
  size_t token_stride;
  size_t head_offset;
  bool bf16;
  __device__ float operator()(int t, int c) const {
    const size_t i = static_cast<size_t>(t) * token_stride + head_offset + static_cast<size_t>(c);
    if (bf16) return quant::bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    return quant::bf16_bits_to_f32(quant::f32_to_bf16_bits(static_cast<const float*>(base)[i]));
  }
};

__device__ void store_sum(uint8_t* sums, int bytes, size_t i, uint32_t value) {
  if (bytes == 1)
    sums[i] = static_cast<uint8_t>(value);
  else
    reinterpret_cast<uint16_t*>(sums)[i] = static_cast<uint16_t>(value);
}

// Codes are ORed into a staged copy of the head's code array in shared memory (u32 words,
// little-endian like the page), then copied out in whole words.
__device__ void stage_code(uint32_t* staged, quant::CodePos pos, int code) {
  atomicOr(&staged[pos.byte / 4], static_cast<uint32_t>(code) << (pos.shift + 8 * static_cast<int>(pos.byte % 4)));
}

// Shared memory: staged [code_bytes / 4] u32 | q_min [D] f32 | q_scale [D] f32 | v_sum [D] u32.
__global__ void __launch_bounds__(kQuantizeThreads) quantize_blocks_kernel(HackPageGeometry g, HackQuantizeBlocks in) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int T = g.block_tokens, D = g.head_dim;
  const int k_bits = g.k_bits, v_bits = g.v_bits, k_max_code = (1 << k_bits) - 1, v_max_code = (1 << v_bits) - 1;
  const size_t k_code_bytes = static_cast<size_t>(T) * static_cast<size_t>(D) * static_cast<size_t>(k_bits) / 8;
  const size_t v_code_bytes = static_cast<size_t>(T) * static_cast<size_t>(D) * static_cast<size_t>(v_bits) / 8;
  const size_t code_bytes = k_code_bytes > v_code_bytes ? k_code_bytes : v_code_bytes;  // staging holds either
  uint32_t* staged = reinterpret_cast<uint32_t*>(smem);
  float* q_min = reinterpret_cast<float*>(smem + code_bytes);
  float* q_scale = q_min + D;
  uint32_t* v_sum = reinterpret_cast<uint32_t*>(q_scale + D);
  const int k_code_words = static_cast<int>(k_code_bytes / 4), v_code_words = static_cast<int>(v_code_bytes / 4);

  uint8_t* page = static_cast<uint8_t*>(in.pages[b]);
  uint8_t* head = page + g.head0 + static_cast<size_t>(h) * g.head_bytes;
  const size_t head_offset = static_cast<size_t>(h) * in.head_stride;
  const BlockSource k{in.k_src[b], in.token_stride, head_offset, in.bf16};
  const BlockSource v{in.v_src[b], in.token_stride, head_offset, in.bf16};
  const quant::BlockRandom k_random(in.seed, in.layer, in.first_tokens[b], h, 0);
  const quant::BlockRandom v_random(in.seed, in.layer, in.first_tokens[b], h, 1);
  // Element index of the stream: t·D + c (as on the CPU).
  auto code_of = [&](const quant::Quantizer& q, float x, const quant::BlockRandom& random, int t, int c) {
    if (!in.stochastic) return quant::quantize_nearest(q, x);
    const uint64_t index = static_cast<uint64_t>(t) * static_cast<uint64_t>(D) + static_cast<uint64_t>(c);
    return quant::quantize_stochastic(q, x, random(index));
  };

  if (h == 0) {  // header and head table, first_token patched in (little-endian u64)
    const uint64_t first = static_cast<uint64_t>(in.first_tokens[b]);
    for (uint32_t i = tid; i < g.header_bytes; i += kQuantizeThreads) {
      const uint32_t f = i - g.first_token_offset;
      page[i] = f < 8 ? static_cast<uint8_t>(first >> (8 * f)) : in.header[i];
    }
  }
  for (uint32_t i = g.fields_end + tid; i < g.head_bytes; i += kQuantizeThreads) head[i] = 0;

  // ---- K: per channel over the block's tokens ----
  for (int i = tid; i < k_code_words; i += kQuantizeThreads) staged[i] = 0;
  uint16_t* k_min_out = reinterpret_cast<uint16_t*>(head + g.k_min);
  uint16_t* k_scale_out = reinterpret_cast<uint16_t*>(head + g.k_scale);
  for (int c = tid; c < D; c += kQuantizeThreads) {
    float lo = k(0, c), hi = lo;
    for (int t = 1; t < T; ++t) {
      const float x = k(t, c);
      lo = quant::min_f32(lo, x);
      hi = quant::max_f32(hi, x);
    }
    if (k_bits == 2 && !in.stochastic) quant::clip_k_range_2bit([&](int t) { return k(t, c); }, T, &lo, &hi);  // as the CPU
    const quant::Quantizer q = quant::make_quantizer(lo, hi, k_max_code, &k_min_out[c], &k_scale_out[c]);
    q_min[c] = q.min;
    q_scale[c] = q.scale;
  }
  __syncthreads();
  const int k_parts = D / g.k_group;
  for (int w = tid; w < T * k_parts; w += kQuantizeThreads) {
    const int t = w / k_parts, p = w % k_parts;
    uint32_t sum = 0;
    for (int c = p * g.k_group; c < (p + 1) * g.k_group; ++c) {
      const int code = code_of(quant::Quantizer{q_min[c], q_scale[c], k_max_code}, k(t, c), k_random, t, c);
      stage_code(staged, quant::k_code_pos(k_bits, D, t, c), code);
      sum += static_cast<uint32_t>(code);
    }
    store_sum(head + g.k_sums, g.k_sum_bytes, static_cast<size_t>(p) * T + static_cast<size_t>(t), sum);
  }
  __syncthreads();
  uint32_t* k_codes_out = reinterpret_cast<uint32_t*>(head + g.k_codes);
  for (int i = tid; i < k_code_words; i += kQuantizeThreads) k_codes_out[i] = staged[i];
  __syncthreads();

  // ---- V: per (token, channel partition), sums per channel over the block ----
  for (int i = tid; i < v_code_words; i += kQuantizeThreads) staged[i] = 0;
  for (int c = tid; c < D; c += kQuantizeThreads) v_sum[c] = 0;
  __syncthreads();
  uint16_t* v_min_out = reinterpret_cast<uint16_t*>(head + g.v_min);
  uint16_t* v_scale_out = reinterpret_cast<uint16_t*>(head + g.v_scale);
  const int v_parts = D / g.v_group;
  for (int w = tid; w < T * v_parts; w += kQuantizeThreads) {
    const int t = w / v_parts, p = w % v_parts, c0 = p * g.v_group;
    float lo = v(t, c0), hi = lo;
    for (int c = c0 + 1; c < c0 + g.v_group; ++c) {
      lo = quant::min_f32(lo, v(t, c));
      hi = quant::max_f32(hi, v(t, c));
    }
    const size_t meta = static_cast<size_t>(p) * T + static_cast<size_t>(t);
    const quant::Quantizer q = quant::make_quantizer(lo, hi, v_max_code, &v_min_out[meta], &v_scale_out[meta]);
    for (int c = c0; c < c0 + g.v_group; ++c) {
      const int code = code_of(q, v(t, c), v_random, t, c);
      stage_code(staged, quant::v_code_pos(v_bits, T, t, c), code);
      atomicAdd(&v_sum[c], static_cast<uint32_t>(code));
    }
  }
  __syncthreads();
  uint32_t* v_codes_out = reinterpret_cast<uint32_t*>(head + g.v_codes);
  for (int i = tid; i < v_code_words; i += kQuantizeThreads) v_codes_out[i] = staged[i];
  for (int c = tid; c < D; c += kQuantizeThreads)
    store_sum(head + g.v_sums, g.v_sum_bytes, static_cast<size_t>(c), v_sum[c]);
}

}  // namespace

void hack_quantize_blocks(const HackPageGeometry& g, const HackQuantizeBlocks& in, cudaStream_t stream) {
  if (in.blocks <= 0) return;
  // hack/core/error.h (fmt) does not compile under nvcc: argument errors go through
  // cuda_fail too, as "invalid argument in <what is wrong>".
  if (g.head_dim < 16 || g.head_dim % 16 != 0 || g.head_dim > 256 || g.block_tokens < 16 || g.block_tokens % 16 != 0 ||
      g.block_tokens > 4096 || (g.k_bits != 2 && g.k_bits != 4 && g.k_bits != 8) ||
      (g.v_bits != 2 && g.v_bits != 4 && g.v_bits != 8) || g.num_heads <= 0 || g.k_group < 16 ||
      g.head_dim % g.k_group != 0 || g.v_group < 16 || g.head_dim % g.v_group != 0)
    cuda_fail(cudaErrorInvalidValue, "hack_quantize_blocks: page geometry the device quantizer does not support",
              __FILE__, __LINE__);
  if (in.k_src == nullptr || in.v_src == nullptr || in.pages == nullptr || in.first_tokens == nullptr ||
      in.header == nullptr)
    cuda_fail(cudaErrorInvalidValue, "hack_quantize_blocks: null source, page, first-token or header array", __FILE__,
              __LINE__);
  const size_t code_bytes = static_cast<size_t>(g.block_tokens) * static_cast<size_t>(g.head_dim) *
                            static_cast<size_t>(g.k_bits > g.v_bits ? g.k_bits : g.v_bits) / 8;
  const size_t smem = code_bytes + 3 * static_cast<size_t>(g.head_dim) * 4;
  allow_dynamic_smem(reinterpret_cast<const void*>(&quantize_blocks_kernel), smem, "hack_quantize_blocks");
  const dim3 grid(static_cast<unsigned>(g.num_heads), static_cast<unsigned>(in.blocks));
  quantize_blocks_kernel<<<grid, kQuantizeThreads, smem, stream>>>(g, in);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
