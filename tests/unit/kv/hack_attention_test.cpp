// Homomorphic attention of the paged HACK cache:
//  - exactness: equals the homomorphic formula evaluated in double on the stored codes
//    (dequantized K/V, the specified Q and P quantization) to fp32 rounding;
//  - approximation: error against fp attention on the unquantized data matches the error
//    model derived from the quantization steps, per bit width and rounding;
//  - SIMD paths are bit-identical to the scalar reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::HackReference;
using hack::test::KvStream;

namespace {

struct Shape {
  int bits, block, dim, group, sinks;
  int v_bits = 0;  ///< 0 = bits
  int recent = 0;  ///< bf16 recent window
};

std::unique_ptr<CpuPagedKvCache> make_cache(const Shape& s, int heads, int layers, CpuIsa isa,
                                          Rounding rounding = Rounding::nearest, uint64_t seed = 0) {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.k_bits = s.bits;
  o.v_bits = s.v_bits > 0 ? s.v_bits : s.bits;
  o.recent_tokens = s.recent;
  o.block_tokens = s.block;
  o.sinks = s.sinks;
  o.rounding = rounding;
  o.seed = seed;
  o.isa = isa;
  return make_paged_kv_cache(KvShape{layers, heads, s.dim, s.group}, o);
}

// Appends `data` in chunks of the given sizes (cycled) and after each chunk attends every
// (layer, head) over the chunk; calls check(layer, head, pos, q_row, out_row) per row.
template <class Check>
void run_stream(CpuPagedKvCache& cache, const KvStream& data, int layers, std::vector<int> chunks, float scale,
                Check&& check) {
  const int H = data.heads, G = data.group, d = data.dim;
  cache.add_sequence(0, data.tokens);
  int pos = 0;
  for (size_t ci = 0; pos < data.tokens; ++ci) {
    const int n = std::min(chunks[ci % chunks.size()], data.tokens - pos);
    std::vector<float> scratch(cache.attend_scratch_floats(n, pos + n));
    std::vector<float> out(static_cast<size_t>(n) * H * G * d);
    for (int l = 0; l < layers; ++l) {
      cache.append(l, 0, pos, n, data.k_at(pos), data.v_at(pos));
      for (int h = 0; h < H; ++h) {
        const size_t row_stride = static_cast<size_t>(H) * G * d;
        const size_t head_off = static_cast<size_t>(h) * G * d;
        cache.attend(l, 0, h, pos, n, data.q_at(pos) + head_off, row_stride, out.data() + head_off, row_stride, scale,
                     scratch.data());
        for (int t = 0; t < n; ++t)
          for (int g = 0; g < G; ++g) {
            const size_t off = static_cast<size_t>(t) * row_stride + head_off + static_cast<size_t>(g) * d;
            check(l, h, pos + t, data.q_at(pos) + off, out.data() + off);
          }
      }
    }
    pos += n;
  }
}

}  // namespace

TEST_CASE("homomorphic attention equals the formula on the stored codes", "[kv][hack_attention]") {
  const CpuIsa isa = cpu_isa();
  const std::vector<Shape> shapes = {
      {2, 64, 128, 4, 4}, {2, 16, 64, 1, 4}, {4, 32, 64, 8, 4}, {8, 16, 128, 4, 0},
      {2, 32, 128, 8, 1}, {4, 64, 64, 1, 0}, {8, 32, 64, 4, 4},
      // K and V of different widths, and recent windows shorter than, equal to and longer than Π
      {4, 32, 64, 3, 4, 2}, {2, 64, 128, 4, 4, 4}, {8, 16, 64, 2, 0, 2}, {2, 32, 64, 4, 4, 8},
      {2, 32, 64, 3, 4, 2, 20}, {4, 16, 64, 2, 4, 2, 16}, {2, 16, 128, 4, 0, 0, 40},
  };
  for (const Shape& s : shapes) {
    const int T = s.block;
    for (int length : {1, T - 1, T, T + 1, 3 * T + 7}) {
      const int total = length + s.sinks;
      for (const std::vector<int>& chunks : {std::vector<int>{1}, std::vector<int>{5, T + 3, 1, 2 * T}}) {
        const uint32_t seed =
            static_cast<uint32_t>(1000 * s.bits + 100 * s.v_bits + 7 * T + length + s.dim + s.group + s.recent);
        const KvStream data(total, 2, s.group, s.dim, seed);
        auto cache = make_cache(s, 2, 2, isa);
        const HackReference ref{*cache, data, 0};
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
        double worst = 0.0;
        int rows = 0;
        std::vector<double> expect(static_cast<size_t>(s.dim)), tol(static_cast<size_t>(s.dim));
        run_stream(*cache, data, 2, chunks, scale, [&](int l, int h, int pos, const float* q, const float* out) {
          ref.attend(l, h, pos, q, scale, expect.data(), tol.data());
          ++rows;
          for (int c = 0; c < s.dim; ++c) {
            const double err = std::fabs(out[c] - expect[static_cast<size_t>(c)]);
            worst = std::max(worst, err / tol[static_cast<size_t>(c)]);
            if (err > tol[static_cast<size_t>(c)]) {
              FAIL_CHECK("bits " << s.bits << "/" << s.v_bits << " recent " << s.recent << " block " << T << " dim " << s.dim << " group " << s.group << " sinks "
                                 << s.sinks << " length " << total << " chunks " << chunks.size() << " seed " << seed
                                 << ": layer " << l << " head " << h << " pos " << pos << " channel " << c << " got "
                                 << out[c] << " expected " << expect[static_cast<size_t>(c)] << " tol "
                                 << tol[static_cast<size_t>(c)]);
              return;
            }
          }
        });
        INFO("worst error / tolerance " << worst << " over " << rows << " rows");
        REQUIRE(worst <= 1.0);
      }
    }
  }
}

