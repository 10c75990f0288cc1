// Internal: the bf16 GEMM of the many-row matmul path (kernels/cpu/gemm_bf16_avx512.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/dtype.h"

namespace hack::cpu::detail {

/// x [rows][k] f32 -> out [rows][k rounded up to even] bf16 (round to nearest even; the pad is 0).
void f32_to_bf16_pairs_avx512(const float* x, size_t rows, size_t k, uint16_t* out);

/// c[i][n] = Σ_j a[i][j] · b[n][j] for i < m, n in [n0, n1); a from f32_to_bf16_pairs_avx512
/// (rows of k rounded up to even), b [N][k] bf16, c row stride ldc. `pack` is scratch of
/// gemm_bf16_pack_words(k) words, one per calling thread.
void gemm_bf16_avx512(const uint16_t* a, size_t m, size_t k, const uint16_t* b, size_t n0, size_t n1, float* c,
                      size_t ldc, uint32_t* pack);
size_t gemm_bf16_pack_words(size_t k);

/// The GEMV of MatmulPrecision::bf16 (decode steps of several sequences): y[r·y_stride + o] =
/// Σ_i x[r][i] · w[o][i] for r < rows (≤ 8), o in [o_begin, o_end); x from
/// f32_to_bf16_pairs_avx512 (rows of `in`), w [out][in] bf16, in % 32 == 0.
void gemv_bf16_dot_avx512(const uint16_t* w, size_t in, const uint16_t* x, size_t rows, float* y, size_t y_stride,
                          size_t o_begin, size_t o_end);
/// Columns per packed panel (two vectors of 16): split [n0, n1) between threads at multiples of this.
inline constexpr size_t kGemmBf16PanelCols = 32;

}  // namespace hack::cpu::detail
