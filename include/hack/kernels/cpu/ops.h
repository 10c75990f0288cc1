/// @file kernels/cpu/ops.h
/// @brief Element-wise and row-wise CPU kernels of the transformer (the reference twins of
/// the CUDA kernels). All take fp32 activations; rows are contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hack/core/tensor.h"

namespace hack::cpu {

/// out[t] = x[t] / rms(x[t]) * weight, for `rows` rows of n floats. out may alias x.
void rmsnorm(const float* x, const float* weight, float* out, size_t rows, size_t n, float eps);

/// Rotates `n_heads` heads of one token in place (Hugging Face "rotate_half" layout:
/// pairs (i, i + head_dim/2)). x: [n_heads][head_dim].
void rope_apply(float* x, int n_heads, int head_dim, int position, const float* inv_freq);

/// FDC's post-RoPE projection (model/fdc.h), in place: every head slot x of `rows` rows of
/// `n_heads` heads becomes x·P[:, :d] of its KV head k = head / heads_per_kv, 0 after d.
/// proj: [kv_heads][head_dim][head_dim] (P[i][j] at k·hd² + i·hd + j); d_qk: [kv_heads].
/// head_dim ≤ 512. Its CUDA twin is cuda::fdc_project.
void fdc_project(float* x, size_t rows, int n_heads, int heads_per_kv, int head_dim, const float* proj,
                 const int* d_qk);

/// out = silu(gate) * up, n elements. out may alias gate.
void swiglu(const float* gate, const float* up, float* out, size_t n);

/// x[i] += y[i]
void add_inplace(float* x, const float* y, size_t n);

/// Dot product of two fp32 vectors.
float dot(const float* a, const float* b, size_t n);
/// y += a * x
void axpy(float a, const float* x, float* y, size_t n);
/// In-place softmax of n floats; returns nothing. Stable (subtracts the max).
void softmax(float* x, size_t n);

/// Row `token` of an embedding table (any float dtype, or a block type: the row dequantized)
/// into out (hidden floats).
void embedding_row(const Tensor& table, int64_t token, float* out);

}  // namespace hack::cpu
