/// @file hack_attention_plan.h
/// @brief Host-side planning of HACK device work (plan on the host, run on the device):
/// the flat page geometry and header template the CUDA quantizer writes, and the split-K
/// plan of decode attention from the SM count, batch, heads and context.
#pragma once

#include <cstdint>
#include <vector>

#include "hack/kernels/hack_page_geometry.h"
#include "hack/kv/hack_page.h"

namespace hack {

/// The geometry of `layout`'s pages. Throws hack::Error unless every head has the same
/// k_dim = v_dim (what the CUDA kernels support; FDC's per-head dims are CPU-only).
HackPageGeometry page_geometry(const HackPageLayout& layout);

/// Header and head table of a page of `layout` (header_bytes bytes) for `layer` and
/// `rounding`, first token 0: the CUDA quantizer copies it and patches the first token.
std::vector<uint8_t> page_header_template(const HackPageLayout& layout, int layer,
                                          Rounding rounding = Rounding::nearest);

/// What the split plan depends on. A split is one warp of the CUDA kernel.
struct HackDecodePlanInput {
  int sm_count = 1;             ///< multiprocessors of the device
  int warps_per_sm = 64;        ///< split warps per SM to aim for (memory parallelism)
  int batch = 1;                ///< sequences
  int kv_heads = 1;
  int max_pages = 0;            ///< most quantized pages of any sequence in the batch
  int min_pages_per_split = 2;  ///< a split's partial state (G·D floats) is worth this many pages
  int max_splits = 256;         ///< cap on partial states per (sequence, KV head)
};

/// Enough splits to fill sm_count·warps_per_sm slots: (batch·kv_heads) splits already fill
/// them when the batch is large, so splits = 1; a small batch over a long context splits
/// the pages evenly, at least min_pages_per_split each where there are that many, never
/// into empty ranges (splits·pages_per_split − max_pages < pages_per_split). Throws
/// hack::Error on non-positive counts.
HackDecodePlan plan_hack_decode(const HackDecodePlanInput& input);

}  // namespace hack
