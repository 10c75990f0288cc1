#include "hack/kv/hack_page.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kernels/cpu/hack_quantize.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack {

namespace {

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

template <class T>
T* at(void* page, size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::byte*>(page) + offset);
}
template <class T>
const T* at(const void* page, size_t offset) {
  return reinterpret_cast<const T*>(static_cast<const std::byte*>(page) + offset);
}

}  // namespace

uint16_t bf16_round_down(float x) { return quant::bf16_round_down(x); }

uint16_t bf16_round_up(float x) { return quant::bf16_round_up(x); }

int hack_group_for(int dim, int max_group) {
  for (int g = std::min(max_group, dim) / 16 * 16; g >= 16; g -= 16)
    if (dim % g == 0) return g;
  return 16;
}

HackPageLayout::HackPageLayout(const HackPageParams& p) {
  for (const int b : {p.k_bits, p.v_bits})
    HACK_CHECK(is_hack_bits(b), "HACK page: bit widths must be 2, 4 or 8, got K {} / V {}", p.k_bits,
               p.v_bits);
  HACK_CHECK(p.block_tokens >= 16 && p.block_tokens % 16 == 0 && p.block_tokens <= 4096,
             "HACK page: block tokens must be a multiple of 16 in [16, 4096], got {}", p.block_tokens);
  HACK_CHECK(p.k_group >= 16 && p.k_group <= 256, "HACK page: k_group must be in [16, 256], got {}", p.k_group);
  HACK_CHECK(p.v_group >= 16, "HACK page: v_group must be at least 16, got {}", p.v_group);
  HACK_CHECK(!p.heads.empty() && p.heads.size() <= 4096, "HACK page: {} heads", p.heads.size());
  const int k_max_code = (1 << p.k_bits) - 1, v_max_code = (1 << p.v_bits) - 1;
  HACK_CHECK(p.block_tokens * v_max_code <= 65535, "HACK page: {} tokens of {}-bit codes overflow the u16 V sums",
             p.block_tokens, p.v_bits);
  k_bits_ = p.k_bits;
  v_bits_ = p.v_bits;
  block_tokens_ = p.block_tokens;

  int max_k_group = 0;
  heads_.resize(p.heads.size());
  for (size_t h = 0; h < p.heads.size(); ++h) {
    const HackHeadDims& d = p.heads[h];
    HACK_CHECK(d.k_dim >= 16 && d.k_dim % 16 == 0 && d.k_dim <= 4096 && d.v_dim >= 16 && d.v_dim % 16 == 0 &&
                   d.v_dim <= 4096,
               "HACK page: head {} dims {}x{} must be multiples of 16 in [16, 4096]", h, d.k_dim, d.v_dim);
    HackHeadLayout& hl = heads_[h];
    hl.k_dim = d.k_dim;
    hl.v_dim = d.v_dim;
    hl.k_group = hack_group_for(d.k_dim, p.k_group);
    hl.v_group = hack_group_for(d.v_dim, std::min(p.v_group, p.block_tokens));
    max_k_group = std::max(max_k_group, hl.k_group);
  }
  k_sum_bytes_ = max_k_group * k_max_code <= 255 ? 1 : 2;
  v_sum_bytes_ = block_tokens_ * v_max_code <= 255 ? 1 : 2;

  header_bytes_ = round_up(sizeof(HackPageHeader) + heads_.size() * sizeof(HackHeadEntry), 64);
  size_t offset = header_bytes_;
  const size_t T = static_cast<size_t>(block_tokens_);
  for (HackHeadLayout& hl : heads_) {
    const size_t kd = static_cast<size_t>(hl.k_dim), vd = static_cast<size_t>(hl.v_dim);
    hl.offset = offset;
    size_t at_ = offset;
    auto place = [&](size_t bytes) {
      const size_t o = at_;
      at_ += bytes;
      return o;
    };
    hl.k_codes = place(T * kd * static_cast<size_t>(k_bits_) / 8);
    hl.v_codes = place(T * vd * static_cast<size_t>(v_bits_) / 8);
    hl.k_min = place(kd * 2);
    hl.k_scale = place(kd * 2);
    hl.k_sums = place(static_cast<size_t>(hl.k_partitions()) * T * static_cast<size_t>(k_sum_bytes_));
    hl.v_min = place(static_cast<size_t>(hl.v_partitions()) * T * 2);
    hl.v_scale = place(static_cast<size_t>(hl.v_partitions()) * T * 2);
    hl.v_sums = place(vd * static_cast<size_t>(v_sum_bytes_));
    hl.bytes = round_up(at_ - offset, 64);
    offset += hl.bytes;
  }
  page_bytes_ = offset;
  HACK_CHECK(page_bytes_ <= 0xffffffffull, "HACK page: {} bytes exceed the 32-bit size field", page_bytes_);
}

