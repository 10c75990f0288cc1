// Internal: the per-ISA dot kernels on block weights (kernels/cpu/quant_dot_*.cpp).
#pragma once

#include "hack/kernels/cpu/quant_dot.h"

namespace hack::cpu::detail {

struct QuantDotTable {
  QuantDotFn q4_0, q4_1, q8_0, q4_k, q5_k, q6_k;
  QuantDotRowsFn q4_0_rows, q4_1_rows, q8_0_rows, q4_k_rows, q5_k_rows, q6_k_rows;
};

const QuantDotTable& quant_dots_scalar();
const QuantDotTable& quant_dots_avx2();
const QuantDotTable& quant_dots_avx512();  // AVX-512 VNNI (VPDPBUSD on 256-bit registers)

}  // namespace hack::cpu::detail
