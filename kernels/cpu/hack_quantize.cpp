// The CPU HACK quantizer (kernels/cpu/hack_quantize.h).
#include "hack/kernels/cpu/hack_quantize.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cpu {

namespace {

using quant::Quantizer;

// The page code of x under q: the shared host/device definition (hack_quant_math.h), so
// the CUDA quantizer writes the same bytes for round to nearest.
int quantize_one(const Quantizer& q, float x, bool stochastic, float random) {
  return stochastic ? quant::quantize_stochastic(q, x, random) : quant::quantize_nearest(q, x);
}

quant::BlockRandom block_random(const HackBlockRounding& r, int kind) {
  return quant::BlockRandom(r.seed, r.layer, r.first_token, r.head, kind);
}

void put_sum(void* sums, int bytes, size_t i, uint32_t value) {
  if (bytes == 1) static_cast<uint8_t*>(sums)[i] = static_cast<uint8_t>(value);
  else static_cast<uint16_t*>(sums)[i] = static_cast<uint16_t>(value);
}

uint32_t load_sum(const void* sums, int bytes, size_t i) {
  return bytes == 1 ? static_cast<const uint8_t*>(sums)[i] : static_cast<const uint16_t*>(sums)[i];
}

// −1 in the lanes whose float bits `u` are not a bf16 (low 16 bits not zero), else 0.
__m256i not_bf16(__m256i u) {
  return _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0xffff)), _mm256_setzero_si256()),
                          _mm256_set1_epi32(-1));
}

// Channels c0..c0+7 of quant::clip_k_range_2bit, one per AVX2 lane. Every lane runs the
// scalar definition's operations in its order (candidates in the same sequence, each error
// summed token by token), with two differences that cannot change a result: every candidate's
// error is summed to the end (the scalar stops once a sum reaches the best, and a sum of
// squares only grows, so such a candidate loses either way), and lanes whose range is empty
// compute and are then left as they were (the scalar returns at once). xs: `tokens` rows.
void clip_8_channels_avx2(const __m256* xs, int tokens, float* lo_out, float* hi_out) {
  const __m256 lo = _mm256_loadu_ps(lo_out), hi = _mm256_loadu_ps(hi_out);
  const __m256 zero = _mm256_setzero_ps(), three = _mm256_set1_ps(3.0f);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256 r = _mm256_sub_ps(hi, lo);
  const __m256 has_range = _mm256_cmp_ps(r, zero, _CMP_GT_OQ);
  __m256 best = zero, best_lo = lo, best_hi = hi;
  bool first = true;
  for (int si = 0; si <= 10; ++si) {
    const __m256 cut = _mm256_mul_ps(_mm256_set1_ps(0.05f * static_cast<float>(si)), r);
    for (int ki = 0; ki <= (si == 0 ? 0 : 4); ++ki) {
      const __m256 below = _mm256_mul_ps(cut, _mm256_set1_ps(0.25f * static_cast<float>(ki)));
      const __m256 l = _mm256_add_ps(lo, below), h = _mm256_sub_ps(hi, _mm256_sub_ps(cut, below));
      // make_quantizer(l, h, 3): min = bf16 toward −∞ of l (a zero as +0), scale = bf16 toward
      // +∞ of (h − min) / 3, or 0 when h − min is not positive.
      const __m256i lu = _mm256_castps_si256(_mm256_blendv_ps(l, zero, _mm256_cmp_ps(l, zero, _CMP_EQ_OQ)));
      const __m256i l_down = _mm256_and_si256(not_bf16(lu), _mm256_srai_epi32(lu, 31));  // −1 where negative and inexact
      const __m256i min_bits = _mm256_and_si256(_mm256_sub_epi32(_mm256_srli_epi32(lu, 16), l_down), low16);
      const __m256 min = _mm256_castsi256_ps(_mm256_slli_epi32(min_bits, 16));
      const __m256 range = _mm256_sub_ps(h, min);
      const __m256i su = _mm256_castps_si256(_mm256_div_ps(range, three));
      const __m256i s_up = _mm256_andnot_si256(_mm256_srai_epi32(su, 31), not_bf16(su));  // −1 where positive and inexact
      __m256i scale_bits = _mm256_and_si256(_mm256_sub_epi32(_mm256_srli_epi32(su, 16), s_up), low16);
      scale_bits = _mm256_and_si256(scale_bits, _mm256_castps_si256(_mm256_cmp_ps(range, zero, _CMP_GT_OQ)));
      const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(scale_bits, 16));
      const __m256 quantizes = _mm256_cmp_ps(scale, zero, _CMP_GT_OQ);  // else every code is 0
      __m256 err = zero;
      for (int t = 0; t < tokens; ++t) {
        const __m256 x = xs[t];
        __m256 c = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(x, min), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c = _mm256_blendv_ps(c, zero, _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
        c = _mm256_blendv_ps(c, three, _mm256_cmp_ps(c, three, _CMP_GT_OQ));
        c = _mm256_and_ps(c, quantizes);
        const __m256 code = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(c));  // the int code back to float, as the scalar
        const __m256 e = _mm256_sub_ps(x, _mm256_add_ps(min, _mm256_mul_ps(scale, code)));
        err = _mm256_add_ps(err, _mm256_mul_ps(e, e));
      }
      if (first) {
        best = err;
        best_lo = l;
        best_hi = h;
        first = false;
      } else {
        const __m256 better = _mm256_cmp_ps(err, best, _CMP_LT_OQ);
        best = _mm256_blendv_ps(best, err, better);
        best_lo = _mm256_blendv_ps(best_lo, l, better);
        best_hi = _mm256_blendv_ps(best_hi, h, better);
      }
    }
  }
  _mm256_storeu_ps(lo_out, _mm256_blendv_ps(lo, best_lo, has_range));
  _mm256_storeu_ps(hi_out, _mm256_blendv_ps(hi, best_hi, has_range));
}

}  // namespace

