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

/// The same with each lane's odd product added before its even one, for x rounded to bf16
/// (permute_even_odd(..., round_bf16 = true)): VDPBF16PS's arithmetic on AVX-512F — the
/// GEMV of MatmulPrecision::bf16 on CpuIsa::avx512, bit for bit gemv_bf16_dot_avx512bf16's
/// (see gemm_kernels.h for the one exception, denormals).
void gemv_bf16_odd_even_avx512(const uint16_t* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                               size_t o_begin, size_t o_end);

/// out[r][b + j] = x[r][b + 2j] and out[r][b + 16 + j] = x[r][b + 2j + 1] for each block of
/// 32 columns b, j < 16 (in % 32 == 0); with round_bf16 each value is rounded to bf16
/// (f32_to_bf16) on the way.
inline void permute_even_odd(const float* x, size_t rows, size_t in, float* out, bool round_bf16 = false) {
  const auto value = [round_bf16](float v) { return round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < in; b += 32)
      for (size_t j = 0; j < 16; ++j) {
        out[r * in + b + j] = value(x[r * in + b + 2 * j]);
        out[r * in + b + 16 + j] = value(x[r * in + b + 2 * j + 1]);
      }
}

}  // namespace hack::cpu::detail
