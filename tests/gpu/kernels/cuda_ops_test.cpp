// Every element-wise / row-wise CUDA kernel of the fp path and the cuBLAS GEMM against its
// CPU twin (kernels/cpu) or a double-precision reference, on awkward shapes. Each check is
// |gpu − ref| ≤ atol + rtol·|ref| with the reason for its size beside it.
#include <catch2/catch.hpp>

#include <cublas_v2.h>

#include <cmath>
#include <numeric>

#include "gpu/cuda_test_util.h"
#include "hack/model/rope.h"
#include "hack/kernels/cpu/ops.h"
#include "support/test_support.h"

using namespace hack;
using test::bptr;
using test::dptr;

namespace {
// Half an ulp of bf16 is 2^-9 relative; 2^-8 leaves room for the fp32 differences before
// the final rounding (which can push a value across a rounding boundary).
constexpr double kBf16Rtol = 1.0 / 256;
}  // namespace

TEST_CASE("cuda rmsnorm matches cpu::rmsnorm", "[gpu][ops]") {
  const uint32_t seed = 1234;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int n : {1, 7, 96, 128, 1000, 4097}) {
    for (int rows : {1, 3, 17}) {
      INFO("rows " << rows << " n " << n);
      const auto x = test::random_floats(rng, static_cast<size_t>(rows * n), -3, 3);
      const auto w = test::random_floats(rng, static_cast<size_t>(n), 0.5f, 1.5f);
      const float eps = 1e-6f;
      std::vector<float> ref(x.size());
      cpu::rmsnorm(x.data(), w.data(), ref.data(), static_cast<size_t>(rows), static_cast<size_t>(n), eps);
      Buffer dx = test::to_device(x), dw = test::to_device(w);

      // bf16 output (the GEMM input): bf16 rounding dominates. Gathered rows: reversed order.
      std::vector<int> index(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) index[static_cast<size_t>(r)] = rows - 1 - r;
      Buffer di = test::to_device(index);
      Buffer dout = Buffer::allocate(MemoryKind::device, x.size() * 2);
      cuda::rmsnorm_to_bf16(dptr<float>(dx), dptr<int>(di), dptr<float>(dw), bptr(dout), rows, n, eps, nullptr);
      const auto got = test::from_bf16_bits(test::to_host<uint16_t>(dout, x.size()));
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i) {
          const double g = got[static_cast<size_t>(r * n + i)];
          const double e = ref[static_cast<size_t>((rows - 1 - r) * n + i)];
          INFO("row " << r << " i " << i << " gpu " << g << " cpu " << e);
          REQUIRE(test::close(g, e, 1e-6, kBf16Rtol));
        }

      // In place, fp32 (the q/k norm): only the order of the fp32 sum of squares differs
      // from the CPU's double sum, ~1e-6 relative.
      cuda::rmsnorm_inplace(dptr<float>(dx), dptr<float>(dw), rows, n, eps, nullptr);
      const auto got32 = test::to_host<float>(dx, x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        INFO("element " << i);
        REQUIRE(test::close(got32[i], ref[i], 1e-6, 1e-5));
      }
    }
  }
}

TEST_CASE("cuda rope matches cpu::rope_apply, incl. linear and llama3 scaling", "[gpu][ops]") {
  const uint32_t seed = 99;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    const char* name;
    int head_dim;
    float theta;
    RopeScaling scaling;
  };
  RopeScaling linear;
  linear.type = RopeScalingType::linear;
  linear.factor = 2.0f;
  RopeScaling llama3;
  llama3.type = RopeScalingType::llama3;
  llama3.factor = 8.0f;
  llama3.low_freq_factor = 1.0f;
  llama3.high_freq_factor = 4.0f;
  llama3.original_max_position_embeddings = 8192;
  const Case cases[] = {{"none", 64, 10000.0f, {}},
                        {"linear", 32, 10000.0f, linear},
                        {"llama3", 128, 500000.0f, llama3},
                        {"llama3 hd 64", 64, 500000.0f, llama3}};
  const std::vector<int> positions{0, 1, 17, 255, 4095, 8191, 70001};
  for (const Case& c : cases) {
    INFO("scaling " << c.name << " head_dim " << c.head_dim);
    ModelConfig cfg;
    cfg.head_dim = c.head_dim;
    cfg.rope_theta = c.theta;
    cfg.rope_scaling = c.scaling;
    const std::vector<float> inv_freq = rope_inv_freq(cfg);
    const int heads = 3;
    const int T = static_cast<int>(positions.size());
    const size_t row = static_cast<size_t>(heads * c.head_dim);
    const auto x = test::random_floats(rng, static_cast<size_t>(T) * row, -2, 2);
    std::vector<float> ref = x;
    for (int t = 0; t < T; ++t)
      cpu::rope_apply(&ref[static_cast<size_t>(t) * row], heads, c.head_dim, positions[static_cast<size_t>(t)],
                      inv_freq.data());
    Buffer dx = test::to_device(x), dp = test::to_device(positions), df = test::to_device(inv_freq);
    cuda::rope_inplace(dptr<float>(dx), dptr<int>(dp), dptr<float>(df), T, heads, c.head_dim, nullptr);
    const auto got = test::to_host<float>(dx, x.size());
    // Same fp32 angle on both sides; CUDA's precise sincosf and libm's cosf/sinf differ by a
    // couple of ulp even after full range reduction (position 70001), ~1e-6 absolute here.
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("token " << i / row << " element " << i % row);
      REQUIRE(test::close(got[i], ref[i], 2e-5, 2e-5));
    }
  }
}

