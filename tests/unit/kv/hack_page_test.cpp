// HACK page format: layout sizes, header round trip and validation, quantization error,
// code sums, stochastic rounding (seeded, unbiased).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kv/hack_page.h"

using namespace hack;

namespace {

HackPageParams params_for(int bits, int block, int heads, int dim) {
  HackPageParams p;
  p.k_bits = p.v_bits = bits;
  p.block_tokens = block;
  p.heads.assign(static_cast<size_t>(heads), HackHeadDims{dim, dim});
  return p;
}

// [tokens][dim] bf16 with per-channel offsets and a few outlier channels, like post-RoPE K.
std::vector<uint16_t> random_block(int tokens, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> bias(static_cast<size_t>(dim)), gain(static_cast<size_t>(dim));
  for (int c = 0; c < dim; ++c) {
    bias[static_cast<size_t>(c)] = 0.5f * normal(rng);
    gain[static_cast<size_t>(c)] = c % 16 == 3 ? 6.0f : 1.0f;
  }
  std::vector<uint16_t> out(static_cast<size_t>(tokens) * static_cast<size_t>(dim));
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < dim; ++c)
      out[static_cast<size_t>(t) * dim + c] = f32_to_bf16(bias[static_cast<size_t>(c)] + gain[static_cast<size_t>(c)] * normal(rng));
  return out;
}

}  // namespace

TEST_CASE("bf16 directed rounding brackets the value", "[kv][hack_page]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = normal(rng);
    const float down = bf16_to_f32(bf16_round_down(x)), up = bf16_to_f32(bf16_round_up(x));
    REQUIRE(down <= x);
    REQUIRE(up >= x);
    REQUIRE(up - down <= std::fabs(x) * 0x1.0p-7f);
  }
  REQUIRE(bf16_to_f32(bf16_round_down(1.5f)) == 1.5f);
  REQUIRE(bf16_to_f32(bf16_round_up(-1.5f)) == -1.5f);
}

TEST_CASE("code index maps are bijections onto the packed bytes", "[kv][hack_page]") {
  for (int bits : {2, 4, 8}) {
    const int tokens = 32, dim = 48;
    std::set<std::pair<size_t, int>> k_seen, v_seen;
    for (int t = 0; t < tokens; ++t)
      for (int c = 0; c < dim; ++c) {
        const cpu::HackCodePos k = cpu::hack_k_code_pos(bits, dim, t, c);
        const cpu::HackCodePos v = cpu::hack_v_code_pos(bits, tokens, t, c);
        REQUIRE(k.byte < static_cast<size_t>(tokens * dim * bits / 8));
        REQUIRE(v.byte < static_cast<size_t>(tokens * dim * bits / 8));
        REQUIRE(k.shift % bits == 0);
        REQUIRE(k.shift + bits <= 8);
        k_seen.insert({k.byte, k.shift});
        v_seen.insert({v.byte, v.shift});
      }
    REQUIRE(k_seen.size() == static_cast<size_t>(tokens * dim));
    REQUIRE(v_seen.size() == static_cast<size_t>(tokens * dim));
  }
}

