// Scalar reference of the HACK attention kernels: plain loops over the page layout, the
// definition the AVX2 and AVX-512 paths must match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/hack_attention_common.h"

namespace hack::cpu::detail {

namespace {

// Online-softmax step of one row over `visible` scores in p[0..visible): returns alpha and
// leaves exp(score − m_new) in p (0 beyond visible, up to `padded`).
float softmax_step(float* p, int visible, int padded, float* max, float* sum) {
  float block_max = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < visible; ++t) block_max = std::max(block_max, p[t]);
  const float m_new = std::max(*max, block_max);
  const float alpha = exp_scalar(*max - m_new);
  for (int t = 0; t < visible; ++t) p[t] = exp_scalar(p[t] - m_new);
  for (int t = visible; t < padded; ++t) p[t] = 0.0f;
  *sum = std::fma(*sum, alpha, canonical_sum(p, padded));
  *max = m_new;
  return alpha;
}

}  // namespace

void hack_block_scalar(const HackHeadView& b, const AttentionRows& rows, float* work) {
  const int kp = b.k_dim / b.k_group;
  const int vp = b.v_dim / b.v_group;
  const HackWork w = carve_hack_work(work, b.tokens, b.k_dim, kp, vp);
  float* scaled = w.tmp;  // [k_dim] q folded with the K scales, then p folded with V scales
  uint8_t* q_codes = w.q_codes;
  uint8_t* p_codes = w.p_codes;
  float* q_sigma = w.q_sigma;
  float* q_mu = w.q_mu;
  float* p_sigma = w.p_sigma;
  float* p_mu = w.p_mu;
  float* p_min = w.p_min;

  for (int r = 0; r < rows.n; ++r) {
    const int visible = rows.visible[r];
    if (visible <= 0) continue;
    const float* q = rows.q + static_cast<size_t>(r) * static_cast<size_t>(b.k_dim);

    // 1. Q: fold the K scales in, quantize each partition to u8.
    for (int c = 0; c < b.k_dim; ++c) scaled[c] = q[c] * bf16_bits_to_f32(b.k_scale[c]);
    for (int p = 0; p < kp; ++p)
      q_sigma[p] = quantize_u8_scalar(scaled + p * b.k_group, b.k_group, q_codes + p * b.k_group, &q_mu[p]);
    const float mterm = canonical_dot(q, [&](int c) { return bf16_bits_to_f32(b.k_min[c]); }, b.k_dim);

    // 2. Scores: integer dots over the codes plus the min/scale corrections.
    float* s = w.p;
    for (int t = 0; t < visible; ++t) {
      float acc = 0.0f;
      for (int p = 0; p < kp; ++p) {
        int32_t dot = 0;
        for (int c = p * b.k_group; c < (p + 1) * b.k_group; ++c)
          dot += static_cast<int32_t>(q_codes[c]) * quant::code_at(b.k_codes, hack_k_code_pos(b.k_bits, b.k_dim, t, c), b.k_bits);
        const float ksum = static_cast<float>(load_sum(b.k_sums, b.k_sum_bytes, static_cast<size_t>(p) * b.tokens + t));
        acc = std::fma(q_sigma[p], static_cast<float>(dot), acc);
        acc = std::fma(q_mu[p], ksum, acc);
      }
      s[t] = acc + mterm;
    }

    // 3. Online softmax over the block.
    const float alpha = softmax_step(s, visible, b.tokens, &rows.max[r], &rows.sum[r]);

    // 4. P: fold the V scales in, quantize per V partition over the block's tokens (masked
    // tokens are 0, so their dequantized weight is exactly 0).
    for (int p = 0; p < vp; ++p) {
      const uint16_t* vs = b.v_scale + static_cast<size_t>(p) * b.tokens;
      const uint16_t* vm = b.v_min + static_cast<size_t>(p) * b.tokens;
      for (int t = 0; t < b.tokens; ++t) scaled[t] = s[t] * bf16_bits_to_f32(vs[t]);
      p_sigma[p] = quantize_u8_scalar(scaled, b.tokens, p_codes + static_cast<size_t>(p) * b.tokens, &p_mu[p]);
      p_min[p] = canonical_dot(s, [&](int t) { return bf16_bits_to_f32(vm[t]); }, b.tokens);
    }

    // 5. P·V: integer dots per channel plus corrections, into the running accumulator.
    float* acc = rows.acc + static_cast<size_t>(r) * static_cast<size_t>(b.v_dim);
    for (int c = 0; c < b.v_dim; ++c) {
      const int p = c / b.v_group;
      const uint8_t* pc = p_codes + static_cast<size_t>(p) * b.tokens;
      int32_t dot = 0;
      for (int t = 0; t < b.tokens; ++t)
        dot += static_cast<int32_t>(pc[t]) * quant::code_at(b.v_codes, hack_v_code_pos(b.v_bits, b.tokens, t, c), b.v_bits);
      const float vsum = static_cast<float>(load_sum(b.v_sums, b.v_sum_bytes, static_cast<size_t>(c)));
      float x = p_sigma[p] * static_cast<float>(dot);
      x = std::fma(p_mu[p], vsum, x);
      x = x + p_min[p];
      acc[c] = std::fma(acc[c], alpha, x);
    }
  }
}

void exact_block_scalar(const ExactHeadView& b, const AttentionRows& rows, float* work) {
  auto k_at = [&](int t, int c) {
    const size_t i = static_cast<size_t>(t) * b.k_stride + static_cast<size_t>(c);
    return b.bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(b.k)[i]) : static_cast<const float*>(b.k)[i];
  };
  auto v_at = [&](int t, int c) {
    const size_t i = static_cast<size_t>(t) * b.v_stride + static_cast<size_t>(c);
    return b.bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(b.v)[i]) : static_cast<const float*>(b.v)[i];
  };
  float* s = work;  // [tokens]
  for (int r = 0; r < rows.n; ++r) {
    const int visible = std::min(rows.visible[r], b.tokens);
    if (visible <= 0) continue;
    const float* q = rows.q + static_cast<size_t>(r) * static_cast<size_t>(b.k_dim);
    for (int t = 0; t < visible; ++t) s[t] = canonical_dot(q, [&](int c) { return k_at(t, c); }, b.k_dim);
    const float alpha = softmax_step(s, visible, visible, &rows.max[r], &rows.sum[r]);
    float* acc = rows.acc + static_cast<size_t>(r) * static_cast<size_t>(b.v_dim);
    for (int c = 0; c < b.v_dim; ++c) acc[c] = acc[c] * alpha;
    for (int t = 0; t < visible; ++t)
      for (int c = 0; c < b.v_dim; ++c) acc[c] = std::fma(s[t], v_at(t, c), acc[c]);
  }
}

}  // namespace hack::cpu::detail
