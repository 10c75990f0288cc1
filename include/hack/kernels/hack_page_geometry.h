/// @file hack_page_geometry.h
/// @brief Plain descriptions the HACK device kernels (hack/kernels/cuda/hack.h) are
/// launched with: the flat byte geometry of one layer's HACK pages (kv/hack_page.h) and
/// the split-K plan of decode attention. No CUDA types: the host side (kv/
/// hack_attention_plan.h) builds them from a HackPageLayout and the device's SM count.
#pragma once

#include <cstdint>

#include "hack/kernels/hack_quant_math.h"  // HACK_HD

namespace hack {

/// Byte geometry of the pages of one layer whose heads all have k_dim = v_dim = head_dim
/// (heads of equal dims get equal sections, so head h starts at head0 + h·head_bytes).
/// Field offsets are relative to the start of a head's section.
struct HackPageGeometry {
  int k_bits = 2;         ///< K code bits: 2, 4 or 8
  int v_bits = 2;         ///< V code bits: 2, 4 or 8
  int block_tokens = 64;  ///< Π
  int num_heads = 0;      ///< KV heads
  int head_dim = 0;
  int k_group = 0;      ///< channels per K partition (Q quantization group)
  int v_group = 0;      ///< channels per V partition (P quantization group)
  int k_sum_bytes = 1;  ///< 1 = u8, 2 = u16
  int v_sum_bytes = 1;
  uint32_t header_bytes = 0;  ///< header + head table
  uint32_t page_bytes = 0;
  uint32_t first_token_offset = 0;  ///< byte of the u64 HackPageHeader::first_token
  uint32_t layer_offset = 0;        ///< byte of the u32 HackPageHeader::layer
  uint32_t head0 = 0;               ///< section of head 0
  uint32_t head_bytes = 0;          ///< one head's section (64-byte multiple)
  uint32_t k_codes = 0, v_codes = 0, k_min = 0, k_scale = 0, k_sums = 0, v_min = 0, v_scale = 0, v_sums = 0;
  uint32_t fields_end = 0;  ///< end of v_sums; [fields_end, head_bytes) is zero padding
};

/// Split-K plan of decode attention: the quantized pages of every sequence are cut into
/// ranges of `pages_per_split`; range s of (sequence, KV head) is one warp writing a partial
/// online-softmax state, and a combine kernel merges the states in range order. Sinks go
/// with range 0 and the open block with the range of the last page.
struct HackDecodePlan {
  int splits = 1;           ///< partial states (warps) per (sequence, KV head)
  int pages_per_split = 1;  ///< ≥ 1
};

/// Work of split `split` for a sequence with `num_pages` quantized pages: pages
/// [page_begin, page_end), the sinks (split 0) and the open block (the split of the last
/// page, or 0 without pages). The last split takes any pages beyond splits·pages_per_split.
struct HackSplitRange {
  int page_begin = 0;
  int page_end = 0;
  bool sinks = false;
  bool open = false;
};

HACK_HD inline HackSplitRange hack_split_range(const HackDecodePlan& plan, int split, int num_pages) {
  HackSplitRange r;
  const int begin = split * plan.pages_per_split;
  r.page_begin = begin < num_pages ? begin : num_pages;
  const int end = split == plan.splits - 1 ? num_pages : begin + plan.pages_per_split;
  r.page_end = end < num_pages ? end : num_pages;
  if (r.page_end < r.page_begin) r.page_end = r.page_begin;
  int last = num_pages == 0 ? 0 : (num_pages - 1) / plan.pages_per_split;
  if (last > plan.splits - 1) last = plan.splits - 1;
  r.sinks = split == 0;
  r.open = split == last;
  return r;
}

}  // namespace hack