TEST_CASE("page layout sizes and bytes per token", "[kv][hack_page]") {
  // Llama-3-8B layer: 8 KV heads × 128. bf16 stores 2 · 8 · 128 · 2 = 4096 bytes per token.
  const double bf16_per_token = 4096.0;
  const HackPageLayout l2(params_for(2, 64, 8, 128));
  // Per head per 64-token page: K and V codes 2 · 64·128/4 = 4096, K min/scale 512,
  // K sums 2 partitions · 64 u8 = 128, V min/scale 2 · 2 · 64 · 2 = 512, V sums 128 u8.
  REQUIRE(l2.head(0).bytes == 4096 + 512 + 128 + 512 + 128);
  REQUIRE(l2.k_sum_bytes() == 1);  // 64 channels · 3 = 192 fits u8
  REQUIRE(l2.v_sum_bytes() == 1);  // 64 tokens · 3 = 192 fits u8
  REQUIRE(l2.header_bytes() == 192);
  REQUIRE(l2.page_bytes() == 192 + 8 * 5376);
  REQUIRE(l2.bytes_per_token() / bf16_per_token <= 0.17);
  const HackPageLayout l4(params_for(4, 64, 8, 128));
  REQUIRE(l4.k_sum_bytes() == 2);
  REQUIRE(l4.bytes_per_token() < l2.bytes_per_token() * 2);
  const HackPageLayout l8(params_for(8, 128, 8, 128));
  REQUIRE(l8.v_sum_bytes() == 2);
  for (int bits : {2, 4, 8})
    for (int block : {32, 64, 128}) {
      const HackPageLayout l(params_for(bits, block, 8, 128));
      INFO("bits " << bits << " block " << block);
      CHECK(l.page_bytes() % 64 == 0);
      for (int h = 0; h < 8; ++h) CHECK(l.head(h).offset % 64 == 0);
    }
}

TEST_CASE("page params are validated", "[kv][hack_page]") {
  REQUIRE_THROWS_AS(HackPageLayout(params_for(3, 64, 2, 64)), Error);
  REQUIRE_THROWS_AS(HackPageLayout(params_for(2, 40, 2, 64)), Error);
  REQUIRE_THROWS_AS(HackPageLayout(params_for(2, 64, 2, 72)), Error);
  REQUIRE_THROWS_AS(HackPageLayout(params_for(2, 64, 0, 64)), Error);
  REQUIRE_THROWS_AS(HackPageLayout(params_for(8, 512, 2, 64)), Error);  // u16 V sums overflow
}

TEST_CASE("header round trip and validation on arrival", "[kv][hack_page]") {
  HackPageParams p = params_for(2, 64, 3, 64);
  p.heads[1] = {48, 80};  // variable per-head dims (FDC)
  const HackPageLayout layout(p);
  REQUIRE(layout.head(1).k_group == 48);
  REQUIRE(layout.head(1).v_group == 16);
  std::vector<std::byte> page(layout.page_bytes());
  layout.write_header(page.data(), 5, 68, Rounding::stochastic);
  const HackPageLayout parsed = HackPageLayout::from_page(page.data(), page.size());
  REQUIRE(parsed == layout);
  REQUIRE(HackPageLayout::page_layer(page.data()) == 5);
  REQUIRE(HackPageLayout::page_first_token(page.data()) == 68);
  REQUIRE_NOTHROW(layout.validate(page.data(), page.size()));

  SECTION("wrong size") { REQUIRE_THROWS_AS(layout.validate(page.data(), page.size() - 64), Error); }
  SECTION("truncated") { REQUIRE_THROWS_AS(HackPageLayout::from_page(page.data(), 40), Error); }
  SECTION("bad magic") {
    page[0] = std::byte{0};
    REQUIRE_THROWS_WITH(HackPageLayout::from_page(page.data(), page.size()), Catch::Contains("magic"));
  }
  SECTION("future version") {
    const uint16_t v = kHackPageVersion + 1;
    std::memcpy(page.data() + 4, &v, 2);
    REQUIRE_THROWS_WITH(layout.validate(page.data(), page.size()), Catch::Contains("version"));
  }
  SECTION("version 1 (one bit width for K and V) is refused by name") {
    const uint16_t v = 1;
    std::memcpy(page.data() + 4, &v, 2);
    REQUIRE_THROWS_WITH(HackPageLayout::from_page(page.data(), page.size()), Catch::Contains("version 1"));
  }
  SECTION("different V bit width") {
    HackPageParams v4 = params_for(2, 64, 2, 64);
    v4.v_bits = 4;
    const HackPageLayout other(v4);
    REQUIRE(!(other == layout));
    std::vector<std::byte> page4(other.page_bytes());
    other.write_header(page4.data(), 0, 68, Rounding::nearest);
    REQUIRE(HackPageLayout::from_page(page4.data(), page4.size()).v_bits() == 4);
    REQUIRE(HackPageLayout::from_page(page4.data(), page4.size()).k_bits() == 2);
    REQUIRE_THROWS_WITH(layout.validate(page4.data(), page4.size()), Catch::Contains("bytes"));
  }
  SECTION("different dims") {
    const HackPageLayout other(params_for(2, 64, 3, 64));
    REQUIRE_THROWS_AS(other.validate(page.data(), page.size()), Error);
  }
  SECTION("corrupt head table") {
    HackHeadEntry e;
    std::memcpy(&e, page.data() + 64 + 16, sizeof e);
    e.offset += 64;
    std::memcpy(page.data() + 64 + 16, &e, sizeof e);
    REQUIRE_THROWS_AS(HackPageLayout::from_page(page.data(), page.size()), Error);
  }
}

