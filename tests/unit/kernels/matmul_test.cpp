// GEMV/GEMM: every ISA path equals the scalar reference; the sgemm (prefill) path equals
// the GEMV (decode) path; MatmulPrecision::bf16 equals a double reference on bf16-rounded
// rows on the tier cpu_isa() gives (ctest runs this binary again with HACK_CPU_ISA=avx2 and
// avx512), and its two AVX-512 tiers give the same bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/kernels/cpu/matmul.h"
#include "hack/kernels/cpu/ops.h"
#include "support/isa_override.h"
#include "support/test_support.h"

using namespace hack;

namespace {

Tensor random_weight(DType dtype, int64_t out, int64_t in, uint64_t seed) {
  Tensor w = Tensor::empty(dtype, {out, in});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  for (int64_t i = 0; i < out * in; ++i) {
    const float f = dist(rng);
    if (dtype == DType::f32) w.data<float>()[i] = f;
    if (dtype == DType::bf16) w.data<uint16_t>()[i] = f32_to_bf16(f);
    if (dtype == DType::f16) w.data<uint16_t>()[i] = f32_to_f16(f);
  }
  return w;
}

std::vector<float> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

}  // namespace

TEST_CASE("GEMV: AVX2 and both AVX-512 tiers equal the scalar reference", "[kernels][matmul]") {
  const uint64_t seed = 1234;
  INFO("seed " << seed);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t in : {1, 7, 16, 33, 128, 1000}) {
      const int64_t out = 37;
      Tensor w = random_weight(dtype, out, in, seed + static_cast<uint64_t>(in));
      for (size_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
        std::vector<float> x = random_vec(rows * static_cast<size_t>(in), seed + rows);
        std::vector<float> ref(rows * static_cast<size_t>(out)), got(ref.size());
        cpu::gemv_rows(CpuIsa::scalar, x.data(), rows, w, ref.data(), 0, static_cast<size_t>(out));
        for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16}) {
          if (!cpu_supports(isa)) continue;
          std::fill(got.begin(), got.end(), -1.0f);
          cpu::gemv_rows(isa, x.data(), rows, w, got.data(), 0, static_cast<size_t>(out));
          for (size_t i = 0; i < ref.size(); ++i) {
            INFO("isa " << cpu_isa_name(isa) << " dtype " << dtype_name(dtype) << " in " << in << " rows " << rows
                        << " i " << i);
            // fp32 accumulation of `in` products of magnitude ~0.5: error ~ in * 2^-24 * |terms|.
            REQUIRE(test::close(got[i], ref[i], 1e-5 * static_cast<double>(in), 1e-5));
          }
        }
      }
    }
  }
}

TEST_CASE("matmul: sgemm path equals GEMV path for 16-bit and fp32 weights", "[kernels][matmul]") {
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t out = 301, in = 96;
    Tensor w = random_weight(dtype, out, in, 99);
    const size_t rows = 20;  // > kGemvMaxRows: BLAS path
    std::vector<float> x = random_vec(rows * static_cast<size_t>(in), 7);
    std::vector<float> big(rows * static_cast<size_t>(out));
    cpu::matmul(x.data(), rows, w, big.data(), pool, ws);
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> one(static_cast<size_t>(out));
      cpu::matmul(&x[r * static_cast<size_t>(in)], 1, w, one.data(), pool, ws);
      for (size_t o = 0; o < static_cast<size_t>(out); ++o) {
        INFO("dtype " << dtype_name(dtype) << " row " << r << " col " << o);
        REQUIRE(test::close(big[r * static_cast<size_t>(out) + o], one[o], 1e-4, 1e-4));
      }
    }
  }
}

