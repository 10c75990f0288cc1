// Internal: the dots on block weights for 256-bit registers, compiled twice: in
// quant_dot_avx2.cpp (VPMADDUBSW + VPMADDWD) and in quant_dot_avx512.cpp, where AVX-512 VNNI
// fuses the multiply and the accumulate (VPDPBUSD for u8 × s8 sums of 4, VPDPWSSD for their
// scaled pair sums). Integer sums are exact either way (bounds below), so the two give the same
// bits; both differ from the scalar reference only in the order of the fp32 sums.
//
// Weights enter as unsigned codes (q4: 0..15, q5 and q5_k: 0..31, q6: 0..63; q8_0 by the sign trick:
// |w| × sign(x, w)); offsets (q4_0's 8, q5_0's 16, q6_k's 32) and mins come back through the activation
// block sums. VPMADDUBSW saturates at ±32767 per pair: 2 · 63 · 127 = 16002 at most here.
#pragma once

#include <immintrin.h>

#include <cstring>
#include <type_traits>

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

// The block's scale d_w · d_x in every lane: d_x broadcast by the load itself (not port 5),
// multiplied by the weight's scale broadcast once per block; the product is the scalar one.
inline __m256 scale(__m256 dw, const float& dx) { return _mm256_mul_ps(dw, _mm256_broadcast_ss(&dx)); }

// A q4 block's 16 bytes as 32 codes: low nibbles (elements 0..15), then high (16..31). The
// bytes are broadcast to both halves by the load itself and the high half shifted by 4 per
// 32-bit lane (no cross-lane shuffle: port 5 is the dots' bottleneck).
inline __m256i unpack_q4(const uint8_t* qs) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Each kernel runs R rows of activations against one weight row: the weight blocks are
// unpacked once and used R times (the decode GEMV of R sequences reads and decodes every weight
// once). Row r's activation blocks are at x + r · xs bytes; out[r · os] gets its dot. Per row
// the arithmetic is that of R = 1, so a row's value does not depend on the others.
template <class XBlock>
inline const XBlock& xblock(const void* x, size_t xs, size_t r, size_t b) {
  return reinterpret_cast<const XBlock*>(static_cast<const unsigned char*>(x) + r * xs)[b];
}

struct KernelQ4_0 {
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const BlockQ4_0*>(wv);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    float offset[R];  // Σ d · 8 · Σ x codes
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offset[r] = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      const __m256i u = unpack_q4(w[b].qs);
      const __m256 dw = _mm256_broadcast_ss(&f16[w[b].d]);
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8x32& xb = xblock<BlockQ8x32>(x, xs, r, b);
        const __m256i p = acc_u8s8(_mm256_setzero_si256(), u, load32(xb.qs));
        const __m256 d = scale(dw, xb.d);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[r]);
        offset[r] += _mm256_cvtss_f32(dw) * (8.0f * xb.s);
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = hsum(acc[r]) - offset[r];
  }
};

struct KernelQ4_1 {
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const BlockQ4_1*>(wv);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    float mins[R];  // Σ m · d_x · Σ x codes
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      const __m256i u = unpack_q4(w[b].qs);
      const __m256 dw = _mm256_broadcast_ss(&f16[w[b].d]);
      const float mw = f16[w[b].m];
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8x32& xb = xblock<BlockQ8x32>(x, xs, r, b);
        const __m256i p = acc_u8s8(_mm256_setzero_si256(), u, load32(xb.qs));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale(dw, xb.d), acc[r]);
        mins[r] += mw * xb.s;
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = hsum(acc[r]) + mins[r];
  }
};

// A Q5 block's 32 codes: unpack_q4's nibbles with bit j of qh as bit 4 of byte j (each qh
// byte spread over 8 bytes by a shuffle, then tested bit by bit: llama.cpp's bytes_from_bits_32).
inline __m256i unpack_q5(const uint8_t* qs, const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit_set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                            _mm256_set1_epi64x(-1));
  return _mm256_or_si256(unpack_q4(qs), _mm256_and_si256(bit_set, _mm256_set1_epi8(0x10)));
}

