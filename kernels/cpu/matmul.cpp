#include "hack/kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "hack/core/error.h"
#include "hack/core/quant_blocks.h"
#include "hack/kernels/cpu/ops.h"
#include "hack/kernels/cpu/quant_dot.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemv_kernels.h"

namespace hack::cpu {

namespace {

void check_weight(const Tensor& w) {
  HACK_CHECK(w.ndim() == 2, "matmul weight must be 2-D, got {}", w.describe());
  HACK_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f16 ||
                 dtype_is_quantized(w.dtype()),
             "matmul weight dtype {} unsupported (f32, f16, bf16, or a GGUF block type)", dtype_name(w.dtype()));
}

// Rows of x quantized per block for the dots on block weights: BlockQ8x32 rows for q4_0,
// q4_1, q8_0 weights, BlockQ8K rows for the K-quants, each made once per call when needed.
struct QuantizedX {
  const unsigned char* q32 = nullptr;
  const unsigned char* qk = nullptr;
  size_t in = 0;

  void prepare(DType w, const float* x, size_t rows, size_t n_in, MatmulWorkspace& ws) {
    in = n_in;
    const bool k = uses_q8k(w);
    if ((k ? qk : q32) != nullptr) return;
    std::vector<unsigned char>& buf = k ? ws.x_q8k : ws.x_q8x32;
    const size_t row_bytes = quantized_activation_bytes(w, in);
    buf.resize(rows * row_bytes);
    for (size_t t = 0; t < rows; ++t) quantize_activations(w, x + t * in, in, buf.data() + t * row_bytes);
    (k ? qk : q32) = buf.data();
  }

  // y[t][o] for o in [o_begin, o_end), t < rows: each weight row read once for every row of x.
  void run(CpuIsa isa, const Tensor& w, size_t rows, float* y, size_t o_begin, size_t o_end) const {
    const DType type = w.dtype();
    const QuantDotRowsFn dot = quant_dot_rows(isa, type);
    const size_t out = static_cast<size_t>(w.dim(0));
    const size_t w_row_bytes = dtype_bytes(type, in), x_row_bytes = quantized_activation_bytes(type, in);
    const size_t blocks = in / dtype_block_elems(type);
    const unsigned char* xq = uses_q8k(type) ? qk : q32;
    const auto* base = static_cast<const unsigned char*>(w.raw());
    // Short rows (a few hundred bytes) end before the hardware prefetcher has ramped up on them:
    // ask for the row kPrefetchRows ahead while this one is multiplied.
    constexpr size_t kPrefetchRows = 4;
    for (size_t o = o_begin; o < o_end; ++o) {
      if (o + kPrefetchRows < o_end) {
        const unsigned char* next = base + (o + kPrefetchRows) * w_row_bytes;
        for (size_t at = 0; at < w_row_bytes; at += 64) __builtin_prefetch(next + at);
      }
      dot(base + o * w_row_bytes, xq, x_row_bytes, rows, blocks, y + o, out);
    }
  }
};

void set_blas_threads(int n) {
  // OpenBLAS keeps its own pool; size it to ours once (prefill calls sgemm from one thread).
  static std::once_flag once;
  std::call_once(once, [n] { openblas_set_num_threads(n); });
}

// GEMV on the best ISA present (AVX2 at least: the build's baseline).
CpuIsa gemv_isa() { return cpu_isa() == CpuIsa::scalar ? CpuIsa::avx2 : cpu_isa(); }

// Output rows per GEMV task: long enough that each thread's weight stream stays
// sequential, short enough to balance the threads.
constexpr size_t kGemvBlockRows = 16;

// Activation rows from which GEMV is compute-bound: the even/odd bf16 kernel pays for
// permuting x, and MatmulPrecision::bf16 switches to bf16 activations.
constexpr size_t kEvenOddMinRows = 4;

// x as one GEMV region reads it: as given; from 4 rows with every weight bf16, in % 32 == 0
// and AVX-512, either rounded to bf16 (MatmulPrecision::bf16, llama.cpp's arithmetic: packed
// for VDPBF16PS on avx512bf16, permuted for the odd/even fp32 kernel on avx512 — the same
// bits) or permuted for the even/odd fp32 kernel.
struct GemvInput {
  enum class Kernel { plain, even_odd, bf16_dot, bf16_odd_even };
  const float* x;
  const uint16_t* x_bf16 = nullptr;
  size_t rows;
  CpuIsa isa;
  Kernel kernel = Kernel::plain;
  QuantizedX quantized;  // the rows of x per block, for the projections on block weights

