// Test helpers for the KV caches: random K/V/Q streams and independent references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/kv/hack_page.h"
#include "hack/backend/cpu_paged_kv_cache.h"

namespace hack::test {

/// K, V of `tokens` tokens × heads × dim (as the transformer appends them) and queries
/// (tokens × heads·group × dim). K has per-channel offsets and outlier channels like
/// post-RoPE keys; Q is scaled so softmax is peaked rather than flat.
struct KvStream {
  int tokens = 0, heads = 0, group = 0, dim = 0;
  std::vector<float> k, v, q;
  KvStream(int tokens_, int heads_, int group_, int dim_, uint32_t seed)
      : tokens(tokens_), heads(heads_), group(group_), dim(dim_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t per_token = static_cast<size_t>(heads) * static_cast<size_t>(dim);
    std::vector<float> bias(per_token), gain(per_token);
    for (size_t i = 0; i < per_token; ++i) {
      bias[i] = 0.7f * normal(rng);
      gain[i] = i % 16 == 5 ? 4.0f : 1.0f;
    }
    k.resize(static_cast<size_t>(tokens) * per_token);
    v.resize(k.size());
    q.resize(k.size() * static_cast<size_t>(group));
    for (int t = 0; t < tokens; ++t)
      for (size_t i = 0; i < per_token; ++i) {
        k[static_cast<size_t>(t) * per_token + i] = bias[i] + gain[i] * normal(rng);
        v[static_cast<size_t>(t) * per_token + i] = normal(rng);
      }
    for (float& x : q) x = 2.0f * normal(rng);
  }
  size_t per_token() const { return static_cast<size_t>(heads) * static_cast<size_t>(dim); }
  const float* k_at(int t) const { return k.data() + static_cast<size_t>(t) * static_cast<size_t>(heads * dim); }
  const float* v_at(int t) const { return v.data() + static_cast<size_t>(t) * static_cast<size_t>(heads * dim); }
  /// Query rows of token t: [heads · group][dim]; KV head h's group starts at h·group·dim.
  const float* q_at(int t) const {
    return q.data() + static_cast<size_t>(t) * static_cast<size_t>(heads * group * dim);
  }
  float k_val(int t, int h, int c) const { return k[(static_cast<size_t>(t) * heads + h) * dim + c]; }
  float v_val(int t, int h, int c) const { return v[(static_cast<size_t>(t) * heads + h) * dim + c]; }
};

inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/// Causal fp attention in double of one query row at position `pos` over K/V given as
/// functions (t, c) -> value; out[dim].
template <class KFn, class VFn>
void reference_attention(const float* q, float scale, int pos, int dim, KFn k, VFn v, double* out) {
  std::vector<double> w(static_cast<size_t>(pos) + 1);
  double mx = -1e300;
  for (int j = 0; j <= pos; ++j) {
    double s = 0.0;
    for (int c = 0; c < dim; ++c) s += static_cast<double>(q[c]) * scale * k(j, c);
    w[static_cast<size_t>(j)] = s;
    mx = std::max(mx, s);
  }
  double denom = 0.0;
  for (double& x : w) denom += (x = std::exp(x - mx));
  for (int c = 0; c < dim; ++c) {
    double acc = 0.0;
    for (int j = 0; j <= pos; ++j) acc += w[static_cast<size_t>(j)] * v(j, c);
    out[c] = acc / denom;
  }
}

/// The homomorphic attention of one query row as defined (DESIGN.md §3.1), evaluated in
/// double on the codes a HACK cache stores: for every quantized block, Q is folded with
/// the block's K scales and quantized to u8 per K partition exactly as specified (the
/// same fp32 operations, so the same codes); scores = Σ (σ q' + μ)·k' + q·k_min (= the
/// quantized q against dequantized K); softmax in double; P folded with the V scales and
/// quantized to u8 per V partition over the block, out = Σ p̂·v' + p·v_min. Exact tokens
/// (sinks, pending and open blocks) use their bf16 values.
/// tol[c] receives the allowance for this comparison, derived from fp32 rounding:
///  - a score is a sum of terms that cancel (σ·Σq'k', μ·Σk', q·k_min, or q·k for exact
///    tokens), so its fp32 error is ≤ 64·2⁻²⁴·M_j with M_j the sum of the terms'
///    magnitudes (a generous constant for ~d roundings in a 16-lane tree); a score error
///    δ_j moves the output by ≤ Σ_j a_j·δ_j·|v̂_j − o| (softmax weights a);
///  - the output accumulation adds ≤ 1e-6·(max|v̂| + 1);
///  - every P code whose rounding sits within 0.01 of a tie (where fp32 scores may round
///    it the other way) may be off by one step: + step·v' for that token.
struct HackReference {
  const CpuPagedKvCache& cache;
  const KvStream& data;
  int seq = 0;

