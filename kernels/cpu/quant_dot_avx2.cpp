// Dots on block weights with AVX2 (VPMADDUBSW + VPMADDWD): kernels/cpu/quant_dot_simd.h.
#include "kernels/cpu/quant_dot_simd.h"

namespace hack::cpu::detail {

const QuantDotTable& quant_dots_avx2() { return kSimdQuantDots; }

}  // namespace hack::cpu::detail
