/// @file hack_page.h
/// @brief The HACK page: Π quantized tokens × all KV heads of one layer, one versioned
/// byte layout shared by prefill, the wire and decode (DESIGN.md §3.1). A page is opaque
/// bytes that describe themselves: a 64-byte header, a head table, then one section per
/// head. Everything is little-endian; offsets are from the start of the page.
///
/// Page (version 2; version 1 had one `bits` for K and V):
///   HackPageHeader                          64 B
///   HackHeadEntry[num_heads]                16 B each, padded to a multiple of 64 B
///   per head h, 64-byte aligned, in head order:
///     k_codes  [Π/16][k_dim/(32/bk)][64 B]  K codes (bk bits), 16-token × (32/bk)-channel chunks
///     v_codes  [v_dim/16][Π/(32/bv)][64 B]  V codes (bv bits), 16-channel × (32/bv)-token chunks
///     k_min    [k_dim] bf16                 K per channel over the block: x ≈ min + scale·code
///     k_scale  [k_dim] bf16
///     k_sums   [k_dim/k_group][Π] u8|u16    Σ of K codes per (partition, token)
///     v_min    [v_dim/v_group][Π] bf16      V per token over channel partitions
///     v_scale  [v_dim/v_group][Π] bf16
///     v_sums   [v_dim] u8|u16               Σ of V codes per channel over the block
///     (zero padding to 64 B)
///
/// A 64-byte chunk holds 8/b sub-tiles packed into bit fields: sub-tile j sits in bits
/// [b·j, b·j + b) of every byte. A K sub-tile is 16 tokens × 4 channels with byte
/// 4·token + channel, so one 32-bit lane is one token and an INT8 dot over it (VPDPBUSD
/// with q broadcast) yields 16 token scores without a horizontal sum. A V sub-tile is
/// 16 channels × 4 tokens with byte 4·channel + token, so a lane is one output channel.
/// Code sums are u8 when their largest possible value fits (2-bit codes), else u16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>


namespace hack {

namespace cpu {
struct HackHeadView;  // kernels/cpu/hack_attention.h (hack_head_view's callers include it)
}  // namespace cpu

inline constexpr uint32_t kHackPageMagic = 0x47504B48;  // "HKPG"
inline constexpr uint16_t kHackPageVersion = 2;

enum class Rounding : uint8_t { nearest = 0, stochastic = 1 };

/// The fixed-size header at byte 0 of every page.
struct HackPageHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_bytes;   ///< header + head table, multiple of 64
  uint32_t page_bytes;     ///< the whole page
  uint32_t layer;
  uint64_t first_token;    ///< sequence position of the block's first token
  uint16_t block_tokens;   ///< Π
  uint16_t num_heads;
  uint8_t k_bits;          ///< K code bits: 2, 4 or 8
  uint8_t k_sum_bytes;     ///< 1 or 2
  uint8_t v_sum_bytes;     ///< 1 or 2
  uint8_t rounding;        ///< Rounding the codes were made with (informational)
  uint8_t v_bits;          ///< V code bits: 2, 4 or 8
  uint8_t reserved[31];
};
static_assert(sizeof(HackPageHeader) == 64);

/// One row of the head table.
struct HackHeadEntry {
  uint16_t k_dim;
  uint16_t v_dim;
  uint16_t k_group;        ///< channels per K partition (= Q quantization group)
  uint16_t v_group;        ///< channels per V partition
  uint32_t offset;         ///< start of the head's section
  uint32_t bytes;          ///< size of the head's section
};
static_assert(sizeof(HackHeadEntry) == 16);

/// The code widths a HACK page can hold (K and V alike).
inline bool is_hack_bits(int bits) { return bits == 2 || bits == 4 || bits == 8; }

/// Per-head dims of one layer (FDC gives heads their own; plain models repeat head_dim).
struct HackHeadDims {
  int k_dim = 0;
  int v_dim = 0;
};

/// What a layout is built from.
struct HackPageParams {
  int k_bits = 2;                 ///< K code bits: 2, 4 or 8
  int v_bits = 2;                 ///< V code bits: 2, 4 or 8
  int block_tokens = 64;          ///< Π, a multiple of 16
  int k_group = 64;               ///< largest K partition (multiple of 16); per head the
                                  ///< largest multiple of 16 ≤ this that divides k_dim
  int v_group = 64;               ///< largest V partition, likewise (≤ Π)
  std::vector<HackHeadDims> heads;
};

/// Byte offsets of one head's section (absolute, from the page start).
struct HackHeadLayout {
  int k_dim = 0, v_dim = 0, k_group = 0, v_group = 0;
  size_t offset = 0, bytes = 0;
  size_t k_codes = 0, v_codes = 0, k_min = 0, k_scale = 0, k_sums = 0, v_min = 0, v_scale = 0, v_sums = 0;
  int k_partitions() const { return k_dim / k_group; }
  int v_partitions() const { return v_dim / v_group; }
};