TEST_CASE("round-to-nearest quantization error and code sums", "[kv][hack_page]") {
  for (int bits : {2, 4, 8})
    for (int block : {16, 64}) {
      const int dim = 64;
      const HackPageLayout layout(params_for(bits, block, 1, dim));
      const auto k = random_block(block, dim, 11u + static_cast<uint32_t>(bits));
      const auto v = random_block(block, dim, 99u + static_cast<uint32_t>(bits));
      std::vector<std::byte> page(layout.page_bytes());
      layout.write_header(page.data(), 0, 0, Rounding::nearest);
      quantize_k_block(layout, 0, k.data(), dim, RoundingSpec{}, page.data());
      quantize_v_block(layout, 0, v.data(), dim, RoundingSpec{}, page.data());
      std::vector<float> kd(k.size()), vd(v.size());
      dequantize_k_block(layout, 0, page.data(), kd.data());
      dequantize_v_block(layout, 0, page.data(), vd.data());
      const HackHeadLayout& hl = layout.head(0);
      const auto* kmin = reinterpret_cast<const uint16_t*>(page.data() + hl.k_min);
      const auto* kscale = reinterpret_cast<const uint16_t*>(page.data() + hl.k_scale);
      const auto* vscale = reinterpret_cast<const uint16_t*>(page.data() + hl.v_scale);
      INFO("bits " << bits << " block " << block);
      for (int t = 0; t < block; ++t)
        for (int c = 0; c < dim; ++c) {
          const size_t i = static_cast<size_t>(t) * dim + c;
          // |x − x̂| ≤ scale/2 (+ fp32 rounding of min + scale·code) inside the stored range;
          // 2-bit K is clipped (quant::clip_k_range_2bit): outside, x̂ is the nearer end.
          const float ks = bf16_to_f32(kscale[c]), lo = bf16_to_f32(kmin[c]);
          const float hi = lo + ks * static_cast<float>((1 << bits) - 1), x = bf16_to_f32(k[i]);
          const float slack = 1e-6f * (1 + std::fabs(kd[i]));
          if (bits != 2) REQUIRE(lo <= x);
          if (x < lo) REQUIRE(std::fabs(kd[i] - lo) <= slack);
          else if (x > hi) REQUIRE(std::fabs(kd[i] - hi) <= slack);
          else REQUIRE(std::fabs(x - kd[i]) <= 0.5f * ks + slack);
          const float vs = bf16_to_f32(vscale[static_cast<size_t>(c / hl.v_group) * block + t]);
          REQUIRE(std::fabs(bf16_to_f32(v[i]) - vd[i]) <= 0.5f * vs + 1e-6f * (1 + std::fabs(vd[i])));
        }
      // Stored code sums equal the sums of the stored codes.
      for (int p = 0; p < hl.k_partitions(); ++p)
        for (int t = 0; t < block; ++t) {
          uint32_t sum = 0;
          for (int c = p * hl.k_group; c < (p + 1) * hl.k_group; ++c) sum += static_cast<uint32_t>(k_code(layout, 0, page.data(), t, c));
          const size_t i = static_cast<size_t>(p) * block + t;
          const uint32_t stored = layout.k_sum_bytes() == 1 ? reinterpret_cast<const uint8_t*>(page.data() + hl.k_sums)[i]
                                                            : reinterpret_cast<const uint16_t*>(page.data() + hl.k_sums)[i];
          REQUIRE(stored == sum);
        }
      for (int c = 0; c < dim; ++c) {
        uint32_t sum = 0;
        for (int t = 0; t < block; ++t) sum += static_cast<uint32_t>(v_code(layout, 0, page.data(), t, c));
        const uint32_t stored = layout.v_sum_bytes() == 1 ? reinterpret_cast<const uint8_t*>(page.data() + hl.v_sums)[c]
                                                          : reinterpret_cast<const uint16_t*>(page.data() + hl.v_sums)[c];
        REQUIRE(stored == sum);
      }
      // Every code level is used somewhere (the range is covered, not wasted).
      std::set<int> levels;
      for (int t = 0; t < block; ++t)
        for (int c = 0; c < dim; ++c) levels.insert(k_code(layout, 0, page.data(), t, c));
      REQUIRE(*levels.begin() == 0);
      REQUIRE(*levels.rbegin() >= (1 << bits) - 2);
    }
}

