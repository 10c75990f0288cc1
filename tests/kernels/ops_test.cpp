#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "hack/kernels/cpu_ops.h"
#include "support/test_support.h"

using namespace hack;

TEST_CASE("rmsnorm matches the definition", "[kernels][ops]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 2);
  const size_t n = 67;
  std::vector<float> x(2 * n), w(n), y(2 * n);
  for (float& f : x) f = d(rng);
  for (float& f : w) f = d(rng);
  cpu::rmsnorm(x.data(), w.data(), y.data(), 2, n, 1e-6f);
  for (size_t r = 0; r < 2; ++r) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (size_t i = 0; i < n; ++i) REQUIRE(test::close(y[r * n + i], x[r * n + i] * inv * w[i], 1e-6, 1e-5));
  }
}

TEST_CASE("rope rotates pairs (i, i + d/2) by position × inv_freq and keeps norms", "[kernels][ops]") {
  ModelConfig cfg;
  cfg.head_dim = 64;
  cfg.rope_theta = 10000.0f;
  std::vector<float> inv = cpu::rope_inv_freq(cfg);
  REQUIRE(inv.size() == 32);
  REQUIRE(inv[0] == 1.0f);
  REQUIRE(test::close(inv[1], std::pow(10000.0, -2.0 / 64), 0, 1e-6));
  std::vector<float> x(2 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<float> y = x;
  cpu::rope_apply(y.data(), 2, 64, 17, inv.data());
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      const float a = x[h * 64 + i], b = x[h * 64 + i + 32];
      const double ang = 17.0 * inv[i];
      REQUIRE(test::close(y[h * 64 + i], a * std::cos(ang) - b * std::sin(ang), 1e-5, 1e-5));
      REQUIRE(test::close(y[h * 64 + i + 32], b * std::cos(ang) + a * std::sin(ang), 1e-5, 1e-5));
    }
}

TEST_CASE("llama3 rope scaling: low frequencies divided by factor, high kept", "[kernels][ops]") {
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
  const auto scaled = cpu::rope_inv_freq(cfg);
  const auto base = cpu::rope_inv_freq(plain);
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

TEST_CASE("softmax sums to one and is shift invariant", "[kernels][ops]") {
  std::vector<float> a{1, 2, 3, 1000}, b{-999, -998, -997, 0};
  cpu::softmax(a.data(), a.size());
  cpu::softmax(b.data(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    s += a[i];
    REQUIRE(test::close(a[i], b[i], 1e-7, 1e-5));
  }
  REQUIRE(s == Approx(1.0));
}
