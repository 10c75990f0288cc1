// Matmul on GGUF block weights (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k) against simple paths:
// every ISA's dot against the scalar dot; matmul()/matmul_many()/matmul_swiglu() and
// gemv_rows() against x · dequantize(W)ᵀ in double, with the error the int8 activations allow.
// Blocks are random bytes with their f16 scales set: ordinary ones and extremes (65504, the
// smallest subnormal 2^-24, 0, negative).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/quant_blocks.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/matmul.h"
#include "hack/kernels/cpu/quant_dot.h"

using namespace hack;

namespace {

constexpr DType kBlockTypes[] = {DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0,
                                 DType::q4_k, DType::q5_k, DType::q6_k};

// Byte offsets of a block's f16 scale fields (core/quant_blocks.h).
std::vector<size_t> half_fields(DType t) {
  switch (t) {
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q6_k: return {208};
    default: return {0};
  }
}

// [out][in] random blocks; with `extreme`, block b's first scale cycles through the extremes.
Tensor random_blocks(DType t, int64_t out, int64_t in, std::mt19937_64& rng, bool extreme) {
  Tensor w = Tensor::empty(t, {out, in});
  auto* bytes = static_cast<unsigned char*>(w.raw());
  for (size_t i = 0; i < w.bytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  static constexpr float kExtremes[] = {65504.0f, 5.9604645e-8f, 0.0f, -1.5f, 6.1e-5f, -65504.0f};
  std::normal_distribution<float> scale(0.0f, 0.02f);
  const size_t block_bytes = dtype_block_bytes(t), blocks = w.bytes() / block_bytes;
  for (size_t b = 0; b < blocks; ++b)
    for (size_t k = 0; k < half_fields(t).size(); ++k) {
      const float v = extreme && k == 0 && b % 3 == 0 ? kExtremes[b / 3 % std::size(kExtremes)] : scale(rng);
      const uint16_t h = f32_to_f16(v);
      std::memcpy(bytes + b * block_bytes + half_fields(t)[k], &h, 2);
    }
  return w;
}

std::vector<float> dequantized(const Tensor& w) {
  std::vector<float> out(static_cast<size_t>(w.numel()));
  convert_to_f32(w.dtype(), w.raw(), out.data(), out.size());
  return out;
}

std::vector<float> random_x(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// The bound on |x·ŵ − x̂·ŵ| from quantizing x per block (|x − x̂| ≤ amax_b / 254 per element,
// d/2 with d = amax/127), plus fp32 sums of the products: (in + 64)·2^-23·Σ|ŵ||x| (the GEMV
// sums its per-block terms in fp32, the sgemm path its products; each rounding ≤ 2^-24 of a
// partial sum, partial sums ≤ Σ|ŵ||x|, and x̂'s own products ≤ (1 + 1/254)·Σ|ŵ||x| + the
// first term). Mins and offsets bring terms up to 4·max|ŵ| of a block per element (|min| ≤
// max|ŵ| + 15 d ≤ 3 max|ŵ|): the last term.
double matmul_bound(const float* x, const float* w_row, size_t in, size_t block) {
  double quant = 0, abs_dot = 0, offsets = 0;
  for (size_t b = 0; b < in; b += block) {
    double amax = 0, wsum = 0, wmax = 0, xsum = 0;
    for (size_t i = b; i < b + block; ++i) {
      amax = std::max(amax, std::abs(double(x[i])));
      wsum += std::abs(double(w_row[i]));
      wmax = std::max(wmax, std::abs(double(w_row[i])));
      xsum += std::abs(double(x[i]));
      abs_dot += std::abs(double(w_row[i]) * x[i]);
    }
    quant += amax / 254.0 * wsum * (1 + 1e-6);
    offsets += 4 * wmax * xsum;
  }
  return quant + (double(in) + 64) * 0x1p-23 * (abs_dot + offsets);
}

}  // namespace

TEST_CASE("quantized activations: |x − d·q| ≤ d/2, block sums, zero blocks", "[kernels][quant]") {
  std::mt19937_64 rng(481);
  std::vector<float> x = random_x(512, rng, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // a zero block
  x[100] = 1e30f;
  x[300] = -1e-30f;
  std::vector<cpu::BlockQ8x32> q32(16);
  cpu::quantize_q8x32(x.data(), x.size(), q32.data());
  for (size_t b = 0; b < q32.size(); ++b) {
    int sum = 0;
    for (size_t j = 0; j < 32; ++j) {
      INFO("block " << b << " element " << j);
      REQUIRE(std::abs(x[32 * b + j] - q32[b].d * q32[b].qs[j]) <= q32[b].d * 0.5f * (1 + 1e-6f));
      REQUIRE(q32[b].qs[j] >= -127);
      sum += q32[b].qs[j];
    }
    REQUIRE(q32[b].s == q32[b].d * static_cast<float>(sum));
  }
  CHECK(q32[1].d == 0.0f);
  std::vector<cpu::BlockQ8K> qk(2);
  cpu::quantize_q8k(x.data(), x.size(), qk.data());
  for (size_t b = 0; b < 2; ++b)
    for (size_t k = 0; k < 16; ++k) {
      int sum = 0;
      for (size_t j = 16 * k; j < 16 * k + 16; ++j) {
        REQUIRE(std::abs(x[256 * b + j] - qk[b].d * qk[b].qs[j]) <= qk[b].d * 0.5f * (1 + 1e-6f));
        sum += qk[b].qs[j];
      }
      REQUIRE(sum == qk[b].bsums[k]);
    }
  CHECK_THROWS(cpu::quantize_q8k(x.data(), 300, qk.data()));

  // A diverged activation (inf, NaN) makes its block's dots non-finite, not undefined.
  x[5] = std::numeric_limits<float>::infinity();
  x[40] = std::numeric_limits<float>::quiet_NaN();
  cpu::quantize_q8x32(x.data(), x.size(), q32.data());
  CHECK(std::isnan(q32[0].d));
  CHECK(std::isnan(q32[1].d));
  CHECK(q32[2].d > 0.0f);
  CHECK(q32[0].qs[5] == 0);
  std::mt19937_64 wr(3);
  const Tensor w = random_blocks(DType::q8_0, 1, 512, wr, false);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_supports(isa)) CHECK_FALSE(std::isfinite(cpu::quant_dot(isa, DType::q8_0)(w.raw(), q32.data(), 16)));
}

// The integer part of every dot is exact on every ISA; the fp32 sums of per-block terms are
// taken in other orders (8 lanes, then a horizontal sum), so SIMD and scalar may differ by
// (blocks + 8)·2^-23·Σ|terms|, with Σ|terms| ≤ 4·Σ_b max|ŵ_b|·Σ|x̂_b| (see matmul_bound).
// AVX2 and AVX-512 VNNI run the same fp32 operations on the same integers: the same bits.
TEST_CASE("quantized dot: AVX2 and AVX-512 VNNI equal the scalar reference", "[kernels][quant]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (DType t : kBlockTypes) {
    INFO(dtype_name(t));
    const size_t block = dtype_block_elems(t);
    for (size_t blocks : {size_t{1}, size_t{3}, size_t{17}}) {
      const size_t in = blocks * block;
      for (bool extreme : {false, true}) {
        const Tensor w = random_blocks(t, 4, static_cast<int64_t>(in), rng, extreme);
        const std::vector<float> wf = dequantized(w);
        for (float xscale : {1.0f, 1e-6f, 1e4f}) {
          const std::vector<float> x = random_x(in, rng, xscale);
          std::vector<unsigned char> xq(cpu::quantized_activation_bytes(t, in));
          cpu::quantize_activations(t, x.data(), in, xq.data());
          std::vector<float> xhat(in);
          for (size_t b = 0; b < in / 32; ++b) {  // x̂ from the codes (both kinds store d per block)
            if (cpu::uses_q8k(t)) {
              const auto* q = reinterpret_cast<const cpu::BlockQ8K*>(xq.data()) + b / 8;
              for (size_t j = 0; j < 32; ++j) xhat[32 * b + j] = q->d * q->qs[32 * (b % 8) + j];
            } else {
              const auto* q = reinterpret_cast<const cpu::BlockQ8x32*>(xq.data()) + b;
              for (size_t j = 0; j < 32; ++j) xhat[32 * b + j] = q->d * q->qs[j];
            }
          }
          for (int64_t o = 0; o < 4; ++o) {
            const unsigned char* row = static_cast<const unsigned char*>(w.raw()) + o * dtype_bytes(t, in);
            const float ref = cpu::quant_dot(CpuIsa::scalar, t)(row, xq.data(), blocks);
            double exact = 0, terms = 0;
            for (size_t b = 0; b < in; b += block) {
              double wmax = 0, xs = 0;
              for (size_t i = b; i < b + block; ++i) {
                exact += double(wf[o * in + i]) * xhat[i];
                wmax = std::max(wmax, std::abs(double(wf[o * in + i])));
                xs += std::abs(double(xhat[i]));
              }
              terms += 4 * wmax * xs;
            }
            const double tol = (double(blocks) + 8) * 0x1p-23 * terms + 1e-30;
            INFO("blocks " << blocks << " extreme " << extreme << " x scale " << xscale << " row " << o);
            // The scalar dot itself against the dequantized weights times x̂ in double.
            REQUIRE(std::abs(ref - exact) <= tol);
            float avx2 = 0;
            for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
              if (!cpu_supports(isa)) continue;
              const float got = cpu::quant_dot(isa, t)(row, xq.data(), blocks);
              INFO("isa " << cpu_isa_name(isa) << " got " << got << " scalar " << ref << " tol " << tol);
              REQUIRE(std::abs(double(got) - ref) <= tol);
              if (isa == CpuIsa::avx2) avx2 = got;
              if (isa == CpuIsa::avx512) REQUIRE(std::memcmp(&got, &avx2, 4) == 0);
            }
          }
        }
      }
    }
  }
}

