// Activation quantization for the dots on block weights (one implementation for every ISA)
// and the per-ISA choice of dot kernel.
#include "hack/kernels/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hack/core/error.h"
#include "kernels/cpu/quant_dot_kernels.h"

namespace hack::cpu {

namespace {

// amax / 127 and its inverse; an all-zero block has d = 0 and codes 0.
struct Scale {
  float d, inv;
};
Scale scale_of(const float* x, size_t n) {
  float amax = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::abs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  if (!finite) return Scale{std::numeric_limits<float>::quiet_NaN(), 0.0f};
  return amax > 0.0f ? Scale{amax / 127.0f, 127.0f / amax} : Scale{0.0f, 0.0f};
}

int8_t code(float v, float inv) {
  // |v·inv| ≤ 127·(1 + 2^-23), which rounds to at most 127. A non-finite block (amax inf or
  // NaN: a diverged activation) gets codes 0 and keeps its non-finite d, so the dot is not
  // finite either and nothing converts a NaN to an integer.
  const float q = std::nearbyint(v * inv);
  return q > -128.0f && q < 128.0f ? static_cast<int8_t>(q) : int8_t{0};
}

}  // namespace

void quantize_q8x32(const float* x, size_t n, BlockQ8x32* out) {
  HACK_CHECK(n % 32 == 0, "quantize_q8x32: {} values are not whole blocks of 32", n);
  for (size_t b = 0; b < n / 32; ++b, x += 32) {
    const Scale s = scale_of(x, 32);
    out[b].d = s.d;
    int32_t sum = 0;
    for (size_t j = 0; j < 32; ++j) {
      out[b].qs[j] = code(x[j], s.inv);
      sum += out[b].qs[j];
    }
    out[b].s = s.d * static_cast<float>(sum);
  }
}

void quantize_q8k(const float* x, size_t n, BlockQ8K* out) {
  HACK_CHECK(n % 256 == 0, "quantize_q8k: {} values are not whole blocks of 256", n);
  for (size_t b = 0; b < n / 256; ++b, x += 256) {
    const Scale s = scale_of(x, 256);
    out[b].d = s.d;
    for (size_t k = 0; k < 16; ++k) {
      int sum = 0;
      for (size_t j = 16 * k; j < 16 * k + 16; ++j) {
        out[b].qs[j] = code(x[j], s.inv);
        sum += out[b].qs[j];
      }
      out[b].bsums[k] = static_cast<int16_t>(sum);
    }
  }
}

void quantize_activations(DType w, const float* x, size_t n, void* out) {
  HACK_CHECK(dtype_is_quantized(w), "quantize_activations: {} is not a block type", dtype_name(w));
  if (uses_q8k(w)) {
    quantize_q8k(x, n, static_cast<BlockQ8K*>(out));
  } else {
    quantize_q8x32(x, n, static_cast<BlockQ8x32*>(out));
  }
}

const float* detail::f16_to_f32_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f16_to_f32(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

namespace {
const detail::QuantDotTable& table_of(CpuIsa isa) {
  return isa == CpuIsa::scalar ? detail::quant_dots_scalar()
         : isa == CpuIsa::avx2 ? detail::quant_dots_avx2()
                               : detail::quant_dots_avx512();
}
}  // namespace

QuantDotRowsFn quant_dot_rows(CpuIsa isa, DType w) {
  const detail::QuantDotTable& t = table_of(isa);
  switch (w) {
    case DType::q4_0: return t.q4_0_rows;
    case DType::q4_1: return t.q4_1_rows;
    case DType::q8_0: return t.q8_0_rows;
    case DType::q4_k: return t.q4_k_rows;
    case DType::q5_k: return t.q5_k_rows;
    case DType::q6_k: return t.q6_k_rows;
    case DType::q5_0: return t.q5_0_rows;
    case DType::q5_1: return t.q5_1_rows;
    default: fail("no quantized dot for {} weights", dtype_name(w));
  }
}

QuantDotFn quant_dot(CpuIsa isa, DType w) {
  const detail::QuantDotTable& t = table_of(isa);
  switch (w) {
    case DType::q4_0: return t.q4_0;
    case DType::q4_1: return t.q4_1;
    case DType::q8_0: return t.q8_0;
    case DType::q4_k: return t.q4_k;
    case DType::q5_k: return t.q5_k;
    case DType::q6_k: return t.q6_k;
    case DType::q5_0: return t.q5_0;
    case DType::q5_1: return t.q5_1;
    default: fail("no quantized dot for {} weights", dtype_name(w));
  }
}

}  // namespace hack::cpu
