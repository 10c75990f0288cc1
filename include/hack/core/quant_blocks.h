/// @file quant_blocks.h
/// @brief GGUF's block-quantized weight layouts (ggml-common.h's block_q4_0 ... block_q6_K,
/// bit for bit, so a tensor of a GGUF file is used where it lies) and their scalar
/// dequantization, the reference every kernel on the blocks is tested against.
///
/// A row of a block type is a run of whole blocks; element j of block b is row element
/// b · elems_per_block + j. f16 fields are IEEE half bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/dtype.h"

namespace hack {

inline constexpr size_t kQ32 = 32;   // elements per block of q4_0, q4_1, q5_0, q5_1, q8_0
inline constexpr size_t kQK = 256;   // elements per super-block of the K-quants

/// x[j] = (lo(qs[j]) − 8)·d, x[j + 16] = (hi(qs[j]) − 8)·d for j < 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
/// x[j] = lo(qs[j])·d + m, x[j + 16] = hi(qs[j])·d + m.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
/// Q4_0 with a fifth bit: q of element j is its nibble | bit j of qh (a little-endian u32) · 16;
/// x = (q − 16)·d.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
/// The same bits as Q5_0; x = q·d + m.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
/// x[j] = qs[j]·d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
/// 8 sub-blocks of 32 with 6-bit scales sc and mins mn (k_scale_min): x = d·sc·q − dmin·mn.
/// Sub-blocks 2i and 2i + 1 are the low and high nibbles of qs[32i .. 32i + 32).
struct BlockQ4K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
/// Q4_K with a fifth bit: q of element l of sub-block s is nibble | bit s of qh[l] · 16.
struct BlockQ5K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
/// 16 sub-blocks of 16 with int8 scales: x = d·scales[s]·(q − 32), q 6 bits (4 in ql, 2 in
/// qh). Per half of 128: element l (< 32) + 32k takes ql[l + 32(k & 1)]'s nibble k >> 1 and
/// bits 2k, 2k + 1 of qh[l].
struct BlockQ6K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == dtype_block_bytes(DType::q4_0));
static_assert(sizeof(BlockQ4_1) == dtype_block_bytes(DType::q4_1));
static_assert(sizeof(BlockQ8_0) == dtype_block_bytes(DType::q8_0));
static_assert(sizeof(BlockQ5_0) == dtype_block_bytes(DType::q5_0));
static_assert(sizeof(BlockQ5_1) == dtype_block_bytes(DType::q5_1));
static_assert(sizeof(BlockQ4K) == dtype_block_bytes(DType::q4_k));
static_assert(sizeof(BlockQ5K) == dtype_block_bytes(DType::q5_k));
static_assert(sizeof(BlockQ6K) == dtype_block_bytes(DType::q6_k));

/// The 6-bit scale and min of sub-block j (< 8) of a Q4_K/Q5_K block's 12 scale bytes
/// (ggml's get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; j ≥ 4 in a nibble of
/// byte j + 4 and the top 2 bits of bytes j − 4 (scale) and j (min).
inline void k_scale_min(size_t j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// n elements of a block-quantized row at src -> dst (n a multiple of the block; src at a
/// block boundary, 2-byte aligned). Throws hack::Error for a plain type or a partial block.
void dequantize_row(DType t, const void* src, float* dst, size_t n);

}  // namespace hack
