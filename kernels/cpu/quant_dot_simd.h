// Internal: the dots on block weights for 256-bit registers, compiled twice: in
// quant_dot_avx2.cpp (VPMADDUBSW + VPMADDWD) and in quant_dot_avx512.cpp, where AVX-512 VNNI
// fuses the multiply and the accumulate (VPDPBUSD for u8 × s8 sums of 4, VPDPWSSD for their
// scaled pair sums). Integer sums are exact either way (bounds below), so the two give the same
// bits; both differ from the scalar reference only in the order of the fp32 sums.
//
// Weights enter as unsigned codes (q4: 0..15, q5: 0..31, q6: 0..63; q8_0 by the sign trick:
// |w| × sign(x, w)); offsets (q4_0's 8, q6_k's 32) and mins come back through the activation
// block sums. VPMADDUBSW saturates at ±32767 per pair: 2 · 63 · 127 = 16002 at most here.
#pragma once

#include <immintrin.h>

#include "hack/core/quant_blocks.h"
#include "kernels/cpu/quant_dot_kernels.h"

namespace hack::cpu::detail {
namespace {

// acc + (per 32-bit lane i) Σ_{k<4} u[4i + k] · s[4i + k]
inline __m256i acc_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + (per 32-bit lane i) Σ_{k<2} scale16[2i + k] · (u[4i + 2k]·s[4i + 2k] + u[4i + 2k + 1]·s[4i + 2k + 1])
inline __m256i acc_u8s8_scaled(__m256i acc, __m256i u, __m256i s, __m256i scale16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), scale16);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16));
#endif
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline float half(uint16_t h) { return _cvtsh_ss(h); }

// A q4 block's 16 bytes as 32 codes: low nibbles (elements 0..15), then high (16..31). The
// bytes are broadcast to both halves by the load itself and the high half shifted by 4 per
// 32-bit lane (no cross-lane shuffle: port 5 is the dots' bottleneck).
inline __m256i unpack_q4(const uint8_t* qs) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

float simd_dot_q4_0(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4_0*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  __m256 acc = _mm256_setzero_ps();
  float offset = 0.0f;  // Σ d · 8 · Σ x codes
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i p = acc_u8s8(_mm256_setzero_si256(), unpack_q4(w[b].qs), load32(x[b].qs));
    const float d = half(w[b].d) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    offset += d * static_cast<float>(8 * x[b].sum);
  }
  return hsum(acc) - offset;
}

float simd_dot_q4_1(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4_1*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;  // Σ m · d_x · Σ x codes
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i p = acc_u8s8(_mm256_setzero_si256(), unpack_q4(w[b].qs), load32(x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half(w[b].d) * x[b].d), acc);
    mins += half(w[b].m) * x[b].d * static_cast<float>(x[b].sum);
  }
  return hsum(acc) + mins;
}

float simd_dot_q8_0(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ8_0*>(wv);
  const auto* x = static_cast<const BlockQ8x32*>(xv);
  __m256 acc = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i q = load32(w[b].qs);
    const __m256i p = acc_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(x[b].qs), q));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half(w[b].d) * x[b].d), acc);
  }
  return hsum(acc);
}

// The 8 scales and Σ mins · (code sums) of a Q4_K/Q5_K block.
inline int32_t k_scales(const uint8_t* scales, const int16_t* bsums, uint8_t* sc) {
  int32_t m = 0;
  for (size_t s = 0; s < 8; ++s) {
    uint8_t mn;
    k_scale_min(s, scales, &sc[s], &mn);
    m += mn * (bsums[2 * s] + bsums[2 * s + 1]);
  }
  return m;
}

float simd_dot_q4_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ4K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t sc[8];
    const int32_t m = k_scales(w[b].scales, x[b].bsums, sc);
    __m256i sumi = _mm256_setzero_si256();
    for (size_t j = 0; j < 4; ++j) {
      const __m256i q = load32(w[b].qs + 32 * j);
      sumi = acc_u8s8_scaled(sumi, _mm256_and_si256(q, m4), load32(x[b].qs + 64 * j), _mm256_set1_epi16(sc[2 * j]));
      sumi = acc_u8s8_scaled(sumi, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), load32(x[b].qs + 64 * j + 32),
                             _mm256_set1_epi16(sc[2 * j + 1]));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(half(w[b].d) * x[b].d), acc);
    mins += half(w[b].dmin) * x[b].d * static_cast<float>(m);
  }
  return hsum(acc) - mins;
}

float simd_dot_q5_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ5K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t sc[8];
    const int32_t m = k_scales(w[b].scales, x[b].bsums, sc);
    const __m256i qh = load32(w[b].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (size_t j = 0; j < 4; ++j) {
      const __m256i q = load32(w[b].qs + 32 * j);
      // bit 2j (low nibbles) and 2j + 1 (high) of qh, moved to bit 4 of each byte
      const __m256i h_lo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * j)), m1), 4);
      const __m256i h_hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * j + 1)), m1), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h_hi);
      sumi = acc_u8s8_scaled(sumi, lo, load32(x[b].qs + 64 * j), _mm256_set1_epi16(sc[2 * j]));
      sumi = acc_u8s8_scaled(sumi, hi, load32(x[b].qs + 64 * j + 32), _mm256_set1_epi16(sc[2 * j + 1]));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(half(w[b].d) * x[b].d), acc);
    mins += half(w[b].dmin) * x[b].d * static_cast<float>(m);
  }
  return hsum(acc) - mins;
}

float simd_dot_q6_k(const void* wv, const void* xv, size_t blocks) {
  const auto* w = static_cast<const BlockQ6K*>(wv);
  const auto* x = static_cast<const BlockQ8K*>(xv);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;  // Σ d · 32 · Σ_s scale_s · (code sum of s)
  for (size_t b = 0; b < blocks; ++b) {
    const int8_t* sc = w[b].scales;
    int32_t off = 0;
    for (size_t s = 0; s < 16; ++s) off += sc[s] * x[b].bsums[s];
    __m256i sumi = _mm256_setzero_si256();
    for (size_t h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[b].ql + 64 * h), ql1 = load32(w[b].ql + 64 * h + 32);
      const __m256i qh = load32(w[b].qh + 32 * h);
      for (size_t k = 0; k < 4; ++k) {  // elements 128h + 32k + l, sub-blocks 8h + 2k and 8h + 2k + 1
        const __m256i ql = k & 1 ? ql1 : ql0;
        const __m256i lo = k >> 1 ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * k)), m3), 4);
        const size_t s = 8 * h + 2 * k;
        const __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(sc[s]), _mm_set1_epi16(sc[s + 1]));
        sumi = acc_u8s8_scaled(sumi, _mm256_or_si256(lo, hi), load32(x[b].qs + 128 * h + 32 * k), scale);
      }
    }
    const float d = half(w[b].d) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    offsets += d * static_cast<float>(32 * off);
  }
  return hsum(acc) - offsets;
}

constexpr QuantDotTable kSimdQuantDots{simd_dot_q4_0, simd_dot_q4_1, simd_dot_q8_0,
                                       simd_dot_q4_k, simd_dot_q5_k, simd_dot_q6_k};

}  // namespace
}  // namespace hack::cpu::detail
