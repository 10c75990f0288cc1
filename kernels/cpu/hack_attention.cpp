// HACK attention: run-time kernel choice and the per-row state helpers.
#include "hack/kernels/cpu/hack_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hack/core/error.h"
#include "kernels/cpu/hack_attention_common.h"

namespace hack::cpu {

float hack_exp(float x) { return detail::exp_scalar(x); }

void attention_rows_reset(const AttentionRows& rows) {
  const size_t n = static_cast<size_t>(rows.n);
  std::fill(rows.max, rows.max + n, -std::numeric_limits<float>::infinity());
  std::fill(rows.sum, rows.sum + n, 0.0f);
  std::fill(rows.acc, rows.acc + n * static_cast<size_t>(rows.v_dim), 0.0f);
}

void attention_rows_finish(const AttentionRows& rows, float* out, size_t out_stride) {
  const size_t dv = static_cast<size_t>(rows.v_dim);
  for (int r = 0; r < rows.n; ++r) {
    const float* acc = rows.acc + static_cast<size_t>(r) * dv;
    float* o = out + static_cast<size_t>(r) * out_stride;
    const float inv = rows.sum[r] > 0.0f ? 1.0f / rows.sum[r] : 0.0f;
    for (size_t c = 0; c < dv; ++c) o[c] = acc[c] * inv;
  }
}

void attention_rows_merge(const AttentionRows& dst, const AttentionRows& src) {
  const size_t dv = static_cast<size_t>(dst.v_dim);
  for (int r = 0; r < dst.n; ++r) {
    if (src.sum[r] == 0.0f && src.max[r] == -std::numeric_limits<float>::infinity()) continue;
    const float m = std::max(dst.max[r], src.max[r]);
    const float a_dst = detail::exp_scalar(dst.max[r] - m);
    const float a_src = detail::exp_scalar(src.max[r] - m);
    float* d = dst.acc + static_cast<size_t>(r) * dv;
    const float* s = src.acc + static_cast<size_t>(r) * dv;
    for (size_t c = 0; c < dv; ++c) d[c] = std::fma(d[c], a_dst, s[c] * a_src);
    dst.sum[r] = std::fma(dst.sum[r], a_dst, src.sum[r] * a_src);
    dst.max[r] = m;
  }
}

size_t hack_block_work_floats(int tokens, int k_dim, int v_dim, int k_group, int v_group) {
  return detail::hack_work_floats(tokens, k_dim, k_dim / k_group, v_dim / v_group);
}

size_t exact_block_work_floats(int tokens) {
  return detail::kRowTile * detail::round16(static_cast<size_t>(tokens)) + 64;
}

const HackAttentionKernels& hack_attention_kernels(CpuIsa isa) {
  static const HackAttentionKernels scalar{CpuIsa::scalar, detail::hack_block_scalar, detail::exact_block_scalar};
  static const HackAttentionKernels avx2{CpuIsa::avx2, detail::hack_block_avx2, detail::exact_block_avx2};
  static const HackAttentionKernels avx512{CpuIsa::avx512, detail::hack_block_avx512, detail::exact_block_avx512};
  // No BF16 instructions in attention: the avx512bf16 tier runs the avx512 kernels.
  static const HackAttentionKernels avx512bf16{CpuIsa::avx512bf16, detail::hack_block_avx512,
                                               detail::exact_block_avx512};
  HACK_CHECK(cpu_supports(isa), "hack attention: this CPU cannot run {} kernels", cpu_isa_name(isa));
  switch (isa) {
    case CpuIsa::scalar: return scalar;
    case CpuIsa::avx2: return avx2;
    case CpuIsa::avx512: return avx512;
    case CpuIsa::avx512bf16: return avx512bf16;
  }
  return scalar;
}

}  // namespace hack::cpu
