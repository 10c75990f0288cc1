#include "hack/kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "hack/core/error.h"
#include "kernels/cpu/gemv_kernels.h"

namespace hack::cpu {

namespace {

void check_weight(const Tensor& w) {
  HACK_CHECK(w.ndim() == 2, "matmul weight must be 2-D, got {}", w.describe());
  HACK_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f16,
             "matmul weight dtype {} unsupported (f32, f16, bf16)", dtype_name(w.dtype()));
}

void set_blas_threads(int n) {
  // OpenBLAS keeps its own pool; size it to ours once (prefill calls sgemm from one thread).
  static std::once_flag once;
  std::call_once(once, [n] { openblas_set_num_threads(n); });
}

}  // namespace

void gemv_rows(CpuIsa isa, const float* x, size_t rows, const Tensor& w, float* y, size_t o_begin, size_t o_end) {
  check_weight(w);
  HACK_CHECK(rows >= 1 && rows <= kGemvMaxRows, "gemv rows {} outside [1, {}]", rows, kGemvMaxRows);
  const size_t in = static_cast<size_t>(w.dim(1));
  const size_t out = static_cast<size_t>(w.dim(0));
  switch (isa) {
    case CpuIsa::scalar: detail::gemv_scalar(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
    case CpuIsa::avx2: detail::gemv_avx2(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
    case CpuIsa::avx512: detail::gemv_avx512(w.dtype(), w.raw(), in, x, rows, y, out, o_begin, o_end); break;
  }
}

void matmul(const float* x, size_t rows, const Tensor& w, float* y, ThreadPool& pool, MatmulWorkspace& ws) {
  check_weight(w);
  if (rows == 0) return;
  const size_t out = static_cast<size_t>(w.dim(0));
  const size_t in = static_cast<size_t>(w.dim(1));
  if (rows <= kGemvMaxRows) {
    const CpuIsa isa = cpu_isa() == CpuIsa::scalar ? CpuIsa::avx2 : cpu_isa();
    // Blocks of 16 output rows keep every thread's weight stream long and sequential.
    const size_t blocks = (out + 15) / 16;
    pool.parallel_for(blocks, [&](size_t b0, size_t b1) {
      gemv_rows(isa, x, rows, w, y, b0 * 16, std::min(out, b1 * 16));
    });
    return;
  }
  set_blas_threads(pool.size());
  const int m = static_cast<int>(rows), k = static_cast<int>(in);
  if (w.dtype() == DType::f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(out), k, 1.0f, x, k, w.data<float>(), k,
                0.0f, y, static_cast<int>(out));
    return;
  }
  // 16-bit weights: convert a tile of weight rows to fp32, then sgemm into y's columns.
  const size_t tile_rows = std::max<size_t>(64, (size_t{1} << 20) / in);
  ws.weight_tile.resize(tile_rows * in);
  const size_t elem = dtype_size(w.dtype());
  for (size_t o0 = 0; o0 < out; o0 += tile_rows) {
    const size_t n = std::min(tile_rows, out - o0);
    const char* src = static_cast<const char*>(w.raw()) + o0 * in * elem;
    pool.parallel_for(n, [&](size_t r0, size_t r1) {
      convert_to_f32(w.dtype(), src + r0 * in * elem, ws.weight_tile.data() + r0 * in, (r1 - r0) * in);
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(n), k, 1.0f, x, k,
                ws.weight_tile.data(), k, 0.0f, y + o0, static_cast<int>(out));
  }
}

}  // namespace hack::cpu