void clip_k_ranges_2bit(const uint16_t* k, size_t k_stride, int tokens, int channels, float* lo, float* hi,
                        CpuIsa isa) {
  constexpr int kMaxTokens = 256;  // rows staged on the stack (8 KB); longer blocks take the scalar path
  int c = 0;
  if (isa != CpuIsa::scalar && tokens <= kMaxTokens) {
    alignas(32) __m256 xs[kMaxTokens];
    for (; c + 8 <= channels; c += 8) {
      for (int t = 0; t < tokens; ++t) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + static_cast<size_t>(t) * k_stride + c));
        xs[t] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16));
      }
      clip_8_channels_avx2(xs, tokens, lo + c, hi + c);
    }
  }
  for (; c < channels; ++c) {
    quant::clip_k_range_2bit([&](int t) { return bf16_to_f32(k[static_cast<size_t>(t) * k_stride + static_cast<size_t>(c)]); },
                             tokens, &lo[c], &hi[c]);
  }
}

void hack_quantize_k(const HackHeadSlots& h, const uint16_t* k, size_t k_stride, const HackBlockRounding& rounding) {
  const int T = h.tokens, bits = h.k_bits, max_code = (1 << bits) - 1;
  std::memset(h.k_codes, 0, static_cast<size_t>(T) * static_cast<size_t>(h.k_dim) * static_cast<size_t>(bits) / 8);
  const quant::BlockRandom random = block_random(rounding, 0);
  constexpr int kMaxDim = 512;  // K channels of one head (head_dim ≤ 256 in every model we load)
  HACK_CHECK(h.k_dim <= kMaxDim, "hack_quantize_k: {} K channels, at most {}", h.k_dim, kMaxDim);
  float lo[kMaxDim], hi[kMaxDim];
  for (int c = 0; c < h.k_dim; ++c) {
    lo[c] = hi[c] = bf16_to_f32(k[c]);
    for (int t = 1; t < T; ++t) {
      const float x = bf16_to_f32(k[static_cast<size_t>(t) * k_stride + static_cast<size_t>(c)]);
      lo[c] = std::min(lo[c], x);
      hi[c] = std::max(hi[c], x);
    }
  }
  // Stochastic rounding stays unbiased: no clipping.
  if (bits == 2 && !rounding.stochastic) clip_k_ranges_2bit(k, k_stride, T, h.k_dim, lo, hi, cpu_isa());
  for (int c = 0; c < h.k_dim; ++c) quant::make_quantizer(lo[c], hi[c], max_code, &h.k_min[c], &h.k_scale[c]);
  const int partitions = h.k_dim / h.k_group;
  for (int t = 0; t < T; ++t) {
    const uint16_t* row = k + static_cast<size_t>(t) * k_stride;
    for (int p = 0; p < partitions; ++p) {
      uint32_t sum = 0;
      for (int c = p * h.k_group; c < (p + 1) * h.k_group; ++c) {
        const Quantizer q = quant::stored_quantizer(h.k_min[c], h.k_scale[c], max_code);
        const int code = quantize_one(q, bf16_to_f32(row[c]), rounding.stochastic,
                                      random(static_cast<uint64_t>(t) * static_cast<uint64_t>(h.k_dim) + c));
        const HackCodePos pos = hack_k_code_pos(bits, h.k_dim, t, c);
        h.k_codes[pos.byte] = static_cast<uint8_t>(h.k_codes[pos.byte] | (code << pos.shift));
        sum += static_cast<uint32_t>(code);
      }
      put_sum(h.k_sums, h.k_sum_bytes, static_cast<size_t>(p) * static_cast<size_t>(T) + static_cast<size_t>(t), sum);
    }
  }
}