bool HackPageLayout::operator==(const HackPageLayout& o) const {
  if (k_bits_ != o.k_bits_ || v_bits_ != o.v_bits_ || block_tokens_ != o.block_tokens_ || page_bytes_ != o.page_bytes_ ||
      heads_.size() != o.heads_.size())
    return false;
  for (size_t h = 0; h < heads_.size(); ++h) {
    const HackHeadLayout &a = heads_[h], &b = o.heads_[h];
    if (a.k_dim != b.k_dim || a.v_dim != b.v_dim || a.k_group != b.k_group || a.v_group != b.v_group ||
        a.offset != b.offset)
      return false;
  }
  return true;
}

void HackPageLayout::write_header(void* page, int layer, int64_t first_token, Rounding rounding) const {
  HackPageHeader hdr{};
  hdr.magic = kHackPageMagic;
  hdr.version = kHackPageVersion;
  hdr.header_bytes = static_cast<uint16_t>(header_bytes_);
  hdr.page_bytes = static_cast<uint32_t>(page_bytes_);
  hdr.layer = static_cast<uint32_t>(layer);
  hdr.first_token = static_cast<uint64_t>(first_token);
  hdr.block_tokens = static_cast<uint16_t>(block_tokens_);
  hdr.num_heads = static_cast<uint16_t>(heads_.size());
  hdr.k_bits = static_cast<uint8_t>(k_bits_);
  hdr.v_bits = static_cast<uint8_t>(v_bits_);
  hdr.k_sum_bytes = static_cast<uint8_t>(k_sum_bytes_);
  hdr.v_sum_bytes = static_cast<uint8_t>(v_sum_bytes_);
  hdr.rounding = static_cast<uint8_t>(rounding);
  std::byte* out = static_cast<std::byte*>(page);
  std::memset(out, 0, header_bytes_);
  std::memcpy(out, &hdr, sizeof hdr);
  for (size_t h = 0; h < heads_.size(); ++h) {
    const HackHeadLayout& hl = heads_[h];
    const HackHeadEntry e{static_cast<uint16_t>(hl.k_dim), static_cast<uint16_t>(hl.v_dim),
                          static_cast<uint16_t>(hl.k_group), static_cast<uint16_t>(hl.v_group),
                          static_cast<uint32_t>(hl.offset), static_cast<uint32_t>(hl.bytes)};
    std::memcpy(out + sizeof hdr + h * sizeof e, &e, sizeof e);
  }
}

HackPageLayout HackPageLayout::from_page(const void* page, size_t size) {
  HACK_CHECK(page != nullptr && size >= sizeof(HackPageHeader), "HACK page: {} bytes is too short for a header", size);
  HackPageHeader hdr;
  std::memcpy(&hdr, page, sizeof hdr);
  HACK_CHECK(hdr.magic == kHackPageMagic, "HACK page: bad magic {:#010x}", hdr.magic);
  HACK_CHECK(hdr.version == kHackPageVersion, "HACK page: version {} (this build reads version {})", hdr.version,
             kHackPageVersion);
  HACK_CHECK(hdr.page_bytes == size, "HACK page: header says {} bytes, received {}", hdr.page_bytes, size);
  HACK_CHECK(hdr.num_heads > 0 && sizeof(HackPageHeader) + hdr.num_heads * sizeof(HackHeadEntry) <= hdr.header_bytes &&
                 hdr.header_bytes <= size,
             "HACK page: head table of {} heads does not fit its {}-byte header", hdr.num_heads, hdr.header_bytes);
  HackPageParams params;
  params.k_bits = hdr.k_bits;
  params.v_bits = hdr.v_bits;
  params.block_tokens = hdr.block_tokens;
  params.k_group = 16;
  params.v_group = 16;
  for (int h = 0; h < hdr.num_heads; ++h) {
    HackHeadEntry e;
    std::memcpy(&e, static_cast<const std::byte*>(page) + sizeof hdr + static_cast<size_t>(h) * sizeof e, sizeof e);
    params.heads.push_back({e.k_dim, e.v_dim});
    params.k_group = std::max<int>(params.k_group, e.k_group);
    params.v_group = std::max<int>(params.v_group, e.v_group);
  }
  HackPageLayout layout(params);
  layout.validate(page, size);
  return layout;
}