// Q5_0 (x = (q − 16)·d) and Q5_1 (x = q·d + m): Q4_0 and Q4_1 with a fifth bit.
template <bool Q5_1>
struct KernelQ5 {
  using Block = std::conditional_t<Q5_1, BlockQ5_1, BlockQ5_0>;
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const Block*>(wv);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    float extra[R];  // Q5_0: Σ d · 16 · Σ x codes (subtracted); Q5_1: Σ m · d_x · Σ x codes (added)
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), extra[r] = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      const __m256i u = unpack_q5(w[b].qs, w[b].qh);
      const __m256 dw = _mm256_broadcast_ss(&f16[w[b].d]);
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8x32& xb = xblock<BlockQ8x32>(x, xs, r, b);
        const __m256i p = acc_u8s8(_mm256_setzero_si256(), u, load32(xb.qs));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale(dw, xb.d), acc[r]);
        if constexpr (Q5_1) {
          extra[r] += f16[w[b].m] * xb.s;
        } else {
          extra[r] += _mm256_cvtss_f32(dw) * (16.0f * xb.s);
        }
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = Q5_1 ? hsum(acc[r]) + extra[r] : hsum(acc[r]) - extra[r];
  }
};

struct KernelQ8_0 {
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const BlockQ8_0*>(wv);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      const __m256i q = load32(w[b].qs);
      const __m256i u = _mm256_sign_epi8(q, q);
      const __m256 dw = _mm256_broadcast_ss(&f16[w[b].d]);
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8x32& xb = xblock<BlockQ8x32>(x, xs, r, b);
        const __m256i p = acc_u8s8(_mm256_setzero_si256(), u, _mm256_sign_epi8(load32(xb.qs), q));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale(dw, xb.d), acc[r]);
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = hsum(acc[r]);
  }
};

// All 8 scales and mins of a Q4_K/Q5_K block (k_scale_min's 6-bit fields) by 32-bit masks, a
// dozen operations instead of eight bit-field extractions (llama.cpp's utmp arrangement):
// words 0 and 1 of the result are the scales, words 2 and 3 the mins.
inline void k_scales_mins(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, q, 12);
  const uint32_t scales[2] = {u[0] & kLow6, (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4)};
  const uint32_t mins[2] = {u[1] & kLow6, ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4)};
  std::memcpy(sc, scales, 8);
  std::memcpy(mn, mins, 8);
}

// Σ over the 8 sub-blocks of min_s · (code sum of s) for one row's Q8_K block.
inline int32_t k_min_sum(const uint8_t* mn, const int16_t* bsums) {
  int32_t m = 0;
  for (size_t s = 0; s < 8; ++s) m += mn[s] * (bsums[2 * s] + bsums[2 * s + 1]);
  return m;
}

// Q4_K and Q5_K: `Q5` adds the fifth bit from qh.
template <bool Q5>
struct KernelQ45K {
  using Block = std::conditional_t<Q5, BlockQ5K, BlockQ4K>;
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const Block*>(wv);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    float mins[R];
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t sc[8], mn[8];
      k_scales_mins(w[b].scales, sc, mn);
      __m256i sumi[R], sumi_hi[R];  // two chains: VPDPWSSD's latency would serialize one
      for (size_t r = 0; r < R; ++r) sumi[r] = sumi_hi[r] = _mm256_setzero_si256();
      for (size_t j = 0; j < 4; ++j) {
        const __m256i q = load32(w[b].qs + 32 * j);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (Q5) {  // bit 2j (low nibbles) and 2j + 1 (high) of qh, moved to bit 4 of each byte
          const __m256i qh = load32(w[b].qh);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * j)), m1), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * j + 1)), m1), 4));
        }
        const __m256i sc_lo = _mm256_set1_epi16(sc[2 * j]), sc_hi = _mm256_set1_epi16(sc[2 * j + 1]);
        for (size_t r = 0; r < R; ++r) {
          const BlockQ8K& xb = xblock<BlockQ8K>(x, xs, r, b);
          sumi[r] = acc_u8s8_scaled(sumi[r], lo, load32(xb.qs + 64 * j), sc_lo);
          sumi_hi[r] = acc_u8s8_scaled(sumi_hi[r], hi, load32(xb.qs + 64 * j + 32), sc_hi);
        }
      }
      for (size_t r = 0; r < R; ++r) sumi[r] = _mm256_add_epi32(sumi[r], sumi_hi[r]);
      const float dw = f16[w[b].d], dmin = f16[w[b].dmin];
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8K& xb = xblock<BlockQ8K>(x, xs, r, b);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_set1_ps(dw * xb.d), acc[r]);
        mins[r] += dmin * xb.d * static_cast<float>(k_min_sum(mn, xb.bsums));
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = hsum(acc[r]) - mins[r];
  }
};

