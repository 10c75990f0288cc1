// Internal: the per-ISA dot kernels on block weights (kernels/cpu/quant_dot_*.cpp).
#pragma once

#include "hack/kernels/cpu/quant_dot.h"

namespace hack::cpu::detail {

struct QuantDotTable {
  QuantDotFn q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, q5_0, q5_1;
  QuantDotRowsFn q4_0_rows, q4_1_rows, q8_0_rows, q4_k_rows, q5_k_rows, q6_k_rows, q5_0_rows, q5_1_rows;
};

/// Every f16 value as f32 (256 KiB, built on first use, shared by the ISAs' kernels): a block's
/// scale becomes one load, broadcast by the load itself, instead of VMOVD + VCVTPH2PS +
/// VBROADCASTSS on port 5 (the dots' bottleneck). The values are f16_to_f32's (exact).
const float* f16_to_f32_table();

const QuantDotTable& quant_dots_scalar();
const QuantDotTable& quant_dots_avx2();
const QuantDotTable& quant_dots_avx512();  // AVX-512 VNNI (VPDPBUSD on 256-bit registers)

}  // namespace hack::cpu::detail
