// Internal: the per-ISA dot kernels on block weights (kernels/cpu/quant_dot_*.cpp).
#pragma once

#include "hack/kernels/cpu/quant_dot.h"

namespace hack::cpu::detail {

struct QuantDotTable {
  QuantDotFn q4_0, q4_1, q8_0, q4_k, q5_k, q6_k;
};

const QuantDotTable& quant_dots_scalar();
const QuantDotTable& quant_dots_avx2();
const QuantDotTable& quant_dots_avx512();  // AVX-512 VNNI (VPDPBUSD on 256-bit registers)

}  // namespace hack::cpu::detail
