/// @file kv_options.h
/// @brief What `--kv`, `--hack-*` and `--kv-select-*` choose for a paged KV cache, on any
/// device: the mode, the HACK widths (per layer under an allocation), Π, sinks, the recent
/// window, rounding, the budget; and the byte sizes those options give, computed without
/// building a cache. Device-neutral: the CPU cache (backend/cpu_paged_kv_cache.h) and the device cache
/// (backend/cuda_paged_kv_cache.h) read the same struct, and the nodes see only this header
/// and kv/paged_kv.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/dtype.h"
#include "hack/kv/hack_page.h"
#include "hack/kv/kv_cache.h"

namespace hack {

// ---- MPCache page selection in decode (DESIGN.md §3.4; the CPU selector is
// backend/cpu_page_selector.h): what --kv-select-* chooses, and what a run selected ----

/// How pages are ranked. quest / mpcache are the product; streaming (the most recent pages),
/// random and oracle (true attention mass of the dequantized pages) are baselines at the same
/// budget, for the fidelity bench.
enum class PageScore : uint8_t { quest, mpcache, streaming, random, oracle };

PageScore parse_page_score(std::string_view name);  ///< throws hack::Error naming the choices
std::string_view page_score_name(PageScore score);

/// `--kv-select-*`. Off unless ratio or tokens is set.
struct PageSelectOptions {
  double ratio = 0;           ///< --kv-select-ratio: budget as a fraction of the context, (0, 1]
  int tokens = 0;             ///< --kv-select-tokens: budget in tokens (instead of a ratio)
  PageScore score = PageScore::quest;  ///< --kv-select-bound
  float alpha = 0.6f;         ///< --kv-select-alpha: MPCache's α
  int group_pages = 2;        ///< --kv-select-group: pages per coarse group; 1 = one level
  double coarse_ratio = 0.5;  ///< --kv-select-coarse: fraction of groups kept by the coarse level
  int dense_layers = 2;       ///< --kv-select-dense: leading layers that attend to everything
  int share_layers = 2;       ///< --kv-select-share: layers that share one selection
  uint64_t seed = 0;          ///< the random baseline's stream
  /// The floor (issue 33: a 20 % budget of a 1K prompt is three pages, too few to find a
  /// passkey): the budget is never below `min_tokens`, and a context shorter than
  /// `min_context` attends to every page. Defaults measured, see kv_flags.cpp.
  int min_tokens = 0;         ///< --kv-select-min-tokens
  int min_context = 0;        ///< --kv-select-min-context
  bool enabled() const { return ratio > 0 || tokens > 0; }
  bool operator==(const PageSelectOptions&) const = default;
};

/// Throws hack::Error naming the flag of the first bad value.
void validate(const PageSelectOptions& options);
/// " select=0.2 quest group=2 coarse=0.5 dense=2 share=2" (empty when off).
std::string describe(const PageSelectOptions& options);

/// What the selections of a run attended to (summed over decode items, KV heads and the
/// layers that selected).
struct PageSelectStats {
  double context_tokens = 0;   ///< tokens the queries could see
  double selected_tokens = 0;  ///< tokens they attended to
  /// With measure_sharing: for each layer that reused a selection, how many of the pages its
  /// own selection would have chosen the shared one holds (MPCache's commonality score).
  double shared_hits = 0, shared_pages = 0;
  int selections = 0;          ///< (layer, item, head) selections made
};

enum class KvMode { fp, hack };

/// How attention reads closed HACK blocks. `homomorphic` is the product: INT8 Q and P
/// against the codes (DESIGN.md §3.1). `dequantized` expands each block to f32 and attends
/// in fp32 — slower, for the fidelity ablation that separates the error of the KV codes
/// from the error of requantizing Q and P.
enum class HackAttention { homomorphic, dequantized };

/// Code bits of one layer's HACK pages.
struct HackLayerBits {
  int k_bits = 2;
  int v_bits = 2;
  bool operator==(const HackLayerBits&) const = default;
};

/// Everything `--kv`, `--hack-*` choose. Defaults are the documented flag defaults.
struct KvCacheOptions {
  KvMode mode = KvMode::hack;
  int k_bits = 2;               ///< --hack-k-bits: K code bits, 2, 4 or 8
  int v_bits = 2;               ///< --hack-v-bits: V code bits, 2, 4 or 8
  int block_tokens = 64;        ///< --hack-block Π: tokens per page, multiple of 16
  int sinks = 4;                ///< --hack-sinks: leading tokens kept in bf16
  Rounding rounding = Rounding::nearest;  ///< --hack-rounding
  uint64_t seed = 0;            ///< stochastic rounding seed
  size_t capacity_bytes = 0;    ///< pool budget, 0 = unbounded
  DType fp_dtype = DType::bf16; ///< fp mode page element type: bf16 or f32
  int k_group = 64;             ///< largest K partition (Q quantization group), channels
  int v_group = 64;             ///< largest V partition, channels (capped at Π)
  std::vector<HackLayerBits> layer_bits;  ///< per layer (a calibrated allocation); empty =
                                          ///< k_bits/v_bits in every layer
  int recent_tokens = 0;        ///< --hack-recent R: a block is quantized only once all its
                                ///< tokens are older than the newest R (KIVI's residual)
  bool exact_prefill = true;    ///< prefill attends to the whole prompt exactly (begin_prefill)
  HackAttention attention = HackAttention::homomorphic;
  std::optional<CpuIsa> isa;    ///< kernel ISA; default cpu_isa()
  PageSelectOptions select;     ///< --kv-select-*: MPCache page selection in decode (hack mode)
};

KvMode parse_kv_mode(std::string_view name);        ///< "fp" | "hack"
Rounding parse_rounding(std::string_view name);     ///< "nearest" | "stochastic"
std::string_view kv_mode_name(KvMode mode);
std::string_view rounding_name(Rounding rounding);
std::string_view hack_attention_name(HackAttention attention);
/// One line for logs and quality tables: "hack k2v2 block=64 sinks=4 nearest", "fp f32 block=64".
std::string describe(const KvCacheOptions& options);

/// Sees every token a sequence's append() stores (after validation), e.g. a decode node that
/// keeps the exact KV of a conversation for the vault after the cache has quantized it. Runs
/// on the appending thread; appends of different sequences may run concurrently, so one
/// observer serves one sequence.
class KvAppendObserver {
 public:
  virtual ~KvAppendObserver() = default;
  /// k, v: [n_tokens][num_kv_heads][head_dim] f32 of positions [start_pos, start_pos + n_tokens).
  virtual void on_append(int layer, int start_pos, int n_tokens, const float* k, const float* v) = 0;
};

/// KV bytes per token (all layers) of closed blocks for a shape and options, without
/// building a cache (for tables and the bench).
double kv_bytes_per_token(const KvShape& shape, const KvCacheOptions& options);
/// The same for an uncompressed bf16 cache: what compression ratios are quoted against.
double bf16_kv_bytes_per_token(const KvShape& shape);
/// The HACK page layout of `layer` under `options` (its bits, or the allocation's, Π, the
/// K/V groups and the shape's per-head dims): what the CPU and the device caches write.
HackPageLayout hack_page_layout(const KvShape& shape, const KvCacheOptions& options, int layer);

}  // namespace hack