// The multi-row kernels share each block's unpacking between rows and nothing else: every row
// must equal the single-row dot bit for bit, on every ISA, for 1..11 rows (8 at a time, then the rest).
TEST_CASE("quantized dot: the rows kernels equal the single-row dot bit for bit", "[kernels][quant]") {
  std::mt19937_64 rng(4849);
  for (DType t : kBlockTypes) {
    INFO(dtype_name(t));
    const size_t in = 2 * 256, blocks = in / dtype_block_elems(t);
    const Tensor w = random_blocks(t, 1, static_cast<int64_t>(in), rng, true);
    const size_t xrow = cpu::quantized_activation_bytes(t, in);
    for (size_t rows = 1; rows <= 11; ++rows) {
      std::vector<unsigned char> xq(rows * xrow);
      for (size_t r = 0; r < rows; ++r) {
        const std::vector<float> x = random_x(in, rng, r % 3 == 0 ? 1e3f : 1.0f);
        cpu::quantize_activations(t, x.data(), in, xq.data() + r * xrow);
      }
      for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
        if (!cpu_supports(isa)) continue;
        INFO("isa " << cpu_isa_name(isa) << " rows " << rows);
        std::vector<float> out(rows * 3, -7.0f);
        cpu::quant_dot_rows(isa, t)(w.raw(), xq.data(), xrow, rows, blocks, out.data(), 3);
        for (size_t r = 0; r < rows; ++r) {
          const float one = cpu::quant_dot(isa, t)(w.raw(), xq.data() + r * xrow, blocks);
          REQUIRE(std::memcmp(&one, &out[r * 3], 4) == 0);
          REQUIRE(out[r * 3 + 1] == -7.0f);  // only every out_stride-th value written
        }
      }
    }
  }
}