void hack_quantize_v(const HackHeadSlots& h, const uint16_t* v, size_t v_stride, const HackBlockRounding& rounding) {
  const int T = h.tokens, bits = h.v_bits, max_code = (1 << bits) - 1;
  std::memset(h.v_codes, 0, static_cast<size_t>(T) * static_cast<size_t>(h.v_dim) * static_cast<size_t>(bits) / 8);
  const quant::BlockRandom random = block_random(rounding, 1);
  std::memset(h.v_sums, 0, static_cast<size_t>(h.v_dim) * static_cast<size_t>(h.v_sum_bytes));
  const int partitions = h.v_dim / h.v_group;
  for (int t = 0; t < T; ++t) {
    const uint16_t* row = v + static_cast<size_t>(t) * v_stride;
    for (int p = 0; p < partitions; ++p) {
      const int c0 = p * h.v_group;
      float lo = bf16_to_f32(row[c0]), hi = lo;
      for (int c = c0 + 1; c < c0 + h.v_group; ++c) {
        lo = std::min(lo, bf16_to_f32(row[c]));
        hi = std::max(hi, bf16_to_f32(row[c]));
      }
      const size_t meta = static_cast<size_t>(p) * static_cast<size_t>(T) + static_cast<size_t>(t);
      const Quantizer q = quant::make_quantizer(lo, hi, max_code, &h.v_min[meta], &h.v_scale[meta]);
      for (int c = c0; c < c0 + h.v_group; ++c) {
        const int code = quantize_one(q, bf16_to_f32(row[c]), rounding.stochastic,
                                      random(static_cast<uint64_t>(t) * h.v_dim + c));
        const HackCodePos pos = hack_v_code_pos(bits, T, t, c);
        h.v_codes[pos.byte] = static_cast<uint8_t>(h.v_codes[pos.byte] | (code << pos.shift));
        const size_t ci = static_cast<size_t>(c);
        put_sum(h.v_sums, h.v_sum_bytes, ci, load_sum(h.v_sums, h.v_sum_bytes, ci) + static_cast<uint32_t>(code));
      }
    }
  }
}

}  // namespace hack::cpu
