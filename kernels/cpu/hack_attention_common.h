// Internal: pieces every HACK attention implementation shares so the scalar reference
// and the SIMD paths compute bit-identical results (kernels/cpu/hack_attention_*.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hack/kernels/hack_attention.h"

namespace hack::cpu::detail {

// exp polynomial (Cephes expf): n = round(x·log2 e), r = x − n·ln 2 (two-part ln 2),
// e^r ≈ 1 + r + r²·P(r), times 2^n through the exponent bits.
inline constexpr float kExpLo = -87.3f;
inline constexpr float kExpHi = 88.3f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

inline float exp_scalar(float x) {
  x = std::min(std::max(x, kExpLo), kExpHi);  // also maps −inf to kExpLo
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpP0;
  p = std::fma(p, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, kExpP5);
  const float r2 = r * r;
  float y = std::fma(p, r2, r);
  y = y + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(e);
}

/// The canonical fold of 16 lane partials: 8+8, 4+4, 2+2, 1+1.
inline float fold16(float* part) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) part[j] = part[j] + part[j + w];
  return part[0];
}

inline float bf16_bits_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

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
  const float sigma = (hi - lo) / 255.0f;
  const float inv = sigma > 0.0f ? 1.0f / sigma : 0.0f;
  for (int i = 0; i < n; ++i) {
    const float c = std::nearbyint((x[i] - lo) * inv);
    codes[i] = static_cast<uint8_t>(std::min(std::max(c, 0.0f), 255.0f));
  }
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