TEST_CASE("matmul on block weights equals x · dequantize(W)ᵀ within the int8-activation bound",
          "[kernels][quant][matmul]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (DType t : kBlockTypes) {
    INFO(dtype_name(t));
    const size_t block = dtype_block_elems(t);
    for (size_t in : {block, 3 * block, 1024 + block}) {
      const size_t out = 37;
      const Tensor w = random_blocks(t, static_cast<int64_t>(out), static_cast<int64_t>(in), rng, true);
      const std::vector<float> wf = dequantized(w);
      for (size_t rows : {size_t{1}, size_t{2}, size_t{7}, size_t{8}, size_t{9}, size_t{33}}) {
        for (cpu::MatmulPrecision precision : {cpu::MatmulPrecision::f32, cpu::MatmulPrecision::bf16}) {
          const std::vector<float> x = random_x(rows * in, rng);
          std::vector<float> y(rows * out, -1.0f);
          cpu::MatmulWorkspace ws;
          ws.precision = precision;
          cpu::matmul(x.data(), rows, w, y.data(), pool, ws);
          for (size_t r = 0; r < rows; ++r)
            for (size_t o = 0; o < out; ++o) {
              double ref = 0;
              for (size_t i = 0; i < in; ++i) ref += double(x[r * in + i]) * wf[o * in + i];
              // GEMM (rows > 8) dequantizes exactly: in fp32 only the sum-order term applies; in bf16
              // (AVX-512) x and the dequantized w are each rounded to bf16 (2^-9 relative), so a
              // product moves by at most 2^-8 + 2^-18 of itself: 2^-8·1.01·Σ|ŵ||x| on top.
              double bound = matmul_bound(x.data() + r * in, wf.data() + o * in, in, block);
              if (rows > cpu::kGemvMaxRows && precision == cpu::MatmulPrecision::bf16) {
                double abs_dot = 0;
                for (size_t i = 0; i < in; ++i) abs_dot += std::abs(double(x[r * in + i]) * wf[o * in + i]);
                bound += 0x1p-8 * 1.01 * abs_dot;
              }
              INFO("in " << in << " rows " << rows << " r " << r << " o " << o << " got " << y[r * out + o] << " ref "
                         << ref << " bound " << bound);
              REQUIRE(std::abs(y[r * out + o] - ref) <= bound);
            }
          if (rows <= cpu::kGemvMaxRows) {  // gemv_rows on every ISA: the same outputs, up to the sum order
            for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
              if (!cpu_supports(isa)) continue;
              std::vector<float> g(rows * out, -1.0f);
              cpu::gemv_rows(isa, x.data(), rows, w, g.data(), 3, out);
              for (size_t r = 0; r < rows; ++r) {
                CHECK(g[r * out + 2] == -1.0f);  // rows before o_begin untouched
                for (size_t o = 3; o < out; ++o) {
                  const double bound = matmul_bound(x.data() + r * in, wf.data() + o * in, in, block);
                  REQUIRE(std::abs(double(g[r * out + o]) - y[r * out + o]) <= 2 * bound);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("matmul_many and matmul_swiglu on mixed block weights equal matmul each", "[kernels][quant][matmul]") {
  std::mt19937_64 rng(4848);
  ThreadPool pool(2);
  const size_t in = 512;
  // Q4_K_M mixes q4_k and q6_k; SmolLM2's Q4_1 file mixes q4_1 and q8_0; both activation kinds at once.
  const Tensor a = random_blocks(DType::q4_k, 40, in, rng, false);
  const Tensor b = random_blocks(DType::q6_k, 24, in, rng, false);
  const Tensor c = random_blocks(DType::q4_1, 17, in, rng, false);
  const Tensor d = random_blocks(DType::q8_0, 40, in, rng, false);
  for (size_t rows : {size_t{1}, size_t{4}, size_t{8}, size_t{12}}) {
    const std::vector<float> x = random_x(rows * in, rng);
    cpu::MatmulWorkspace ws;
    std::vector<float> ya(rows * 40), yb(rows * 24), yc(rows * 17), yd(rows * 40);
    const cpu::Projection p[] = {{&a, ya.data()}, {&b, yb.data()}, {&c, yc.data()}, {&d, yd.data()}};
    cpu::matmul_many(x.data(), rows, p, pool, ws);
    for (const cpu::Projection& q : p) {
      std::vector<float> one(rows * static_cast<size_t>(q.w->dim(0)));
      cpu::MatmulWorkspace fresh;
      cpu::matmul(x.data(), rows, *q.w, one.data(), pool, fresh);
      INFO(q.w->describe() << " rows " << rows);
      REQUIRE(std::memcmp(one.data(), q.y, one.size() * 4) == 0);  // the same kernels on the same codes
    }
    std::vector<float> gate(rows * 40), up(rows * 40), ga(rows * 40), yd2(rows * 40);
    cpu::matmul_swiglu(x.data(), rows, a, d, gate.data(), up.data(), pool, ws);
    cpu::matmul(x.data(), rows, a, ga.data(), pool, ws);
    cpu::matmul(x.data(), rows, d, yd2.data(), pool, ws);
    for (size_t i = 0; i < gate.size(); ++i) {
      const float silu = ga[i] / (1.0f + std::exp(-ga[i]));
      REQUIRE(gate[i] == Approx(silu * yd2[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}
