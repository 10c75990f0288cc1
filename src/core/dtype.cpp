#include "hack/core/dtype.h"

#include "hack/core/error.h"
#include "hack/core/quant_blocks.h"

namespace hack {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::q4_0: return "q4_0";
    case DType::q4_1: return "q4_1";
    case DType::q8_0: return "q8_0";
    case DType::q4_k: return "q4_k";
    case DType::q5_k: return "q5_k";
    case DType::q6_k: return "q6_k";
    case DType::q5_0: return "q5_0";
    case DType::q5_1: return "q5_1";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "F32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "F16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::bf16;
  if (name == "i8" || name == "I8" || name == "int8") return DType::i8;
  if (name == "u8" || name == "U8" || name == "uint8") return DType::u8;
  if (name == "i32" || name == "I32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "I64" || name == "int64") return DType::i64;
  if (name == "q4_0" || name == "Q4_0") return DType::q4_0;
  if (name == "q4_1" || name == "Q4_1") return DType::q4_1;
  if (name == "q8_0" || name == "Q8_0") return DType::q8_0;
  if (name == "q4_k" || name == "Q4_K") return DType::q4_k;
  if (name == "q5_k" || name == "Q5_K") return DType::q5_k;
  if (name == "q6_k" || name == "Q6_K") return DType::q6_k;
  if (name == "q5_0" || name == "Q5_0") return DType::q5_0;
  if (name == "q5_1" || name == "Q5_1") return DType::q5_1;
  fail("unsupported dtype '{}'", name);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;     // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;    // overflow (>= 65520) -> inf
  if (abs < 0x38800000u) {                          // subnormal or zero in half
    if (abs < 0x33000000u) return sign;             // < 2^-25 rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;               // 14 + (113 - exp)
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

// src may be any address (a received payload has no alignment promise): 16-bit values are
// read by memcpy, which compiles to plain loads, not through a misaligned uint16_t*.
void convert_to_f32(DType from, const void* src, float* dst, size_t n) {
  if (n == 0) return;  // dst / src may then be null (an empty vector's data())
  const auto* bytes = static_cast<const unsigned char*>(src);
  auto u16_at = [bytes](size_t i) {
    uint16_t v;
    std::memcpy(&v, bytes + 2 * i, sizeof v);
    return v;
  };
  switch (from) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::bf16: {
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(u16_at(i));
      return;
    }
    case DType::f16: {
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(u16_at(i));
      return;
    }
    case DType::i8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::u8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::i32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::i64: {
      const auto* s = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::q4_0:
    case DType::q4_1:
    case DType::q8_0:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
    case DType::q5_0:
    case DType::q5_1: dequantize_row(from, src, dst, n); return;
  }
}

}  // namespace hack