TEST_CASE("matmul_many and matmul_swiglu equal separate matmuls", "[kernels][matmul]") {
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws;
  const int64_t in = 72;
  const Tensor wq = random_weight(DType::bf16, 53, in, 1), wk = random_weight(DType::bf16, 17, in, 2),
               wv = random_weight(DType::bf16, 17, in, 3);
  const Tensor gate_w = random_weight(DType::bf16, 45, in, 4), up_w = random_weight(DType::bf16, 45, in, 5);
  for (size_t rows : {size_t{1}, size_t{3}, cpu::kGemvMaxRows, size_t{12}}) {
    INFO("rows " << rows);
    const std::vector<float> x = random_vec(rows * static_cast<size_t>(in), 40 + rows);
    auto sized = [&](const Tensor& w) { return std::vector<float>(rows * static_cast<size_t>(w.dim(0)), -1.0f); };
    std::vector<float> q = sized(wq), k = sized(wk), v = sized(wv);
    const cpu::Projection qkv[] = {{&wq, q.data()}, {&wk, k.data()}, {&wv, v.data()}};
    cpu::matmul_many(x.data(), rows, qkv, pool, ws);
    for (const cpu::Projection& p : qkv) {
      std::vector<float> one = sized(*p.w);
      cpu::matmul(x.data(), rows, *p.w, one.data(), pool, ws);
      REQUIRE(std::equal(one.begin(), one.end(), p.y));  // the same kernel on the same rows: same bits
    }
    std::vector<float> gate = sized(gate_w), up = sized(up_w);
    cpu::matmul_swiglu(x.data(), rows, gate_w, up_w, gate.data(), up.data(), pool, ws);
    std::vector<float> g = sized(gate_w), u = sized(up_w), want(g.size());
    cpu::matmul(x.data(), rows, gate_w, g.data(), pool, ws);
    cpu::matmul(x.data(), rows, up_w, u.data(), pool, ws);
    cpu::swiglu(g.data(), u.data(), want.data(), want.size());
    REQUIRE(gate == want);
  }
}

TEST_CASE("matmul bf16 precision: the bf16 GEMM equals a double reference on bf16-rounded rows",
          "[kernels][matmul]") {
  // avx512bf16: VDPBF16PS; avx512: its fp32 FMA twin; avx2 and scalar: fp32 (x not rounded).
  const bool rounds = cpu_isa() >= CpuIsa::avx512;
  INFO("isa " << cpu_isa_name(cpu_isa()));
  if (!rounds) WARN("ISA " << cpu_isa_name(cpu_isa()) << ": MatmulPrecision::bf16 runs as f32 here (checked below)");
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws;
  ws.precision = cpu::MatmulPrecision::bf16;
  for (int64_t in : {1, 33, 64, 577}) {
    for (int64_t out : {5, 32, 70}) {
      const Tensor w = random_weight(DType::bf16, out, in, 500 + static_cast<uint64_t>(in * out));
      for (size_t rows : {size_t{9}, size_t{12}, size_t{13}, size_t{30}}) {
        INFO("in " << in << " out " << out << " rows " << rows);
        const std::vector<float> x = random_vec(rows * static_cast<size_t>(in), 77 + rows);
        std::vector<float> y(rows * static_cast<size_t>(out), -1.0f);
        cpu::matmul(x.data(), rows, w, y.data(), pool, ws);
        for (size_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            double want = 0, magnitude = 0;
            for (int64_t i = 0; i < in; ++i) {
              const float xi = x[r * static_cast<size_t>(in) + static_cast<size_t>(i)];
              const double xr = rounds ? bf16_to_f32(f32_to_bf16(xi)) : xi;
              const double term = xr * bf16_to_f32(w.data<uint16_t>()[o * in + i]);
              want += term;
              magnitude += std::abs(term);
            }
            // Products of two bf16 are exact in fp32; only the fp32 accumulation rounds.
            REQUIRE(std::abs(y[r * static_cast<size_t>(out) + static_cast<size_t>(o)] - want) <=
                    1e-6 * magnitude + 1e-6);
          }
        }
      }
    }
  }
}

TEST_CASE("matmul bf16 precision, GEMV rows: bf16 activations from 4 rows equal a double reference on bf16-rounded rows",
          "[kernels][matmul]") {
  INFO("isa " << cpu_isa_name(cpu_isa()));
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws, ws_f32;
  ws.precision = cpu::MatmulPrecision::bf16;
  for (int64_t in : {32, 576, 100}) {  // 100: not a multiple of 32, fp32 GEMV whatever the rows
    const Tensor w = random_weight(DType::bf16, 45, in, 700 + static_cast<uint64_t>(in));
    for (size_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
      INFO("in " << in << " rows " << rows);
      const std::vector<float> x = random_vec(rows * static_cast<size_t>(in), 40 + rows);
      std::vector<float> got(rows * 45, -1.0f), f32(got.size(), -2.0f);
      cpu::matmul(x.data(), rows, w, got.data(), pool, ws);
      cpu::matmul(x.data(), rows, w, f32.data(), pool, ws_f32);
      const bool dot = cpu_isa() >= CpuIsa::avx512 && rows >= 4 && in % 32 == 0;
      if (!dot) {
        REQUIRE(got == f32);  // memory-bound GEMVs (or no AVX-512 / odd widths) stay fp32, bit for bit
        continue;
      }
      for (size_t r = 0; r < rows; ++r) {
        for (int64_t o = 0; o < 45; ++o) {
          double want = 0, magnitude = 0;
          for (int64_t i = 0; i < in; ++i) {
            const double xr = bf16_to_f32(f32_to_bf16(x[r * static_cast<size_t>(in) + static_cast<size_t>(i)]));
            const double term = xr * bf16_to_f32(w.data<uint16_t>()[o * in + i]);
            want += term;
            magnitude += std::abs(term);
          }
          REQUIRE(std::abs(got[r * 45 + static_cast<size_t>(o)] - want) <= 1e-6 * magnitude + 1e-6);
        }
      }
      CHECK(got != f32);  // the rounded activations show: this is not the fp32 kernel
    }
  }
}

