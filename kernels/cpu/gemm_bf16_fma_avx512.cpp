// MatmulPrecision::bf16's GEMM on AVX-512F (no AVX-512 BF16; called for CpuIsa::avx512):
// C[m][n] = Σ_k A[m][k] · B[n][k] with A rounded to bf16 (f32_round_bf16_pairs) and B bf16,
// fp32 accumulation — gemm_bf16_avx512bf16's arithmetic with each VDPBF16PS replaced by two
// FMAs in its order (the odd k of a pair, then the even one; see gemm_kernels.h).
//
// B is packed panel by panel, 32 rows at a time, already widened to fp32:
// [K/2][odd, even][32] floats, so the inner loop is four loads and 4·MR FMAs per k pair with
// no widening; an MR × 32 tile of C stays in 2·MR registers across the whole K loop, A's
// values are broadcast from memory.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_kernels.h"

namespace hack::cpu::detail {

namespace {

constexpr size_t kPanel = kGemmBf16PanelCols;
constexpr int kMaxMr = 12;  // rows of A per micro-tile: 24 accumulators + 4 panel vectors + broadcasts

// pack[(2kp) * 32 + j] = B[n0 + j][2kp + 1], pack[(2kp + 1) * 32 + j] = B[n0 + j][2kp], as fp32;
// rows past n_rows and an odd K's missing last element are zero.
void pack_panel_f32(const uint16_t* b, size_t ldb, size_t k, size_t n0, size_t n_rows, float* pack) {
  const size_t pairs = (k + 1) / 2;
  for (size_t j = 0; j < kPanel; ++j) {
    const uint16_t* row = j < n_rows ? b + (n0 + j) * ldb : nullptr;
    for (size_t kp = 0; kp < pairs; ++kp) {
      const size_t even = 2 * kp, odd = 2 * kp + 1;
      pack[(2 * kp) * kPanel + j] = row && odd < k ? bf16_to_f32(row[odd]) : 0.0f;
      pack[(2 * kp + 1) * kPanel + j] = row ? bf16_to_f32(row[even]) : 0.0f;
    }
  }
}

template <int MR>
void micro_tile(const float* a, size_t lda, size_t pairs, const float* pack, float* c, size_t ldc, __mmask16 mask0,
                __mmask16 mask1) {
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (size_t kp = 0; kp < pairs; ++kp) {
    const float* p = pack + 2 * kp * kPanel;
    const __m512 odd0 = _mm512_loadu_ps(p), odd1 = _mm512_loadu_ps(p + 16);
    const __m512 even0 = _mm512_loadu_ps(p + 32), even1 = _mm512_loadu_ps(p + 48);
    for (int m = 0; m < MR; ++m) {
      const float* am = a + static_cast<size_t>(m) * lda + 2 * kp;
      const __m512 xo = _mm512_set1_ps(am[1]);
      acc[m][0] = _mm512_fmadd_ps(odd0, xo, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(odd1, xo, acc[m][1]);
      const __m512 xe = _mm512_set1_ps(am[0]);
      acc[m][0] = _mm512_fmadd_ps(even0, xe, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(even1, xe, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(c + static_cast<size_t>(m) * ldc, mask0, acc[m][0]);
    _mm512_mask_storeu_ps(c + static_cast<size_t>(m) * ldc + 16, mask1, acc[m][1]);
  }
}

template <int MR>
void tile_rows(const float* a, size_t lda, size_t pairs, const float* pack, float* c, size_t ldc, __mmask16 mask0,
               __mmask16 mask1, int rows) {
  if constexpr (MR > 1) {
    if (rows < MR) return tile_rows<MR - 1>(a, lda, pairs, pack, c, ldc, mask0, mask1, rows);
  }
  micro_tile<MR>(a, lda, pairs, pack, c, ldc, mask0, mask1);
}

}  // namespace

size_t gemm_bf16_fma_pack_floats(size_t k) { return (k + 1) / 2 * 2 * kPanel; }

void gemm_bf16_fma_avx512(const float* a, size_t m, size_t k, const uint16_t* b, size_t n0, size_t n1, float* c,
                          size_t ldc, float* pack) {
  const size_t pairs = (k + 1) / 2, lda = 2 * pairs;
  for (size_t n = n0; n < n1; n += kPanel) {
    const size_t cols = std::min(kPanel, n1 - n);
    pack_panel_f32(b, k, k, n, cols, pack);
    const PanelMasks masks = panel_masks(cols);
    const auto mask0 = static_cast<__mmask16>(masks.lo), mask1 = static_cast<__mmask16>(masks.hi);
    for (size_t r = 0; r < m; r += kMaxMr) {
      const int rows = static_cast<int>(std::min<size_t>(kMaxMr, m - r));
      tile_rows<kMaxMr>(a + r * lda, lda, pairs, pack, c + r * ldc + n, ldc, mask0, mask1, rows);
    }
  }
}

}  // namespace hack::cpu::detail
