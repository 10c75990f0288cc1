// RoPE's inverse frequencies (model/rope.h), as Hugging Face computes them.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <vector>

#include "hack/model/rope.h"
#include "support/test_support.h"

using namespace hack;

TEST_CASE("rope inverse frequencies are theta^(-2i/d)", "[model][rope]") {
  ModelConfig cfg;
  cfg.head_dim = 64;
  cfg.rope_theta = 10000.0f;
  const std::vector<float> inv = rope_inv_freq(cfg);
  REQUIRE(inv.size() == 32);
  REQUIRE(inv[0] == 1.0f);
  REQUIRE(test::close(inv[1], std::pow(10000.0, -2.0 / 64), 0, 1e-6));
}

TEST_CASE("llama3 rope scaling: low frequencies divided by factor, high kept", "[model][rope]") {
  ModelConfig cfg;
  cfg.head_dim = 64;
  cfg.rope_theta = 500000.0f;
  cfg.rope_scaling.type = RopeScalingType::llama3;
  cfg.rope_scaling.factor = 8;
  cfg.rope_scaling.low_freq_factor = 1;
  cfg.rope_scaling.high_freq_factor = 4;
  cfg.rope_scaling.original_max_position_embeddings = 8192;
  ModelConfig plain = cfg;
  plain.rope_scaling.type = RopeScalingType::none;
  const auto scaled = rope_inv_freq(cfg);
  const auto base = rope_inv_freq(plain);
  REQUIRE(scaled.front() == base.front());                              // wavelength 2π < 2048
  REQUIRE(test::close(scaled.back(), base.back() / 8, 0, 1e-6));        // wavelength > 8192
  bool saw_medium = false;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wl = 2 * std::numbers::pi / base[i];
    if (wl > 2048 && wl < 8192) {
      saw_medium = true;
      REQUIRE(scaled[i] < base[i]);
      REQUIRE(scaled[i] > base[i] / 8);
    }
  }
  REQUIRE(saw_medium);
}