TEST_CASE("constant channels quantize exactly", "[kv][hack_page]") {
  const HackPageLayout layout(params_for(2, 16, 1, 16));
  std::vector<uint16_t> k(16 * 16, f32_to_bf16(0.75f));
  std::vector<std::byte> page(layout.page_bytes());
  quantize_k_block(layout, 0, k.data(), 16, RoundingSpec{}, page.data());
  quantize_v_block(layout, 0, k.data(), 16, RoundingSpec{}, page.data());
  std::vector<float> out(k.size());
  dequantize_k_block(layout, 0, page.data(), out.data());
  for (float x : out) REQUIRE(x == 0.75f);
  dequantize_v_block(layout, 0, page.data(), out.data());
  for (float x : out) REQUIRE(x == 0.75f);
}

TEST_CASE("2-bit K ranges are clipped to the least squared error", "[kv][hack_page]") {
  // Nearest rounding of 2-bit K picks the range of least squared error among clipped
  // candidates, so it never does worse than min–max on the block it quantizes.
  for (const uint32_t seed : {3u, 4u, 5u}) {
    const int block = 64, dim = 64;
    const HackPageLayout layout(params_for(2, block, 1, dim));
    auto k = random_block(block, dim, seed);
    for (int t = 0; t < block; t += 13) k[static_cast<size_t>(t) * dim + 5] = f32_to_bf16(9.0f);  // outliers
    std::vector<std::byte> page(layout.page_bytes());
    layout.write_header(page.data(), 0, 0, Rounding::nearest);
    quantize_k_block(layout, 0, k.data(), dim, RoundingSpec{}, page.data());
    std::vector<float> kd(k.size());
    dequantize_k_block(layout, 0, page.data(), kd.data());
    for (int c = 0; c < dim; ++c) {
      float lo = 1e30f, hi = -1e30f;
      for (int t = 0; t < block; ++t) {
        lo = std::min(lo, bf16_to_f32(k[static_cast<size_t>(t) * dim + c]));
        hi = std::max(hi, bf16_to_f32(k[static_cast<size_t>(t) * dim + c]));
      }
      uint16_t mb, sb;
      const quant::Quantizer mm = quant::make_quantizer(lo, hi, 3, &mb, &sb);
      double err = 0, err_minmax = 0;
      for (int t = 0; t < block; ++t) {
        const float x = bf16_to_f32(k[static_cast<size_t>(t) * dim + c]);
        const float y = mm.min + mm.scale * static_cast<float>(quant::quantize_nearest(mm, x));
        err += (x - kd[static_cast<size_t>(t) * dim + c]) * (x - kd[static_cast<size_t>(t) * dim + c]);
        err_minmax += (x - y) * (x - y);
      }
      INFO("seed " << seed << " channel " << c);
      REQUIRE(err <= err_minmax * (1 + 1e-5) + 1e-9);
    }
  }
}

