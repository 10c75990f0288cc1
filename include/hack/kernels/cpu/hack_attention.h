/// @file kernels/cpu/hack_attention.h
/// @brief CPU kernels of homomorphic attention (HACK, DESIGN.md §3.1): one block of one KV
/// head against a few query rows, updating an online-softmax state. A quantized block is
/// never dequantized: Q·Kᵀ and P·V are INT8×INT8→INT32 dot products over the stored codes
/// plus corrections from the stored min/scale and code sums. Exact (bf16/f32) blocks —
/// attention sinks, the open block, the pages of `--kv fp` — use fp32 math.
///
/// Scalar reference, AVX2 and AVX-512 VNNI implementations, chosen at run time. They are
/// bitwise identical: every float reduction has one canonical order (16 lane partials,
/// lane j takes elements j, j+16, ..., folded 8+8, 4+4, 2+2, 1+1), every a·b + c is one
/// FMA, and exp is the same polynomial everywhere.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/cpu_features.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cpu {

// ---- tile geometry of packed codes (the page format of kv/hack_page.h stores these) ----

/// Bytes of one packed chunk; it holds 8/b sub-tiles of 64 codes, sub-tile j in bits
/// [b·j, b·j + b) of every byte.
inline constexpr int kHackChunkBytes = quant::kChunkBytes;

using HackCodePos = quant::CodePos;

/// K chunk = 16 tokens × (32/b) channels; sub-tile j = channels 4j..4j+3 of the chunk,
/// byte 4·token + channel. Chunks: [Π/16][k_dim/(32/b)].
inline HackCodePos hack_k_code_pos(int bits, int k_dim, int token, int channel) {
  return quant::k_code_pos(bits, k_dim, token, channel);
}

/// V chunk = 16 channels × (32/b) tokens; sub-tile j = tokens 4j..4j+3 of the chunk,
/// byte 4·channel + token. Chunks: [v_dim/16][Π/(32/b)].
inline HackCodePos hack_v_code_pos(int bits, int block_tokens, int token, int channel) {
  return quant::v_code_pos(bits, block_tokens, token, channel);
}

// ---- views and state -------------------------------------------------------------------

/// One KV head of one quantized block (pointers into a HACK page).
struct HackHeadView {
  int k_bits = 2;        ///< K code bits: 2, 4 or 8
  int v_bits = 2;        ///< V code bits
  int tokens = 0;        ///< Π
  int k_dim = 0, v_dim = 0;
  int k_group = 0;       ///< channels per K partition
  int v_group = 0;       ///< channels per V partition
  int k_sum_bytes = 2;   ///< 1 = u8, 2 = u16
  int v_sum_bytes = 2;
  const uint8_t* k_codes = nullptr;  ///< [Π/16][k_dim/(32/k_bits)][64]
  const uint16_t* k_min = nullptr;   ///< [k_dim] bf16
  const uint16_t* k_scale = nullptr; ///< [k_dim] bf16
  const void* k_sums = nullptr;      ///< [k_dim/k_group][Π]
  const uint8_t* v_codes = nullptr;  ///< [v_dim/16][Π/(32/v_bits)][64]
  const uint16_t* v_min = nullptr;   ///< [v_dim/v_group][Π] bf16
  const uint16_t* v_scale = nullptr; ///< [v_dim/v_group][Π] bf16
  const void* v_sums = nullptr;      ///< [v_dim]
  /// Bytes the caller reads next (the following block of this head): the kernel spreads
  /// prefetches of them over its work so the next block arrives while this one computes.
  const void* prefetch = nullptr;
  size_t prefetch_bytes = 0;
};

/// One KV head of an exactly stored block: token t's K at k + t·k_stride (elements).
struct ExactHeadView {
  bool bf16 = true;  ///< element type bf16, else f32
  int tokens = 0;
  int k_dim = 0, v_dim = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  size_t k_stride = 0, v_stride = 0;
};

/// Online-softmax state of n query rows (a row = one query head at one position).
struct AttentionRows {
  int n = 0;
  int k_dim = 0, v_dim = 0;
  const float* q = nullptr;      ///< [n][k_dim], already multiplied by the softmax scale
  const int* visible = nullptr;  ///< [n] leading tokens of the block row r may see (causal)
  float* max = nullptr;          ///< [n] running max of scores, −inf before the first block
  float* sum = nullptr;          ///< [n] running Σ exp(score − max)
  float* acc = nullptr;          ///< [n][v_dim] running Σ exp(score − max)·v
};

/// Sets max = −inf, sum = 0, acc = 0.
void attention_rows_reset(const AttentionRows& rows);
/// out[r] = acc[r] / sum[r]; rows `out_stride` floats apart. A row that saw no token gets 0.
void attention_rows_finish(const AttentionRows& rows, float* out, size_t out_stride);
/// Merges partial states of the same rows computed over disjoint token ranges:
/// dst ← dst ⊕ src (flash-decoding reduction).
void attention_rows_merge(const AttentionRows& dst, const AttentionRows& src);

/// Floats of `work` a hack_block call needs.
size_t hack_block_work_floats(int tokens, int k_dim, int v_dim, int k_group, int v_group);
/// Floats of `work` an exact_block call needs.
size_t exact_block_work_floats(int tokens);

using HackBlockFn = void (*)(const HackHeadView& block, const AttentionRows& rows, float* work);
using ExactBlockFn = void (*)(const ExactHeadView& block, const AttentionRows& rows, float* work);

struct HackAttentionKernels {
  CpuIsa isa;
  /// Attends rows to a quantized block: Q quantized to u8 per K partition after folding
  /// the K scales in, scores = Σ_p σ_p·(q'·k') + μ_p·Σk' + q·k_min; P = exp(score − max)
  /// with V scales folded in quantized to u8 per V partition (over the block's tokens),
  /// out += σ·(p'·v') + μ·Σv' + p·v_min.
  HackBlockFn hack_block;
  /// Attends rows to an exact block in fp32.
  ExactBlockFn exact_block;
};

/// Kernels of `isa` (which the CPU must support).
const HackAttentionKernels& hack_attention_kernels(CpuIsa isa);

/// exp(x) as every kernel computes it (polynomial, ≤ 2 ulp for x in [−87, 88]; x ≤ −87.3
/// gives ~1e-38, −inf included).
float hack_exp(float x);

}  // namespace hack::cpu
