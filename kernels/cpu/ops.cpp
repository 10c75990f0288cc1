// Element-wise kernels. The whole build targets x86-64-v3, so these use AVX2/FMA
// directly; each has a plain loop for the tail.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "hack/core/error.h"
#include "hack/kernels/cpu/ops.h"

namespace hack::cpu {

namespace {
// e^x for 8 lanes: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a degree-6 Taylor polynomial
// (relative error < 2e-7 over the clamped range), 2^n built in the exponent bits.
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n·ln2 in two steps (Cody–Waite) so r keeps its low bits.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
}  // namespace

float dot(const float* a, const float* b, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void add_inplace(float* x, const float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

void rmsnorm(const float* x, const float* weight, float* out, size_t rows, size_t n, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    // Sum of squares in double: HF computes the mean in fp32, but a long fp32 sum drifts
    // with summation order; double keeps us closest to the exact value.
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (size_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void fdc_project(float* x, size_t rows, int n_heads, int heads_per_kv, int head_dim, const float* proj,
                 const int* d_qk) {
  const size_t hd = static_cast<size_t>(head_dim);
  HACK_CHECK(hd <= 512, "FDC: head_dim {} above 512", hd);
  float out[512];
  for (size_t r = 0; r < rows; ++r)
    for (int h = 0; h < n_heads; ++h) {
      const int kv_head = h / heads_per_kv;
      const size_t d = static_cast<size_t>(d_qk[kv_head]);
      const float* p = proj + static_cast<size_t>(kv_head) * hd * hd;
      float* slot = x + (r * static_cast<size_t>(n_heads) + static_cast<size_t>(h)) * hd;
      std::fill(out, out + d, 0.0f);
      for (size_t i = 0; i < hd; ++i) {
        const float xi = slot[i];
        const float* row = p + i * hd;
        for (size_t j = 0; j < d; ++j) out[j] += xi * row[j];
      }
      std::copy(out, out + d, slot);
      std::fill(slot + d, slot + hd, 0.0f);
    }
}

void rope_apply(float* x, int n_heads, int head_dim, int position, const float* inv_freq) {
  const int half = head_dim / 2;
  // Angles as HF computes them: fp32 product of position and inverse frequency.
  float cos_v[512], sin_v[512];
  HACK_CHECK(half <= 512, "head_dim {} too large for rope_apply", head_dim);
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    cos_v[i] = std::cos(angle);
    sin_v[i] = std::sin(angle);
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * static_cast<size_t>(head_dim);
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_v[i] - b * sin_v[i];
      v[i + half] = b * cos_v[i] + a * sin_v[i];
    }
  }
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  // Every element takes the vector path (the tail through a padded copy), so an element's
  // value does not depend on where a call's range starts (matmul_swiglu runs column blocks).
  const auto lanes = [](const __m256 g, const __m256 u) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, lanes(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    _mm256_store_ps(o, lanes(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(o, o + (n - i), out + i);
  }
}

void softmax(float* x, size_t n) {
  if (n == 0) return;
  float m = x[0];
  for (size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void embedding_row(const Tensor& table, int64_t token, float* out) {
  HACK_CHECK(token >= 0 && token < table.dim(0), "token id {} out of range [0, {})", token, table.dim(0));
  const size_t hidden = static_cast<size_t>(table.dim(1));
  const char* row = static_cast<const char*>(table.raw()) + static_cast<size_t>(token) * dtype_bytes(table.dtype(), hidden);
  convert_to_f32(table.dtype(), row, out, hidden);
}

}  // namespace hack::cpu
