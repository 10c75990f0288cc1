/// @file kernels/cpu/hack_quantize.h
/// @brief The CPU HACK quantizer (DESIGN.md §3.1), twin of hack_quantize_blocks
/// (kernels/cuda/hack.h) and bit-identical to it for round to nearest (both evaluate the
/// shared definitions of kernels/hack_quant_math.h): one KV head of one block of Π bf16
/// tokens into that head's fields of a HACK page. kv/hack_page.h knows where the fields
/// sit (the page layout) and calls these with a view of them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/cpu_features.h"

namespace hack::cpu {

/// Writable view of one KV head's fields in a HACK page (the quantizer's twin of
/// HackHeadView, kernels/cpu/hack_attention.h, which reads them).
struct HackHeadSlots {
  int k_bits = 2, v_bits = 2;  ///< code bits: 2, 4 or 8
  int tokens = 0;              ///< Π
  int k_dim = 0, v_dim = 0;
  int k_group = 0, v_group = 0;  ///< channels per K / V partition
  int k_sum_bytes = 2, v_sum_bytes = 2;  ///< 1 = u8, 2 = u16
  uint8_t* k_codes = nullptr;   ///< [Π/16][k_dim/(32/k_bits)][64]
  uint16_t* k_min = nullptr;    ///< [k_dim] bf16
  uint16_t* k_scale = nullptr;  ///< [k_dim] bf16
  void* k_sums = nullptr;       ///< [k_dim/k_group][Π]
  uint8_t* v_codes = nullptr;   ///< [v_dim/16][Π/(32/v_bits)][64]
  uint16_t* v_min = nullptr;    ///< [v_dim/v_group][Π] bf16
  uint16_t* v_scale = nullptr;  ///< [v_dim/v_group][Π] bf16
  void* v_sums = nullptr;       ///< [v_dim]
};

/// How a block's codes are rounded: to nearest, or stochastically from the stream of
/// (seed, layer, first_token, head, K|V) (quant::BlockRandom).
struct HackBlockRounding {
  bool stochastic = false;
  uint64_t seed = 0;
  int layer = 0;
  int64_t first_token = 0;
  int head = 0;
};

/// The clipped 2-bit ranges (quant::clip_k_range_2bit) of `channels` K channels at once:
/// on entry lo[c]/hi[c] hold channel c's extremes over the block's `tokens` rows (row t at
/// k + t·k_stride, channel c at column c), on return the chosen range. `isa` above scalar runs
/// 8 channels per AVX2 register, every lane doing the scalar definition's float operations in
/// its order, so the result is bit-identical (hack_quantize.cpp is compiled without fp
/// contraction, so its scalar path rounds as the device code does). The search is most of a 2-bit K block's quantization (~20× the rest).
void clip_k_ranges_2bit(const uint16_t* k, size_t k_stride, int tokens, int channels, float* lo, float* hi,
                        CpuIsa isa);

/// K of one head: per-channel min/scale over the block's Π tokens (2-bit nearest clips the
/// range, quant::clip_k_range_2bit), codes, and per (partition, token) code sums.
/// k: Π rows of k_dim bf16, row t at k + t·k_stride.
void hack_quantize_k(const HackHeadSlots& head, const uint16_t* k, size_t k_stride, const HackBlockRounding& rounding);
/// V of one head: per (partition, token) min/scale, codes, and per-channel code sums.
/// v: Π rows of v_dim bf16, row t at v + t·v_stride.
void hack_quantize_v(const HackHeadSlots& head, const uint16_t* v, size_t v_stride, const HackBlockRounding& rounding);

}  // namespace hack::cpu
