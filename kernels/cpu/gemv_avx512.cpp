// AVX-512 GEMV (compiled with -mavx512f/bw/vl/...; called only when cpu_supports(avx512)).
#include <immintrin.h>

#include "kernels/cpu/gemv_impl.h"
#include "kernels/cpu/gemv_kernels.h"

namespace hack::cpu::detail {

namespace {
struct Avx512 {
  using reg = __m512;
  static constexpr size_t width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }
  template <DType WT>
  static reg load_w(const void* w, size_t idx) {
    if constexpr (WT == DType::f32) {
      return _mm512_loadu_ps(static_cast<const float*>(w) + idx);
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + idx));
      if constexpr (WT == DType::bf16) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      } else {
        return _mm512_cvtph_ps(h);
      }
    }
  }
};
}  // namespace

void gemv_avx512(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                 size_t o_begin, size_t o_end) {
  gemv_dispatch<Avx512>(wtype, w, in, x, rows, y, y_stride, o_begin, o_end);
}

}  // namespace hack::cpu::detail
