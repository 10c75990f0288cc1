/// @file kernels/cpu/matmul.h
/// @brief y = x · Wᵀ for the transformer's linear layers on the CPU, W in its checkpoint
/// dtype (f32, f16, bf16, or a GGUF block type: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k) and HF
/// layout [out_features, in_features].
///
/// Few rows (decode): a weight-streaming GEMV that reads each weight row once for all rows
/// of x (memory-bound; AVX2 or AVX-512 chosen at run time); on block weights x is quantized
/// to int8 per block and the dots run on the blocks (kernels/cpu/quant_dot.h, llama.cpp's
/// arithmetic). Many rows (prefill): OpenBLAS sgemm, converting 16-bit weights to fp32 (block
/// weights: dequantizing) tile by tile.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/tensor.h"
#include "hack/core/thread_pool.h"

namespace hack::cpu {

/// Rows of x at or below which matmul() streams weights (GEMV) instead of calling sgemm.
inline constexpr size_t kGemvMaxRows = 8;

/// Arithmetic of the compute-bound matmuls (prefill chunks, decode steps of 4 or more rows)
/// on bf16 weights. f32: the weights widened to fp32 (OpenBLAS sgemm, or the fp32 GEMV;
/// matches transformers in fp32 to ~1e-5). bf16: the activations rounded to bf16, fp32
/// accumulation — llama.cpp's arithmetic for bf16 weights: with VDPBF16PS on
/// CpuIsa::avx512bf16 (twice the multiply rate), by fp32 FMA in the same order on
/// CpuIsa::avx512 (the same bits); on avx2 and scalar it runs as f32. Block weights (GGUF) in
/// the many-row path are dequantized tile by tile and rounded to bf16 for the same GEMM.
/// GEMVs of 1–3 rows (memory-bound) stay fp32 in both.
enum class MatmulPrecision { f32, bf16 };

/// Parses "fp32" | "bf16" (the --matmul-precision flag).
MatmulPrecision parse_matmul_precision(std::string_view name);

/// Scratch for matmul(), reused across calls, and the many-row path's arithmetic.
struct MatmulWorkspace {
  MatmulPrecision precision = MatmulPrecision::f32;
  std::vector<float> weight_tile;            // f32: fp32 tiles of 16-bit or block weights for sgemm
  std::vector<uint16_t> weight_tile_bf16;    // bf16 on AVX-512: bf16 tiles of block weights for gemm_bf16
  std::vector<float> x_even_odd;             // GEMV: x permuted for the even/odd bf16 kernel
  std::vector<uint16_t> x_bf16;              // bf16 on avx512bf16: the activations (GEMM and GEMV)
  std::vector<float> x_bf16_f32;             // bf16 on avx512: the activations' bf16 values in fp32 (GEMM)
  std::vector<std::vector<uint32_t>> packs;  // bf16 on avx512bf16: one packed weight panel per thread
  std::vector<std::vector<float>> packs_f32; // bf16 on avx512: one panel widened to fp32 per thread
  std::vector<unsigned char> x_q8x32;        // GEMV on q4_0/q4_1/q8_0 weights: x as BlockQ8x32 rows
  std::vector<unsigned char> x_q8k;          // GEMV on K-quant weights: x as BlockQ8K rows
};

/// y[t][o] = Σ_i x[t][i] · w[o][i] for t < rows; x: [rows][in], y: [rows][out] (row-major,
/// contiguous). `w` is [out][in] f32/f16/bf16 or a block type.
void matmul(const float* x, size_t rows, const Tensor& w, float* y, ThreadPool& pool, MatmulWorkspace& ws);

/// One output of matmul_many: y = x · wᵀ ([rows][w.dim(0)]).
struct Projection {
  const Tensor* w;
  float* y;
};

/// Several projections of the same x (a layer's Q, K and V). With few rows (GEMV) they run
/// in one parallel region, their output rows dealt out as one list, so a decode step pays
/// one dispatch and barrier instead of one per matrix; with many rows, matmul() each.
void matmul_many(const float* x, size_t rows, std::span<const Projection> projections, ThreadPool& pool,
                 MatmulWorkspace& ws);

/// gate = silu(x · w_gateᵀ) * (x · w_upᵀ), [rows][intermediate]; `up` is scratch of the same
/// size. With few rows each block of output columns computes its gate and up rows and then
/// their product, all in one parallel region.
void matmul_swiglu(const float* x, size_t rows, const Tensor& w_gate, const Tensor& w_up, float* gate, float* up,
                   ThreadPool& pool, MatmulWorkspace& ws);

/// The GEMV path on an explicit ISA (tests compare every ISA with the scalar one).
/// Computes output rows [o_begin, o_end) only.
void gemv_rows(CpuIsa isa, const float* x, size_t rows, const Tensor& w, float* y, size_t o_begin, size_t o_end);

}  // namespace hack::cpu
