// Internal: pieces every HACK attention implementation shares so the scalar reference
// and the SIMD paths compute bit-identical results (kernels/cpu/hack_attention_*.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cpu::detail {

// exp polynomial (Cephes expf), defined once for host and device in hack_quant_math.h;
// the SIMD paths evaluate the same constants lane-wise.
inline constexpr float kExpLo = quant::kExpLo;
inline constexpr float kExpHi = quant::kExpHi;
inline constexpr float kLog2e = quant::kLog2e;
inline constexpr float kLn2Hi = quant::kLn2Hi;
inline constexpr float kLn2Lo = quant::kLn2Lo;
inline constexpr float kExpP0 = quant::kExpP0;
inline constexpr float kExpP1 = quant::kExpP1;
inline constexpr float kExpP2 = quant::kExpP2;
inline constexpr float kExpP3 = quant::kExpP3;
inline constexpr float kExpP4 = quant::kExpP4;
inline constexpr float kExpP5 = quant::kExpP5;

inline float exp_scalar(float x) { return quant::exp_f32(x); }

/// The canonical fold of 16 lane partials: 8+8, 4+4, 2+2, 1+1.
inline float fold16(float* part) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) part[j] = part[j] + part[j + w];
  return part[0];
}

inline float bf16_bits_to_f32(uint16_t h) { return quant::bf16_bits_to_f32(h); }

/// Σ a[i]·b[i] in the canonical order (lane i mod 16, one FMA each, then fold16).
template <class LoadB>
inline float canonical_dot(const float* a, LoadB b, int n) {
  float part[16] = {};
  for (int i = 0; i < n; ++i) part[i % 16] = std::fma(a[i], b(i), part[i % 16]);
  return fold16(part);
}

/// Σ a[i] in the canonical order.
inline float canonical_sum(const float* a, int n) {
  float part[16] = {};
  for (int i = 0; i < n; ++i) part[i % 16] = part[i % 16] + a[i];
  return fold16(part);
}

/// u8 asymmetric quantization of x[0..n): lo = min, σ = (max − lo)/255, code = round((x − lo)/σ).
/// Returns σ and writes lo; all-equal input gives σ = 0 and codes 0.
inline float quantize_u8_scalar(const float* x, int n, uint8_t* codes, float* lo_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float sigma = quant::u8_sigma(lo, hi);
  const float inv = quant::u8_inverse(sigma);
  for (int i = 0; i < n; ++i) codes[i] = quant::u8_code(x[i], lo, inv);
  *lo_out = lo;
  return sigma;
}

inline uint32_t load_sum(const void* sums, int bytes, size_t i) {
  return bytes == 1 ? static_cast<const uint8_t*>(sums)[i] : static_cast<const uint16_t*>(sums)[i];
}

/// Horizontal reductions the SIMD paths batch over rows.
enum class Reduce { add, min, max };

/// Work layout of hack_block (per tile of up to kRowTile rows); offsets in floats.
inline constexpr int kRowTile = 4;
struct HackWork {
  float* p;          // [kRowTile][Π] scores, then exp(score − max)
  uint8_t* q_codes;  // [kRowTile][k_dim]
  uint8_t* p_codes;  // [kRowTile][v_parts][Π]
  float* q_sigma;    // [kRowTile][k_parts]
  float* q_mu;       // [kRowTile][k_parts]
  int32_t* q_sum;    // [kRowTile][k_parts] Σ q' (8-bit paths)
  float* p_sigma;    // [kRowTile][v_parts]
  float* p_mu;       // [kRowTile][v_parts]
  float* p_min;      // [kRowTile][v_parts] Σ_t p_t·v_min
  int32_t* p_sum;    // [kRowTile][v_parts] Σ p' (8-bit paths)
  float* row;        // [kRowTile][8]: m_new, alpha, mterm
  float* tmp;        // [kRowTile][max(k_dim, v_parts·Π)] scratch
};

inline size_t round16(size_t n) { return (n + 15) / 16 * 16; }

inline HackWork carve_hack_work(float* work, int tokens, int k_dim, int k_parts, int v_parts) {
  HackWork w;
  float* at = work;
  auto take = [&](size_t floats) {
    float* p = at;
    at += round16(floats);
    return p;
  };
  const size_t R = kRowTile;
  w.p = take(R * static_cast<size_t>(tokens));
  w.q_codes = reinterpret_cast<uint8_t*>(take(R * static_cast<size_t>(k_dim) / 4 + 1));
  w.p_codes = reinterpret_cast<uint8_t*>(take(R * static_cast<size_t>(v_parts) * static_cast<size_t>(tokens) / 4 + 1));
  w.q_sigma = take(R * static_cast<size_t>(k_parts));
  w.q_mu = take(R * static_cast<size_t>(k_parts));
  w.q_sum = reinterpret_cast<int32_t*>(take(R * static_cast<size_t>(k_parts)));
  w.p_sigma = take(R * static_cast<size_t>(v_parts));
  w.p_mu = take(R * static_cast<size_t>(v_parts));
  w.p_min = take(R * static_cast<size_t>(v_parts));
  w.p_sum = reinterpret_cast<int32_t*>(take(R * static_cast<size_t>(v_parts)));
  w.row = take(R * 8);
  w.tmp = take(R * static_cast<size_t>(std::max(k_dim, v_parts * tokens)));
  return w;
}

inline size_t hack_work_floats(int tokens, int k_dim, int k_parts, int v_parts) {
  const size_t R = kRowTile;
  return round16(R * static_cast<size_t>(tokens)) + round16(R * static_cast<size_t>(k_dim) / 4 + 1) +
         round16(R * static_cast<size_t>(v_parts) * static_cast<size_t>(tokens) / 4 + 1) +
         3 * round16(R * static_cast<size_t>(k_parts)) + 4 * round16(R * static_cast<size_t>(v_parts)) +
         round16(R * 8) + round16(R * static_cast<size_t>(std::max(k_dim, v_parts * tokens))) + 16;
}

// Per-ISA entry points.
void hack_block_scalar(const HackHeadView& block, const AttentionRows& rows, float* work);
void exact_block_scalar(const ExactHeadView& block, const AttentionRows& rows, float* work);
void hack_block_avx2(const HackHeadView& block, const AttentionRows& rows, float* work);
void exact_block_avx2(const ExactHeadView& block, const AttentionRows& rows, float* work);
void hack_block_avx512(const HackHeadView& block, const AttentionRows& rows, float* work);
void exact_block_avx512(const ExactHeadView& block, const AttentionRows& rows, float* work);

}  // namespace hack::cpu::detail
