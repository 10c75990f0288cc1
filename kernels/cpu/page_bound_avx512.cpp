// Page scores, AVX-512: the 16 lanes are one zmm; bit-identical to page_bound_scalar (the
// same fold and fma; see page_bound.h).
#include <immintrin.h>

#include <algorithm>

#include "hack/kernels/cpu/page_bound.h"

namespace hack::cpu::detail {

namespace {

__m512 load_bf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

float fold16(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

}  // namespace

void page_bound_avx512(const PageBoundArgs& a, float* out) {
  const int boxes = (a.n_pages + a.span - 1) / a.span;
  const __m512 levels = _mm512_set1_ps(a.levels), alpha = _mm512_set1_ps(a.alpha), beta = _mm512_set1_ps(1.0f - a.alpha);
  for (int b = 0; b < boxes; ++b) {
    const int p0 = b * a.span, p1 = std::min(a.n_pages, p0 + a.span);
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < a.k_dim; c += 16) {
      __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
      for (int p = p0; p < p1; ++p) {
        const __m512 mn = load_bf16(reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_min_offset) + c);
        const __m512 mx = _mm512_fmadd_ps(load_bf16(reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_scale_offset) + c),
                                          levels, mn);
        lo = p == p0 ? mn : _mm512_min_ps(lo, mn);
        hi = p == p0 ? mx : _mm512_max_ps(hi, mx);
      }
      if (a.linear) {
        const __m512 m = _mm512_fmadd_ps(alpha, hi, _mm512_mul_ps(beta, lo));
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a.qsum + c), m, acc);
      } else {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a.qpos + c), hi, _mm512_fmadd_ps(_mm512_loadu_ps(a.qneg + c), lo, acc));
      }
    }
    out[b] = fold16(acc);
  }
}

}  // namespace hack::cpu::detail
