#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "hack/core/dtype.h"
#include "hack/core/error.h"

using namespace hack;

TEST_CASE("bf16 round trip and rounding", "[core][dtype]") {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 1e-20f, 65504.0f}) {
    REQUIRE(bf16_to_f32(f32_to_bf16(f)) == Approx(f).epsilon(1.0 / 128));
  }
  // 1 + 2^-8 is halfway between bf16 values 1 and 1 + 2^-7: ties go to even (1).
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("f16 conversion is exact on every half value", "[core][dtype]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    INFO("half bits " << h);
    REQUIRE(f32_to_f16(f) == bits);
  }
  REQUIRE(f16_to_f32(0x3c00) == 1.0f);
  REQUIRE(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  REQUIRE(f32_to_f16(1e6f) == 0x7c00);
}

TEST_CASE("parse_dtype accepts safetensors names and rejects others", "[core][dtype]") {
  REQUIRE(parse_dtype("BF16") == DType::bf16);
  REQUIRE(parse_dtype("F32") == DType::f32);
  REQUIRE_THROWS_AS(parse_dtype("F8_E4M3"), Error);
}