  GemvInput(const float* x_in, size_t n_rows, size_t in, bool bf16_weights, MatmulWorkspace& ws)
      : x(x_in), rows(n_rows), isa(gemv_isa()) {
    if (!bf16_weights || isa < CpuIsa::avx512 || n_rows < kEvenOddMinRows || in % 32 != 0) return;
    if (ws.precision == MatmulPrecision::bf16 && isa == CpuIsa::avx512bf16) {
      kernel = Kernel::bf16_dot;
      ws.x_bf16.resize(n_rows * in);
      detail::f32_to_bf16_pairs_avx512bf16(x_in, n_rows, in, ws.x_bf16.data());
      x_bf16 = ws.x_bf16.data();
      return;
    }
    const bool round_bf16 = ws.precision == MatmulPrecision::bf16;
    kernel = round_bf16 ? Kernel::bf16_odd_even : Kernel::even_odd;
    ws.x_even_odd.resize(n_rows * in);
    detail::permute_even_odd(x_in, n_rows, in, ws.x_even_odd.data(), round_bf16);
    x = ws.x_even_odd.data();
  }

  // x quantized for block weights of type w (before run() on such weights; not thread-safe).
  void quantize_for(const Tensor& w, const float* x_in, MatmulWorkspace& ws) {
    if (dtype_is_quantized(w.dtype())) quantized.prepare(w.dtype(), x_in, rows, static_cast<size_t>(w.dim(1)), ws);
  }

  // Output rows [o_begin, o_end) of y = x · wᵀ.
  void run(const Tensor& w, float* y, size_t o_begin, size_t o_end) const {
    if (dtype_is_quantized(w.dtype())) {
      quantized.run(isa, w, rows, y, o_begin, o_end);
      return;
    }
    const size_t out = static_cast<size_t>(w.dim(0)), in = static_cast<size_t>(w.dim(1));
    switch (kernel) {
      case Kernel::bf16_dot:
        detail::gemv_bf16_dot_avx512bf16(w.data<uint16_t>(), in, x_bf16, rows, y, out, o_begin, o_end);
        break;
      case Kernel::bf16_odd_even:
        detail::gemv_bf16_odd_even_avx512(w.data<uint16_t>(), in, x, rows, y, out, o_begin, o_end);
        break;
      case Kernel::even_odd:
        detail::gemv_bf16_even_odd_avx512(w.data<uint16_t>(), in, x, rows, y, out, o_begin, o_end);
        break;
      case Kernel::plain: gemv_rows(isa, x, rows, w, y, o_begin, o_end); break;
    }
  }
};

// y = x · wᵀ with x rounded to bf16 (MatmulPrecision::bf16, isa avx512 or avx512bf16): each
// thread packs and multiplies its own panels of w's rows. y's rows are ldc apart (w may be a tile
// of a larger matrix's rows); convert_x = false reuses the x ws holds from the previous call.
void gemm_bf16(CpuIsa isa, const float* x, size_t rows, const Tensor& w, float* y, size_t ldc, ThreadPool& pool,
               MatmulWorkspace& ws, bool convert_x = true) {
  const size_t out = static_cast<size_t>(w.dim(0)), in = static_cast<size_t>(w.dim(1));
  const size_t ld = (in + 1) / 2 * 2;
  const bool dot = isa == CpuIsa::avx512bf16;
  if (dot) {
    ws.x_bf16.resize(rows * ld);
  } else {
    ws.x_bf16_f32.resize(rows * ld);
  }
  if (convert_x) pool.parallel_for(rows, [&](size_t r0, size_t r1) {
    if (dot) {
      detail::f32_to_bf16_pairs_avx512bf16(x + r0 * in, r1 - r0, in, ws.x_bf16.data() + r0 * ld);
    } else {
      detail::f32_round_bf16_pairs(x + r0 * in, r1 - r0, in, ws.x_bf16_f32.data() + r0 * ld);
    }
  });
  ws.packs.resize(static_cast<size_t>(pool.size()));
  ws.packs_f32.resize(static_cast<size_t>(pool.size()));
  const size_t panel = detail::kGemmBf16PanelCols;
  const size_t panels = (out + panel - 1) / panel;
  pool.run([&](int thread, int threads) {
    size_t p0, p1;
    split_range(panels, thread, threads, &p0, &p1);
    if (p0 == p1) return;
    const size_t n0 = p0 * panel, n1 = std::min(out, p1 * panel);
    if (dot) {
      std::vector<uint32_t>& pack = ws.packs[static_cast<size_t>(thread)];
      pack.resize(detail::gemm_bf16_pack_words(in));
      detail::gemm_bf16_avx512bf16(ws.x_bf16.data(), rows, in, w.data<uint16_t>(), n0, n1, y, ldc, pack.data());
    } else {
      std::vector<float>& pack = ws.packs_f32[static_cast<size_t>(thread)];
      pack.resize(detail::gemm_bf16_fma_pack_floats(in));
      detail::gemm_bf16_fma_avx512(ws.x_bf16_f32.data(), rows, in, w.data<uint16_t>(), n0, n1, y, ldc, pack.data());
    }
  });
}

}  // namespace

