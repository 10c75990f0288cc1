// AVX-512 BF16 GEMM (the only file compiled with -mavx512bf16; called only for
// CpuIsa::avx512bf16): C[m][n] = Σ_k A[m][k] · B[n][k] with A and B in bf16 and fp32
// accumulation (VDPBF16PS). Its AVX-512F twin, same arithmetic by fp32 FMA, is
// gemm_bf16_fma_avx512.cpp.
//
// B (a weight matrix, [N][K] as the checkpoint stores it) is packed panel by panel: 32 rows
// at a time into [K/2][32] words of two bf16, so one 512-bit load holds one k pair of 16
// output columns. A row's k pair is broadcast against it; an MR × 32 tile of C stays in
// 2·MR registers across the whole K loop.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "hack/core/error.h"
#include "kernels/cpu/gemm_kernels.h"

namespace hack::cpu::detail {

namespace {

constexpr size_t kPanel = kGemmBf16PanelCols;
constexpr int kMaxMr = 12;     // rows of A per micro-tile: 24 accumulators + 2 panel vectors + 1 broadcast

// pack[kp * 32 + j] = (B[n0 + j][2kp], B[n0 + j][2kp + 1]); rows past n_rows and the odd
// K's last high half are zero.
void pack_panel(const uint16_t* b, size_t ldb, size_t k, size_t n0, size_t n_rows, uint32_t* pack) {
  const size_t pairs = (k + 1) / 2;
  for (size_t j = 0; j < kPanel; ++j) {
    if (j >= n_rows) {
      for (size_t kp = 0; kp < pairs; ++kp) pack[kp * kPanel + j] = 0;
      continue;
    }
    const uint16_t* row = b + (n0 + j) * ldb;
    for (size_t kp = 0; kp < k / 2; ++kp) {
      uint32_t word;
      std::memcpy(&word, row + 2 * kp, sizeof word);
      pack[kp * kPanel + j] = word;
    }
    if (k % 2) pack[(pairs - 1) * kPanel + j] = row[k - 1];
  }
}

template <int MR>
void micro_tile(const uint32_t* a, size_t lda_pairs, size_t pairs, const uint32_t* pack, float* c, size_t ldc,
                __mmask16 mask0, __mmask16 mask1) {
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (size_t kp = 0; kp < pairs; ++kp) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(pack + kp * kPanel);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(pack + kp * kPanel + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[static_cast<size_t>(m) * lda_pairs + kp]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, x);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, x);
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(c + static_cast<size_t>(m) * ldc, mask0, acc[m][0]);
    _mm512_mask_storeu_ps(c + static_cast<size_t>(m) * ldc + 16, mask1, acc[m][1]);
  }
}

template <int MR>
void tile_rows(const uint32_t* a, size_t lda_pairs, size_t pairs, const uint32_t* pack, float* c, size_t ldc,
               __mmask16 mask0, __mmask16 mask1, int rows) {
  if constexpr (MR > 1) {
    if (rows < MR) return tile_rows<MR - 1>(a, lda_pairs, pairs, pack, c, ldc, mask0, mask1, rows);
  }
  micro_tile<MR>(a, lda_pairs, pairs, pack, c, ldc, mask0, mask1);
}

// One weight row at a time (one sequential stream for the prefetcher), R activation rows
// against it: 32 bf16 weights per load, one VDPBF16PS per row.
template <int R>
void gemv_dot_rows(const uint16_t* w, size_t in, const uint16_t* x, float* y, size_t y_stride, size_t o_begin,
                   size_t o_end) {
  for (size_t o = o_begin; o < o_end; ++o) {
    const uint16_t* wo = w + o * in;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (size_t i = 0; i < in; i += 32) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(wo + i);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_dpbf16_ps(acc[r], wv, (__m512bh)_mm512_loadu_si512(x + static_cast<size_t>(r) * in + i));
    }
    for (int r = 0; r < R; ++r) y[static_cast<size_t>(r) * y_stride + o] = _mm512_reduce_add_ps(acc[r]);
  }
}

}  // namespace

void gemv_bf16_dot_avx512bf16(const uint16_t* w, size_t in, const uint16_t* x, size_t rows, float* y, size_t y_stride,
                          size_t o_begin, size_t o_end) {
  switch (rows) {
    case 1: return gemv_dot_rows<1>(w, in, x, y, y_stride, o_begin, o_end);
    case 2: return gemv_dot_rows<2>(w, in, x, y, y_stride, o_begin, o_end);
    case 3: return gemv_dot_rows<3>(w, in, x, y, y_stride, o_begin, o_end);
    case 4: return gemv_dot_rows<4>(w, in, x, y, y_stride, o_begin, o_end);
    case 5: return gemv_dot_rows<5>(w, in, x, y, y_stride, o_begin, o_end);
    case 6: return gemv_dot_rows<6>(w, in, x, y, y_stride, o_begin, o_end);
    case 7: return gemv_dot_rows<7>(w, in, x, y, y_stride, o_begin, o_end);
    case 8: return gemv_dot_rows<8>(w, in, x, y, y_stride, o_begin, o_end);
    default: fail("gemv_bf16_dot_avx512bf16: {} rows outside [1, 8]", rows);
  }
}

size_t gemm_bf16_pack_words(size_t k) { return (k + 1) / 2 * kPanel; }

void f32_to_bf16_pairs_avx512bf16(const float* x, size_t rows, size_t k, uint16_t* out) {
  const size_t ld = (k + 1) / 2 * 2;
  for (size_t r = 0; r < rows; ++r) {
    const float* src = x + r * k;
    uint16_t* dst = out + r * ld;
    size_t i = 0;
    for (; i + 32 <= k; i += 32) {
      // Round to nearest even, as f32_to_bf16 (NaN stays NaN).
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
      _mm512_storeu_si512(dst + i, (__m512i)h);
    }
    for (; i < k; ++i) dst[i] = f32_to_bf16(src[i]);
    if (ld > k) dst[k] = 0;
  }
}

void gemm_bf16_avx512bf16(const uint16_t* a, size_t m, size_t k, const uint16_t* b, size_t n0, size_t n1, float* c,
                      size_t ldc, uint32_t* pack) {
  const size_t pairs = (k + 1) / 2;
  const uint32_t* a_pairs = reinterpret_cast<const uint32_t*>(a);  // rows of `pairs` words (gemm_kernels.h)
  for (size_t n = n0; n < n1; n += kPanel) {
    const size_t cols = std::min(kPanel, n1 - n);
    pack_panel(b, k, k, n, cols, pack);
    const PanelMasks masks = panel_masks(cols);
    const auto mask0 = static_cast<__mmask16>(masks.lo), mask1 = static_cast<__mmask16>(masks.hi);
    for (size_t r = 0; r < m; r += kMaxMr) {
      const int rows = static_cast<int>(std::min<size_t>(kMaxMr, m - r));
      tile_rows<kMaxMr>(a_pairs + r * pairs, pairs, pairs, pack, c + r * ldc + n, ldc, mask0, mask1, rows);
    }
  }
}

}  // namespace hack::cpu::detail
