// The AVX2 clip search of 2-bit K (cpu::clip_k_ranges_2bit) against the scalar definition
// (quant::clip_k_range_2bit, the one the CUDA quantizer evaluates): bit-identical ranges on
// blocks built to reach its corners — outliers, constant and zero channels, −0, ranges at the
// edge of bf16 rounding, tiny and huge magnitudes, channel counts that leave a scalar tail.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/dtype.h"
#include "hack/kernels/cpu/hack_quantize.h"

using namespace hack;

namespace {

// Channel c of a block of `tokens` rows × `dim`, in one of several shapes chosen by c.
std::vector<uint16_t> corner_block(int tokens, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> k(static_cast<size_t>(tokens) * static_cast<size_t>(dim));
  for (int c = 0; c < dim; ++c) {
    const int shape = static_cast<int>(rng() % 8);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (int t = 0; t < tokens; ++t) {
      float x = 0;
      switch (shape) {
        case 0: x = normal(rng) * scale; break;                                             // plain
        case 1: x = (t % 13 == 0 ? 9.0f : normal(rng)) * scale; break;                      // outliers
        case 2: x = 1.5f * scale; break;                                                     // constant
        case 3: x = (t % 2 == 0) ? 0.0f : -0.0f; break;                                      // zeros of both signs
        case 4: x = scale * (1.0f + static_cast<float>(rng() % 3) * 0.0078125f); break;      // a few bf16 steps
        case 5: x = std::abs(normal(rng)) * scale; break;                                    // min near 0
        case 6: x = static_cast<float>(static_cast<int>(rng() % 4)) * scale - scale; break;  // exactly 4 levels
        default: {  // arbitrary bf16 bits of one exponent band
          const uint32_t bits = ((rng() & 1u) << 15) | ((120u + rng() % 14) << 7) | (rng() & 0x7fu);
          k[static_cast<size_t>(t) * static_cast<size_t>(dim) + static_cast<size_t>(c)] = static_cast<uint16_t>(bits);
          continue;
        }
      }
      k[static_cast<size_t>(t) * static_cast<size_t>(dim) + static_cast<size_t>(c)] = f32_to_bf16(x);
    }
  }
  return k;
}

}  // namespace

TEST_CASE("the AVX2 2-bit K clip search equals the scalar definition bit for bit", "[kernels][hack_quantize]") {
  int channels_compared = 0, clipped = 0;
  for (const int tokens : {64, 16, 128, 1, 2}) {
    for (const int dim : {64, 128, 72, 5}) {
      for (uint32_t seed = 1; seed <= 6; ++seed) {
        const std::vector<uint16_t> k = corner_block(tokens, dim, seed * 7919u + static_cast<uint32_t>(tokens * dim));
        std::vector<float> lo(static_cast<size_t>(dim)), hi(static_cast<size_t>(dim));
        for (int c = 0; c < dim; ++c) {
          lo[static_cast<size_t>(c)] = hi[static_cast<size_t>(c)] = bf16_to_f32(k[static_cast<size_t>(c)]);
          for (int t = 1; t < tokens; ++t) {
            const float x = bf16_to_f32(k[static_cast<size_t>(t) * static_cast<size_t>(dim) + static_cast<size_t>(c)]);
            lo[static_cast<size_t>(c)] = std::min(lo[static_cast<size_t>(c)], x);
            hi[static_cast<size_t>(c)] = std::max(hi[static_cast<size_t>(c)], x);
          }
        }
        std::vector<float> lo_s = lo, hi_s = hi, lo_v = lo, hi_v = hi;
        cpu::clip_k_ranges_2bit(k.data(), static_cast<size_t>(dim), tokens, dim, lo_s.data(), hi_s.data(), CpuIsa::scalar);
        cpu::clip_k_ranges_2bit(k.data(), static_cast<size_t>(dim), tokens, dim, lo_v.data(), hi_v.data(), CpuIsa::avx2);
        for (size_t c = 0; c < static_cast<size_t>(dim); ++c) {
          INFO("tokens " << tokens << " dim " << dim << " seed " << seed << " channel " << c);
          REQUIRE(std::bit_cast<uint32_t>(lo_v[c]) == std::bit_cast<uint32_t>(lo_s[c]));
          REQUIRE(std::bit_cast<uint32_t>(hi_v[c]) == std::bit_cast<uint32_t>(hi_s[c]));
          ++channels_compared;
          if (lo_s[c] != lo[c] || hi_s[c] != hi[c]) ++clipped;
        }
      }
    }
  }
  // The corners above must include real clipping, or the comparison proves little.
  CHECK(clipped > channels_compared / 10);
}