TEST_CASE("cuda swiglu, bias, residual add and embedding gather match the cpu", "[gpu][ops]") {
  const uint32_t seed = 7;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (size_t n : {size_t{1}, size_t{1000}, size_t{65537}}) {
    INFO("n " << n);
    const auto gate = test::random_floats(rng, n, -20, 20);
    const auto up = test::random_floats(rng, n, -3, 3);
    std::vector<float> ref(n);
    cpu::swiglu(gate.data(), up.data(), ref.data(), n);
    Buffer dg = test::to_device(gate), du = test::to_device(up);
    Buffer dout = Buffer::allocate(MemoryKind::device, n * 2);
    cuda::swiglu_to_bf16(dptr<float>(dg), dptr<float>(du), bptr(dout), static_cast<long long>(n), nullptr);
    const auto got = test::from_bf16_bits(test::to_host<uint16_t>(dout, n));
    // bf16 output rounding; expf vs std::exp differ by an ulp or two before it.
    for (size_t i = 0; i < n; ++i) {
      INFO("i " << i << " gate " << gate[i]);
      REQUIRE(test::close(got[i], ref[i], 1e-6, kBf16Rtol));
    }
  }

  // Bias and residual: the same fp32 additions in the same order as the CPU backend, so exact.
  for (int rows : {1, 5}) {
    for (int n : {1, 33, 1000}) {
      INFO("rows " << rows << " n " << n);
      const size_t total = static_cast<size_t>(rows * n);
      const auto x = test::random_floats(rng, total, -1, 1);
      const auto y = test::random_floats(rng, total, -1, 1);
      const auto b = test::random_floats(rng, static_cast<size_t>(n), -1, 1);
      std::vector<float> ref_bias = x, ref_res = x, tmp = y;
      for (int r = 0; r < rows; ++r) {
        cpu::add_inplace(&ref_bias[static_cast<size_t>(r * n)], b.data(), static_cast<size_t>(n));
        cpu::add_inplace(&tmp[static_cast<size_t>(r * n)], b.data(), static_cast<size_t>(n));
      }
      cpu::add_inplace(ref_res.data(), tmp.data(), total);
      Buffer dx1 = test::to_device(x), dx2 = test::to_device(x), dy = test::to_device(y), db = test::to_device(b);
      cuda::add_bias(dptr<float>(dx1), dptr<float>(db), rows, n, nullptr);
      cuda::add_residual(dptr<float>(dx2), dptr<float>(dy), dptr<float>(db), rows, n, nullptr);
      REQUIRE(test::to_host<float>(dx1, total) == ref_bias);
      REQUIRE(test::to_host<float>(dx2, total) == ref_res);
    }
  }

  // Embedding gather: bf16 -> f32 is exact.
  const int vocab = 37, hidden = 130;
  const auto table = test::random_floats(rng, static_cast<size_t>(vocab * hidden), -1, 1, /*bf16_exact=*/true);
  const std::vector<int> tokens{0, 36, 5, 5, 17};
  Buffer dt = test::to_device(test::to_bf16_bits(table)), dtok = test::to_device(tokens);
  Buffer dout = Buffer::allocate(MemoryKind::device, tokens.size() * static_cast<size_t>(hidden) * sizeof(float));
  cuda::embedding_gather(bptr(dt), dptr<int>(dtok), static_cast<int>(tokens.size()), hidden, dptr<float>(dout), nullptr);
  const auto got = test::to_host<float>(dout, tokens.size() * static_cast<size_t>(hidden));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < hidden; ++i)
      REQUIRE(got[t * static_cast<size_t>(hidden) + static_cast<size_t>(i)] ==
              table[static_cast<size_t>(tokens[t] * hidden + i)]);
}