void HackPageLayout::validate(const void* page, size_t size) const {
  HACK_CHECK(page != nullptr && size == page_bytes_, "HACK page: {} bytes, expected {}", size, page_bytes_);
  HackPageHeader hdr;
  std::memcpy(&hdr, page, sizeof hdr);
  HACK_CHECK(hdr.magic == kHackPageMagic, "HACK page: bad magic {:#010x}", hdr.magic);
  HACK_CHECK(hdr.version == kHackPageVersion, "HACK page: version {} (this build reads version {})", hdr.version,
             kHackPageVersion);
  HACK_CHECK(hdr.page_bytes == page_bytes_ && hdr.header_bytes == header_bytes_,
             "HACK page: sizes {}/{} do not match the expected {}/{}", hdr.page_bytes, hdr.header_bytes, page_bytes_,
             header_bytes_);
  HACK_CHECK(hdr.k_bits == k_bits_ && hdr.v_bits == v_bits_ && hdr.block_tokens == block_tokens_ &&
                 hdr.num_heads == heads_.size(),
             "HACK page: K {}-bit / V {}-bit, {} tokens, {} heads; expected K {}-bit / V {}-bit, {} tokens, {} heads",
             hdr.k_bits, hdr.v_bits, hdr.block_tokens, hdr.num_heads, k_bits_, v_bits_, block_tokens_, heads_.size());
  HACK_CHECK(hdr.k_sum_bytes == k_sum_bytes_ && hdr.v_sum_bytes == v_sum_bytes_,
             "HACK page: code sums of {}/{} bytes, expected {}/{}", hdr.k_sum_bytes, hdr.v_sum_bytes, k_sum_bytes_,
             v_sum_bytes_);
  HACK_CHECK(hdr.rounding <= 1, "HACK page: unknown rounding {}", hdr.rounding);
  for (size_t h = 0; h < heads_.size(); ++h) {
    HackHeadEntry e;
    std::memcpy(&e, static_cast<const std::byte*>(page) + sizeof hdr + h * sizeof e, sizeof e);
    const HackHeadLayout& hl = heads_[h];
    HACK_CHECK(e.k_dim == hl.k_dim && e.v_dim == hl.v_dim && e.k_group == hl.k_group && e.v_group == hl.v_group &&
                   e.offset == hl.offset && e.bytes == hl.bytes,
               "HACK page: head {} is {}x{} (groups {}/{}) at {}, expected {}x{} (groups {}/{}) at {}", h, e.k_dim,
               e.v_dim, e.k_group, e.v_group, e.offset, hl.k_dim, hl.v_dim, hl.k_group, hl.v_group, hl.offset);
  }
}

void HackPageLayout::validate_at(const void* page, int layer, int64_t first_token) const {
  validate(page, page_bytes_);
  HACK_CHECK(page_layer(page) == layer && page_first_token(page) == first_token,
             "HACK page: layer {} token {}, expected layer {} token {}", page_layer(page), page_first_token(page), layer,
             first_token);
}

int HackPageLayout::page_layer(const void* page) {
  HackPageHeader hdr;
  std::memcpy(&hdr, page, sizeof hdr);
  return static_cast<int>(hdr.layer);
}

int64_t HackPageLayout::page_first_token(const void* page) {
  HackPageHeader hdr;
  std::memcpy(&hdr, page, sizeof hdr);
  return static_cast<int64_t>(hdr.first_token);
}