TEST_CASE("stochastic rounding is seeded and unbiased", "[kv][hack_page]") {
  const int block = 16, dim = 32;
  const HackPageLayout layout(params_for(2, block, 1, dim));
  const auto k = random_block(block, dim, 5);
  std::vector<std::byte> a(layout.page_bytes()), b(layout.page_bytes());
  const RoundingSpec s1{Rounding::stochastic, 1, 0, 0};
  quantize_k_block(layout, 0, k.data(), dim, s1, a.data());
  quantize_k_block(layout, 0, k.data(), dim, s1, b.data());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);  // same seed, same codes
  const RoundingSpec s2{Rounding::stochastic, 2, 0, 0};
  quantize_k_block(layout, 0, k.data(), dim, s2, b.data());
  REQUIRE(std::memcmp(a.data() + layout.head(0).k_codes, b.data() + layout.head(0).k_codes, 128) != 0);

  // Mean of the dequantized value over N seeds → x. Per element the rounding error is
  // a two-point variable with variance ≤ scale²/4, so |mean − x| ≤ 5·scale/(2√N) fails
  // with probability < 1e-6 per element.
  const int N = 2000;
  std::vector<double> mean(static_cast<size_t>(block * dim), 0.0), mean_v(mean.size(), 0.0);
  std::vector<float> kd(mean.size()), vd(mean.size());
  for (int s = 0; s < N; ++s) {
    const RoundingSpec spec{Rounding::stochastic, static_cast<uint64_t>(1000 + s), 3, 64};
    quantize_k_block(layout, 0, k.data(), dim, spec, a.data());
    quantize_v_block(layout, 0, k.data(), dim, spec, a.data());
    dequantize_k_block(layout, 0, a.data(), kd.data());
    dequantize_v_block(layout, 0, a.data(), vd.data());
    for (size_t i = 0; i < mean.size(); ++i) {
      mean[i] += kd[i] / N;
      mean_v[i] += vd[i] / N;
    }
  }
  const auto* kscale = reinterpret_cast<const uint16_t*>(a.data() + layout.head(0).k_scale);
  double worst = 0.0, total_bias = 0.0;
  for (int t = 0; t < block; ++t)
    for (int c = 0; c < dim; ++c) {
      const size_t i = static_cast<size_t>(t) * dim + c;
      const double x = bf16_to_f32(k[i]);
      const double sd = bf16_to_f32(kscale[c]) / 2.0 / std::sqrt(static_cast<double>(N));
      worst = std::max(worst, std::fabs(mean[i] - x) / sd);
      total_bias += (mean[i] - x);
    }
  INFO("largest |mean − x| in standard errors: " << worst);
  REQUIRE(worst < 5.0);
  REQUIRE(std::fabs(total_bias / static_cast<double>(mean.size())) < 0.01);
  const auto* vscale = reinterpret_cast<const uint16_t*>(a.data() + layout.head(0).v_scale);
  double worst_v = 0.0;
  for (int t = 0; t < block; ++t)
    for (int c = 0; c < dim; ++c) {
      const size_t i = static_cast<size_t>(t) * dim + c;
      const double scale = bf16_to_f32(vscale[static_cast<size_t>(c / layout.head(0).v_group) * block + t]);
      worst_v = std::max(worst_v, std::fabs(mean_v[i] - bf16_to_f32(k[i])) / (scale / 2.0 / std::sqrt(double{N})));
    }
  INFO("V: largest |mean − x| in standard errors: " << worst_v);
  REQUIRE(worst_v < 5.0);
}