struct KernelQ6K {
  template <size_t R>
  static void run(const void* wv, const void* x, size_t xs, size_t blocks, float* out, size_t os) {
    const auto* w = static_cast<const BlockQ6K*>(wv);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    const float* f16 = f16_to_f32_table();
    __m256 acc[R];
    float offsets[R];  // Σ d · 32 · Σ_s scale_s · (code sum of s)
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      const int8_t* sc = w[b].scales;
      __m256i sumi[R];
      for (size_t r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
      for (size_t h = 0; h < 2; ++h) {
        const __m256i ql0 = load32(w[b].ql + 64 * h), ql1 = load32(w[b].ql + 64 * h + 32);
        const __m256i qh = load32(w[b].qh + 32 * h);
        for (size_t k = 0; k < 4; ++k) {  // elements 128h + 32k + l, sub-blocks 8h + 2k and 8h + 2k + 1
          const __m256i ql = k & 1 ? ql1 : ql0;
          const __m256i lo = k >> 1 ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
          const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, static_cast<int>(2 * k)), m3), 4);
          const __m256i u = _mm256_or_si256(lo, hi);
          const size_t s = 8 * h + 2 * k;
          const __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(sc[s]), _mm_set1_epi16(sc[s + 1]));
          for (size_t r = 0; r < R; ++r)
            sumi[r] = acc_u8s8_scaled(sumi[r], u, load32(xblock<BlockQ8K>(x, xs, r, b).qs + 128 * h + 32 * k), scale);
        }
      }
      const float dw = f16[w[b].d];
      for (size_t r = 0; r < R; ++r) {
        const BlockQ8K& xb = xblock<BlockQ8K>(x, xs, r, b);
        int32_t off = 0;
        for (size_t s = 0; s < 16; ++s) off += sc[s] * xb.bsums[s];
        const float d = dw * xb.d;
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_set1_ps(d), acc[r]);
        offsets[r] += d * static_cast<float>(32 * off);
      }
    }
    for (size_t r = 0; r < R; ++r) out[r * os] = hsum(acc[r]) - offsets[r];
  }
};

template <class K>
float simd_dot(const void* w, const void* x, size_t blocks) {
  float out;
  K::template run<1>(w, x, 0, blocks, &out, 1);
  return out;
}

template <class K>
void simd_dot_rows(const void* w, const void* x, size_t xs, size_t rows, size_t blocks, float* out, size_t os) {
  for (; rows >= 8; rows -= 8, x = static_cast<const unsigned char*>(x) + 8 * xs, out += 8 * os)
    K::template run<8>(w, x, xs, blocks, out, os);
  switch (rows) {
    case 1: K::template run<1>(w, x, xs, blocks, out, os); break;
    case 2: K::template run<2>(w, x, xs, blocks, out, os); break;
    case 3: K::template run<3>(w, x, xs, blocks, out, os); break;
    case 4: K::template run<4>(w, x, xs, blocks, out, os); break;
    case 5: K::template run<5>(w, x, xs, blocks, out, os); break;
    case 6: K::template run<6>(w, x, xs, blocks, out, os); break;
    case 7: K::template run<7>(w, x, xs, blocks, out, os); break;
    default: break;
  }
}

constexpr QuantDotTable kSimdQuantDots{
    simd_dot<KernelQ4_0>,        simd_dot<KernelQ4_1>,       simd_dot<KernelQ8_0>,
    simd_dot<KernelQ45K<false>>, simd_dot<KernelQ45K<true>>, simd_dot<KernelQ6K>,
    simd_dot<KernelQ5<false>>,   simd_dot<KernelQ5<true>>,   simd_dot_rows<KernelQ4_0>,
    simd_dot_rows<KernelQ4_1>,   simd_dot_rows<KernelQ8_0>,  simd_dot_rows<KernelQ45K<false>>,
    simd_dot_rows<KernelQ45K<true>>, simd_dot_rows<KernelQ6K>, simd_dot_rows<KernelQ5<false>>,
    simd_dot_rows<KernelQ5<true>>};

}  // namespace
}  // namespace hack::cpu::detail
