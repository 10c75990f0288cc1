// The host/device HACK arithmetic (hack/kernels/hack_quant_math.h) on the host: directed
// bf16 rounding, quantizer construction, codes, the u8 folding quantizer and exp, against
// values worked out by hand or with double precision.
#include "hack/kernels/hack_quant_math.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "hack/core/dtype.h"

using namespace hack;

TEST_CASE("bf16 directed rounding: exact values stay, others step outward", "[kv][hack_quant_math]") {
  // 1 + 2^-9 lies between bf16 1.0 (0x3f80) and 1 + 2^-7 (0x3f81).
  const float x = 1.0f + 0x1.0p-9f;
  CHECK(quant::bf16_round_down(x) == 0x3f80);
  CHECK(quant::bf16_round_up(x) == 0x3f81);
  CHECK(quant::bf16_round_down(-x) == 0xbf81);  // toward −∞: larger magnitude
  CHECK(quant::bf16_round_up(-x) == 0xbf80);
  CHECK(quant::bf16_round_down(2.0f) == 0x4000);
  CHECK(quant::bf16_round_up(2.0f) == 0x4000);
  CHECK(quant::bf16_round_down(0.0f) == 0x0000);
  CHECK(quant::bf16_round_up(0.0f) == 0x0000);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = normal(rng);
    INFO("seed 11, value " << v);
    const float down = quant::bf16_bits_to_f32(quant::bf16_round_down(v));
    const float up = quant::bf16_bits_to_f32(quant::bf16_round_up(v));
    REQUIRE(down <= v);
    REQUIRE(up >= v);
    REQUIRE((down == up) == (down == v));
  }
}

TEST_CASE("quantizer covers the range and codes are nearest", "[kv][hack_quant_math]") {
  uint16_t min_bits = 0, scale_bits = 0;
  // [−1, 2] with 2-bit codes: min −1 (exact), scale = 3/3 = 1 (exact).
  const quant::Quantizer q = quant::make_quantizer(-1.0f, 2.0f, 3, &min_bits, &scale_bits);
  CHECK(min_bits == f32_to_bf16(-1.0f));
  CHECK(scale_bits == f32_to_bf16(1.0f));
  CHECK(q.min == -1.0f);
  CHECK(q.scale == 1.0f);
  CHECK(quant::quantize_nearest(q, -1.0f) == 0);
  CHECK(quant::quantize_nearest(q, -0.4f) == 1);  // u = 0.6
  CHECK(quant::quantize_nearest(q, 0.5f) == 2);   // u = 1.5: half to even
  CHECK(quant::quantize_nearest(q, 1.5f) == 2);   // u = 2.5: half to even
  CHECK(quant::quantize_nearest(q, 2.0f) == 3);
  CHECK(quant::quantize_nearest(q, 9.0f) == 3);  // clamped
  CHECK(quant::quantize_nearest(q, -9.0f) == 0);
  CHECK(quant::quantize_stochastic(q, 0.25f, 0.2f) == 2);  // u = 1.25: 0.2 < 0.25 rounds up
  CHECK(quant::quantize_stochastic(q, 0.25f, 0.3f) == 1);

  // A scale that is not a bf16 value rounds up: [0, 1] over 15 levels, 1/15 → next bf16 above.
  const quant::Quantizer q4 = quant::make_quantizer(0.0f, 1.0f, 15, &min_bits, &scale_bits);
  CHECK(q4.scale >= 1.0f / 15.0f);
  CHECK(q4.scale < 1.0f / 15.0f * (1.0f + 0x1.0p-7f));
  CHECK(q4.min + q4.scale * 15.0f >= 1.0f);

  // Random groups: the stored range covers [lo, hi] and the code error is ≤ scale/2.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int i = 0; i < 2000; ++i) {
    float a = normal(rng), b = normal(rng);
    if (b < a) std::swap(a, b);
    for (int bits : {2, 4, 8}) {
      const int max_code = (1 << bits) - 1;
      const quant::Quantizer r = quant::make_quantizer(a, b, max_code, &min_bits, &scale_bits);
      INFO("seed 5, lo " << a << " hi " << b << " bits " << bits);
      REQUIRE(r.min <= a);
      REQUIRE(static_cast<double>(r.min) + static_cast<double>(r.scale) * max_code >= static_cast<double>(b));
      const float x = a + (b - a) * 0.37f;
      const int code = quant::quantize_nearest(r, x);
      REQUIRE(std::fabs(r.min + r.scale * static_cast<float>(code) - x) <= r.scale * 0.5f * 1.0001f);
    }
  }
}