TEST_CASE("cuBLAS bf16 GEMM (y = x · W^T) matches a double reference", "[gpu][ops][gemm]") {
  const uint32_t seed = 2024;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  cublasHandle_t handle = nullptr;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  struct Shape {
    int rows, out, in;
  };
  // Decode-sized M (1, 3, 5), prefill-sized M (64), odd N and K, K past 4096.
  const Shape shapes[] = {{1, 1, 1}, {1, 4096, 128}, {3, 257, 96}, {17, 130, 1000}, {64, 512, 256}, {5, 33, 4097}};
  for (const Shape& s : shapes) {
    INFO("rows " << s.rows << " out " << s.out << " in " << s.in);
    // Operands exactly representable in bf16, so the only error is fp32 accumulation order.
    const auto w = test::random_floats(rng, static_cast<size_t>(s.out) * static_cast<size_t>(s.in), -1, 1, true);
    const auto x = test::random_floats(rng, static_cast<size_t>(s.rows) * static_cast<size_t>(s.in), -1, 1, true);
    Buffer dw = test::to_device(test::to_bf16_bits(w)), dx = test::to_device(test::to_bf16_bits(x));
    Buffer dy = Buffer::allocate(MemoryKind::device, static_cast<size_t>(s.rows * s.out) * sizeof(float));
    cuda::gemm_bf16(handle, bptr(dw), s.out, s.in, bptr(dx), s.rows, dptr<float>(dy));
    const auto y = test::to_host<float>(dy, static_cast<size_t>(s.rows * s.out));
    for (int r = 0; r < s.rows; ++r) {
      for (int o = 0; o < s.out; ++o) {
        double ref = 0, mag = 0;
        for (int i = 0; i < s.in; ++i) {
          const double p = static_cast<double>(x[static_cast<size_t>(r) * static_cast<size_t>(s.in) + static_cast<size_t>(i)]) *
                           w[static_cast<size_t>(o) * static_cast<size_t>(s.in) + static_cast<size_t>(i)];
          ref += p;
          mag += std::fabs(p);
        }
        // fp32 accumulation: error ~ sqrt(K)·2^-24·Σ|x w| typically; 1e-4·Σ|x w| also covers
        // blocked / split-K orders while a layout mistake (wrong transpose, ld) is O(1).
        const double got = y[static_cast<size_t>(r * s.out + o)];
        INFO("row " << r << " col " << o << " gpu " << got << " ref " << ref);
        REQUIRE(std::fabs(got - ref) <= 1e-6 + 1e-4 * mag);
      }
    }
  }
  cublasDestroy(handle);
}

TEST_CASE("cuda fdc_project matches cpu::fdc_project (FDC's post-RoPE Q/K projection)", "[gpu][ops][fdc]") {
  const uint32_t seed = 7;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const int head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    const int rows = 5, kv_heads = 3, per_kv = 3, heads = kv_heads * per_kv;
    const std::vector<int> d_qk{16, head_dim, head_dim / 2};  // ranks differ per KV head
    const auto proj = test::random_floats(rng, static_cast<size_t>(kv_heads) * head_dim * head_dim, -0.2f, 0.2f);
    const auto x = test::random_floats(rng, static_cast<size_t>(rows) * heads * head_dim, -2, 2);
    std::vector<float> ref = x;
    cpu::fdc_project(ref.data(), rows, heads, per_kv, head_dim, proj.data(), d_qk.data());
    Buffer dx = test::to_device(x), dp = test::to_device(proj), dd = test::to_device(d_qk);
    cuda::fdc_project(dptr<float>(dx), rows, heads, per_kv, head_dim, dptr<float>(dp), dptr<int>(dd), nullptr);
    const auto got = test::to_host<float>(dx, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const int c = static_cast<int>(i % static_cast<size_t>(head_dim));
      const int kv = static_cast<int>(i / static_cast<size_t>(head_dim)) % heads / per_kv;
      INFO("element " << i << " channel " << c);
      if (c >= d_qk[static_cast<size_t>(kv)]) REQUIRE(got[i] == 0.0f);
      else REQUIRE(test::close(got[i], ref[i], 1e-5, 1e-5));
    }
  }
}
