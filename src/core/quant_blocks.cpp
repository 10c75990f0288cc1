// The scalar dequantization of GGUF's block types: ggml's dequantize_row_* arithmetic
// (products in fp32 in the same order), written from the layouts in core/quant_blocks.h.
#include "hack/core/quant_blocks.h"

#include <cstring>

#include "hack/core/error.h"

namespace hack {

namespace {

void dequantize_q4_0(const BlockQ4_0* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, y += kQ32) {
    const float d = f16_to_f32(b[i].d);
    for (size_t j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, y += kQ32) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (size_t j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

// Code of element j (< 32) of a Q5 block: nibble j % 16 of qs (low, then high) | bit j of qh.
int q5_code(const uint8_t* qs, const uint8_t* qh_bytes, size_t j) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const int nibble = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
  return nibble | static_cast<int>(((qh >> j) & 1u) << 4);
}

void dequantize_q5_0(const BlockQ5_0* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, y += kQ32) {
    const float d = f16_to_f32(b[i].d);
    for (size_t j = 0; j < kQ32; ++j) y[j] = static_cast<float>(q5_code(b[i].qs, b[i].qh, j) - 16) * d;
  }
}

void dequantize_q5_1(const BlockQ5_1* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, y += kQ32) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (size_t j = 0; j < kQ32; ++j) y[j] = static_cast<float>(q5_code(b[i].qs, b[i].qh, j)) * d + m;
  }
}

void dequantize_q8_0(const BlockQ8_0* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, y += kQ32) {
    const float d = f16_to_f32(b[i].d);
    for (size_t j = 0; j < kQ32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequantize_q4_k(const BlockQ4K* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (size_t s = 0; s < 8; s += 2, q += 32) {
      uint8_t sc, mn;
      k_scale_min(s, b[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      k_scale_min(s + 1, b[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (size_t l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (size_t l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_k(const BlockQ5K* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (size_t s = 0; s < 8; s += 2, ql += 32, u1 = static_cast<uint8_t>(u1 << 2), u2 = static_cast<uint8_t>(u2 << 2)) {
      uint8_t sc, mn;
      k_scale_min(s, b[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      k_scale_min(s + 1, b[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (size_t l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (size_t l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void dequantize_q6_k(const BlockQ6K* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (size_t half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (size_t l = 0; l < 32; ++l) {
        const size_t is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, size_t n) {
  HACK_CHECK(dtype_is_quantized(t), "dequantize_row: {} is not a block type", dtype_name(t));
  const size_t block = dtype_block_elems(t);
  HACK_CHECK(n % block == 0, "dequantize_row: {} elements of {} are not whole blocks of {}", n, dtype_name(t), block);
  const size_t blocks = n / block;
  switch (t) {
    case DType::q4_0: dequantize_q4_0(static_cast<const BlockQ4_0*>(src), blocks, dst); return;
    case DType::q4_1: dequantize_q4_1(static_cast<const BlockQ4_1*>(src), blocks, dst); return;
    case DType::q8_0: dequantize_q8_0(static_cast<const BlockQ8_0*>(src), blocks, dst); return;
    case DType::q4_k: dequantize_q4_k(static_cast<const BlockQ4K*>(src), blocks, dst); return;
    case DType::q5_k: dequantize_q5_k(static_cast<const BlockQ5K*>(src), blocks, dst); return;
    case DType::q6_k: dequantize_q6_k(static_cast<const BlockQ6K*>(src), blocks, dst); return;
    case DType::q5_0: dequantize_q5_0(static_cast<const BlockQ5_0*>(src), blocks, dst); return;
    case DType::q5_1: dequantize_q5_1(static_cast<const BlockQ5_1*>(src), blocks, dst); return;
    default: break;
  }
}

}  // namespace hack
