// Reference GEMV: plain loops, double accumulation. Everything else is checked against it.
#include "kernels/cpu/gemv_kernels.h"

namespace hack::cpu::detail {

namespace {
inline float load_weight(DType t, const void* w, size_t idx) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(w)[idx];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(w)[idx]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(w)[idx]);
    default: return 0.0f;
  }
}
}  // namespace

void gemv_scalar(DType wtype, const void* w, size_t in, const float* x, size_t rows, float* y, size_t y_stride,
                 size_t o_begin, size_t o_end) {
  for (size_t o = o_begin; o < o_end; ++o) {
    for (size_t t = 0; t < rows; ++t) {
      double s = 0;
      for (size_t i = 0; i < in; ++i) s += static_cast<double>(load_weight(wtype, w, o * in + i)) * x[t * in + i];
      y[t * y_stride + o] = static_cast<float>(s);
    }
  }
}

}  // namespace hack::cpu::detail
