// Page scores for MPCache selection: the scalar reference (16 emulated lanes, the canonical
// fold) and the ISA dispatch. See include/hack/kernels/cpu/page_bound.h.
#include "hack/kernels/cpu/page_bound.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hack::cpu {

namespace detail {

namespace {

float bf16_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Σ of 16 lanes folded 8+8, 4+4, 2+2, 1+1.
float fold16(float* v) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) v[j] = v[j] + v[j + w];
  return v[0];
}

}  // namespace

void page_bound_scalar(const PageBoundArgs& a, float* out) {
  const int boxes = (a.n_pages + a.span - 1) / a.span;
  const float beta = 1.0f - a.alpha;
  for (int b = 0; b < boxes; ++b) {
    const int p0 = b * a.span, p1 = std::min(a.n_pages, p0 + a.span);
    float acc[16] = {};
    for (int c = 0; c < a.k_dim; c += 16) {
      float lo[16], hi[16];
      for (int p = p0; p < p1; ++p) {
        const auto* mins = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_min_offset) + c;
        const auto* scales = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_scale_offset) + c;
        for (int j = 0; j < 16; ++j) {
          const float mn = bf16_f32(mins[j]);
          const float mx = std::fma(bf16_f32(scales[j]), a.levels, mn);
          lo[j] = p == p0 ? mn : (lo[j] < mn ? lo[j] : mn);  // as minps(lo, mn)
          hi[j] = p == p0 ? mx : (hi[j] > mx ? hi[j] : mx);  // as maxps(hi, mx)
        }
      }
      for (int j = 0; j < 16; ++j) {
        if (a.linear) {
          acc[j] = std::fma(a.qsum[c + j], std::fma(a.alpha, hi[j], beta * lo[j]), acc[j]);
        } else {
          acc[j] = std::fma(a.qpos[c + j], hi[j], std::fma(a.qneg[c + j], lo[j], acc[j]));
        }
      }
    }
    out[b] = fold16(acc);
  }
}

}  // namespace detail

void quest_split(const float* q, int rows, int k_dim, float* qpos, float* qneg) {
  for (int d = 0; d < k_dim; ++d) qpos[d] = qneg[d] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* row = q + static_cast<size_t>(r) * static_cast<size_t>(k_dim);
    for (int d = 0; d < k_dim; ++d) {
      qpos[d] += std::max(row[d], 0.0f);
      qneg[d] += std::min(row[d], 0.0f);
    }
  }
}

PageBoundFn page_bound_kernel(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return detail::page_bound_scalar;
    case CpuIsa::avx2: return detail::page_bound_avx2;
    case CpuIsa::avx512:
    case CpuIsa::avx512bf16: return detail::page_bound_avx512;
  }
  return detail::page_bound_scalar;
}

}  // namespace hack::cpu
