/// @file fdc.h
/// @brief FDC (DESIGN.md §3.2): post-RoPE dimensionality compression of Q/K and a low-rank
/// V, from one calibration artifact.
///
/// Per (layer, KV head) the artifact holds two orthonormal bases of the head's head_dim
/// space, each with its singular values in descending order:
///   qk  R — right singular vectors of the stacked post-RoPE Q rows (every query head of
///       the group) and K rows, each block scaled to equal Frobenius norm. Online, after
///       RoPE: q' = q·R[:, :d_qk], k' = k·R[:, :d_qk], and q'·k' ≈ q·k.
///   v   U — left singular vectors of W_V of the head (`weights`), or of W_V·L with L·Lᵀ
///       the covariance of the layer's input activations (`whitened`, Palu's choice, the
///       same as the principal directions of the head's V outputs). V' = v·U[:, :d_v] is
///       folded into W_V at load time; W_O's input columns of every query head of the group
///       absorb U[:, :d_v] (the up-projection), so attention runs on V' directly.
/// A singular-value removal rate r gives a head its ranks: the smallest d whose removed
/// singular values sum to at most r of all of them, rounded up to a multiple of 16
/// (head_dim 64 keeps 16, 32, 48 or 64).
///
/// Everything stays in head_dim-wide slots outside the KV cache: a head's compressed q', k',
/// v' and attention output occupy the first d entries of its head_dim slot, the rest are 0.
/// The KV cache stores only the first d (KvShape's per-head dims), so bytes shrink in fp and
/// HACK pages alike, and the attention kernels read d_qk/d_v channels per head.
///
/// Artifact file (one file, beside the model, default <model>/fdc.safetensors): a
/// safetensors file with f32 tensors `qk_basis` [layers][kv_heads][head_dim][head_dim]
/// (row i, column j = R[i][j]), `qk_singular` [layers][kv_heads][head_dim], `v_basis`,
/// `v_singular` likewise, and metadata key "fdc" = JSON:
///   {"version": 1, "num_layers", "num_kv_heads", "head_dim", "hidden_size",
///    "model_digest": hex of the weights' digest it was calibrated on,
///    "removal_rate": r, "v_method": "weights"|"whitened",
///    "d_qk": [[per head] per layer], "d_v": [[...]],
///    "calibration": {"tokens", "seed", "source": "random"|"text", "max_position", ...}}
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hack/model/weights.h"

namespace hack {

inline constexpr int kFdcArtifactVersion = 1;

/// Ranks of one KV head.
struct FdcRanks {
  int d_qk = 0;
  int d_v = 0;
  bool operator==(const FdcRanks&) const = default;
};

struct FdcArtifact {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  std::string model_digest;       ///< weights_digest() of the model it was calibrated on
  double removal_rate = 0;        ///< r the ranks were chosen with
  std::string v_method = "weights";
  std::vector<FdcRanks> ranks;    ///< [layer · num_kv_heads + head]
  std::vector<float> qk_basis;    ///< [layer][head][head_dim][head_dim], R[i][j]
  std::vector<float> qk_singular; ///< [layer][head][head_dim], descending
  std::vector<float> v_basis;     ///< [layer][head][head_dim][head_dim], U[i][j]
  std::vector<float> v_singular;  ///< [layer][head][head_dim], descending
  std::string calibration_json;   ///< the "calibration" object, as JSON text
  /// SHA-256 (hex) of the artifact file's bytes: set by load/save; enters the KV format
  /// (wire, vault fingerprint, router pairing), so nodes with different artifacts never mix.
  std::string digest;

  const FdcRanks& rank(int layer, int head) const { return ranks[static_cast<size_t>(layer * num_kv_heads + head)]; }
  const float* qk(int layer, int head) const;  ///< R of (layer, head), head_dim × head_dim
  const float* v(int layer, int head) const;   ///< U of (layer, head)
};

/// Reads and validates an artifact (version, shapes, finite values, singular values
/// descending and non-negative, bases orthonormal within 1e-3, head_dim a multiple of 16,
/// ranks multiples of 16 within [16, head_dim]); throws hack::Error naming the file and the
/// first problem.
FdcArtifact load_fdc_artifact(const std::filesystem::path& path);
/// Validates and writes `artifact` (atomically: a temporary file renamed over `path`) and
/// sets its digest to the written file's. calibration_json, when set, must be a JSON object.
void save_fdc_artifact(FdcArtifact& artifact, const std::filesystem::path& path);

/// Ranks every head gets at removal rate r ∈ [0, 1) from the artifact's singular values.
std::vector<FdcRanks> fdc_ranks_for_rate(const FdcArtifact& artifact, double removal_rate);
/// The smallest multiple of 16 (≥ 16, ≤ the count) of leading values whose removed tail
/// sums to at most r of the total.
int fdc_rank_for_rate(const float* singular_desc, int count, double removal_rate);

/// What the backend applies online: per (layer, KV head) the ranks and R[:, :d_qk].
struct FdcRuntime {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<FdcRanks> ranks;   ///< [layer · num_kv_heads + head]
  std::vector<float> qk_proj;    ///< [layer][head][head_dim][head_dim]: R with columns ≥ d_qk zeroed
  /// The artifact's digest; with ranks other than the artifact's (apply_fdc's `ranks`), the
  /// SHA-256 of that digest and the ranks, since the ranks change the KV bytes.
  std::string digest;
  double removal_rate = 0;       ///< the artifact's r (informational)

  const FdcRanks& rank(int layer, int head) const { return ranks[static_cast<size_t>(layer * num_kv_heads + head)]; }
  const float* proj(int layer, int head) const {
    return qk_proj.data() + static_cast<size_t>(layer * num_kv_heads + head) * static_cast<size_t>(head_dim * head_dim);
  }
};

/// A copy of `base` with FDC applied: `ranks` per head (default: the artifact's), W_V of
/// every layer replaced by U[:, :d_v]ᵀ·W_V per KV head (rows ≥ d_v of a head's slot zero),
/// W_O by W_O·U[:, :d_v] per query head (columns ≥ d_v zero), both f32, and model.fdc set.
/// The other weights are shared with base; bv (attention_bias) is projected like W_V. Throws
/// hack::Error when the artifact does not fit the model (dims, or a model digest that differs:
/// the artifact was calibrated on another model), when a rank is invalid, or when base
/// already has FDC applied.
Model apply_fdc(const Model& base, const FdcArtifact& artifact, const std::vector<FdcRanks>& ranks = {});

}  // namespace hack
