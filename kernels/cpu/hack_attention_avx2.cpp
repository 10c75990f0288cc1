// AVX2 HACK attention (x86-64-v3). 16 lanes are two ymm halves (lanes 0–7, 8–15). INT8
// dots with VPMADDUBSW (u8 × s8 pairs → s16, no saturation: 2-bit and 4-bit codes ≤ 15
// keep pairs ≤ 2·255·15) and VPMADDWD into int32; 8-bit codes are split into nibbles.
#include <immintrin.h>

#include "kernels/cpu/hack_attention_simd.h"

namespace hack::cpu::detail {

namespace {

struct Avx2 {
  struct F {
    __m256 lo, hi;
  };
  struct A {
    __m256i lo, hi;
  };
  static constexpr bool kCodeOffset8 = false;

  template <class Op>
  static F map(F a, F b, Op op) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }

  static F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F fset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static F fload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F fload_n(const float* p, int n) {
    alignas(32) float tmp[16] = {};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return fload(tmp);
  }
  static void fstore(float* p, F x) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
  }
  static __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static F fload_bf16(const uint16_t* p) {
    return {widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static F fload_bf16_n(const uint16_t* p, int n) {
    alignas(32) uint16_t tmp[16] = {};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return fload_bf16(tmp);
  }
  static F add(F a, F b) { return map(a, b, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); }); }
  static F sub(F a, F b) { return map(a, b, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); }); }
  static F mul(F a, F b) { return map(a, b, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }); }
  static F fmin(F a, F b) { return map(a, b, [](__m256 x, __m256 y) { return _mm256_min_ps(x, y); }); }
  static F fmax(F a, F b) { return map(a, b, [](__m256 x, __m256 y) { return _mm256_max_ps(x, y); }); }
  static F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static float fold16(F a) {
    const __m256 h8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  }
  static F round(F a) {
    constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(a.lo, kMode), _mm256_round_ps(a.hi, kMode)};
  }
  static __m256 exp2i_half(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static F exp2i(F n) { return {exp2i_half(n.lo), exp2i_half(n.hi)}; }
  static F load_sums(const uint8_t* p, int bytes) {
    if (bytes == 1) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))};
    }
    return {_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))),
            _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + 1)))};
  }
  static A codes_i(F x) {
    const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
    return {_mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(x.lo), zero), top),  // nearest even
            _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(x.hi), zero), top)};
  }
  static A codes_raw(F x) { return {_mm256_cvtps_epi32(x.lo), _mm256_cvtps_epi32(x.hi)}; }
  static void store_codes4(A a, A b, A c, A d, uint8_t* dst) {
    // Per 128-bit lane: packs → [a b] / [c d] words of 4 channels, packus → bytes [a b c d]:
    // one quad of the four rows; lanes 0–1 of lo are quads 0–1, of hi quads 2–3.
    const __m256i lo = _mm256_packus_epi16(_mm256_packs_epi32(a.lo, b.lo), _mm256_packs_epi32(c.lo, d.lo));
    const __m256i hi = _mm256_packus_epi16(_mm256_packs_epi32(a.hi, b.hi), _mm256_packs_epi32(c.hi, d.hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), hi);
  }
  static __m128i codes_bytes(A c) {
    const __m256i w = _mm256_packs_epi32(c.lo, c.hi);  // [lo0-3 hi0-3 | lo4-7 hi4-7] int16
    const __m256i b = _mm256_packus_epi16(w, w);
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
  }
  template <Reduce Op>
  static __m256 op_of(__m256 a, __m256 b) {
    if constexpr (Op == Reduce::add) return _mm256_add_ps(a, b);
    else if constexpr (Op == Reduce::min) return _mm256_min_ps(a, b);
    else return _mm256_max_ps(a, b);
  }
  template <Reduce Op>
  static void reduce4(F a, F b, F c, F d, float* out) {
    const auto op = [](auto x, auto y) { return op_of<Op>(x, y); };
    const __m256 a8 = op(a.lo, a.hi), b8 = op(b.lo, b.hi), c8 = op(c.lo, c.hi), d8 = op(d.lo, d.hi);  // j ⊕ j+8
    __m256 x = op(_mm256_permute2f128_ps(a8, b8, 0x20), _mm256_permute2f128_ps(a8, b8, 0x31));      // j ⊕ j+4
    __m256 y = op(_mm256_permute2f128_ps(c8, d8, 0x20), _mm256_permute2f128_ps(c8, d8, 0x31));
    x = op(x, _mm256_permute_ps(x, 0x4E));  // j ⊕ j+2
    y = op(y, _mm256_permute_ps(y, 0x4E));
    x = op(x, _mm256_permute_ps(x, 0xB1));  // j ⊕ j+1
    y = op(y, _mm256_permute_ps(y, 0xB1));
    alignas(32) float t[16];
    _mm256_store_ps(t, x);
    _mm256_store_ps(t + 8, y);
    out[0] = t[0];
    out[1] = t[4];
    out[2] = t[8];
    out[3] = t[12];
  }
  static A azero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static F to_float(A a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
  static A add_a(A a, A b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
  static int hsum_i(A a) {
    alignas(32) int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi32(a.lo, a.hi));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
  }
  static A add_i(A a, int x) {
    const __m256i v = _mm256_set1_epi32(x);
    return {_mm256_add_epi32(a.lo, v), _mm256_add_epi32(a.hi, v)};
  }

  template <int Bits, int R>
  static void dot_chunk(A* acc, const uint8_t* chunk, const uint8_t* a, int quad) {
    constexpr int kSubs = 8 / Bits;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; ++half) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * half));
      __m256i sum16[R];
      for (int r = 0; r < R; ++r) sum16[r] = _mm256_setzero_si256();
      if constexpr (Bits == 8) {
        const __m256i nib = _mm256_set1_epi8(0x0f);
        const __m256i lo = _mm256_and_si256(x, nib), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
        for (int r = 0; r < R; ++r) {
          int32_t a4;
          std::memcpy(&a4, a + 4 * (R * quad + r), 4);
          const __m256i ab = _mm256_set1_epi32(a4);
          const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(ab, lo), ones);
          const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(ab, hi), _mm256_set1_epi16(16));
          __m256i& dst = half == 0 ? acc[r].lo : acc[r].hi;
          dst = _mm256_add_epi32(dst, _mm256_add_epi32(plo, phi));
        }
        continue;
      } else {
        const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << Bits) - 1));
        // ≤ 4 sub-tiles of pairs ≤ 2·255·15 each stay below 2^15 in s16.
        for (int j = 0; j < kSubs; ++j) {
          const __m256i codes = _mm256_and_si256(j == 0 ? x : _mm256_srli_epi16(x, Bits * j), mask);
          for (int r = 0; r < R; ++r) {
            int32_t a4;
            std::memcpy(&a4, a + 4 * (R * (quad + j) + r), 4);
            sum16[r] = _mm256_add_epi16(sum16[r], _mm256_maddubs_epi16(_mm256_set1_epi32(a4), codes));
          }
        }
        for (int r = 0; r < R; ++r) {
          __m256i& dst = half == 0 ? acc[r].lo : acc[r].hi;
          dst = _mm256_add_epi32(dst, _mm256_madd_epi16(sum16[r], ones));
        }
      }
    }
  }
};

}  // namespace

void hack_block_avx2(const HackHeadView& b, const AttentionRows& rows, float* work) {
  HackSimd<Avx2>::hack_block(b, rows, work);
}

void exact_block_avx2(const ExactHeadView& b, const AttentionRows& rows, float* work) {
  HackSimd<Avx2>::exact_block(b, rows, work);
}

}  // namespace hack::cpu::detail
