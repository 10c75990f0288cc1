// AVX2 + FMA + F16C GEMV (the build's baseline ISA).
#include <immintrin.h>

#include "kernels/cpu/gemv_impl.h"
#include "kernels/cpu/gemv_kernels.h"

namespace hack::cpu::detail {

namespace {
struct Avx2 {
  using reg = __m256;
  static constexpr size_t width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(reg v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }
  template <DType WT>
  static reg load_w(const void* w, size_t idx) {
    if constexpr (WT == DType::f32) {
      return _mm256_loadu_ps(static_cast<const float*>(w) + idx);
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + idx));
      if constexpr (WT == DType::bf16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      } else {
        return _mm256_cvtph_ps(h);
      }
    }
  }
};
}  // namespace

void gemv_avx2(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
               size_t o_begin, size_t o_end) {
  gemv_dispatch<Avx2>(wtype, w, in, x, rows, y, y_stride, o_begin, o_end);
}

}  // namespace hack::cpu::detail