/// The layout of every page of one layer, computed once from HackPageParams.
class HackPageLayout {
 public:
  HackPageLayout() = default;
  /// Validates params (bits, Π, dims multiples of 16, groups) and places every field.
  explicit HackPageLayout(const HackPageParams& params);
  /// The layout a received page declares, after checking it is self-consistent and fits
  /// in `size` bytes. Throws hack::Error naming the first problem.
  static HackPageLayout from_page(const void* page, size_t size);

  int k_bits() const { return k_bits_; }
  int v_bits() const { return v_bits_; }
  int block_tokens() const { return block_tokens_; }
  int num_heads() const { return static_cast<int>(heads_.size()); }
  int k_sum_bytes() const { return k_sum_bytes_; }
  int v_sum_bytes() const { return v_sum_bytes_; }
  size_t header_bytes() const { return header_bytes_; }
  size_t page_bytes() const { return page_bytes_; }
  const HackHeadLayout& head(int h) const { return heads_[static_cast<size_t>(h)]; }
  /// Bytes per token of a full page (header included).
  double bytes_per_token() const { return static_cast<double>(page_bytes_) / block_tokens_; }

  /// Writes the header and head table; the rest of the page is left as is.
  void write_header(void* page, int layer, int64_t first_token, Rounding rounding) const;
  /// Throws hack::Error unless `page` (size bytes) is a page of exactly this layout
  /// (magic, version, size, Π, bit widths, head dims and offsets).
  void validate(const void* page, size_t size) const;
  /// validate(page, page_bytes()), and that the header names `layer` and `first_token`
  /// (a page offered for a given block: a known page at a close, a received one).
  void validate_at(const void* page, int layer, int64_t first_token) const;
  /// Layer and first token stored in a page's header.
  static int page_layer(const void* page);
  static int64_t page_first_token(const void* page);

  bool operator==(const HackPageLayout& other) const;

 private:
  int k_bits_ = 0;
  int v_bits_ = 0;
  int block_tokens_ = 0;
  int k_sum_bytes_ = 0;
  int v_sum_bytes_ = 0;
  size_t header_bytes_ = 0;
  size_t page_bytes_ = 0;
  std::vector<HackHeadLayout> heads_;
};

/// Where a block's random stream comes from: stochastic rounding is a pure function of
/// (seed, layer, first_token, head, K|V, element), so the same block quantizes to the same
/// codes on any node, thread or chunking.
struct RoundingSpec {
  Rounding mode = Rounding::nearest;
  uint64_t seed = 0;
  int layer = 0;
  int64_t first_token = 0;
};

/// The attention kernels' view of KV head `head` of a HACK page laid out by `layout`.
cpu::HackHeadView hack_head_view(const HackPageLayout& layout, const std::byte* page, int head);

/// The quantizer itself is kernels/cpu/hack_quantize.h, beside its CUDA twin
/// (kernels/cuda/hack.h), which writes the same bytes; these place it in the page layout.
///
/// Quantizes one head's K block. k: [Π][k_dim] bf16 (token rows `k_stride` elements apart).
/// Per channel: min rounded down and scale rounded up to bf16 so the range is covered,
/// codes = round((x − min) / scale) clamped to [0, 2^b − 1], then the per-token code sums.
void quantize_k_block(const HackPageLayout& layout, int head, const uint16_t* k, size_t k_stride,
                      const RoundingSpec& rounding, void* page);
/// Quantizes one head's V block. v: [Π][v_dim] bf16. Per (token, partition) min/scale,
/// then the per-channel code sums.
void quantize_v_block(const HackPageLayout& layout, int head, const uint16_t* v, size_t v_stride,
                      const RoundingSpec& rounding, void* page);

/// Code of K(token, channel) / V(token, channel) of one head (the layout's index map).
int k_code(const HackPageLayout& layout, int head, const void* page, int token, int channel);
int v_code(const HackPageLayout& layout, int head, const void* page, int token, int channel);
/// Dequantized block of one head, out: [Π][dim] f32 (min + scale·code, fp32 math).
void dequantize_k_block(const HackPageLayout& layout, int head, const void* page, float* out);
void dequantize_v_block(const HackPageLayout& layout, int head, const void* page, float* out);

/// Largest multiple of 16 that is ≤ max_group and divides dim (dim a multiple of 16).
int hack_group_for(int dim, int max_group);

/// bf16 of x rounded toward −∞ / +∞ (so a stored min never exceeds, and a stored scale
/// never falls short of, the value it replaces).
uint16_t bf16_round_down(float x);
uint16_t bf16_round_up(float x);

}  // namespace hack