  void attend(int layer, int head, int pos, const float* q_row, float scale, double* out, double* tol) const {
    const HackPageLayout& layout = cache.hack_layout();
    const HackHeadLayout& hl = layout.head(head);
    const int d = data.dim, T = layout.block_tokens(), S = cache.options().sinks;
    const int n_pages = cache.hack_page_count(seq, layer);
    std::vector<float> qs(static_cast<size_t>(d));
    for (int c = 0; c < d; ++c) qs[static_cast<size_t>(c)] = q_row[c] * scale;
    std::vector<double> score(static_cast<size_t>(pos) + 1), magnitude(score.size(), 0.0);
    auto quantized = [&](int j) { return j >= S && j < S + n_pages * T; };
    auto page_of = [&](int j) { return cache.hack_page(seq, layer, (j - S) / T).data(); };
    auto bf = [](const std::byte* p, size_t off, size_t i) {
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(p + off)[i]);
    };
    // Scores.
    for (int b = -1; b < n_pages; ++b) {
      if (b >= 0 && S + b * T > pos) break;
      if (b < 0) {
        for (int j = 0; j <= pos; ++j) {
          if (quantized(j)) continue;
          double s = 0.0, m = 0.0;
          for (int c = 0; c < d; ++c) {
            const double term = static_cast<double>(qs[static_cast<size_t>(c)]) * bf16_round(data.k_val(j, head, c));
            s += term;
            m += std::fabs(term);
          }
          score[static_cast<size_t>(j)] = s;
          magnitude[static_cast<size_t>(j)] = m;
        }
        continue;
      }
      const std::byte* page = cache.hack_page(seq, layer, b).data();
      std::vector<double> qhat(static_cast<size_t>(d)), sigma_p(static_cast<size_t>(hl.k_partitions())),
          mu_p(sigma_p.size());
      double mterm = 0.0, mterm_mag = 0.0;
      for (int p = 0; p < hl.k_partitions(); ++p) {
        std::vector<float> qt(static_cast<size_t>(hl.k_group));
        for (int i = 0; i < hl.k_group; ++i) {
          const int c = p * hl.k_group + i;
          qt[static_cast<size_t>(i)] = qs[static_cast<size_t>(c)] * bf(page, hl.k_scale, static_cast<size_t>(c));
        }
        const float lo = *std::min_element(qt.begin(), qt.end()), hi = *std::max_element(qt.begin(), qt.end());
        const float sigma = (hi - lo) / 255.0f;
        const float inv = sigma > 0.0f ? 1.0f / sigma : 0.0f;
        sigma_p[static_cast<size_t>(p)] = sigma;
        mu_p[static_cast<size_t>(p)] = lo;
        for (int i = 0; i < hl.k_group; ++i) {
          const float code = std::clamp(std::nearbyint((qt[static_cast<size_t>(i)] - lo) * inv), 0.0f, 255.0f);
          qhat[static_cast<size_t>(p * hl.k_group + i)] = static_cast<double>(sigma) * code + lo;
        }
      }
      for (int c = 0; c < d; ++c) {
        const double term = static_cast<double>(qs[static_cast<size_t>(c)]) * bf(page, hl.k_min, static_cast<size_t>(c));
        mterm += term;
        mterm_mag += std::fabs(term);
      }
      for (int t = 0; t < T && S + b * T + t <= pos; ++t) {
        double s = mterm, m = mterm_mag;
        for (int c = 0; c < d; ++c) s += qhat[static_cast<size_t>(c)] * k_code(layout, head, page, t, c);
        for (int p = 0; p < hl.k_partitions(); ++p) {  // |σ·Σq'k'| + |μ·Σk'| per partition
          double qk = 0.0, ks = 0.0;
          for (int c = p * hl.k_group; c < (p + 1) * hl.k_group; ++c) {
            const int kc = k_code(layout, head, page, t, c);
            qk += (qhat[static_cast<size_t>(c)] - mu_p[static_cast<size_t>(p)]) * kc;
            ks += kc;
          }
          m += std::fabs(qk) + std::fabs(mu_p[static_cast<size_t>(p)] * ks);
        }
        score[static_cast<size_t>(S + b * T + t)] = s;
        magnitude[static_cast<size_t>(S + b * T + t)] = m;
      }
    }
    double mx = -1e300;
    for (double s : score) mx = std::max(mx, s);
    std::vector<double> w(score.size());
    double denom = 0.0;
    for (size_t j = 0; j < w.size(); ++j) denom += (w[j] = std::exp(score[j] - mx));
    std::vector<double> num(static_cast<size_t>(d), 0.0), flips(static_cast<size_t>(d), 0.0);
    double vmax = 0.0;
    for (int j = 0; j <= pos; ++j) {
      if (quantized(j)) continue;
      for (int c = 0; c < d; ++c) {
        const double vv = bf16_round(data.v_val(j, head, c));
        num[static_cast<size_t>(c)] += w[static_cast<size_t>(j)] * vv;
        vmax = std::max(vmax, std::fabs(vv));
      }
    }
    for (int b = 0; b < n_pages && S + b * T <= pos; ++b) {
      const std::byte* page = page_of(S + b * T);
      for (int p = 0; p < hl.v_partitions(); ++p) {
        std::vector<double> pt(static_cast<size_t>(T), 0.0), w_blk(static_cast<size_t>(T), 0.0);
        for (int t = 0; t < T; ++t) {
          const int j = S + b * T + t;
          if (j > pos) continue;
          w_blk[static_cast<size_t>(t)] = w[static_cast<size_t>(j)];
          pt[static_cast<size_t>(t)] = w[static_cast<size_t>(j)] * bf(page, hl.v_scale, static_cast<size_t>(p) * T + t);
        }
        const double lo = *std::min_element(pt.begin(), pt.end()), hi = *std::max_element(pt.begin(), pt.end());
        const double sigma = (hi - lo) / 255.0;
        for (int t = 0; t < T; ++t) {
          const double u = sigma > 0 ? (pt[static_cast<size_t>(t)] - lo) / sigma : 0.0;
          const double code = std::nearbyint(u);
          const bool near_tie = std::fabs(u - std::floor(u) - 0.5) < 0.01;
          const double phat = lo + sigma * code;
          const double vm = w_blk[static_cast<size_t>(t)] * bf(page, hl.v_min, static_cast<size_t>(p) * T + t);
          for (int c = p * hl.v_group; c < (p + 1) * hl.v_group; ++c) {
            const int vc = v_code(layout, head, page, t, c);
            num[static_cast<size_t>(c)] += phat * vc + vm;
            if (near_tie) flips[static_cast<size_t>(c)] += sigma * vc;
            const double deq = bf(page, hl.v_min, static_cast<size_t>(p) * T + t) +
                               static_cast<double>(bf(page, hl.v_scale, static_cast<size_t>(p) * T + t)) * vc;
            if (S + b * T + t <= pos) vmax = std::max(vmax, std::fabs(deq));
          }
        }
      }
    }
    // Dequantized values of every token, for the score-error term.
    auto v_hat = [&](int j, int c) -> double {
      if (!quantized(j)) return bf16_round(data.v_val(j, head, c));
      const std::byte* page = page_of(j);
      const int t = (j - S) % T;
      const size_t meta = static_cast<size_t>(c / hl.v_group) * T + static_cast<size_t>(t);
      return bf(page, hl.v_min, meta) + static_cast<double>(bf(page, hl.v_scale, meta)) * v_code(layout, head, page, t, c);
    };
    constexpr double kScoreUlps = 64.0 * 0x1.0p-24;
    for (int c = 0; c < d; ++c) {
      out[c] = num[static_cast<size_t>(c)] / denom;
      double score_err = 0.0;
      for (int j = 0; j <= pos; ++j)
        score_err += w[static_cast<size_t>(j)] / denom * kScoreUlps * magnitude[static_cast<size_t>(j)] *
                     std::fabs(v_hat(j, c) - out[c]);
      tol[c] = score_err + 1e-6 * (vmax + 1.0) + flips[static_cast<size_t>(c)] / denom;
    }
  }
};

}  // namespace hack::test
