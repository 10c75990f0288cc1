// Internal: per-ISA GEMV entry points (kernels/cpu/gemv_*.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/dtype.h"

namespace hack::cpu::detail {

// y[t * y_stride + o] = Σ_i x[t * in + i] · w[o][i] for t < rows (rows <= 8), o in [o_begin, o_end).
void gemv_scalar(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                 size_t o_begin, size_t o_end);
void gemv_avx2(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
               size_t o_begin, size_t o_end);
void gemv_avx512(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                 size_t o_begin, size_t o_end);

/// The same for bf16 weights with in % 32 == 0 and x permuted by permute_even_odd: a
/// cheaper widening of the weights, for the rows where GEMV is compute-bound (4–8 rows:
/// 1.2–1.3× on the dev VM's EPYC; the same speed as gemv_avx512 for 1–2 rows).
void gemv_bf16_even_odd_avx512(const uint16_t* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                               size_t o_begin, size_t o_end);

/// out[r][b + j] = x[r][b + 2j] and out[r][b + 16 + j] = x[r][b + 2j + 1] for each block of
/// 32 columns b, j < 16 (in % 32 == 0).
inline void permute_even_odd(const float* x, size_t rows, size_t in, float* out) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < in; b += 32)
      for (size_t j = 0; j < 16; ++j) {
        out[r * in + b + j] = x[r * in + b + 2 * j];
        out[r * in + b + 16 + j] = x[r * in + b + 2 * j + 1];
      }
}

}  // namespace hack::cpu::detail
