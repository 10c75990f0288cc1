/// @file kv_block.h
/// @brief The value of a vault block (DESIGN.md §3.3): the KV of Π consecutive tokens, all
/// layers, all KV heads, in one of two codecs, laid out layer by layer with a per-layer table
/// so a reader can apply layer 0 before layer 1 has arrived, and the vault can stream it per
/// layer without knowing the codec.
///
/// Codecs:
///   exact      the cache's exact element type (bf16 or f32), bit copies: a restored block is
///              bit-identical to a recomputed one, so a restored prefill equals a recomputed
///              one token for token. [K|V][tokens][heads][head_dim] elements per layer.
///   int8-head  the tierKV format: per (layer, K|V, token, head) one fp32 scale (absmax/127)
///              and head_dim INT8 values (symmetric, round to nearest even): groups aligned to
///              head boundaries so one head's outlier never touches another; ~2× smaller than
///              bf16 (head_dim 64: 68 bytes vs 128). Rounding error is uniform in ±scale/2, so
///              SNR ≈ 52.9 dB − the rows' crest factor (absmax² / mean square, in dB): on
///              SmolLM2-135M's KV 39.5 dB (K) and 43.6 dB (V) (bench/kv_block_snr; bf16
///              rounding itself: 55.7 dB). DESIGN.md's "≥ 52 dB" is out of reach for 8-bit
///              absmax codes on real rows.
///              Per layer: K scales f32 [tokens][heads], K codes int8 [tokens][heads][dim],
///              then V likewise.
///
/// Value layout (version 1), little-endian:
///   u32 magic "HKVB" | u16 version | u8 codec (1 exact, 2 int8-head) | u8 dtype (exact:
///   1 bf16, 2 f32; int8-head: 0) | u32 num_layers | u32 tokens | u16 num_kv_heads |
///   u16 head_dim | u32 reserved (0) | u64 first_token                          (32 bytes)
///   per layer: u64 offset (from the value's start) | u64 bytes | u64 xxh64 of the slice
///   the slices, layer 0 first, contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/kv/paged_kv.h"

namespace hack {

enum class BlockCodec : uint8_t { exact = 1, int8_head = 2 };

/// "exact" | "int8-head"; throws hack::Error naming the choices otherwise.
BlockCodec parse_block_codec(std::string_view name);
std::string_view block_codec_name(BlockCodec codec);

inline constexpr uint32_t kKvBlockMagic = 0x42564B48;  // "HKVB"
inline constexpr uint16_t kKvBlockVersion = 1;
inline constexpr size_t kKvBlockHeaderBytes = 32;
inline constexpr size_t kKvBlockLayerEntryBytes = 24;

struct KvBlockLayer {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;  ///< xxh64 (seed 0) of the slice
};

struct KvBlockHeader {
  BlockCodec codec = BlockCodec::exact;
  DType dtype = DType::bf16;     ///< exact codec: the element type (bf16 or f32); int8-head:
                                 ///< DType::i8 when decoded, ignored when passed in
  int num_layers = 0;
  int tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t first_token = 0;
  std::vector<KvBlockLayer> layers;
};

/// Bytes of one layer's slice: exact 2·tokens·heads·head_dim·dtype_size, int8-head
/// 2·tokens·heads·(4 + head_dim). `dtype` matters only for exact (bf16 or f32, else throws).
size_t kv_block_layer_bytes(BlockCodec codec, DType dtype, int tokens, int num_kv_heads, int head_dim);
/// Bytes of a whole value (header, table, slices).
size_t kv_block_bytes(BlockCodec codec, DType dtype, const KvShape& shape, int tokens);

/// Decodes and validates the header and table: magic, version, codec, dtype, dims, reserved
/// zero, positions that fit an int, that each slice has its codec's size and lies inside
/// `value`, the slices contiguous after the table in layer order and ending at the value's
/// end (`value` is the whole value). Checksums are not verified here (see
/// verify_kv_block_layer). Throws hack::Error naming the problem; never reads out of bounds.
KvBlockHeader decode_kv_block_header(std::span<const std::byte> value);
/// The same for a value's first bytes only (header and table; the slices need not be
/// there): checks the table describes contiguous slices of the codec's sizes right after it.
/// What a reader that receives a block layer by layer validates first.
KvBlockHeader decode_kv_block_prefix(std::span<const std::byte> prefix);
/// Whether a layer's slice of `value` matches its checksum (false when it lies outside
/// `value`); throws for a layer out of the header's range.
bool verify_kv_block_layer(const KvBlockHeader& header, int layer, std::span<const std::byte> value);

/// Encodes tokens [first_token, first_token + tokens) of one layer of a sequence into a
/// slice (appended to `out`). The tokens must be stored exactly in the cache
/// (PagedKv::copy_exact_tokens / read_exact_tokens): fp mode always, hack mode before
/// they are quantized (a prefill node encodes in the layer callback of its last chunk).
/// exact copies cache.exact_dtype() elements bit for bit: assemble with that dtype.
/// Throws hack::Error (`out` unchanged) for a token not stored exactly.
void encode_kv_block_layer(const PagedKv& cache, int seq_id, int layer, int first_token, int tokens,
                           BlockCodec codec, std::vector<std::byte>& out);
/// The same from f32 K/V ([tokens][heads][head_dim] each); exact converts to `dtype`.
void encode_kv_block_layer(const float* k, const float* v, int tokens, int num_kv_heads, int head_dim,
                           BlockCodec codec, DType dtype, std::vector<std::byte>& out);
/// Assembles a value from per-layer slices (each of the codec's size, layer order).
std::vector<std::byte> assemble_kv_block(BlockCodec codec, DType dtype, const KvShape& shape, int64_t first_token,
                                         int tokens, std::span<const std::vector<std::byte>> slices);

/// Decodes one layer's slice to f32 K and V ([tokens][heads][head_dim] each). Checks the
/// slice's size and, for int8-head, that scales are finite and ≥ 0 and codes in [−127, 127]
/// (a block can pass its checksum and still be malformed); throws hack::Error otherwise.
void decode_kv_block_layer(const KvBlockHeader& header, std::span<const std::byte> slice, float* k, float* v);
/// Appends one layer of a block to a sequence of `cache`: checks codec/shape against the
/// cache (exact: dtype == cache.exact_dtype()), that the layer's length is the block's
/// first_token, the sequence's capacity, the slice's size and checksum, and decodes it;
/// then appends its tokens. Throws hack::Error (the cache unchanged) on any mismatch.
/// `scratch` is reused between calls. exact into a bf16 cache stores the block's bf16 bits
/// (bf16 → f32 → bf16 is the identity, except that a signalling NaN comes back quiet).
/// When `times` is given, the seconds spent are added to it (checks and checksum + codec
/// decode; the append, which for a HACK cache quantizes the tokens into its pages).
struct KvRestoreTimes {
  double decode_s = 0;  ///< checks, checksum, codec → f32
  double append_s = 0;  ///< f32 → the cache's own format
};
void restore_kv_block_layer(PagedKv& cache, int seq_id, int layer, const KvBlockHeader& header,
                            std::span<const std::byte> slice, std::vector<float>& scratch,
                            KvRestoreTimes* times = nullptr);

/// Signal-to-noise ratio in dB of `approx` against `exact` (10·log10(Σx² / Σ(x − y)²));
/// +infinity when equal. For the int8-head codec's quality report.
double snr_db(std::span<const float> exact, std::span<const float> approx);

}  // namespace hack
