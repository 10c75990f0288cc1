/// @file hack_bits.h
/// @brief Choosing HACK code bits per layer under an accuracy budget (hack-calibrate
/// --hack): the adaptive principle FDC applies to ranks, applied to bits (DESIGN.md §3.1).
///
/// Quality is measured on the real decode path, teacher-forced: each calibration window is
/// prefilled (exactly, then quantized), then fed one token at a time; the score is the mean
/// KL(p_fp32 ‖ p_hack) of the next-token distributions at the decode positions. Search:
///   1. KL of the base configuration (every layer `base`), and for each layer the KL with
///      only that layer raised to `upgrade`;
///   2. layers ranked by KL gained per extra byte;
///   3. the shortest prefix of that ranking whose measured KL ≤ max_kl (binary search,
///      measuring each candidate), never beyond the byte budget; without max_kl, the
///      longest prefix within the budget.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/kv/kv_options.h"

namespace hack {

/// Teacher-forced decode-path scores of one KV configuration against the fp32 cache.
struct DecodePathScore {
  double mean_kl = 0;     ///< mean over decode positions of KL(p_fp32 ‖ p)
  double top1 = 0;        ///< fraction of positions whose argmax agrees
  double nll = 0;         ///< mean negative log-likelihood of the text's next token
  size_t positions = 0;
};

/// Log-probabilities of the fp32 reference at the decode positions of each window, kept so
/// every configuration is compared with the same numbers. windows: token ids, each
/// prefill_tokens + decode_tokens long.
class DecodePathReference {
 public:
  /// `model` and `pool` must outlive the reference.
  DecodePathReference(const Model& model, ThreadPool& pool, std::vector<std::vector<int>> windows, int prefill_tokens,
                      int prefill_chunk);
  /// Scores `options` (a hack or fp configuration) on the same windows, running `model`
  /// (e.g. the reference model with FDC applied) or, when null, the reference model.
  DecodePathScore score(const KvCacheOptions& options, const Model* model = nullptr) const;
  double reference_nll() const { return ref_nll_; }
  int prefill_tokens() const { return prefill_tokens_; }

 private:
  std::vector<std::vector<float>> run(const Model& model, const KvCacheOptions& options,
                                      const std::vector<int>& window) const;

  const Model& model_;
  ThreadPool& pool_;
  std::vector<std::vector<int>> windows_;
  int prefill_tokens_ = 0;
  int prefill_chunk_ = 512;
  std::vector<std::vector<std::vector<float>>> ref_;  // [window][position][vocab] log-probs
  double ref_nll_ = 0;
};

struct HackBitsSearch {
  HackLayerBits base{2, 2};
  HackLayerBits upgrade{4, 2};
  double max_bytes_fraction = 0.20;  ///< budget: closed-page bytes / bf16 bytes
  double max_kl = 0;                 ///< 0 = no accuracy target: best within the budget
};

struct HackBitsResult {
  std::vector<HackLayerBits> layers;
  std::vector<double> layer_gain_kl;   ///< KL saved by raising each layer alone
  std::vector<int> ranking;            ///< layers, best gain per byte first
  int upgraded = 0;                    ///< how many of the ranking were raised
  DecodePathScore base_score, final_score;
  double bytes_fraction = 0;           ///< of the chosen allocation, vs bf16
  int measurements = 0;
};

/// Runs the search; `options` holds everything but the bits (block, sinks, window, ...).
/// `log` gets one line per measurement.
HackBitsResult search_hack_bits(const DecodePathReference& reference, const KvShape& shape,
                                const KvCacheOptions& options, const HackBitsSearch& search,
                                const std::function<void(const std::string&)>& log);

}  // namespace hack
