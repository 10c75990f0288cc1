#include "hack/backend/hack_attention_plan.h"

#include <algorithm>
#include <cstddef>

#include "hack/core/error.h"

namespace hack {

HackPageGeometry page_geometry(const HackPageLayout& layout) {
  HACK_CHECK(layout.num_heads() > 0, "HACK page geometry: empty layout");
  const HackHeadLayout& h0 = layout.head(0);
  HackPageGeometry g;
  g.k_bits = layout.k_bits();
  g.v_bits = layout.v_bits();
  g.block_tokens = layout.block_tokens();
  g.num_heads = layout.num_heads();
  g.head_dim = h0.k_dim;
  g.k_group = h0.k_group;
  g.v_group = h0.v_group;
  g.k_sum_bytes = layout.k_sum_bytes();
  g.v_sum_bytes = layout.v_sum_bytes();
  g.header_bytes = static_cast<uint32_t>(layout.header_bytes());
  g.page_bytes = static_cast<uint32_t>(layout.page_bytes());
  g.first_token_offset = static_cast<uint32_t>(offsetof(HackPageHeader, first_token));
  g.layer_offset = static_cast<uint32_t>(offsetof(HackPageHeader, layer));
  g.head0 = static_cast<uint32_t>(h0.offset);
  g.head_bytes = static_cast<uint32_t>(h0.bytes);
  auto rel = [&](size_t absolute) { return static_cast<uint32_t>(absolute - h0.offset); };
  g.k_codes = rel(h0.k_codes);
  g.v_codes = rel(h0.v_codes);
  g.k_min = rel(h0.k_min);
  g.k_scale = rel(h0.k_scale);
  g.k_sums = rel(h0.k_sums);
  g.v_min = rel(h0.v_min);
  g.v_scale = rel(h0.v_scale);
  g.v_sums = rel(h0.v_sums);
  g.fields_end = g.v_sums + static_cast<uint32_t>(h0.v_dim * layout.v_sum_bytes());
  for (int h = 0; h < layout.num_heads(); ++h) {
    const HackHeadLayout& hl = layout.head(h);
    HACK_CHECK(hl.k_dim == h0.k_dim && hl.v_dim == h0.k_dim && hl.k_group == h0.k_group && hl.v_group == h0.v_group &&
                   hl.offset == h0.offset + static_cast<size_t>(h) * h0.bytes && hl.bytes == h0.bytes,
               "HACK page geometry: head {} is {}x{}, the device kernels need every head {}x{}", h, hl.k_dim, hl.v_dim,
               h0.k_dim, h0.k_dim);
  }
  return g;
}

std::vector<uint8_t> page_header_template(const HackPageLayout& layout, int layer, Rounding rounding) {
  std::vector<uint8_t> bytes(layout.header_bytes());
  layout.write_header(bytes.data(), layer, 0, rounding);
  return bytes;
}

HackDecodePlan plan_hack_decode(const HackDecodePlanInput& in) {
  HACK_CHECK(in.sm_count > 0 && in.warps_per_sm > 0 && in.batch > 0 && in.kv_heads > 0 && in.max_pages >= 0 &&
                 in.min_pages_per_split > 0 && in.max_splits > 0,
             "HACK decode plan: {} SMs × {} warps, batch {}, {} KV heads, {} pages ({} per split at least), {} splits "
             "at most",
             in.sm_count, in.warps_per_sm, in.batch, in.kv_heads, in.max_pages, in.min_pages_per_split,
             in.max_splits);
  const int64_t slots = static_cast<int64_t>(in.sm_count) * in.warps_per_sm;
  const int64_t units = static_cast<int64_t>(in.batch) * in.kv_heads;  // splits of one range each
  int64_t splits = (slots + units - 1) / units;
  const int64_t most = std::min<int64_t>((in.max_pages + in.min_pages_per_split - 1) / in.min_pages_per_split,
                                         in.max_splits);
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, most));
  HackDecodePlan plan;
  plan.pages_per_split = std::max(1, static_cast<int>((in.max_pages + splits - 1) / splits));
  // Re-derive the count so no range is empty (e.g. 10 pages over 4 splits: 3 per split, 4 splits;
  // 9 pages over 6: 2 per split, 5 splits).
  plan.splits = std::max(1, (in.max_pages + plan.pages_per_split - 1) / plan.pages_per_split);
  return plan;
}

}  // namespace hack