TEST_CASE("matmul's GEMV path (even/odd bf16 kernel from 4 rows) equals the scalar reference", "[kernels][matmul]") {
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws;
  for (int64_t in : {32, 576, 100}) {  // 100: not a multiple of 32, the plain kernel
    const Tensor w = random_weight(DType::bf16, 45, in, 900 + static_cast<uint64_t>(in));
    for (size_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
      INFO("in " << in << " rows " << rows);
      const std::vector<float> x = random_vec(rows * static_cast<size_t>(in), 60 + rows);
      std::vector<float> ref(rows * 45), got(ref.size(), -1.0f);
      cpu::gemv_rows(CpuIsa::scalar, x.data(), rows, w, ref.data(), 0, 45);
      cpu::matmul(x.data(), rows, w, got.data(), pool, ws);
      for (size_t i = 0; i < ref.size(); ++i) REQUIRE(test::close(got[i], ref[i], 1e-5 * static_cast<double>(in), 1e-5));
    }
  }
}

TEST_CASE("matmul bf16 precision: the avx512 tier's fp32 FMAs give the avx512bf16 tier's VDPBF16PS bits",
          "[kernels][matmul]") {
  if (!cpu_supports(CpuIsa::avx512bf16)) {
    WARN("no AVX-512 BF16 on this CPU: nothing to compare the FMA twin with");
    return;
  }
  // Both add each lane's odd then even bf16 × bf16 product (exact in fp32) with one rounding
  // each and fold the lanes alike (gemm_kernels.h), so the bits agree; the inputs are normal
  // numbers far from 2^-126, where VDPBF16PS's denormal flushing (the one difference) cannot act.
  ThreadPool pool(2);
  cpu::MatmulWorkspace ws;
  ws.precision = cpu::MatmulPrecision::bf16;
  const auto run = [&](CpuIsa isa, const std::vector<float>& x, size_t rows, const Tensor& w) {
    const test::IsaOverride force(isa);
    REQUIRE(cpu_isa() == isa);
    std::vector<float> y(rows * static_cast<size_t>(w.dim(0)), -1.0f);
    cpu::matmul(x.data(), rows, w, y.data(), pool, ws);
    return y;
  };
  for (int64_t in : {1, 2, 33, 64, 576, 577}) {
    for (int64_t out : {5, 32, 70}) {
      const Tensor w = random_weight(DType::bf16, out, in, 1100 + static_cast<uint64_t>(in * out));
      // 4–8 rows: the GEMV kernels (in % 32 == 0; fp32 GEMV otherwise); 9 and more: the GEMMs
      // (row tiles of 12, so 13 and 30 leave partial tiles; 70 columns a partial panel).
      for (size_t rows : {size_t{4}, size_t{7}, cpu::kGemvMaxRows, size_t{9}, size_t{13}, size_t{30}}) {
        const uint64_t seed = 1300 + rows + static_cast<uint64_t>(in);
        INFO("in " << in << " out " << out << " rows " << rows << " seed " << seed);
        const std::vector<float> x = random_vec(rows * static_cast<size_t>(in), seed);
        const std::vector<float> fma = run(CpuIsa::avx512, x, rows, w);
        const std::vector<float> dot = run(CpuIsa::avx512bf16, x, rows, w);
        size_t first = fma.size();
        for (size_t i = 0; i < fma.size() && first == fma.size(); ++i)
          if (std::memcmp(&fma[i], &dot[i], sizeof(float)) != 0) first = i;
        INFO("first difference at " << first << (first < fma.size() ? ": " + std::to_string(fma[first]) + " vs " +
                                                                           std::to_string(dot[first])
                                                                     : std::string()));
        REQUIRE(first == fma.size());
      }
    }
  }
}
