// AVX-512 GEMV (compiled with -mavx512f/bw/vl/dq/vnni, no BF16 instructions; called for
// CpuIsa::avx512 and avx512bf16).
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

namespace {
// T activation rows against one bf16 weight row, 32 weights per step: the even weights are
// the low halves of the 32-bit lanes (<< 16), the odd ones the high halves (& 0xffff0000),
// so no widening shuffle is needed; x comes permuted to match (permute_even_odd). OddFirst
// adds each lane's odd product before its even one, as VDPBF16PS does.
template <int T, bool OddFirst>
void gemv_even_odd_rows(const uint16_t* w, size_t in, const float* x, float* y, size_t y_stride, size_t o_begin,
                        size_t o_end) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (size_t o = o_begin; o < o_end; ++o) {
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const uint16_t* row = w + o * in;
    for (size_t i = 0; i < in; i += 32) {
      const __m512i v = _mm512_loadu_si512(row + i);
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, high));
      for (int t = 0; t < T; ++t) {
        const __m512 xe = _mm512_loadu_ps(x + static_cast<size_t>(t) * in + i);
        const __m512 xo = _mm512_loadu_ps(x + static_cast<size_t>(t) * in + i + 16);
        if constexpr (OddFirst) {
          acc[t] = _mm512_fmadd_ps(odd, xo, acc[t]);
          acc[t] = _mm512_fmadd_ps(even, xe, acc[t]);
        } else {
          acc[t] = _mm512_fmadd_ps(even, xe, acc[t]);
          acc[t] = _mm512_fmadd_ps(odd, xo, acc[t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) y[static_cast<size_t>(t) * y_stride + o] = _mm512_reduce_add_ps(acc[t]);
  }
}
}  // namespace

namespace {
template <bool OddFirst>
void gemv_even_odd(const uint16_t* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                   size_t o_begin, size_t o_end) {
  switch (rows) {
    case 1: gemv_even_odd_rows<1, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 2: gemv_even_odd_rows<2, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 3: gemv_even_odd_rows<3, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 4: gemv_even_odd_rows<4, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 5: gemv_even_odd_rows<5, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 6: gemv_even_odd_rows<6, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 7: gemv_even_odd_rows<7, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 8: gemv_even_odd_rows<8, OddFirst>(w, in, x, y, y_stride, o_begin, o_end); break;
    default: break;
  }
}
}  // namespace

void gemv_bf16_even_odd_avx512(const uint16_t* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                               size_t o_begin, size_t o_end) {
  gemv_even_odd<false>(w, in, x, rows, y, y_stride, o_begin, o_end);
}

void gemv_bf16_odd_even_avx512(const uint16_t* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                               size_t o_begin, size_t o_end) {
  gemv_even_odd<true>(w, in, x, rows, y, y_stride, o_begin, o_end);
}

void gemv_avx512(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                 size_t o_begin, size_t o_end) {
  gemv_dispatch<Avx512>(wtype, w, in, x, rows, y, y_stride, o_begin, o_end);
}

}  // namespace hack::cpu::detail
