/// @file kernels/cpu/quant_dot.h
/// @brief Dot products of a block-quantized weight row (core/quant_blocks.h) with activations
/// quantized to int8 per block, as llama.cpp computes them: the integer part exact (int8 ×
/// 4/5/6/8-bit codes summed in int32), scaled per block in fp32.
///
/// Activations: per 32 (BlockQ8x32) for q4_0, q4_1, q5_0, q5_1, q8_0; per 256 with sums of each 16
/// (BlockQ8K) for the K-quants, whose mins and 6-bit offsets fold into those sums. Both round
/// x·127/amax to nearest even, so |x − d·q| ≤ d/2 = amax/254 per element; one quantizer for
/// every ISA, so the ISAs differ only in the order of the fp32 sums.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/cpu_features.h"
#include "hack/core/dtype.h"

namespace hack::cpu {

/// x[j] ≈ d·qs[j]; s = d · Σ qs (one fp32 rounding), what the q4_0 offset and the q4_1 min
/// multiply: stored as a float so the dots convert no integer per block.
struct BlockQ8x32 {
  float d;
  float s;
  int8_t qs[32];
};
/// x[j] ≈ d·qs[j]; bsums[k] = Σ qs[16k .. 16k + 16).
struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8x32) == 40 && sizeof(BlockQ8K) == 292);

/// Whether weights of type w take BlockQ8K activations (the K-quants) or BlockQ8x32.
constexpr bool uses_q8k(DType w) { return w == DType::q4_k || w == DType::q5_k || w == DType::q6_k; }
/// Bytes of one row of n activations quantized for weights of type w.
constexpr size_t quantized_activation_bytes(DType w, size_t n) {
  return uses_q8k(w) ? n / 256 * sizeof(BlockQ8K) : n / 32 * sizeof(BlockQ8x32);
}

/// n floats (n % 32 == 0) -> n / 32 blocks.
void quantize_q8x32(const float* x, size_t n, BlockQ8x32* out);
/// n floats (n % 256 == 0) -> n / 256 blocks.
void quantize_q8k(const float* x, size_t n, BlockQ8K* out);
/// The quantizer weights of type w need (out: quantized_activation_bytes(w, n) bytes).
void quantize_activations(DType w, const float* x, size_t n, void* out);

/// Σ_i w[i]·x[i] over one row of `blocks` blocks of w's type; x quantized by
/// quantize_activations(w, ...).
using QuantDotFn = float (*)(const void* w, const void* x, size_t blocks);
/// The dot of block type w on `isa` (avx512 and avx512bf16: VPDPBUSD; avx2: VPMADDUBSW).
QuantDotFn quant_dot(CpuIsa isa, DType w);

/// out[r · out_stride] = the QuantDotFn of row r of x (at x + r · x_stride bytes) for r < rows:
/// bit for bit quant_dot's values, with each weight block read and unpacked once for all rows
/// (the decode GEMV of several sequences).
using QuantDotRowsFn = void (*)(const void* w, const void* x, size_t x_stride, size_t rows, size_t blocks, float* out,
                                size_t out_stride);
QuantDotRowsFn quant_dot_rows(CpuIsa isa, DType w);

}  // namespace hack::cpu