MatmulPrecision parse_matmul_precision(std::string_view name) {
  if (name == "fp32") return MatmulPrecision::f32;
  if (name == "bf16") return MatmulPrecision::bf16;
  fail("--matmul-precision must be fp32 or bf16, got '{}'", name);
}

void gemv_rows(CpuIsa isa, const float* x, size_t rows, const Tensor& w, float* y, size_t o_begin, size_t o_end) {
  check_weight(w);
  HACK_CHECK(rows >= 1 && rows <= kGemvMaxRows, "gemv rows {} outside [1, {}]", rows, kGemvMaxRows);
  const size_t in = static_cast<size_t>(w.dim(1));
  const size_t out = static_cast<size_t>(w.dim(0));
  if (dtype_is_quantized(w.dtype())) {
    MatmulWorkspace ws;
    QuantizedX q;
    q.prepare(w.dtype(), x, rows, in, ws);
    q.run(isa, w, rows, y, o_begin, o_end);
    return;
  }
  switch (isa) {
    case CpuIsa::scalar: detail::gemv_scalar(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
    case CpuIsa::avx2: detail::gemv_avx2(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
    case CpuIsa::avx512:
    case CpuIsa::avx512bf16: detail::gemv_avx512(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
  }
}

void matmul(const float* x, size_t rows, const Tensor& w, float* y, ThreadPool& pool, MatmulWorkspace& ws) {
  check_weight(w);
  if (rows == 0) return;
  const size_t out = static_cast<size_t>(w.dim(0));
  const size_t in = static_cast<size_t>(w.dim(1));
  if (rows <= kGemvMaxRows) {
    const Projection p{&w, y};
    matmul_many(x, rows, std::span<const Projection>(&p, 1), pool, ws);
    return;
  }
  if (const CpuIsa isa = gemv_isa(); ws.precision == MatmulPrecision::bf16 && isa >= CpuIsa::avx512) {
    if (w.dtype() == DType::bf16) {
      gemm_bf16(isa, x, rows, w, y, out, pool, ws);
      return;
    }
    if (dtype_is_quantized(w.dtype())) {  // block weights: dequantized tile by tile into bf16 panels
      const size_t panel = detail::kGemmBf16PanelCols;
      const size_t tile_rows = std::max<size_t>(64, (size_t{1} << 20) / in) / panel * panel;
      const size_t row_bytes = dtype_bytes(w.dtype(), in);
      ws.weight_tile.resize(tile_rows * in);
      ws.weight_tile_bf16.resize(tile_rows * in);
      for (size_t o0 = 0; o0 < out; o0 += tile_rows) {
        const size_t n = std::min(tile_rows, out - o0);
        const char* src = static_cast<const char*>(w.raw()) + o0 * row_bytes;
        pool.parallel_for(n, [&](size_t r0, size_t r1) {
          float* f = ws.weight_tile.data() + r0 * in;
          dequantize_row(w.dtype(), src + r0 * row_bytes, f, (r1 - r0) * in);
          for (size_t i = 0; i < (r1 - r0) * in; ++i) ws.weight_tile_bf16[r0 * in + i] = f32_to_bf16(f[i]);
        });
        const Tensor tile = Tensor::view(DType::bf16, {static_cast<int64_t>(n), static_cast<int64_t>(in)},
                                         ws.weight_tile_bf16.data(), nullptr);
        gemm_bf16(isa, x, rows, tile, y + o0, out, pool, ws, /*convert_x=*/o0 == 0);
      }
      return;
    }
  }
  set_blas_threads(pool.size());
  const int m = static_cast<int>(rows), k = static_cast<int>(in);
  if (w.dtype() == DType::f32) {
    pool.park();  // OpenBLAS's threads take the cores now
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(out), k, 1.0f, x, k, w.data<float>(), k,
                0.0f, y, static_cast<int>(out));
    return;
  }
  // 16-bit or block weights: convert (dequantize) a tile of weight rows to fp32, then sgemm
  // into y's columns.
  const size_t tile_rows = std::max<size_t>(64, (size_t{1} << 20) / in);
  ws.weight_tile.resize(tile_rows * in);
  const size_t row_bytes = dtype_bytes(w.dtype(), in);
  for (size_t o0 = 0; o0 < out; o0 += tile_rows) {
    const size_t n = std::min(tile_rows, out - o0);
    const char* src = static_cast<const char*>(w.raw()) + o0 * row_bytes;
    pool.parallel_for(n, [&](size_t r0, size_t r1) {
      convert_to_f32(w.dtype(), src + r0 * row_bytes, ws.weight_tile.data() + r0 * in, (r1 - r0) * in);
    });
    pool.park();  // OpenBLAS's threads take the cores now
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(n), k, 1.0f, x, k,
                ws.weight_tile.data(), k, 0.0f, y + o0, static_cast<int>(out));
  }
}

void matmul_many(const float* x, size_t rows, std::span<const Projection> projections, ThreadPool& pool,
                 MatmulWorkspace& ws) {
  if (rows == 0 || projections.empty()) return;
  const size_t in = static_cast<size_t>(projections[0].w->dim(1));
  for (const Projection& p : projections) {
    check_weight(*p.w);
    HACK_CHECK(static_cast<size_t>(p.w->dim(1)) == in, "matmul_many: weights of {} and {} inputs", in, p.w->dim(1));
  }
  if (rows > kGemvMaxRows) {
    for (const Projection& p : projections) matmul(x, rows, *p.w, p.y, pool, ws);
    return;
  }
  // Task b is block b - first[k] of projection k, where first[k] ≤ b < first[k + 1].
  size_t first[8];
  HACK_CHECK(projections.size() < std::size(first), "matmul_many: at most {} projections", std::size(first) - 1);
  first[0] = 0;
  for (size_t k = 0; k < projections.size(); ++k)
    first[k + 1] = first[k] + (static_cast<size_t>(projections[k].w->dim(0)) + kGemvBlockRows - 1) / kGemvBlockRows;
  bool all_bf16 = true;
  for (const Projection& p : projections) all_bf16 = all_bf16 && p.w->dtype() == DType::bf16;
  GemvInput input(x, rows, in, all_bf16, ws);
  for (const Projection& p : projections) input.quantize_for(*p.w, x, ws);
  pool.parallel_for(first[projections.size()], [&](size_t b0, size_t b1) {
    size_t k = 0;
    for (size_t b = b0; b < b1; ++b) {
      while (b >= first[k + 1]) ++k;
      const Projection& p = projections[k];
      const size_t out = static_cast<size_t>(p.w->dim(0)), o = (b - first[k]) * kGemvBlockRows;
      input.run(*p.w, p.y, o, std::min(out, o + kGemvBlockRows));
    }
  });
}

void matmul_swiglu(const float* x, size_t rows, const Tensor& w_gate, const Tensor& w_up, float* gate, float* up,
                   ThreadPool& pool, MatmulWorkspace& ws) {
  if (rows == 0) return;
  check_weight(w_gate);
  check_weight(w_up);
  HACK_CHECK(w_gate.dim(0) == w_up.dim(0) && w_gate.dim(1) == w_up.dim(1), "matmul_swiglu: gate {} but up {}",
             w_gate.describe(), w_up.describe());
  const size_t out = static_cast<size_t>(w_gate.dim(0));
  if (rows > kGemvMaxRows) {
    matmul(x, rows, w_gate, gate, pool, ws);
    matmul(x, rows, w_up, up, pool, ws);
    pool.parallel_for(rows, [&](size_t r0, size_t r1) { swiglu(gate + r0 * out, up + r0 * out, gate + r0 * out, (r1 - r0) * out); });
    return;
  }
  GemvInput input(x, rows, static_cast<size_t>(w_gate.dim(1)),
                  w_gate.dtype() == DType::bf16 && w_up.dtype() == DType::bf16, ws);
  input.quantize_for(w_gate, x, ws);
  input.quantize_for(w_up, x, ws);
  pool.parallel_for((out + kGemvBlockRows - 1) / kGemvBlockRows, [&](size_t b0, size_t b1) {
    const size_t o0 = b0 * kGemvBlockRows, o1 = std::min(out, b1 * kGemvBlockRows);
    input.run(w_gate, gate, o0, o1);
    input.run(w_up, up, o0, o1);
    for (size_t t = 0; t < rows; ++t) swiglu(gate + t * out + o0, up + t * out + o0, gate + t * out + o0, o1 - o0);
  });
}

}  // namespace hack::cpu
