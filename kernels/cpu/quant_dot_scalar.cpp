// The reference dots on block weights: each block's integer sum exact in int32, then one
// fp32 multiply-add per block (per super-block for the K-quants) in index order.
#include <cstring>

#include "hack/core/quant_blocks.h"
#include "kernels/cpu/quant_dot_kernels.h"

namespace hack::cpu::detail {

namespace {

float dot_q4_0(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4_0*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0, sum = 0;
    for (size_t j = 0; j < 16; ++j) {
      s += (w[b].qs[j] & 0xF) * x[b].qs[j] + (w[b].qs[j] >> 4) * x[b].qs[j + 16];
      sum += x[b].qs[j] + x[b].qs[j + 16];
    }
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(s - 8 * sum);
  }
  return acc;
}

float dot_q4_1(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4_1*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0;
    for (size_t j = 0; j < 16; ++j) s += (w[b].qs[j] & 0xF) * x[b].qs[j] + (w[b].qs[j] >> 4) * x[b].qs[j + 16];
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(s) + f16_to_f32(w[b].m) * x[b].s;
  }
  return acc;
}

// Code j (< 32) of a Q5 block (core/quant_blocks.h): nibble | bit j of qh · 16.
int q5_code(const uint8_t* qs, const uint8_t* qh_bytes, size_t j) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  return (j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4) | static_cast<int>(((qh >> j) & 1u) << 4);
}

float dot_q5_0(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ5_0*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0, sum = 0;
    for (size_t j = 0; j < 32; ++j) {
      s += q5_code(w[b].qs, w[b].qh, j) * x[b].qs[j];
      sum += x[b].qs[j];
    }
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(s - 16 * sum);
  }
  return acc;
}

float dot_q5_1(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ5_1*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0;
    for (size_t j = 0; j < 32; ++j) s += q5_code(w[b].qs, w[b].qh, j) * x[b].qs[j];
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(s) + f16_to_f32(w[b].m) * x[b].s;
  }
  return acc;
}

float dot_q8_0(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ8_0*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0;
    for (size_t j = 0; j < 32; ++j) s += w[b].qs[j] * x[b].qs[j];
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(s);
  }
  return acc;
}

// Σ over sub-blocks s of min_s · (sum of x's codes in s), for the K-quants with mins.
int32_t min_sum(const uint8_t* scales, const int16_t* bsums) {
  int32_t m = 0;
  for (size_t s = 0; s < 8; ++s) {
    uint8_t sc, mn;
    k_scale_min(s, scales, &sc, &mn);
    m += mn * (bsums[2 * s] + bsums[2 * s + 1]);
  }
  return m;
}

float dot_q4_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t sumi = 0;
    for (size_t j = 0; j < 4; ++j) {
      uint8_t sc_lo, sc_hi, mn;
      k_scale_min(2 * j, w[b].scales, &sc_lo, &mn);
      k_scale_min(2 * j + 1, w[b].scales, &sc_hi, &mn);
      int32_t lo = 0, hi = 0;
      for (size_t l = 0; l < 32; ++l) {
        lo += (w[b].qs[32 * j + l] & 0xF) * x[b].qs[64 * j + l];
        hi += (w[b].qs[32 * j + l] >> 4) * x[b].qs[64 * j + 32 + l];
      }
      sumi += sc_lo * lo + sc_hi * hi;
    }
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(sumi) -
           f16_to_f32(w[b].dmin) * x[b].d * static_cast<float>(min_sum(w[b].scales, x[b].bsums));
  }
  return acc;
}

float dot_q5_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ5K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t sumi = 0;
    for (size_t j = 0; j < 4; ++j) {
      uint8_t sc_lo, sc_hi, mn;
      k_scale_min(2 * j, w[b].scales, &sc_lo, &mn);
      k_scale_min(2 * j + 1, w[b].scales, &sc_hi, &mn);
      int32_t lo = 0, hi = 0;
      for (size_t l = 0; l < 32; ++l) {
        const int q_lo = (w[b].qs[32 * j + l] & 0xF) | (((w[b].qh[l] >> (2 * j)) & 1) << 4);
        const int q_hi = (w[b].qs[32 * j + l] >> 4) | (((w[b].qh[l] >> (2 * j + 1)) & 1) << 4);
        lo += q_lo * x[b].qs[64 * j + l];
        hi += q_hi * x[b].qs[64 * j + 32 + l];
      }
      sumi += sc_lo * lo + sc_hi * hi;
    }
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(sumi) -
           f16_to_f32(w[b].dmin) * x[b].d * static_cast<float>(min_sum(w[b].scales, x[b].bsums));
  }
  return acc;
}

float dot_q6_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ6K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  float acc = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t sumi = 0;
    for (size_t e0 = 0; e0 < 256; e0 += 16) {  // sub-block e0 / 16
      int32_t s = 0;
      for (size_t e = e0; e < e0 + 16; ++e) {
        const size_t h = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t ql = w[b].ql[64 * h + 32 * (k & 1) + l];
        const int q = ((k >> 1 ? ql >> 4 : ql & 0xF) | (((w[b].qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
        s += q * x[b].qs[e];
      }
      sumi += w[b].scales[e0 / 16] * s;
    }
    acc += f16_to_f32(w[b].d) * x[b].d * static_cast<float>(sumi);
  }
  return acc;
}

// Row by row: the reference has nothing to share between rows.
template <QuantDotFn Dot>
void dot_rows(const void* w, const void* x, size_t xs, size_t rows, size_t blocks, float* out, size_t os) {
  for (size_t r = 0; r < rows; ++r) out[r * os] = Dot(w, static_cast<const unsigned char*>(x) + r * xs, blocks);
}

}  // namespace

const QuantDotTable& quant_dots_scalar() {
  static constexpr QuantDotTable table{
      dot_q4_0,           dot_q4_1,           dot_q8_0,           dot_q4_k,           dot_q5_k,           dot_q6_k,
      dot_q5_0,           dot_q5_1,           dot_rows<dot_q4_0>, dot_rows<dot_q4_1>, dot_rows<dot_q8_0>, dot_rows<dot_q4_k>,
      dot_rows<dot_q5_k>, dot_rows<dot_q6_k>, dot_rows<dot_q5_0>, dot_rows<dot_q5_1>};
  return table;
}

}  // namespace hack::cpu::detail
