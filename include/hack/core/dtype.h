/// @file dtype.h
/// @brief Element types of tensors and the scalar conversions between them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace hack {

/// Plain element types, then GGUF's block-quantized weight types (ggml's layouts, see
/// core/quant_blocks.h): a row of a block type is a whole number of blocks of 32 or 256
/// elements, each with its own scales.
enum class DType : uint8_t { f32, f16, bf16, i8, u8, i32, i64, q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, q5_0, q5_1 };

/// Whether `t` is a block-quantized type (q4_0 ... q5_1).
constexpr bool dtype_is_quantized(DType t) { return t >= DType::q4_0; }

/// Bytes per element of a plain type; 0 for a block type (use dtype_bytes).
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    default: return 0;
  }
}

/// Elements per block: 1 for a plain type, 32 (q4_0, q4_1, q5_0, q5_1, q8_0) or 256 (the K-quants).
constexpr size_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q8_0: return 32;
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k: return 256;
    default: return 1;
  }
}

/// Bytes per block (per element for a plain type); static_asserts in core/quant_blocks.h
/// tie these to the block structs.
constexpr size_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::q4_0: return 18;   // f16 d, 16 bytes of nibbles
    case DType::q4_1: return 20;   // f16 d, f16 m, 16 bytes of nibbles
    case DType::q5_0: return 22;   // f16 d, 4 bytes of fifth bits, 16 bytes of nibbles
    case DType::q5_1: return 24;   // f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles
    case DType::q8_0: return 34;   // f16 d, 32 int8
    case DType::q4_k: return 144;  // f16 d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
    case DType::q5_k: return 176;  // q4_k + 32 bytes of high bits
    case DType::q6_k: return 210;  // 128 low nibbles, 64 bytes of high 2 bits, 16 int8 scales, f16 d
    default: return dtype_size(t);
  }
}

/// Bytes of n elements of `t`; for a block type n must be a multiple of dtype_block_elems
/// (callers check: a row's length is).
constexpr size_t dtype_bytes(DType t, size_t n) { return n / dtype_block_elems(t) * dtype_block_bytes(t); }

/// Lower-case name ("f32", "bf16", ...).
std::string_view dtype_name(DType t);
/// Parses our names and safetensors names ("F32", "BF16", "F16", "I8", "U8", "I32", "I64");
/// throws hack::Error for anything else.
DType parse_dtype(std::string_view name);

/// bf16 bits -> float (exact).
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

/// float -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE half bits -> float (exact, handles subnormals, inf, NaN).
float f16_to_f32(uint16_t h);
/// float -> IEEE half bits, round to nearest even.
uint16_t f32_to_f16(float f);

/// Converts n elements of type `from` at src to float at dst; a block type is dequantized
/// (n a multiple of its block, src at a block boundary; core/quant_blocks.h).
void convert_to_f32(DType from, const void* src, float* dst, size_t n);

}  // namespace hack
