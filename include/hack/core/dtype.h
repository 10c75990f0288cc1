/// @file dtype.h
/// @brief Element types of tensors and the scalar conversions between them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace hack {

enum class DType : uint8_t { f32, f16, bf16, i8, u8, i32, i64 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

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

/// Converts n elements of type `from` at src to float at dst.
void convert_to_f32(DType from, const void* src, float* dst, size_t n);

}  // namespace hack
