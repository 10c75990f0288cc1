/// @file fdc_calibrate.h
/// @brief FDC calibration (hack-calibrate --fdc, DESIGN.md §3.2): the per-(layer, KV head)
/// bases of an FDC artifact (model/fdc.h) from activations, and the removal rate r that
/// meets an accuracy target.
///
/// Bases. Calibration sequences run through the CPU backend over an fp32 cache; its
/// activation observer shows every layer's post-RoPE Q and K and its V. Per layer and KV
/// head the Gram matrices (head_dim × head_dim, double) are accumulated instead of the rows:
///   G_q = Σ qᵀq over the rows of every query head of the group,  G_k = Σ kᵀk,  G_v = Σ vᵀv.
/// Stacking the Q rows scaled by a and the K rows scaled by b, with a² = 1/tr(G_q) and
/// b² = 1/tr(G_k) (both blocks of equal Frobenius norm: Q rows outnumber K rows by the
/// group size), the stack's right singular vectors are the eigenvectors of a²G_q + b²G_k and
/// its singular values the square roots of the eigenvalues. V: `weights` takes the left
/// singular vectors of W_V of the head (eigenvectors of W_V·W_Vᵀ); `whitened` the
/// eigenvectors of G_v, the principal directions of the head's V outputs (= the SVD of
/// W_V·L, L·Lᵀ the input covariance; Palu's choice). Vectors are sorted by descending
/// singular value and sign-normalised (largest-magnitude component positive), so a seed
/// gives the same artifact bit for bit.
///
/// Rate. With an accuracy target, r ∈ [0, max_rate] is found by binary search on the
/// teacher-forced decode-path KL (calibrate/hack_bits.h DecodePathReference) of the model
/// with FDC applied at r, over an fp32 cache (FDC alone) or a HACK one (FDC + HACK).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "hack/calibrate/hack_bits.h"
#include "hack/model/fdc.h"

namespace hack {

/// Calibration token ids: `tokens` in all, in sequences of at most `seq_len` (the last may
/// be shorter), each opened by the model's BOS when it has one. The rest are uniform random
/// ids from std::mt19937_64(seed) (the paper's method), or with `text` the text's ids in
/// order (throws when it has too few).
std::vector<std::vector<int>> fdc_calibration_sequences(const ModelConfig& config, int tokens, int seq_len,
                                                        uint64_t seed, std::span<const int> text = {});

struct FdcCalibrationOptions {
  std::string v_method = "weights";  ///< weights | whitened
  int prefill_chunk_tokens = 512;
  double removal_rate = 0;           ///< ranks the artifact is written with
};

/// The artifact of `model` (a plain model, FDC not applied) from `sequences`, each run from
/// position 0 (so they cover the positions [0, longest)). calibration_json records the
/// token count, the sequences and the largest position.
FdcArtifact calibrate_fdc(const Model& model, ThreadPool& pool, const std::vector<std::vector<int>>& sequences,
                          const FdcCalibrationOptions& options);

/// `artifact` with the ranks of removal rate r and removal_rate = r; its digest is cleared
/// (it names a file, and this artifact is not one yet).
FdcArtifact fdc_artifact_at_rate(FdcArtifact artifact, double removal_rate);

/// Decode-path scores of `base` with `artifact` applied, over the cache `options`.
DecodePathScore score_fdc(const DecodePathReference& reference, const Model& base, const FdcArtifact& artifact,
                          const KvCacheOptions& options);

struct FdcRateSearch {
  double max_kl = 0;       ///< accuracy target: mean decode-path KL
  double max_rate = 0.5;   ///< r is searched in [0, max_rate]
  int iterations = 8;
};

struct FdcRateResult {
  double removal_rate = 0;  ///< the largest r found whose KL ≤ max_kl; 0 when none is
  DecodePathScore score;    ///< at removal_rate
  int measurements = 0;     ///< decode-path runs (rates giving ranks already measured reuse the score)
};

/// Binary search for the largest r whose KL ≤ search.max_kl (KL grows with r). `options`:
/// the cache scored (fp f32 = FDC alone; hack = FDC + HACK). `log` gets one line per rate.
FdcRateResult search_fdc_rate(const DecodePathReference& reference, const Model& base, const FdcArtifact& artifact,
                              const KvCacheOptions& options, const FdcRateSearch& search,
                              const std::function<void(const std::string&)>& log);

}  // namespace hack
