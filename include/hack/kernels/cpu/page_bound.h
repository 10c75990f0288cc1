/// @file page_bound.h
/// @brief MPCache / Quest page scores on CPU (DESIGN.md §3.4): from a HACK page's per-channel
/// K min and scale (bf16) — every dequantized K of the page lies in [lo_d, hi_d] with
/// lo_d = min_d, hi_d = min_d + scale_d·(2^b − 1) — one small dot per page scores it for a
/// query group:
///   quest:   Σ_r Σ_d max(q_rd·hi_d, q_rd·lo_d)   (≥ q_r·k for every dequantized k of the page —
///            what attention reads; 2-bit nearest rounding clips K's range, so an outlier of
///            the exact K may exceed it), computed as Σ_d qpos_d·hi_d + qneg_d·lo_d with
///            qpos = Σ_r max(q_r, 0), qneg = Σ_r min(q_r, 0) — equal since hi ≥ lo, and two
///            fmas a channel whatever the group's size (quest_split)
///   mpcache: Σ_d qsum_d·(α·hi_d + (1 − α)·lo_d)  (the linearized similarity, qsum = Σ_r q_r)
/// A box of several consecutive pages (a coarse group) is scored on the envelope of its
/// pages' ranges (lo = min of lo, hi = max of hi), a bound of every page in it.
///
/// Every ISA gives the same bits (so the same selection on any machine, and a cluster equals
/// hack-run): channels accumulate in 16 lanes (lane j holds channels ≡ j mod 16), folded
/// 8+8, 4+4, 2+2, 1+1; rows are added in order; fma exactly where written above.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hack/core/cpu_features.h"

namespace hack::cpu {

struct PageBoundArgs {
  const std::byte* const* pages = nullptr;  ///< [n_pages] HACK pages of one layer
  int n_pages = 0;
  int span = 1;                 ///< pages per box: box b is pages [b·span, min((b + 1)·span, n_pages))
  size_t k_min_offset = 0;      ///< the head's k_min / k_scale within a page (HackHeadLayout)
  size_t k_scale_offset = 0;
  int k_dim = 0;                ///< multiple of 16
  float levels = 3;             ///< 2^k_bits − 1
  bool linear = false;          ///< mpcache (else quest)
  float alpha = 0.6f;           ///< mpcache's α
  const float* qpos = nullptr;  ///< quest: [k_dim] Σ_r max(q_r, 0) over the query group's rows
  const float* qneg = nullptr;  ///< quest: [k_dim] Σ_r min(q_r, 0)
  const float* qsum = nullptr;  ///< mpcache: [k_dim] Σ of the rows
};

/// qpos/qneg of PageBoundArgs from a query group's rows q [rows][k_dim] (rows added in order).
void quest_split(const float* q, int rows, int k_dim, float* qpos, float* qneg);

/// out[b] = the score of box b, for the ceil(n_pages / span) boxes.
using PageBoundFn = void (*)(const PageBoundArgs& args, float* out);

/// The kernel of `isa` (scalar, avx2, avx512 = avx512bf16: bit-identical).
PageBoundFn page_bound_kernel(CpuIsa isa);

namespace detail {
void page_bound_scalar(const PageBoundArgs& args, float* out);
void page_bound_avx2(const PageBoundArgs& args, float* out);
void page_bound_avx512(const PageBoundArgs& args, float* out);
}  // namespace detail

}  // namespace hack::cpu
