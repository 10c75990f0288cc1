/// @file mma_fragments.h
/// @brief The index math of tensor-core HACK attention (issue 49 items 3 and 6), in plain
/// functions that compile for the host — where CI tests them against the page format's scalar
/// code_at (kernels/hack_quant_math.h) — and for the device:
///   - which matrix element each lane's registers hold in
///     `mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32` (PTX ISA, "Matrix Fragments for
///     mma.m16n8k32", the 8-bit integer types; the .s8 forms share the layout), with
///     g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group):
///       A 16×32 row-major, 4 registers: a_i (register i / 4, byte i % 4) is row g + 8·((i/4) & 1),
///         column 4t + 16·(i / 8) + i % 4;
///       B 32×8 column-major, 2 registers: b_i (register i / 4, byte i % 4) is row (k)
///         4t + 16·(i / 4) + i % 4, column (n) g;
///       C/D 16×8 s32, 4 registers: c_i is row g + 8·(i / 2), column 2t + i % 2;
///     lower-indexed elements in lower-order bytes;
///   - the HACK page words that are such a B register as they lie: Q·Kᵀ takes B = K codes
///     (k = channels, n = tokens) and P·V takes B = V codes (k = tokens, n = channels). The page
///     format (kv/hack_page.h) packs a K chunk as 16 tokens × 32/b channels with channels
///     4j..4j+3 of a token in bits [b·j, b·j + b) of its 4 bytes (V: channels and tokens swapped),
///     so a B register is one aligned 32-bit load, a shift and a mask: codes unpacked in registers,
///     no shared-memory staging and no dequantization. The codes are unsigned (u8 operands); Q and
///     P are the u8 codes of the folded query and probabilities (hack_quant_math.h u8_code), and
///     the stored code sums correct the offsets afterwards (summation elimination, DESIGN §3.1).
#pragma once

#include <cstdint>

#include "hack/kernels/hack_quant_math.h"  // HACK_HD, k_code_pos, v_code_pos

namespace hack::mma {

/// A matrix position: row, column of the operand (for B, row = k and column = n).
struct Coord {
  int row = 0;
  int col = 0;
};

inline constexpr int kM = 16, kN = 8, kK = 32;  ///< the m16n8k32 tile
inline constexpr int kARegs = 4, kBRegs = 2, kCRegs = 4;

/// Element i (0..15) of lane's A fragment: register i / 4, byte i % 4.
HACK_HD inline Coord a_coord(int lane, int i) {
  const int g = lane >> 2, t = lane & 3, reg = i >> 2;
  return {g + 8 * (reg & 1), 4 * t + 16 * (reg >> 1) + (i & 3)};
}

/// Element i (0..7) of lane's B fragment: register i / 4, byte i % 4; row = k, col = n.
HACK_HD inline Coord b_coord(int lane, int i) {
  const int g = lane >> 2, t = lane & 3;
  return {4 * t + 16 * (i >> 2) + (i & 3), g};
}

/// Element i (0..3) of lane's accumulator fragment.
HACK_HD inline Coord c_coord(int lane, int i) {
  const int g = lane >> 2, t = lane & 3;
  return {g + 8 * (i >> 1), 2 * t + (i & 1)};
}

/// Each byte of a word holds one b-bit code in its low bits after the shift: the mask that
/// keeps them (b = 2, 4 or 8).
HACK_HD inline uint32_t code_byte_mask(int bits) { return bits == 8 ? 0xFFFFFFFFu : 0x01010101u * ((1u << bits) - 1u); }

/// Where one B register of a HACK page lies: the 32-bit word at byte `byte` of the head's code
/// array (4-byte aligned when the array is), shifted right by `shift`, masked by
/// code_byte_mask(bits).
struct CodeWord {
  uint32_t byte = 0;
  int shift = 0;
};

/// Q·Kᵀ: register `reg` (0, 1) of lane's B fragment over channels [k0, k0 + 32) and tokens
/// [n0, n0 + 8) of a page's K codes (k0 a multiple of 32 below k_dim; n0 a multiple of 8 below
/// Π): token n0 + g, channels k0 + 16·reg + 4t .. + 3, byte j = channel + j.
HACK_HD inline CodeWord k_b_word(int bits, int k_dim, int n0, int k0, int lane, int reg) {
  const int g = lane >> 2, t = lane & 3;
  const quant::CodePos p = quant::k_code_pos(bits, k_dim, n0 + g, k0 + 16 * reg + 4 * t);
  return {static_cast<uint32_t>(p.byte), p.shift};  // p.byte is 4-aligned: channel % 4 == 0
}

/// P·V: register `reg` of lane's B fragment over tokens [k0, k0 + 32) and channels
/// [n0, n0 + 8) of a page's V codes (k0 a multiple of 32 below Π, n0 a multiple of 8 below
/// v_dim): channel n0 + g, tokens k0 + 16·reg + 4t .. + 3, byte j = token + j.
HACK_HD inline CodeWord v_b_word(int bits, int block_tokens, int n0, int k0, int lane, int reg) {
  const int g = lane >> 2, t = lane & 3;
  const quant::CodePos p = quant::v_code_pos(bits, block_tokens, k0 + 16 * reg + 4 * t, n0 + g);
  return {static_cast<uint32_t>(p.byte), p.shift};  // p.byte is 4-aligned: token % 4 == 0
}

/// The B register itself, from the head's code array (4-byte aligned).
HACK_HD inline uint32_t load_b_register(const uint8_t* codes, CodeWord w, int bits) {
  uint32_t word;
#if defined(__CUDA_ARCH__)
  word = *reinterpret_cast<const uint32_t*>(codes + w.byte);
#else
  word = static_cast<uint32_t>(codes[w.byte]) | static_cast<uint32_t>(codes[w.byte + 1]) << 8 |
         static_cast<uint32_t>(codes[w.byte + 2]) << 16 | static_cast<uint32_t>(codes[w.byte + 3]) << 24;
#endif
  return (word >> w.shift) & code_byte_mask(bits);
}

}  // namespace hack::mma
