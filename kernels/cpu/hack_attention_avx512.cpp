// AVX-512 VNNI HACK attention (compiled with -mavx512f/bw/vl/dq/vnni, no BF16 instructions;
// called for CpuIsa::avx512 and avx512bf16). INT8 dots with VPDPBUSD: u8 Q/P codes broadcast 4 at a time
// against 16 lanes of K/V codes, one lane per token (K) or output channel (V).
#include <immintrin.h>

#include "kernels/cpu/hack_attention_simd.h"

namespace hack::cpu::detail {

namespace {

struct Avx512 {
  using F = __m512;
  using A = __m512i;
  static constexpr bool kCodeOffset8 = true;

  static F fzero() { return _mm512_setzero_ps(); }
  static F fset1(float x) { return _mm512_set1_ps(x); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static F fload_n(const float* p, int n) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p); }
  static void fstore(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static F fload_bf16(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F fload_bf16_n(const uint16_t* p, int n) {
    return widen_bf16(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmin(F a, F b) { return _mm512_min_ps(a, b); }
  static F fmax(F a, F b) { return _mm512_max_ps(a, b); }
  static float fold16(F a) {
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F exp2i(F n) {
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(e);
  }
  static F load_sums(const uint8_t* p, int bytes) {
    const __m512i v = bytes == 1 ? _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
                                 : _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_cvtepi32_ps(v);
  }
  static A codes_i(F x) {
    const __m512i c = _mm512_cvtps_epi32(x);  // round to nearest even
    return _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()), _mm512_set1_epi32(255));
  }
  static A codes_raw(F x) { return _mm512_cvtps_epi32(x); }
  static __m128i codes_bytes(A c) { return _mm512_cvtepi32_epi8(c); }
  static void store_codes4(A a, A b, A c, A d, uint8_t* dst) {
    // Per 128-bit lane L: packs gives [a b] then [c d] words of channels 4L..4L+3; packus
    // gives bytes [a b c d] of them, i.e. quad L of the four rows.
    const __m512i ab = _mm512_packs_epi32(a, b), cd = _mm512_packs_epi32(c, d);
    _mm512_storeu_si512(dst, _mm512_packus_epi16(ab, cd));
  }
  template <Reduce Op>
  static __m512 op_of(__m512 a, __m512 b) {
    if constexpr (Op == Reduce::add) return _mm512_add_ps(a, b);
    else if constexpr (Op == Reduce::min) return _mm512_min_ps(a, b);
    else return _mm512_max_ps(a, b);
  }
  template <Reduce Op>
  static void reduce4(F a, F b, F c, F d, float* out) {
    const auto op = [](auto x, auto y) { return op_of<Op>(x, y); };
    const F ab = op(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));  // j ⊕ j+8
    const F cd = op(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    F x = op(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));     // j ⊕ j+4
    x = op(x, _mm512_permute_ps(x, 0x4E));                                                 // j ⊕ j+2
    x = op(x, _mm512_permute_ps(x, 0xB1));                                                 // j ⊕ j+1
    alignas(64) float t[16];
    _mm512_store_ps(t, x);
    out[0] = t[0];
    out[1] = t[4];
    out[2] = t[8];
    out[3] = t[12];
  }
  static A azero() { return _mm512_setzero_si512(); }
  static F to_float(A a) { return _mm512_cvtepi32_ps(a); }
  static A add_i(A a, int x) { return _mm512_add_epi32(a, _mm512_set1_epi32(x)); }
  static A add_a(A a, A b) { return _mm512_add_epi32(a, b); }
  static int hsum_i(A a) { return _mm512_reduce_add_epi32(a); }

  template <int Bits, int R>
  static void dot_chunk(A* acc, const uint8_t* chunk, const uint8_t* a, int quad) {
    const __m512i x = _mm512_loadu_si512(chunk);
    constexpr int kSubs = 8 / Bits;
    const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << Bits) - 1));
    for (int j = 0; j < kSubs; ++j) {
      __m512i codes;
      if constexpr (Bits == 8) codes = _mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80)));
      else codes = _mm512_and_si512(j == 0 ? x : _mm512_srli_epi16(x, Bits * j), mask);
      const uint8_t* aj = a + 4 * R * (quad + j);
      for (int r = 0; r < R; ++r) {
        int32_t a4;
        std::memcpy(&a4, aj + 4 * r, 4);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(a4), codes);
      }
    }
  }
};

}  // namespace

void hack_block_avx512(const HackHeadView& b, const AttentionRows& rows, float* work) {
  HackSimd<Avx512>::hack_block(b, rows, work);
}

void exact_block_avx512(const ExactHeadView& b, const AttentionRows& rows, float* work) {
  HackSimd<Avx512>::exact_block(b, rows, work);
}

}  // namespace hack::cpu::detail