namespace {

// One head's fields in `page`: the attention kernels' read-only HackHeadView or the
// quantizer's writable HackHeadSlots (the same fields, const or not).
template <class View, class Byte>
View head_fields(const HackPageLayout& layout, Byte* page, int head) {
  const HackHeadLayout& hl = layout.head(head);
  View h;
  h.k_bits = layout.k_bits();
  h.v_bits = layout.v_bits();
  h.tokens = layout.block_tokens();
  h.k_dim = hl.k_dim;
  h.v_dim = hl.v_dim;
  h.k_group = hl.k_group;
  h.v_group = hl.v_group;
  h.k_sum_bytes = layout.k_sum_bytes();
  h.v_sum_bytes = layout.v_sum_bytes();
  auto field = [&](auto member, size_t offset) { return reinterpret_cast<decltype(member)>(page + offset); };
  h.k_codes = field(h.k_codes, hl.k_codes);
  h.k_min = field(h.k_min, hl.k_min);
  h.k_scale = field(h.k_scale, hl.k_scale);
  h.k_sums = field(h.k_sums, hl.k_sums);
  h.v_codes = field(h.v_codes, hl.v_codes);
  h.v_min = field(h.v_min, hl.v_min);
  h.v_scale = field(h.v_scale, hl.v_scale);
  h.v_sums = field(h.v_sums, hl.v_sums);
  return h;
}

cpu::HackHeadSlots head_slots(const HackPageLayout& layout, int head, void* page) {
  return head_fields<cpu::HackHeadSlots>(layout, static_cast<std::byte*>(page), head);
}

cpu::HackBlockRounding block_rounding(const RoundingSpec& r, int head) {
  return {r.mode == Rounding::stochastic, r.seed, r.layer, r.first_token, head};
}

}  // namespace

cpu::HackHeadView hack_head_view(const HackPageLayout& layout, const std::byte* page, int head) {
  return head_fields<cpu::HackHeadView>(layout, page, head);
}

void quantize_k_block(const HackPageLayout& layout, int head, const uint16_t* k, size_t k_stride,
                      const RoundingSpec& rounding, void* page) {
  cpu::hack_quantize_k(head_slots(layout, head, page), k, k_stride, block_rounding(rounding, head));
}

void quantize_v_block(const HackPageLayout& layout, int head, const uint16_t* v, size_t v_stride,
                      const RoundingSpec& rounding, void* page) {
  cpu::hack_quantize_v(head_slots(layout, head, page), v, v_stride, block_rounding(rounding, head));
}

int k_code(const HackPageLayout& layout, int head, const void* page, int token, int channel) {
  const HackHeadLayout& hl = layout.head(head);
  const cpu::HackCodePos pos = cpu::hack_k_code_pos(layout.k_bits(), hl.k_dim, token, channel);
  return (at<uint8_t>(page, hl.k_codes)[pos.byte] >> pos.shift) & ((1 << layout.k_bits()) - 1);
}

int v_code(const HackPageLayout& layout, int head, const void* page, int token, int channel) {
  const HackHeadLayout& hl = layout.head(head);
  const cpu::HackCodePos pos = cpu::hack_v_code_pos(layout.v_bits(), layout.block_tokens(), token, channel);
  return (at<uint8_t>(page, hl.v_codes)[pos.byte] >> pos.shift) & ((1 << layout.v_bits()) - 1);
}

void dequantize_k_block(const HackPageLayout& layout, int head, const void* page, float* out) {
  const HackHeadLayout& hl = layout.head(head);
  const uint16_t* mins = at<uint16_t>(page, hl.k_min);
  const uint16_t* scales = at<uint16_t>(page, hl.k_scale);
  for (int t = 0; t < layout.block_tokens(); ++t)
    for (int c = 0; c < hl.k_dim; ++c)
      out[static_cast<size_t>(t) * hl.k_dim + c] =
          bf16_to_f32(mins[c]) + bf16_to_f32(scales[c]) * static_cast<float>(k_code(layout, head, page, t, c));
}

void dequantize_v_block(const HackPageLayout& layout, int head, const void* page, float* out) {
  const HackHeadLayout& hl = layout.head(head);
  const uint16_t* mins = at<uint16_t>(page, hl.v_min);
  const uint16_t* scales = at<uint16_t>(page, hl.v_scale);
  const int T = layout.block_tokens();
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < hl.v_dim; ++c) {
      const size_t meta = static_cast<size_t>(c / hl.v_group) * static_cast<size_t>(T) + static_cast<size_t>(t);
      out[static_cast<size_t>(t) * hl.v_dim + c] =
          bf16_to_f32(mins[meta]) + bf16_to_f32(scales[meta]) * static_cast<float>(v_code(layout, head, page, t, c));
    }
}

}  // namespace hack