TEST_CASE("constant groups get scale 0 and code 0, never NaN", "[kv][hack_quant_math]") {
  uint16_t min_bits = 0xffff, scale_bits = 0xffff;
  for (float v : {0.0f, -0.0f, 3.25f, -7.5f, 0x1.0p-100f}) {  // bf16-exact values
    INFO("value " << v);
    const quant::Quantizer q = quant::make_quantizer(v, v, 3, &min_bits, &scale_bits);
    CHECK(scale_bits == 0);
    CHECK(q.scale == 0.0f);
    CHECK(quant::quantize_nearest(q, v) == 0);
    CHECK(quant::quantize_stochastic(q, v, 0.9f) == 0);
    CHECK_FALSE(std::isnan(q.min + q.scale * 0.0f));
  }
  // A constant that bf16 cannot hold: min rounds below it, so the scale is tiny but not 0;
  // the value still reconstructs within half a step.
  const float odd = 1.0f + 0x1.0p-12f;
  const quant::Quantizer qo = quant::make_quantizer(odd, odd, 3, &min_bits, &scale_bits);
  CHECK(qo.scale > 0.0f);
  CHECK(std::fabs(qo.min + qo.scale * static_cast<float>(quant::quantize_nearest(qo, odd)) - odd) <= qo.scale * 0.5f);
  // −0 and +0 give the same stored min (a parallel min may meet them in either order).
  quant::make_quantizer(-0.0f, 1.0f, 3, &min_bits, &scale_bits);
  CHECK(min_bits == 0x0000);
  // The u8 folding quantizer: constant input → σ = 0, inverse 0, codes 0.
  CHECK(quant::u8_sigma(2.0f, 2.0f) == 0.0f);
  CHECK(quant::u8_inverse(0.0f) == 0.0f);
  CHECK(quant::u8_code(2.0f, 2.0f, 0.0f) == 0);
}

TEST_CASE("u8 folding quantizer: codes span 0..255", "[kv][hack_quant_math]") {
  const float lo = -1.0f, hi = 3.0f;
  const float sigma = quant::u8_sigma(lo, hi);
  CHECK(sigma == 4.0f / 255.0f);
  const float inv = quant::u8_inverse(sigma);
  CHECK(quant::u8_code(lo, lo, inv) == 0);
  CHECK(quant::u8_code(hi, lo, inv) == 255);
  CHECK(quant::u8_code(-5.0f, lo, inv) == 0);
  CHECK(quant::u8_code(50.0f, lo, inv) == 255);
  // σ = 1 exactly on [0, 255]: halves round to even.
  const float one = quant::u8_inverse(quant::u8_sigma(0.0f, 255.0f));
  CHECK(one == 1.0f);
  CHECK(quant::u8_code(127.5f, 0.0f, one) == 128);
  CHECK(quant::u8_code(126.5f, 0.0f, one) == 126);
  CHECK(quant::u8_code(3.4f, 0.0f, one) == 3);
}

TEST_CASE("code positions cover one byte per code slot", "[kv][hack_quant_math]") {
  // 2-bit K: chunk = 16 tokens × 16 channels; channel 5 is sub-tile 1 (bits 2..3),
  // byte 4·token + 5 % 4.
  const quant::CodePos k = quant::k_code_pos(2, 64, 3, 5);
  CHECK(k.byte == static_cast<size_t>(4 * 3 + 1));
  CHECK(k.shift == 2);
  // Token 17 of a 64-channel head: second row of chunks (64/16 = 4 chunks per row).
  CHECK(quant::k_code_pos(2, 64, 17, 0).byte == static_cast<size_t>(4 * 64 + 4));
  // 8-bit V: chunk = 16 channels × 4 tokens, byte 4·channel + token, shift 0.
  const quant::CodePos v = quant::v_code_pos(8, 64, 6, 18);
  CHECK(v.byte == static_cast<size_t>((1 * 16 + 1) * 64 + 4 * 2 + 2));
  CHECK(v.shift == 0);
  uint8_t codes[64] = {};
  codes[13] = 0b00101100;  // sub-tile 1 holds 3, sub-tile 2 holds 2
  CHECK(quant::code_at(codes, {13, 2}, 2) == 3);
  CHECK(quant::code_at(codes, {13, 4}, 2) == 2);
}

TEST_CASE("exp polynomial is within 2 ulp of exp", "[kv][hack_quant_math]") {
  for (float x = -87.0f; x <= 88.0f; x += 0.173f) {
    const double ref = std::exp(static_cast<double>(x));
    const double got = quant::exp_f32(x);
    INFO("x " << x);
    REQUIRE(std::fabs(got - ref) <= 2.5 * ref * 0x1.0p-23);
  }
  CHECK(quant::exp_f32(0.0f) == 1.0f);
  const float tiny = quant::exp_f32(-std::numeric_limits<float>::infinity());
  CHECK(tiny >= 0.0f);
  CHECK(tiny < 1e-37f);
}
