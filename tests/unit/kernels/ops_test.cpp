#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "hack/kernels/cpu/ops.h"
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

TEST_CASE("rope rotates pairs (i, i + d/2) by position × inv_freq and keeps norms", "[kernels][ops]") {
  std::vector<float> inv(32);
  for (int i = 0; i < 32; ++i) inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * i / 64));
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

TEST_CASE("fdc_project: each head slot becomes x·P[:, :d] of its KV head, 0 after d", "[kernels][fdc]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int rows = 3, kv_heads = 2, per_kv = 3, heads = kv_heads * per_kv, hd = 64;
  const std::vector<int> d_qk{16, 48};
  std::vector<float> proj(static_cast<size_t>(kv_heads) * hd * hd), x(static_cast<size_t>(rows) * heads * hd);
  for (float& v : proj) v = u(rng);
  for (float& v : x) v = u(rng);
  std::vector<float> got = x;
  cpu::fdc_project(got.data(), rows, heads, per_kv, hd, proj.data(), d_qk.data());
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      const int kv = h / per_kv;
      const float* in = &x[(static_cast<size_t>(r) * heads + h) * hd];
      const float* out = &got[(static_cast<size_t>(r) * heads + h) * hd];
      for (int j = 0; j < hd; ++j) {
        double ref = 0;
        if (j < d_qk[static_cast<size_t>(kv)])
          for (int i = 0; i < hd; ++i) ref += static_cast<double>(in[i]) * proj[(static_cast<size_t>(kv) * hd + i) * hd + j];
        INFO("row " << r << " head " << h << " dim " << j);
        REQUIRE(std::fabs(out[j] - ref) <= 1e-4 * (1 + std::fabs(ref)));
      }
    }
}

TEST_CASE("swiglu matches silu(gate) * up, and an element's value does not depend on where the call starts",
          "[kernels][ops]") {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
  const size_t n = 1003;
  std::vector<float> gate(n), up(n), out(n), shifted(n);
  for (size_t i = 0; i < n; ++i) {
    gate[i] = dist(rng);
    up[i] = dist(rng) / 10;
  }
  gate[0] = -100.0f;  // exp overflow side: silu → -0
  gate[1] = 100.0f;   // silu → gate
  cpu::swiglu(gate.data(), up.data(), out.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    INFO("i " << i << " gate " << g);
    REQUIRE(std::abs(out[i] - want) <= 1e-6 * std::abs(want) + 1e-30);
  }
  for (size_t start : {size_t{1}, size_t{5}, size_t{13}}) {
    cpu::swiglu(gate.data() + start, up.data() + start, shifted.data() + start, n - start);
    for (size_t i = start; i < n; ++i) REQUIRE(shifted[i] == out[i]);
  }
}
