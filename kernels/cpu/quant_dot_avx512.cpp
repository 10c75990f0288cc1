// Dots on block weights with AVX-512 VNNI (VPDPBUSD, VPDPWSSD on 256-bit registers):
// kernels/cpu/quant_dot_simd.h, the same code as quant_dot_avx2.cpp with the fused forms.
#include "kernels/cpu/quant_dot_simd.h"

#if !defined(__AVX512VNNI__) || !defined(__AVX512VL__)
#error "quant_dot_avx512.cpp needs the AVX-512 VNNI flags (src/CMakeLists.txt: *_avx512.cpp)"
#endif

namespace hack::cpu::detail {

const QuantDotTable& quant_dots_avx512() { return kSimdQuantDots; }

}  // namespace hack::cpu::detail
