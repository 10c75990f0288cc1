// Internal: the GEMV loop, written once over a vector-traits class V so the AVX2 and
// AVX-512 files (compiled with different -m flags) share it. V provides:
//   using reg; static constexpr size_t width;
//   zero(), load_f32(const float*), load_w<DType>(const void*, size_t idx), fma(a, b, c), hsum(reg)
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/dtype.h"

namespace hack::cpu::detail {

// One weight element as float (the tail of a row shorter than a vector).
template <DType WT>
inline float weight_scalar(const void* w, size_t idx) {
  if constexpr (WT == DType::f32) return static_cast<const float*>(w)[idx];
  else if constexpr (WT == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(w)[idx]);
  else return f16_to_f32(static_cast<const uint16_t*>(w)[idx]);
}

// R weight rows × T activation rows per block: R·T accumulators stay in registers and
// each weight element is loaded once for all T activation rows.
template <class V, DType WT, int T, int R>
inline void gemv_block(const void* w, size_t in, const float* x, float* y, size_t y_stride, size_t o) {
  typename V::reg acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = V::zero();
  size_t i = 0;
  for (; i + V::width <= in; i += V::width) {
    typename V::reg wv[R];
    for (int r = 0; r < R; ++r) wv[r] = V::template load_w<WT>(w, (o + static_cast<size_t>(r)) * in + i);
    for (int t = 0; t < T; ++t) {
      const typename V::reg xv = V::load_f32(x + static_cast<size_t>(t) * in + i);
      for (int r = 0; r < R; ++r) acc[r][t] = V::fma(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = V::hsum(acc[r][t]);
      for (size_t j = i; j < in; ++j)
        s += weight_scalar<WT>(w, (o + static_cast<size_t>(r)) * in + j) * x[static_cast<size_t>(t) * in + j];
      y[static_cast<size_t>(t) * y_stride + o + static_cast<size_t>(r)] = s;
    }
  }
}

// One weight row at a time: the weights stream through memory in order. Interleaving
// R > 1 rows (R streams 2·in bytes apart) starved the hardware prefetcher: on the dev VM's
// EPYC a 576-wide bf16 GEMV read 4.6–5.5 GB/s with R = 4 and 15–17 GB/s with R = 1, one
// thread (bench/RESULTS.md, issue 16). Each weight vector is still loaded once for all T rows.
template <class V, DType WT, int T>
inline void gemv_rows_t(const void* w, size_t in, const float* x, float* y, size_t y_stride, size_t o_begin,
                        size_t o_end) {
  for (size_t o = o_begin; o < o_end; ++o) gemv_block<V, WT, T, 1>(w, in, x, y, y_stride, o);
}

template <class V, DType WT>
inline void gemv_dispatch_rows(const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                               size_t o_begin, size_t o_end) {
  switch (rows) {
    case 1: gemv_rows_t<V, WT, 1>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 2: gemv_rows_t<V, WT, 2>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 3: gemv_rows_t<V, WT, 3>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 4: gemv_rows_t<V, WT, 4>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 5: gemv_rows_t<V, WT, 5>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 6: gemv_rows_t<V, WT, 6>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 7: gemv_rows_t<V, WT, 7>(w, in, x, y, y_stride, o_begin, o_end); break;
    case 8: gemv_rows_t<V, WT, 8>(w, in, x, y, y_stride, o_begin, o_end); break;
    default: break;
  }
}

template <class V>
inline void gemv_dispatch(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y,
                          size_t y_stride, size_t o_begin, size_t o_end) {
  switch (wtype) {
    case DType::f32: gemv_dispatch_rows<V, DType::f32>(w, in, x, rows, y, y_stride, o_begin, o_end); break;
    case DType::bf16: gemv_dispatch_rows<V, DType::bf16>(w, in, x, rows, y, y_stride, o_begin, o_end); break;
    case DType::f16: gemv_dispatch_rows<V, DType::f16>(w, in, x, rows, y, y_stride, o_begin, o_end); break;
    default: break;
  }
}

}  // namespace hack::cpu::detail