TEST_CASE("stored pages are quantized once and identical however the tokens arrive", "[kv][hack_attention]") {
  const Shape s{2, 32, 64, 4, 4};
  const KvStream data(4 + 32 * 5 + 10, 2, 4, 64, 3);
  auto one_by_one = make_cache(s, 2, 1, CpuIsa::scalar);
  auto chunked = make_cache(s, 2, 1, CpuIsa::scalar);
  one_by_one->add_sequence(0, data.tokens);
  chunked->add_sequence(0, data.tokens);
  for (int t = 0; t < data.tokens; ++t) one_by_one->append(0, 0, t, 1, data.k_at(t), data.v_at(t));
  const int last = data.tokens - 1;
  for (int pos = 0, n = 7; pos < last; pos += n, n = n * 2 + 1) {
    n = std::min(n, last - pos);
    chunked->append(0, 0, pos, n, data.k_at(pos), data.v_at(pos));
    // Blocks this append filled stay exact (pending) until the next append.
    const int filled = std::max(0, pos + n - 4) / 32;
    REQUIRE(chunked->hack_page_count(0, 0) == std::max(0, pos - 4) / 32);
    (void)filled;
  }
  chunked->append(0, 0, last, 1, data.k_at(last), data.v_at(last));
  REQUIRE(one_by_one->hack_page_count(0, 0) == 5);
  REQUIRE(chunked->hack_page_count(0, 0) == 5);
  for (int i = 0; i < one_by_one->hack_page_count(0, 0); ++i) {
    const auto a = one_by_one->hack_page(0, 0, i), b = chunked->hack_page(0, 0, i);
    REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
}

namespace {

struct ApproxResult {
  double measured_mse = 0, predicted_mse = 0, signal = 0;
};

// Runs decode over `data` (prefill of the first half in one chunk, then token by token) and
// compares against fp attention on the unquantized K/V. The error model: every rounding
// error is independent, zero-mean, of variance κ·step² (κ = 1/12 nearest, 1/6 stochastic
// for K/V codes; 1/12 for the u8 Q and P codes and for bf16, step = 2^-8·|x|). A token j
// perturbs its score by e_j and its values by δv_jc with
//   Var e_j   = Σ_c (scale·q_c)² κ s_c² + Σ_c σq_c² k'_jc² / 12 + bf16 term
//   Var δv_jc = κ sv_j² + bf16 term
// (s, sv: K and V steps; σq: the Q code step of c's partition; k': K codes), and to first
// order, with softmax weights a and P code steps τ per block and V partition,
//   Var Δo_c = Σ_j a_j² [ (v_jc − o_c)² Var e_j + Var δv_jc ] + Σ_j τ_j² v'_jc² / 12.
ApproxResult approximation(const Shape& s, Rounding rounding, uint64_t seed) {
  const int H = 2, L = 5 * s.block + 11;
  const KvStream data(L, H, s.group, s.dim, static_cast<uint32_t>(seed * 31 + 1));
  auto cache = make_cache(s, H, 1, cpu_isa(), rounding, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  const double kappa = rounding == Rounding::nearest ? 1.0 / 12.0 : 1.0 / 6.0;
  const HackPageLayout& layout = cache->hack_layout();
  ApproxResult r;
  int count = 0;
  std::vector<double> expect(static_cast<size_t>(s.dim));
  run_stream(*cache, data, 1, {L / 2, 1}, scale, [&](int, int h, int pos, const float* q, const float* out) {
    if (pos < L / 2) return;  // prefill rows attend exactly to their own chunk
    test::reference_attention(
        q, scale, pos, s.dim, [&](int t, int c) { return data.k_val(t, h, c); },
        [&](int t, int c) { return data.v_val(t, h, c); }, expect.data());
    // Predicted variance from the stored steps.
    const int n_pages = cache->hack_page_count(0, 0);
    const HackHeadLayout& hl = layout.head(h);
    const int vp = hl.v_partitions(), vg = hl.v_group;
    const size_t n = static_cast<size_t>(pos) + 1;
    std::vector<double> score(n), var_e(n, 0.0), var_v(n * static_cast<size_t>(s.dim), 0.0);
    double mx = -1e300;
    for (int j = 0; j <= pos; ++j) {
      double sc = 0;
      for (int c = 0; c < s.dim; ++c) {
        const double qc = static_cast<double>(q[c]) * scale, kb = data.k_val(j, h, c) * 0x1.0p-8;
        sc += qc * data.k_val(j, h, c);
        var_e[static_cast<size_t>(j)] += qc * qc * kb * kb / 12;
        const double vb = data.v_val(j, h, c) * 0x1.0p-8;
        var_v[static_cast<size_t>(j) * s.dim + c] = vb * vb / 12;
      }
      score[static_cast<size_t>(j)] = sc;
      mx = std::max(mx, sc);
    }
    double denom = 0;
    for (double& x : score) denom += (x = std::exp(x - mx));
    std::vector<double> var_p(static_cast<size_t>(s.dim), 0.0);  // Σ_j τ_j² v'² / 12 per channel
    for (int b = 0; b < n_pages && s.sinks + b * s.block <= pos; ++b) {
      const std::byte* page = cache->hack_page(0, 0, b).data();
      auto bf = [&](size_t off, size_t i) { return static_cast<double>(bf16_to_f32(reinterpret_cast<const uint16_t*>(page + off)[i])); };
      std::vector<double> sigma_q(static_cast<size_t>(hl.k_partitions()));
      for (int p = 0; p < hl.k_partitions(); ++p) {
        double lo = 1e300, hi = -1e300;
        for (int c = p * hl.k_group; c < (p + 1) * hl.k_group; ++c) {
          const double qt = static_cast<double>(q[c]) * scale * bf(hl.k_scale, static_cast<size_t>(c));
          lo = std::min(lo, qt);
          hi = std::max(hi, qt);
        }
        sigma_q[static_cast<size_t>(p)] = (hi - lo) / 255;
      }
      for (int p = 0; p < vp; ++p) {
        double lo = 1e300, hi = -1e300;
        for (int t = 0; t < s.block; ++t) {
          const int j = s.sinks + b * s.block + t;
          const double pt = j <= pos ? score[static_cast<size_t>(j)] / denom * bf(hl.v_scale, static_cast<size_t>(p * s.block + t)) : 0.0;
          lo = std::min(lo, pt);
          hi = std::max(hi, pt);
        }
        const double tau = (hi - lo) / 255;
        for (int t = 0; t < s.block && s.sinks + b * s.block + t <= pos; ++t)
          for (int c = p * vg; c < (p + 1) * vg; ++c) {
            const double vc = v_code(layout, h, page, t, c);
            var_p[static_cast<size_t>(c)] += tau * tau * vc * vc / 12;
          }
      }
      for (int t = 0; t < s.block; ++t) {
        const int j = s.sinks + b * s.block + t;
        if (j > pos) break;
        for (int c = 0; c < s.dim; ++c) {
          const double qc = static_cast<double>(q[c]) * scale, sk = bf(hl.k_scale, static_cast<size_t>(c));
          const double kc = k_code(layout, h, page, t, c), sq = sigma_q[static_cast<size_t>(c / hl.k_group)];
          var_e[static_cast<size_t>(j)] += qc * qc * kappa * sk * sk + sq * sq * kc * kc / 12;
          const double sv = bf(hl.v_scale, static_cast<size_t>((c / vg) * s.block + t));
          var_v[static_cast<size_t>(j) * s.dim + c] += kappa * sv * sv;
        }
      }
    }
    (void)vp;
    for (int c = 0; c < s.dim; ++c) {
      double var = var_p[static_cast<size_t>(c)];
      for (int j = 0; j <= pos; ++j) {
        const double a = score[static_cast<size_t>(j)] / denom;
        const double dv = data.v_val(j, h, c) - expect[static_cast<size_t>(c)];
        var += a * a * (dv * dv * var_e[static_cast<size_t>(j)] + var_v[static_cast<size_t>(j) * s.dim + c]);
      }
      const double err = out[c] - expect[static_cast<size_t>(c)];
      r.measured_mse += err * err;
      r.predicted_mse += var;
      r.signal += expect[static_cast<size_t>(c)] * expect[static_cast<size_t>(c)];
      ++count;
    }
  });
  r.measured_mse /= count;
  r.predicted_mse /= count;
  r.signal /= count;
  return r;
}

}  // namespace

TEST_CASE("approximation error follows the quantization error model", "[kv][hack_attention]") {
  for (int bits : {2, 4, 8})
    for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
      const Shape s{bits, 64, 128, 4, 4};
      ApproxResult total;
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        const ApproxResult r = approximation(s, rounding, seed);
        total.measured_mse += r.measured_mse / 3;
        total.predicted_mse += r.predicted_mse / 3;
        total.signal += r.signal / 3;
      }
      const double ratio = std::sqrt(total.measured_mse / total.predicted_mse);
      WARN(bits << "-bit " << rounding_name(rounding) << ": RMS error " << std::sqrt(total.measured_mse)
                << " predicted " << std::sqrt(total.predicted_mse) << " (ratio " << ratio << "), RMS output "
                << std::sqrt(total.signal));
      // The model must explain the error: within a factor of 1.5 either way.
      CHECK(ratio < 1.5);
      CHECK(ratio > 0.67);
    }
}
