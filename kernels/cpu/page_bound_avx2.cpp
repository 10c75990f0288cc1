// Page scores, AVX2: 16 lanes as two ymm (channels c..c+7, c+8..c+15), bit-identical to
// page_bound_scalar (the same fold and fma; see page_bound.h).
#include <immintrin.h>

#include <algorithm>

#include "hack/kernels/cpu/page_bound.h"

namespace hack::cpu::detail {

namespace {

__m256 load_bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Lanes j of lo and j + 8 of hi, folded 8+8, 4+4, 2+2, 1+1.
float fold16(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

}  // namespace

void page_bound_avx2(const PageBoundArgs& a, float* out) {
  const int boxes = (a.n_pages + a.span - 1) / a.span;
  const __m256 levels = _mm256_set1_ps(a.levels), alpha = _mm256_set1_ps(a.alpha), beta = _mm256_set1_ps(1.0f - a.alpha);
  for (int b = 0; b < boxes; ++b) {
    const int p0 = b * a.span, p1 = std::min(a.n_pages, p0 + a.span);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int c = 0; c < a.k_dim; c += 16) {
      __m256 lo[2], hi[2];
      for (int p = p0; p < p1; ++p) {
        const auto* mins = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_min_offset) + c;
        const auto* scales = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_scale_offset) + c;
        for (int h = 0; h < 2; ++h) {
          const __m256 mn = load_bf16(mins + 8 * h);
          const __m256 mx = _mm256_fmadd_ps(load_bf16(scales + 8 * h), levels, mn);
          lo[h] = p == p0 ? mn : _mm256_min_ps(lo[h], mn);
          hi[h] = p == p0 ? mx : _mm256_max_ps(hi[h], mx);
        }
      }
      for (int h = 0; h < 2; ++h) {
        if (a.linear) {
          const __m256 m = _mm256_fmadd_ps(alpha, hi[h], _mm256_mul_ps(beta, lo[h]));
          acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(a.qsum + c + 8 * h), m, acc[h]);
        } else {
          acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(a.qpos + c + 8 * h), hi[h],
                                   _mm256_fmadd_ps(_mm256_loadu_ps(a.qneg + c + 8 * h), lo[h], acc[h]));
        }
      }
    }
    out[b] = fold16(acc[0], acc[1]);
  }
}

}  // namespace hack::cpu::detail
