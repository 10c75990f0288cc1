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

}  // namespace hack::cpu::detail
