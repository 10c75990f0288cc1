// Internal: the bf16 GEMMs of the many-row matmul path (MatmulPrecision::bf16):
// kernels/cpu/gemm_bf16_avx512bf16.cpp (VDPBF16PS, CpuIsa::avx512bf16) and its AVX-512F twin
// kernels/cpu/gemm_bf16_fma_avx512.cpp (fp32 FMA, CpuIsa::avx512). Both compute, per output
// and per 32-bit lane, acc += x[2i+1]·w[2i+1] then acc += x[2i]·w[2i] over the k pairs, and
// fold the lanes alike; bf16 × bf16 products are exact in fp32, so the two give the same bits
// except where VDPBF16PS flushes a denormal (a bf16 weight below 2^-126, or a sum that small).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/dtype.h"

namespace hack::cpu::detail {

/// x [rows][k] f32 -> out [rows][k rounded up to even] bf16 (round to nearest even; the pad is 0).
void f32_to_bf16_pairs_avx512bf16(const float* x, size_t rows, size_t k, uint16_t* out);

/// c[i][n] = Σ_j a[i][j] · b[n][j] for i < m, n in [n0, n1); a from f32_to_bf16_pairs_avx512bf16
/// (rows of k rounded up to even), b [N][k] bf16, c row stride ldc. `pack` is scratch of
/// gemm_bf16_pack_words(k) words, one per calling thread.
void gemm_bf16_avx512bf16(const uint16_t* a, size_t m, size_t k, const uint16_t* b, size_t n0, size_t n1, float* c,
                          size_t ldc, uint32_t* pack);
size_t gemm_bf16_pack_words(size_t k);

/// The GEMV of MatmulPrecision::bf16 (decode steps of several sequences): y[r·y_stride + o] =
/// Σ_i x[r][i] · w[o][i] for r < rows (≤ 8), o in [o_begin, o_end); x from
/// f32_to_bf16_pairs_avx512bf16 (rows of `in`), w [out][in] bf16, in % 32 == 0.
void gemv_bf16_dot_avx512bf16(const uint16_t* w, size_t in, const uint16_t* x, size_t rows, float* y,
                              size_t y_stride, size_t o_begin, size_t o_end);
/// Columns per packed panel (two vectors of 16): split [n0, n1) between threads at multiples of this.
inline constexpr size_t kGemmBf16PanelCols = 32;

/// Lane masks of a panel with `cols` (<= kGemmBf16PanelCols) output columns: its first and
/// second 16 columns, as the AVX-512 kernels' __mmask16.
struct PanelMasks {
  uint16_t lo, hi;
};
inline constexpr PanelMasks panel_masks(size_t cols) {
  return {static_cast<uint16_t>(cols >= 16 ? 0xffff : (1u << cols) - 1),
          static_cast<uint16_t>(cols <= 16 ? 0 : cols >= 32 ? 0xffff : (1u << (cols - 16)) - 1)};
}

/// x [rows][k] f32 -> out [rows][k rounded up to even] f32 holding bf16 values (f32_to_bf16,
/// widened back; the pad is 0): the activations of gemm_bf16_fma_avx512.
inline void f32_round_bf16_pairs(const float* x, size_t rows, size_t k, float* out) {
  const size_t ld = (k + 1) / 2 * 2;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < k; ++i) out[r * ld + i] = bf16_to_f32(f32_to_bf16(x[r * k + i]));
    if (ld > k) out[r * ld + k] = 0.0f;
  }
}

/// gemm_bf16_avx512bf16 on AVX-512F: a from f32_round_bf16_pairs, the rest alike; `pack` is
/// scratch of gemm_bf16_fma_pack_floats(k) floats per calling thread (b's panel widened to fp32).
void gemm_bf16_fma_avx512(const float* a, size_t m, size_t k, const uint16_t* b, size_t n0, size_t n1, float* c,
                          size_t ldc, float* pack);
size_t gemm_bf16_fma_pack_floats(size_t k);

}  // namespace hack::cpu::detail
